"""A stop signal loses nothing: every rank saves the same iteration, the
process exits with the preemption code, and ``--resume`` continues to the
weights of the run that was never interrupted.

The real demo detector (dual-stream Faster R-CNN + MACL, random flips)
trains on 32 synthetic pairs; a ``ProgressHook`` slows each iteration a
little and writes its count, and the test sends SIGTERM to the launcher
(``tools/train.py``, or ``tools/dist_train.sh`` for 2 gloo ranks) once a
randomly chosen iteration is reached. The interrupted-and-resumed run must
end with weights ``torch.equal`` to the uninterrupted run's, on every rank.
Three runs cover the axes between them (each run costs three trainings):
single process and DDP, epoch- and iteration-based loops, 2 loader workers
and 0 (after the loader probe fell back to 0 workers), a seed in the config
and none (like the recipes: the run draws one); the other tests use the
single-process epoch run with 0 workers.
"""
import os
import os.path as osp
import random
import signal
import sys

import pytest
import torch

from mmsafe.checkpoint import load_checkpoint_file
from mmsafe.engine.runner.stop import PREEMPTED_EXIT_CODE
from mmsafe.events import read_events
from tests.utils import (REPO_ROOT, TRAIN, free_port, run_and_signal,
                         run_once_per_session, run_train, write_config)

pytestmark = pytest.mark.slow

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
DIST_TRAIN = osp.join(REPO_ROOT, 'tools', 'dist_train.sh')
TIMEOUT = 300

CONFIG = """
_base_ = [{demo!r}]
custom_imports = dict(
    imports=['mmsafe', 'tests.engine.step_toys', 'tests.engine.preempt_toys'],
    allow_failed_imports=False)
work_dir = {work_dir!r}
synthetic = dict(num_train=32, num_test=4, img_size=(160, 128), seed=0,
                 max_people=3, empty_ratio=0.5, person_height=(30, 110))
train_dataloader = dict(
    batch_size=2, num_workers={workers}, persistent_workers=False,
    dataset=dict(data_root={data_root!r}, synthetic=synthetic))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={data_root!r}, synthetic=synthetic))
test_dataloader = val_dataloader
train_cfg = {train_cfg}
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False,
                        begin=0, end=8)]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=5),
    checkpoint=dict(type='CheckpointHook', interval={ckpt_interval},
                    by_epoch={by_epoch}))
custom_hooks = [
    dict(type='DataLoaderProbeHook', timeout=0.01) if {fallback} and
    h['type'] == 'DataLoaderProbeHook' else h for h in _base_.custom_hooks
] + [dict(type='StepDumpHook'), dict(type='ProgressHook', delay={delay}),
     dict(type='SlowCheckpointHook', wait={save_wait}, pad_mb={pad_mb})]
"""

EPOCHS = "dict(type='EpochBasedTrainLoop', max_epochs=2, val_interval=100)"
ITERS = ("dict(_delete_=True, type='IterBasedTrainLoop', max_iters={}, "
         "val_interval=1000)")
MODES = {
    # name: (nproc, workers, loop, iterations, probe fallback)
    'single_epoch': (1, 0, EPOCHS, 32, False),
    'single_iter_workers': (1, 2, ITERS.format(24), 24, False),
    'single_epoch_fallback': (1, 2, EPOCHS, 32, True),
    'ddp_epoch_workers': (2, 2, EPOCHS, 16, False),
}
#: The runs of the exact-resume test: each axis (processes, loop, workers)
#: takes both of its values among them.
EXACT_RESUME_MODES = ('single_epoch_fallback', 'single_iter_workers',
                      'ddp_epoch_workers')
#: Runs whose config sets no seed, as the recipes: each run draws its own,
#: and the resume must take the stopped run's seed before its loader
#: (sampler, worker seeds) is built. The loader's workers of the iteration
#: loop start with the loop.
DRAWN_SEED_MODES = ('single_iter_workers', )
DEMO_SEED = 0  # configs/llvip/demo_cpu.py's randomness.seed


