"""What :class:`~mmsafe.engine.hooks.RankFaultHook` computes, apart from
its runner glue:

* :mod:`.loss_terms`: which loss terms a rank produced, iteration by
  iteration, and which modules they reach;
* :mod:`.ddp_errors`: PyTorch's DDP reducer errors, read back into the
  parameters and modules they name.
"""
