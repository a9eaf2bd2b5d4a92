"""The loops of a :class:`~mmsafe.engine.runner.SafeRunner` run: mmsafe's
train loops in place of MMEngine's, and the loader workers they keep,
stopped when the run ends.

* :func:`resumable_train_loop`: a ``train_cfg`` naming MMEngine's
  ``EpochBasedTrainLoop``/``IterBasedTrainLoop`` (by type, or by
  ``by_epoch``) builds
  :class:`~mmsafe.engine.loops.ResumableEpochBasedTrainLoop` /
  :class:`~mmsafe.engine.loops.ResumableIterBasedTrainLoop` instead: the
  same arguments, the same behaviour in a run that does not resume; they
  also continue a resumed epoch exactly (:mod:`mmsafe.engine.loops`).
* :class:`BuiltLoops`: the loops the runner built (MMEngine builds every
  loop through ``build_train_loop``/``build_val_loop``/``build_test_loop``),
  whose loader workers are stopped at the end of the run, instead of being
  left to the interpreter's exit, where multiprocessing terminates them and
  torch reports "DataLoader worker ... is killed by signal" after a run
  that ended well (an iteration loop has the next round's started).
"""
import logging
from typing import Dict

from mmengine.runner import BaseLoop, EpochBasedTrainLoop, IterBasedTrainLoop

from mmsafe.engine.loops import (ResumableEpochBasedTrainLoop,
                                 ResumableIterBasedTrainLoop,
                                 stop_loop_workers)
from mmsafe.events import log


def resumable_train_loop(loop: Dict) -> Dict:
    """``train_cfg`` with mmsafe's loop type in place of MMEngine's
    ``EpochBasedTrainLoop``/``IterBasedTrainLoop`` (any other loop as
    given)."""
    loop = dict(loop)
    kind = loop.get('type')
    if kind is None:
        by_epoch = loop.pop('by_epoch', None)
        kind = ('EpochBasedTrainLoop' if by_epoch
                else 'IterBasedTrainLoop' if by_epoch is not None
                else None)
    if kind in ('EpochBasedTrainLoop', EpochBasedTrainLoop):
        loop['type'] = ResumableEpochBasedTrainLoop
    elif kind in ('IterBasedTrainLoop', IterBasedTrainLoop):
        loop['type'] = ResumableIterBasedTrainLoop
    return loop


class BuiltLoops:
    """The latest loop of each kind (``'train'``, ``'val'``, ``'test'``)
    that the runner built."""

    KINDS = ('train', 'val', 'test')

    def __init__(self) -> None:
        self.loops: Dict[str, BaseLoop] = {}

    def built(self, kind: str, loop):
        """Record ``loop``, the result of the runner's build of ``kind``;
        returns it."""
        self.loops[kind] = loop
        return loop

    def stop_workers(self) -> None:
        """The run is over: stop the loader workers its loops keep (logged
        when some do not stop)."""
        for kind in self.KINDS:
            loop = self.loops.get(kind)
            if not isinstance(loop, BaseLoop):
                continue
            alive = stop_loop_workers(loop)
            if alive:
                log(f'loader worker processes {alive} did not stop at the '
                    'end of the run', logging.WARNING)
