"""Point an MMEngine loop at another DataLoader.

MMEngine's loops read their batches from the ``dataloader`` attribute
(``EpochBasedTrainLoop``, ``ValLoop``, ``TestLoop``: ``for data_batch in
self.dataloader``); ``IterBasedTrainLoop`` reads them from its
``dataloader_iterator`` attribute, an ``_InfiniteDataloaderIterator``
built on ``dataloader`` in its constructor. Both are plain attributes of
the loop; :func:`replace_loop_loader` sets them and changes no method.
"""
from typing import Any, List

from torch.utils.data import DataLoader

from mmsafe.datasets.loader.processes import (shutdown_iterator,
                                              shutdown_loader)


def replace_loop_loader(loop: Any, new_loader: DataLoader) -> List[int]:
    """Make ``loop`` read its batches from ``new_loader``.

    Call it before the loop fetched its first batch (a ``before_train``,
    ``before_val`` or ``before_test`` hook). Invariants after the call:

    * ``loop.dataloader is new_loader``;
    * for a loop with a ``dataloader_iterator`` (``IterBasedTrainLoop``),
      that iterator is a new one of the same type on ``new_loader``, at the
      start of its first round, as the loop's constructor leaves it;
    * the old loader's worker processes (its persistent iterator, and the
      iterator that ``IterBasedTrainLoop`` started in its constructor) are
      shut down.

    Args:
        loop: an MMEngine train, val or test loop.
        new_loader (DataLoader): the loader to read from; it should share
            the old loader's sampler so that the sample order is kept
            (:func:`mmsafe.datasets.loader.rebuild_loader` does).

    Returns:
        list[int]: pids of old worker processes that could not be stopped.
    """
    alive = shutdown_loader(loop.dataloader)
    loop.dataloader = new_loader
    infinite = getattr(loop, 'dataloader_iterator', None)
    if infinite is not None:
        alive += shutdown_iterator(getattr(infinite, '_iterator', None))
        loop.dataloader_iterator = type(infinite)(new_loader)
    return alive