def _config(root, name, mode, delay=0.0, save_wait=0.0, pad_mb=0,
            ckpt_interval=100, seed=DEMO_SEED):
    nproc, workers, loop, _, fallback = MODES[mode]
    by_epoch = 'Epoch' in loop
    work_dir = str(root / name)
    cfg = write_config(str(root / f'{name}.py'), CONFIG.format(
        demo=DEMO, work_dir=work_dir,
        data_root=str(root / 'data') + '/', workers=workers,
        train_cfg=loop, ckpt_interval=ckpt_interval, by_epoch=by_epoch,
        fallback=fallback, delay=delay, save_wait=save_wait, pad_mb=pad_mb))
    if seed != DEMO_SEED:
        with open(cfg, 'a') as f:
            f.write(f'randomness = dict(seed={seed!r})\n')
    return cfg, work_dir


def _launch(cfg, nproc, args=()):
    if nproc == 1:
        return [sys.executable, TRAIN, cfg, *args]
    return ['bash', DIST_TRAIN, cfg, str(nproc), *args]


def _dist_env(nproc):
    # tools/dist_train.sh runs the `python` of PATH: this test's
    return dict(PORT=str(free_port()), PATH=os.pathsep.join(
        [osp.dirname(sys.executable), os.environ.get('PATH', '')])) \
        if nproc > 1 else None


def _progress(work_dir, at):
    path = osp.join(work_dir, 'progress_rank0')

    def ready():
        try:
            with open(path) as f:
                return int(f.read() or 0) >= at
        except (OSError, ValueError):
            return False
    return ready


def _send(sig):
    return lambda proc: os.kill(proc.pid, sig)


def _dumps(work_dir, nproc):
    return [torch.load(osp.join(work_dir, f'step_dump_rank{r}.pt'),
                       weights_only=True) for r in range(nproc)]


def _assert_same_weights(got, want, nproc, what):
    for rank in range(nproc):
        a, b = got[rank]['state_dict'], want[rank]['state_dict']
        differ = [k for k in a if not torch.equal(a[k], b[k])]
        assert differ == [], (f'{what}, rank {rank}: {len(differ)} of '
                              f'{len(a)} tensors differ, e.g. {differ[:4]}')


def uninterrupted(mode, seed=DEMO_SEED):
    """The final dumps of the uninterrupted run of ``mode`` with ``seed``
    (one run per test session, shared by the tests that compare with
    it)."""
    def run(folder):
        import pathlib
        nproc = MODES[mode][0]
        cfg, work_dir = _config(pathlib.Path(folder), 'full', mode,
                                seed=seed)
        result = run_train(cfg, nproc=nproc, timeout=TIMEOUT)
        assert result.returncode == 0, result
        return _dumps(work_dir, nproc)
    return run_once_per_session(f'preemption_full_{mode}_seed{seed}', run)


def _interrupt(root, mode, at, **cfg_args):
    nproc = MODES[mode][0]
    cfg, work_dir = _config(root, 'run', mode, delay=0.25, **cfg_args)
    result = run_and_signal(
        _launch(cfg, nproc), TIMEOUT,
        [(_progress(work_dir, at), _send(signal.SIGTERM))],
        env=_dist_env(nproc))
    return cfg, work_dir, result


@pytest.mark.timeout(900)
@pytest.mark.parametrize('mode', EXACT_RESUME_MODES)
def test_sigterm_saves_one_iteration_and_resume_is_exact(
        tmp_path_factory, mode):
    nproc, workers, loop, iterations, fallback = MODES[mode]
    at = random.Random(mode).randint(2, iterations - 6)
    root = tmp_path_factory.mktemp(mode)
    drawn_seed = mode in DRAWN_SEED_MODES
    cfg, work_dir, stopped = _interrupt(
        root, mode, at, seed=None if drawn_seed else DEMO_SEED)
    where = f'{mode}: SIGTERM at iteration {at}'
    assert not stopped.timed_out, (where, stopped)
    assert stopped.returncode == PREEMPTED_EXIT_CODE, (where, stopped)

    # One checkpoint of one iteration, the same on every rank, named by
    # last_checkpoint and in the log and the report.
    events = read_events(work_dir, 'preempted')
    assert len(events) == 1, (where, events)
    done = events[0]['iter']
    assert at <= done < iterations, (where, events)
    path = osp.join(work_dir, f'preempted_iter_{done}.pth')
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert f.read().strip() == path
    ckpt = load_checkpoint_file(path, map_location='cpu')  # weights-only
    state = ckpt['meta']['mmsafe_resume']
    assert [s['rank'] for s in state['ranks']] == list(range(nproc))
    assert {s['iter'] for s in state['ranks']} == {done}, state['ranks']
    assert ckpt['meta']['iter'] == done
    seed = ckpt['meta']['seed']
    assert drawn_seed or seed == DEMO_SEED, (where, seed)
    assert 'SIGTERM' in state['signals']
    assert (f'preempted at ' in stopped.output
            and f'iteration {done}; checkpoint {path}' in stopped.output)
    assert f'exits with code {PREEMPTED_EXIT_CODE}' in stopped.output
    import json
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    assert report['status'] == 'preempted', report
    assert report['preemption']['checkpoint'] == path
    assert report['iter'] == done
    if fallback:
        assert read_events(work_dir, 'dataloader_fallback'), stopped

    resumed = run_train(cfg, nproc=nproc, timeout=TIMEOUT,
                        args=['--resume'], env=_dist_env(nproc))
    assert resumed.returncode == 0, (where, resumed)
    assert f'resumed from {path} at ' in resumed.output, resumed
    assert ': exact: the same remaining samples' in resumed.output, resumed
    if drawn_seed:
        assert f'the run takes its seed {seed}' in resumed.output, resumed
    if workers and not fallback:
        assert 'batches replayed' in resumed.output, resumed
    got = _dumps(work_dir, nproc)
    assert got[0]['last_iter'] == iterations
    # the run that was never stopped, with the seed the stopped run had
    _assert_same_weights(got, uninterrupted(mode, seed), nproc,
                         f'{where}, seed {seed}')


