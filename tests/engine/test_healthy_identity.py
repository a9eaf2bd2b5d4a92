"""A healthy run is the run it would have been without mmsafe.

The real demo detector (dual-stream Faster R-CNN + MACL) trains from the
same seed twice: with every guard of ``configs/_base_/safety_runtime.py``,
mmsafe's optim wrapper and the LLVIP recipe's ``KeepFreedMemory`` step at
the end of the demo's pipelines ("on"), and with no mmsafe hook, MMEngine's
plain wrapper and the demo's pipelines as they are ("off"). The final
weights must be ``torch.equal``: single process and 2-rank gloo DDP, fp32
and CPU AMP, the loader probe on with and without DataLoader workers.
Half of the synthetic images hold no person, so
background-only batches occur (asserted), and they must train as MMEngine
trains them.

The guards-on runs judge gradient-norm spikes (``mmsafe_spike_skip``,
with a window of 8 steps so that half of the 16 steps are judged): none is
skipped, and the weights stay the same.

The guards-on runs also count, per iteration, the Python-level collectives
of the whole process and the host synchronisations of mmsafe's guard code
(``tests/engine/identity_toys.py``): a healthy step adds no collective
(monitoring values travel at the log interval, in one all-reduce) and at
most one host sync.
"""
import json
import os.path as osp

import pytest
import torch

from mmsafe.events import read_events
from tests.utils import REPO_ROOT, run_train, write_config

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
MAX_ITERS = 16
LOG_INTERVAL = 5
TIMEOUT = 420

CONFIG = """
_base_ = [{demo!r}]
custom_imports = dict(
    imports=['mmsafe', 'tests.engine.step_toys', 'tests.engine.identity_toys'],
    allow_failed_imports=False)
work_dir = {work_dir!r}
synthetic = dict(num_train=32, num_test=4, img_size=(160, 128), seed=0,
                 max_people=3, empty_ratio=0.5, person_height=(30, 110))
train_dataloader = dict(
    batch_size=2, num_workers={workers}, persistent_workers=False,
    dataset=dict(data_root={data_root!r}, synthetic=synthetic,
                 pipeline={train_pipeline}))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root={data_root!r}, synthetic=synthetic,
                 pipeline={test_pipeline}))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop',
                 max_iters={max_iters}, val_interval=100000)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False,
                        begin=0, end=8)]
optim_wrapper = dict({optim_wrapper})
default_hooks = dict(
    logger=dict(type='LoggerHook', interval={log_interval}),
    checkpoint=dict(type='CheckpointHook', interval=100000))
custom_hooks = {hooks}
# the fragment's spike rule, judged from the 9th step on in these short runs
mmsafe_spike_skip = dict(window=8, sigmas=6.0, min_ratio=20.0)
{runner}
"""

GUARDS_ON = "_base_.custom_hooks + [dict(type='StepDumpHook'), " \
    "dict(type='CallCountHook')]"
GUARDS_OFF = "[dict(type='StepDumpHook')]"
# On: the demo's pipelines with the LLVIP recipe's last step, KeepFreedMemory
# (the loading processes reuse the memory they free); off: without it.
PIPELINE_ON = "_base_.{} + [dict(type='KeepFreedMemory')]"
KEEP_FREED_LOG = 'KeepFreedMemory: each process that runs this pipeline'

MODES = {
    # name: (nproc, workers, optim wrapper on, optim wrapper off)
    'single_fp32': (1, 0, "type='NaNSkipOptimWrapper'",
                    "type='OptimWrapper'"),
    'single_fp32_workers': (1, 2, "type='NaNSkipOptimWrapper'",
                            "type='OptimWrapper'"),
    'ddp_fp32': (2, 0, "type='NaNSkipOptimWrapper'", "type='OptimWrapper'"),
    'single_cpu_amp': (1, 0, "type='AmpNaNSkipOptimWrapper'",
                       "type='ReferenceCpuAmpOptimWrapper'"),
}


