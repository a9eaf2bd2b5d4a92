"""MMEngine's train loops, continuing a resumed run exactly.

:class:`~mmsafe.engine.runner.SafeRunner` builds these in place of
MMEngine's ``EpochBasedTrainLoop`` and ``IterBasedTrainLoop`` (the same
arguments, the same behaviour in a run that does not resume). On a resume
from a checkpoint that :class:`~mmsafe.engine.hooks.PreemptionHook` wrote,
the runner holds a :class:`~mmsafe.engine.resume_state.ResumePlan`, and
the loop:

* **replays** the batches that were trained before the stop: loads them
  through the same loader (same sampler order, same worker processes,
  same per-worker random streams) and discards them. What a sample looks
  like after random augmentation depends on the random state of the process
  that loads it, which in turn depends on every sample that process loaded
  before; replaying the loading is what brings it back.
* then puts the random generators of the training process back to their
  state at the stop, and trains the remaining batches with the batch
  indices they had (the logger shows ``[k/N]`` as in the run that stopped).

**Going back** (:meth:`ResumableEpochBasedTrainLoop.rewind_to`, used by
:class:`~mmsafe.engine.hooks.DivergenceRollbackHook` after it restored an
earlier state): the loop's count of completed iterations is set back; the
batches keep coming from where the loader is, so the data that preceded
the rollback is not trained again in this pass, and the epoch count goes
on.

``IterBasedTrainLoop`` of MMEngine 0.8 and newer replays on a resume
already (from the first iteration: "Advance dataloader N steps");
:class:`ResumableIterBasedTrainLoop` adds the generators and the report at
the end of that replay, and on MMEngine 0.7, whose loop starts the loader
again from its first batch, draws those batches itself before the first
one it trains (:func:`mmsafe.compat.mmengine_features.\
iter_loop_skips_trained_batches`), so that a resumed run trains the
batches it had not trained on every release. Without a plan both loops
are MMEngine's.

**Guards that must act before the workers start**
(:func:`prepare_loop_loader`): ``IterBasedTrainLoop`` starts its loader's
worker processes in its constructor (its ``dataloader_iterator``), before
any ``before_train`` hook; a dataset that spawn-started workers cannot
receive ends the run there. :class:`ResumableIterBasedTrainLoop` lets
MMEngine build the loader (``BaseLoop``'s constructor), hands it to every
hook of the runner that defines ``prepare_loader(runner, name, loader)``
(:class:`~mmsafe.engine.hooks.DataLoaderProbeHook`), and builds MMEngine's
loop on the loader they return.

**Another loader for a loop** (:func:`replace_loop_loader`, used by
:class:`~mmsafe.engine.hooks.DataLoaderProbeHook`): MMEngine's loops read
their batches from the ``dataloader`` attribute (``EpochBasedTrainLoop``,
``ValLoop``, ``TestLoop``: ``for data_batch in self.dataloader``);
``IterBasedTrainLoop`` reads them from its
``dataloader_iterator`` attribute, an ``_InfiniteDataloaderIterator``
built on ``dataloader`` in its constructor. Both are plain attributes of
the loop; :func:`replace_loop_loader` sets them and changes no method.
"""
from typing import Any, Callable, Iterator, List, Optional

from mmsafe.registry import LOOPS
from mmengine.runner import BaseLoop, EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import DataLoader

from mmsafe.compat.mmengine_features import iter_loop_skips_trained_batches
from mmsafe.datasets.loader.processes import (shutdown_iterator,
                                              shutdown_loader)
from mmsafe.engine.run_context import run_context
from mmsafe.events import log


#: the hook method that acts on a loop's loader before its workers start
PREPARE_LOADER = 'prepare_loader'


def prepare_loop_loader(runner, name: str, loader: Any) -> Any:
    """The loader that loop ``name`` (``'train'``, ``'val'``, ``'test'``)
    is to read: ``loader`` passed through the ``prepare_loader(runner,
    name, loader)`` method of each of the runner's hooks that has one, in
    the hooks' order, before any of its worker processes exists."""
    for hook in getattr(runner, 'hooks', ()):
        prepare = getattr(hook, PREPARE_LOADER, None)
        if callable(prepare):
            loader = prepare(runner, name, loader)
    return loader


class _Rewindable:
    """The iteration count of a train loop, set back by a rollback."""

    #: the loop supports :meth:`rewind_to`
    rewindable = True

    def rewind_to(self, done: int) -> None:
        """Count ``done`` completed iterations once the iteration under way
        ends. Call it from ``after_train_iter``: MMEngine's ``run_iter``
        then adds the iteration under way, so the next iteration is
        iteration ``done`` (``runner.iter == done``). The epoch count and
        the loader's position are unchanged.

        Args:
            done (int): completed iterations after the current one ends,
                at most the current count.

        Raises:
            ValueError: ``done`` is negative or ahead of the loop.
        """
        done = int(done)
        if done < 0 or done > self._iter + 1:
            from mmsafe.errors import MMSafeValueError
            raise MMSafeValueError(
                f'rewind_to({done}): the loop is at iteration {self._iter}')
        self._iter = done - 1


