"""What :class:`~mmsafe.engine.hooks.LossDictLintHook` computes, apart from
its runner glue:

* :mod:`.lint`: structural and numeric lint of a loss dict;
* :mod:`.weight_probe`: which config loss weights reach the loss.
"""
