"""replace_loop_loader(force=True): the workers of a loader that failed the
probe are killed before the DataLoader's polite shutdown, instead of that
shutdown waiting on workers that never answer."""
import signal
import threading
from types import SimpleNamespace

import pytest
from mmengine.runner.loops import _InfiniteDataloaderIterator
from torch.utils.data import DataLoader, Dataset, get_worker_info

from mmsafe.engine.loops import replace_loop_loader


class _BlockingInWorkers(Dataset):
    """Loads in the main process; a worker ignores SIGTERM and blocks
    forever (a loader that froze)."""

    def __len__(self):
        return 8

    def __getitem__(self, idx):
        if get_worker_info() is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            threading.Event().wait()
        return idx


@pytest.mark.slow
def test_forced_replacement_kills_the_workers_before_shutting_down():
    loader = DataLoader(_BlockingInWorkers(), batch_size=2, num_workers=2,
                        multiprocessing_context='fork',
                        persistent_workers=True)
    # IterBasedTrainLoop's constructor starts the loader's workers
    loop = SimpleNamespace(dataloader=loader,
                           dataloader_iterator=_InfiniteDataloaderIterator(
                               loader))
    it = loop.dataloader_iterator._iterator
    workers = list(it._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    alive_at_shutdown = []
    polite = it._shutdown_workers

    def shutdown_spy():
        alive_at_shutdown.append([w.is_alive() for w in workers])
        polite()

    it._shutdown_workers = shutdown_spy
    new_loader = DataLoader(list(range(8)), batch_size=2)
    assert replace_loop_loader(loop, new_loader, force=True) == []
    # (a persistent loader's iterator is also the loop's: asked twice)
    assert alive_at_shutdown and all(
        alive == [False, False] for alive in alive_at_shutdown)
    assert not any(w.is_alive() for w in workers)
    assert loop.dataloader is new_loader
    assert next(loop.dataloader_iterator).tolist() == [0, 1]