def _pending_plan(runner) -> Optional[Any]:
    plan = run_context(runner).resume_plan
    return None if plan is None or plan.done else plan


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(_Rewindable, EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` that continues a resumed epoch after the
    batch where it stopped, and whose iteration count a rollback can set
    back (see the module docstring)."""

    continues_inside_epoch = True
    replays_from_epoch_start = True

    def run_epoch(self) -> None:
        plan = _pending_plan(self.runner)
        if plan is None:
            return super().run_epoch()
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        batches = enumerate(self.dataloader)
        replayed = 0
        for _ in range(plan.batches_in_epoch):
            if next(batches, None) is None:
                break
            replayed += 1
        plan.finish(self.runner, self.dataloader, replayed)
        for idx, data_batch in batches:
            self.run_iter(idx, data_batch)
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1


class _CountingIterator:
    """Hands out the loop's batches during MMEngine's resume replay and
    finishes the plan after the last replayed batch.

    Args:
        source (callable): returns the loop's current batch iterator (a
            loader fallback may replace it before the replay starts).
        plan: the pending :class:`~mmsafe.engine.resume_state.ResumePlan`.
        count (int): batches to replay.
        finish (callable): called as ``finish(plan, count)`` after the last
            replayed batch.
    """

    def __init__(self, source: Callable[[], Iterator], plan: Any,
                 count: int, finish: Callable[[Any, int], None]) -> None:
        self.source, self.plan, self.finish = source, plan, finish
        self.left = self.count = count

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.source())
        self.left -= 1
        if self.left <= 0:
            self.finish(self.plan, self.count)
        return batch


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(_Rewindable, IterBasedTrainLoop):
    """``IterBasedTrainLoop`` whose resume replay ends with the random
    generators of the stop (see the module docstring).

    MMEngine's ``run`` replays ``iter`` batches through
    ``dataloader_iterator`` before it trains; while a plan is pending that
    attribute hands out a counting view of the iterator, which puts the
    generators back after the last replayed batch. A plan still pending at
    the first trained iteration is reported as not exact.

    The loader passes the runner's ``prepare_loader`` hooks before the
    constructor starts its workers (see :func:`prepare_loop_loader`).
    Arguments are those of ``IterBasedTrainLoop``.
    """

    continues_inside_epoch = True
    replays_from_epoch_start = False  # MMEngine replays from iteration 0

    _replay: Optional[_CountingIterator] = None
    _advance: Optional['_AdvanceFirst'] = None

    def __init__(self, runner, dataloader, *args, **kwargs) -> None:
        # MMEngine's own build of the loader (a dict config: with the
        # run's seed), then the guards, then MMEngine's constructor, which
        # starts the workers of the loader they return
        BaseLoop.__init__(self, runner, dataloader)
        loader = prepare_loop_loader(runner, 'train', self.dataloader)
        super().__init__(runner, loader, *args, **kwargs)

    @property
    def dataloader_iterator(self):
        if self._advance is not None:
            return self._advance
        return self._replay if self._replay is not None else self._iterator

    @dataloader_iterator.setter
    def dataloader_iterator(self, iterator) -> None:
        # Set by MMEngine's constructor and by a loader fallback.
        self._iterator = iterator

    def run(self):
        plan = _pending_plan(self.runner)
        if plan is not None:
            plan.batches_in_epoch = self._iter
            if self._iter > 0:
                self._replay = _CountingIterator(lambda: self._iterator, plan,
                                                 self._iter,
                                                 self._end_replay)
            else:
                plan.finish(self.runner, self.dataloader, 0)
        if self._iter > 0 and not iter_loop_skips_trained_batches():
            self._advance = _AdvanceFirst(lambda: self.dataloader_iterator,
                                          self._iter, self._advanced)
        return super().run()

    def _advanced(self) -> None:
        self._advance = None

    def _end_replay(self, plan: Any, count: int) -> None:
        self._replay = None
        plan.finish(self.runner, self.dataloader, count)

    def run_iter(self, data_batch) -> None:
        plan = _pending_plan(self.runner)
        if plan is not None:
            self._replay = None
            plan.reasons.append('the loader was not replayed before '
                                'training went on')
            plan.finish(self.runner, self.dataloader, 0)
        super().run_iter(data_batch)


class _AdvanceFirst:
    """The first batch a resumed iteration loop draws, after the ``count``
    batches it trained before (MMEngine 0.7's loop does not skip them).

    Args:
        source (callable): returns the loop's batch iterator once this
            object is out of the way.
        count (int): batches trained before the resume.
        done (callable): takes this object out of the loop's way.
    """

    def __init__(self, source: Callable[[], Iterator], count: int,
                 done: Callable[[], None]) -> None:
        self.source, self.count, self.done = source, count, done

    def __iter__(self):
        return self

    def __next__(self):
        self.done()
        log(f'advancing the train loader {self.count} batches past the '
            'data trained before the resume')
        for _ in range(self.count):
            next(self.source())
        return next(self.source())


def replace_loop_loader(loop: Any, new_loader: DataLoader,
                        force: bool = False) -> List[int]:
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
        force (bool): kill the old workers before shutting them down (a
            loader whose workers failed: they may never answer the polite
            shutdown, which waits seconds for each). Defaults to False.

    Returns:
        list[int]: pids of old worker processes that could not be stopped.
    """
    alive = stop_loop_workers(loop, force=force)
    loop.dataloader = new_loader
    infinite = getattr(loop, 'dataloader_iterator', None)
    if infinite is not None:
        loop.dataloader_iterator = type(infinite)(new_loader)
    return alive


def stop_loop_workers(loop: Any, force: bool = False) -> List[int]:
    """Shut down the loader workers that ``loop`` keeps between batches:
    its loader's persistent iterator and, for ``IterBasedTrainLoop``, the
    iterator inside its ``dataloader_iterator`` (which starts the next
    round's workers before the last batch is used). The loader starts new
    workers on its next ``iter``.

    Returns:
        list[int]: pids of worker processes that could not be stopped.
    """
    alive = shutdown_loader(loop.dataloader, force=force)
    infinite = getattr(loop, 'dataloader_iterator', None)
    if infinite is not None:
        alive += shutdown_iterator(getattr(infinite, '_iterator', None),
                                   force=force)
    return alive
