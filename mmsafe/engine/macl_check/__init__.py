"""What :class:`~mmsafe.engine.hooks.MACLCheckHook` computes, apart from
its runner glue:

* :mod:`.signals`: the per-iteration signals of the MACL loss (is it in the
  loss dict, does it reach the head, how far from chance is it);
* :mod:`.verdicts`: the verdicts drawn from them, logged and recorded.
"""