def _run(tmp_path_factory, mode: str, guards: bool):
    nproc, workers, wrapper_on, wrapper_off = MODES[mode]
    root = tmp_path_factory.mktemp(f'{mode}_{"on" if guards else "off"}')
    data_root = str(tmp_path_factory.getbasetemp() / 'llvip_identity') + '/'
    work_dir = str(root / 'work')
    cfg = write_config(str(root / 'cfg.py'), CONFIG.format(
        demo=DEMO, work_dir=work_dir, data_root=data_root, workers=workers,
        max_iters=MAX_ITERS, log_interval=LOG_INTERVAL,
        optim_wrapper=wrapper_on if guards else wrapper_off,
        hooks=GUARDS_ON if guards else GUARDS_OFF,
        **{name: PIPELINE_ON.format(name) if guards else f'_base_.{name}'
           for name in ('train_pipeline', 'test_pipeline')},
        # Off in a single process: MMEngine's own Runner, i.e. the run
        # without mmsafe. DDP on CPU needs SafeRunner's gloo start-up.
        runner="runner_type = 'Runner'" if not guards and nproc == 1
        else ''))
    result = run_train(cfg, nproc=nproc, timeout=TIMEOUT)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    dumps = [torch.load(osp.join(work_dir, f'step_dump_rank{r}.pt'),
                        weights_only=True) for r in range(nproc)]
    return work_dir, result, dumps


@pytest.mark.parametrize('mode', sorted(MODES))
def test_guards_leave_a_healthy_run_bit_identical(tmp_path_factory, mode):
    on_dir, on, on_dumps = _run(tmp_path_factory, mode, guards=True)
    _, off, off_dumps = _run(tmp_path_factory, mode, guards=False)
    nproc = MODES[mode][0]

    # Background-only batches happened, and trained: no step was skipped,
    # the spike rule judging the last half of the steps.
    assert read_events(on_dir, 'empty_batch'), on
    assert on_dumps[0]['counters']['skipped'] == 0, on
    assert 'is skipped (mmsafe_spike_skip; judged once 8 steps were ' \
        'applied)' in on.output, on
    assert on_dumps[0]['last_iter'] == off_dumps[0]['last_iter'] == MAX_ITERS
    if MODES[mode][1]:
        assert 'DataLoaderProbeHook: the train loader passed' in on.output
    # the loading processes kept their freed memory in the on run only
    assert KEEP_FREED_LOG in on.output, on
    assert KEEP_FREED_LOG not in off.output, off

    for rank in range(nproc):
        on_state = on_dumps[rank]['state_dict']
        off_state = off_dumps[rank]['state_dict']
        assert on_state.keys() == off_state.keys()
        differ = [k for k in on_state
                  if not torch.equal(on_state[k], off_state[k])]
        assert differ == [], (f'rank {rank}: {len(differ)} of '
                              f'{len(on_state)} tensors differ, e.g. '
                              f'{differ[:5]}')
    if nproc > 1:
        # Parameters are identical on every rank (running statistics are
        # buffers, kept per rank: MMEngine's DDP does not broadcast them).
        for key in on_dumps[0]['param_names']:
            assert torch.equal(on_dumps[0]['state_dict'][key],
                               on_dumps[1]['state_dict'][key]), key

    # Communication and host syncs of the guards, per iteration.
    for rank in range(nproc):
        with open(osp.join(on_dir, f'call_counts_rank{rank}.json')) as f:
            counts = json.load(f)
        records = counts['records']
        assert [r['iter'] for r in records] == list(range(MAX_ITERS))
        for r in records:
            done = r['iter'] + 1
            sync_iter = done % LOG_INTERVAL == 0 or done == MAX_ITERS
            expected = 1 if (nproc > 1 and sync_iter) else 0
            assert r['collectives'] == expected, (rank, r, counts)
        # The first iterations carry one-time analyses (loss-dict lint,
        # first-batch statistics). Every later step adds one host sync (the
        # optim wrapper reads the gradient norm), plus, under DDP at the log
        # interval, the one read of the monitoring all-reduce.
        for r in records[3:]:
            expected = 1 + r['collectives']
            assert r['guard_syncs'] == expected, (rank, r, counts)
