"""Count, in the main process, the samples that
``ValidInstanceResampleDataset`` replaced in its DataLoader workers."""
import logging
from typing import Any, Optional

from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.datasets.valid_instance_resample import (RESAMPLE_TRIES,
                                                     RESAMPLED_FROM,
                                                     RESAMPLED_FROM_PATH)
from mmsafe.dist import get_world_size
from mmsafe.engine.guard_status import ACTIVE, INACTIVE
from mmsafe.engine.modalities import train_datasets
from mmsafe.engine.monitor_sync import monitor_sync_of
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event

RESAMPLED = 'valid_instance_resample/resampled'


@HOOKS.register_module()
class ValidInstanceResampleHook(Hook):
    """Count and log the samples replaced by
    :class:`~mmsafe.datasets.ValidInstanceResampleDataset`.

    The wrapper runs in DataLoader worker processes, which cannot reach the
    runner; it marks each replacement in the data sample's metainfo
    (``resampled_from``, ``resampled_from_path``, ``resample_tries``). This
    hook reads those marks from every training batch in the main process:

    * each replacement is logged (the first ``log_first`` ones in detail,
      with rank, iteration and the original and replacement files) and
      written to ``mmsafe_events.jsonl``;
    * the totals are published as message-hub counters
      ``mmsafe/valid_instance_resample`` (``resampled``, ``tries``), which
      ``SafetyReportHook`` reports;
    * the count of all ranks travels with mmsafe's other monitoring values
      (:class:`MonitorSync`, at the log interval) and is
      logged when it is not zero.

    Args:
        log_first (int): replacements logged one by one; later ones are only
            counted (and summed over ranks at the log interval). Defaults
            to 20.
    """

    guard_outputs = GuardOutputs(
        Section.OTHER,
        events=(Event.INSTANCE_RESAMPLE, ),
        counters=(CounterKey.VALID_INSTANCE_RESAMPLE, ))

    priority = 'NORMAL'

    def __init__(self, log_first: int = 20) -> None:
        self.log_first = int(log_first)
        self.resampled = 0
        self.tries = 0
        self.all_ranks = 0
        self._sync = None

    def before_run(self, runner) -> None:
        self._sync = monitor_sync_of(runner)
        self._sync.declare(RESAMPLED)

    def guard_status(self, runner) -> dict:
        """Active when the training data is wrapped in
        ``ValidInstanceResampleDataset`` (it counts its replacements)."""
        from mmsafe.datasets import ValidInstanceResampleDataset
        if any(isinstance(d, ValidInstanceResampleDataset)
               for d in train_datasets(runner)):
            return dict(status=ACTIVE, detail=f'{self.resampled} samples '
                        'replaced on this rank')
        return dict(status=INACTIVE, detail='the training data is not '
                    'wrapped in ValidInstanceResampleDataset: nothing to '
                    'count')

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        samples = data_batch.get('data_samples', []) if isinstance(
            data_batch, dict) else []
        found = []
        for sample in samples or []:
            meta = getattr(sample, 'metainfo', {}) or {}
            if RESAMPLED_FROM in meta:
                found.append(
                    dict(index=meta[RESAMPLED_FROM],
                         file=meta.get(RESAMPLED_FROM_PATH),
                         tries=meta.get(RESAMPLE_TRIES),
                         replacement=meta.get('img_path')))
        sync = self._sync
        sync.post(RESAMPLED, float(len(found)))
        it = runner.iter + 1
        for item in found:
            self.resampled += 1
            self.tries += int(item['tries'] or 0)
            write_event(runner.work_dir, Event.INSTANCE_RESAMPLE, iter=it,
                        **item)
            if self.resampled <= self.log_first:
                log(f'ValidInstanceResampleDataset replaced sample '
                    f'{item["index"]} ({item["file"]}: no valid instance '
                    f'after the pipeline) with {item["replacement"]} after '
                    f'{item["tries"]} tries (iter {it}, rank '
                    f'{runner.rank}; {self.resampled} so far)',
                    logging.WARNING)
                if self.resampled == self.log_first:
                    log('ValidInstanceResampleHook: further replacements '
                        'are counted, not logged one by one')
        total = int(sync.last(RESAMPLED)) if sync.sync(runner) else 0
        if total:
            self.all_ranks += total
            log(f'ValidInstanceResampleDataset: {total} samples without '
                'valid instances were replaced up to Iter(train) '
                f'{it} since the last report, on {get_world_size()} '
                f'rank(s) ({self.all_ranks} in all)', logging.WARNING)
        if found or total:
            update_counters(CounterKey.VALID_INSTANCE_RESAMPLE,
                            resampled=self.resampled, tries=self.tries,
                            all_ranks=self.all_ranks)