@pytest.mark.timeout(600)
def test_second_signal_while_saving_is_ignored_and_a_changed_config_is_named(
        tmp_path):
    cfg, work_dir = _config(tmp_path, 'run', 'single_epoch', delay=0.25,
                            save_wait=2.0)
    saving = osp.join(work_dir, 'saving')
    stopped = run_and_signal(_launch(cfg, 1), TIMEOUT, [
        (_progress(work_dir, 4), _send(signal.SIGTERM)),
        (lambda: osp.exists(saving), _send(signal.SIGTERM)),
        (lambda: True, _send(signal.SIGINT)),
    ])
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped
    assert 'received again on rank 0 while stopping: ignored' in \
        stopped.output, stopped
    done = read_events(work_dir, 'preempted')[0]['iter']
    path = osp.join(work_dir, f'preempted_iter_{done}.pth')
    from mmsafe.checkpoint import checkpoint_problem
    assert checkpoint_problem(path) is None

    # A resume whose config differs says so, instead of "exact".
    resumed = run_train(cfg, timeout=TIMEOUT, args=[
        '--resume', '--cfg-options', 'optim_wrapper.optimizer.lr=0.001'])
    assert resumed.returncode == 0, resumed
    assert 'NOT exact: config optim_wrapper.optimizer.lr: 0.002 -> 0.001' \
        in resumed.output, resumed
    event = read_events(work_dir, 'resume_continuation')[-1]
    assert event['exact'] is False and event['checkpoint'] == path, event


@pytest.mark.timeout(600)
def test_sigkill_while_saving_leaves_the_previous_checkpoint(tmp_path):
    # A regular checkpoint after epoch 1 (iteration 16), a stop in epoch 2
    # whose save is padded to take a while, SIGKILL while it is written.
    cfg, work_dir = _config(tmp_path, 'run', 'single_epoch', delay=0.25,
                            pad_mb=600, ckpt_interval=1)

    def writing():
        return any(name.startswith('.preempted_iter_')
                   for name in os.listdir(work_dir)) \
            if osp.isdir(work_dir) else False

    def kill(proc):
        os.killpg(proc.pid, signal.SIGKILL)

    killed = run_and_signal(_launch(cfg, 1), TIMEOUT, [
        (_progress(work_dir, 18), _send(signal.SIGTERM)),
        (writing, kill),
    ])
    assert killed.returncode == -signal.SIGKILL, killed
    names = os.listdir(work_dir)
    assert not [n for n in names if n.startswith('preempted_iter_')], names
    previous = osp.join(work_dir, 'epoch_1.pth')
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert f.read().strip() == previous
    from mmsafe.checkpoint import checkpoint_problem
    assert checkpoint_problem(previous) is None

    resumed = run_train(cfg, timeout=TIMEOUT, args=['--resume'])
    assert resumed.returncode == 0, resumed
    assert f'resumed from {previous} at iteration 16' in resumed.output
    assert 'NOT exact: the checkpoint holds no random state' in \
        resumed.output, resumed
    assert not [n for n in os.listdir(work_dir) if 'mmsafe-tmp' in n]
