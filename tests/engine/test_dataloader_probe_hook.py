"""DataLoaderProbeHook: real Runner runs with real DataLoader workers.

Fault injection: spawn-started workers that block forever (the main
process waits without a message), a pipeline transform that holds a
lambda; and a healthy loader that must be left alone. Every run carries a
marker in its environment so that the test can prove no process of it
survives.
"""
import json
import os
import os.path as osp
import re
import time
import uuid

import pytest
import torch

from mmsafe.events import read_events
from tests.utils import run_train, write_config

HARD_TIMEOUT = 420  # the machine is shared and slow; a hang still fails

CONFIG = """
default_scope = 'mmdet'
custom_imports = dict(
    imports=['mmsafe', 'tests.engine.probe_toys'], allow_failed_imports=False)
model = dict(type='ProbeToyModel')
train_dataloader = dict(
    batch_size=2, {loader}
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='{dataset}', length=8, {dataset_args}))
val_dataloader = dict(
    batch_size=2, {loader}
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='{dataset}', length=4, {dataset_args}))
val_evaluator = dict(type='ProbeToyMetric')
train_cfg = dict({train_cfg})
val_cfg = dict(type='ValLoop')
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=1),
    checkpoint=dict(type='CheckpointHook', interval=1000, save_last=False))
custom_hooks = [dict(type='DataLoaderProbeHook', {probe}),
                dict(type='RecordLoaderHook')]
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='nccl'))  # MMEngine 0.7 has no default
work_dir = '{work_dir}'
"""

EPOCHS = "type='EpochBasedTrainLoop', max_epochs=2, val_interval=1"


def _run(tmp_path, loader, dataset='ProbeToyDataset', dataset_args='',
         probe='', train_cfg=EPOCHS):
    work_dir = str(tmp_path / 'work')
    cfg = write_config(str(tmp_path / 'cfg.py'), CONFIG.format(
        loader=loader, dataset=dataset, dataset_args=dataset_args,
        probe=probe, train_cfg=train_cfg, work_dir=work_dir))
    mark = uuid.uuid4().hex
    start = time.monotonic()
    result = run_train(cfg, timeout=HARD_TIMEOUT,
                       env=dict(MMSAFE_TEST_MARK=mark))
    result.wall = time.monotonic() - start
    result.work_dir = work_dir
    result.mark = mark
    return result


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def _marked_processes(mark: str) -> list:
    """Live processes whose environment carries the run's marker."""
    found = []
    needle = f'MMSAFE_TEST_MARK={mark}'.encode()
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open(f'/proc/{pid}/environ', 'rb') as f:
                if needle not in f.read():
                    continue
        except OSError:
            continue
        if _running(int(pid)):
            found.append(int(pid))
    return found


def _assert_no_process_left(result) -> None:
    # The run's process group is gone; any worker would have outlived it.
    assert _marked_processes(result.mark) == []


def _record(result) -> dict:
    with open(osp.join(result.work_dir, 'loader_record.json')) as f:
        return json.load(f)


pytestmark = pytest.mark.skipif(not osp.isdir('/proc'),
                                reason='process checks read /proc')


def test_blocked_spawn_workers_fall_back_within_deadline(tmp_path):
    deadline = 15
    result = _run(
        tmp_path,
        loader="num_workers=2, persistent_workers=True, "
        "multiprocessing_context='spawn',",
        dataset_args='block_in_spawn_worker=True, paired=True,',
        probe=f"timeout={deadline}")
    assert result.returncode == 0, result
    assert not result.timed_out

    fallbacks = read_events(result.work_dir, 'dataloader_fallback')
    assert [e['loader'] for e in fallbacks] == ['train', 'val'], fallbacks
    for event in fallbacks:
        assert 'within the probe deadline' in event['cause']
        # Detected and recovered before that loader's first iteration.
        first = re.search(r'Epoch\((train|val)\)\s*\[1\]\[\s*1/',
                          result.output[result.output.index(
                              f'FALLING BACK to num_workers=0 for the '
                              f"{event['loader']} loader"):])
        assert first and first.group(1) == event['loader'], event
        assert event['leaked_workers'] == 0
    # One loud warning per loader, with the config line to change.
    assert result.output.count('FALLING BACK to num_workers=0') == 2
    assert 'train_dataloader = dict(num_workers=0, ' \
        'persistent_workers=False)' in result.output
    record = _record(result)
    assert len(record['train_iters']) == 8  # 2 epochs x 4 batches
    assert all(it['num_workers'] == 0 and it['workers'] == [-1, -1]
               for it in record['train_iters'] + record['val_iters'])
    assert 'count: 4.0' in result.output  # validation ran on all samples
    _assert_no_process_left(result)


def test_lambda_in_pipeline_is_named(tmp_path):
    result = _run(
        tmp_path,
        loader="num_workers=2, multiprocessing_context='spawn',",
        dataset_args="pipeline=[dict(type='ProbeToVector'), "
        "dict(type='ProbeScaleWithLambda', factor=2.0)],",
        probe='timeout=60')
    assert result.returncode == 0, result
    events = read_events(result.work_dir, 'dataloader_fallback')
    assert [e['loader'] for e in events] == ['train', 'val']
    for event in events:
        assert 'dataset.pipeline.transforms[1].fn' in event['cause'], event
        assert '<lambda>' in event['cause']
        # Found by pickling, before any worker was started.
        assert 'cannot be pickled' in event['cause'], event
    assert read_events(result.work_dir, 'dataloader_probe') == []
    assert 'dataset.pipeline.transforms[1].fn' in result.output
    _assert_no_process_left(result)


def test_lambda_in_an_iteration_loop_is_named_before_its_workers(tmp_path):
    """IterBasedTrainLoop starts its loader's workers when it is built,
    before any before_train hook: SafeRunner's loop probes the loader
    first, falls back to num_workers=0 and trains to its end."""
    result = _run(
        tmp_path,
        loader="num_workers=2, multiprocessing_context='spawn',",
        dataset_args="pipeline=[dict(type='ProbeToVector'), "
        "dict(type='ProbeScaleWithLambda', factor=2.0)],",
        probe='timeout=60',
        train_cfg="type='IterBasedTrainLoop', max_iters=4, val_interval=4")
    assert result.returncode == 0, result
    events = read_events(result.work_dir, 'dataloader_fallback')
    assert [e['loader'] for e in events] == ['train', 'val']
    for event in events:
        assert 'dataset.pipeline.transforms[1].fn' in event['cause'], event
        assert 'cannot be pickled' in event['cause']
        assert event['leaked_workers'] == 0
    record = _record(result)
    assert len(record['train_iters']) == 4
    assert all(it['num_workers'] == 0 and it['workers'] == [-1, -1]
               for it in record['train_iters'])
    # the loop was built on the fallen-back loader: the one it trains from
    assert {it['loader'] for it in record['train_iters']} == \
        {record['train_loader_before']}
    assert 'count: 4.0' in result.output
    assert 'Traceback' not in result.output
    _assert_no_process_left(result)


def test_under_a_plain_runner_the_probe_says_it_came_late(tmp_path,
                                                          capsys):
    """MMEngine's Runner builds MMEngine's IterBasedTrainLoop, which started
    its workers before before_train: the probe still runs, and says so."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    import tests.engine.probe_toys  # noqa: F401  registers the toys
    text = CONFIG.format(
        loader="num_workers=1, multiprocessing_context='fork',",
        dataset='ProbeToyDataset', dataset_args='',
        probe="loaders=('train', ), timeout=60",
        train_cfg="type='IterBasedTrainLoop', max_iters=2, val_interval=2",
        work_dir=str(tmp_path / 'work'))
    runner = Runner.from_cfg(Config.fromstring(text, '.py'))
    assert type(runner) is Runner
    runner.train()
    out = capsys.readouterr().out
    assert "the train loop (IterBasedTrainLoop) started its loader's " \
        'workers when it was built, before this probe' in out
    assert "runner_type='SafeRunner'" in out
    (event, ) = read_events(runner.work_dir, 'dataloader_probe')
    assert (event['loader'], event['result']) == ('train', 'pass')


def test_lambda_without_probe_fails_unnamed(tmp_path):
    """The failure the probe prevents: probe='off' crashes in the loop."""
    result = _run(
        tmp_path,
        loader="num_workers=1, multiprocessing_context='spawn',",
        dataset_args="pipeline=[dict(type='ProbeToVector'), "
        "dict(type='ProbeScaleWithLambda', factor=2.0)],",
        probe="probe='off'")
    assert result.returncode != 0 and not result.timed_out, result
    assert 'pickle' in result.output
    assert 'transforms[1]' not in result.output
    _assert_no_process_left(result)


def test_error_only_in_spawned_workers_falls_back(tmp_path):
    result = _run(
        tmp_path, loader="num_workers=2, multiprocessing_context='spawn',",
        dataset_args='raise_in_spawn_worker=True,',
        probe='timeout=120',
        train_cfg="type='EpochBasedTrainLoop', max_epochs=1")
    assert result.returncode == 0, result
    events = read_events(result.work_dir, 'dataloader_fallback')
    assert [e['loader'] for e in events] == ['train', 'val']
    for event in events:
        assert 'broken sample 0' in event['cause']
        assert 'loads without workers' in event['cause']
    _assert_no_process_left(result)


def test_data_bug_is_raised_not_hidden_by_fallback(tmp_path):
    result = _run(
        tmp_path, loader='num_workers=2,', dataset_args='raise_always=True,',
        probe='timeout=120')
    assert result.returncode != 0 and not result.timed_out, result
    assert "KeyError: 'ProbeToyDataset: broken sample 0'" in result.output
    assert 'FALLING BACK' not in result.output
    assert read_events(result.work_dir, 'dataloader_fallback') == []
    _assert_no_process_left(result)


@pytest.mark.parametrize('context', ['fork', 'spawn'])
def test_healthy_loader_is_kept(tmp_path, context):
    result = _run(
        tmp_path,
        loader=f"num_workers=2, persistent_workers=True, "
        f"multiprocessing_context='{context}',",
        dataset_args='paired=True,', probe='timeout=120')
    assert result.returncode == 0, result
    assert read_events(result.work_dir, 'dataloader_fallback') == []
    (train, val) = read_events(result.work_dir, 'dataloader_probe')
    assert (train['loader'], train['result']) == ('train', 'pass')
    assert (val['loader'], val['result']) == ('val', 'pass')
    assert train['leaked_workers'] == 0 and train['batch_bytes'] > 0
    record = _record(result)
    # No cost after the probe: the very same loader object, still fed by
    # its worker processes.
    loaders = {it['loader'] for it in record['train_iters']}
    assert loaders == {record['train_loader_before']}
    workers = {w for it in record['train_iters'] for w in it['workers']}
    assert workers == {0, 1}
    assert 'FALLING BACK' not in result.output
    _assert_no_process_left(result)


def test_memory_budget_caps_workers_iter_loop(tmp_path):
    """IterBasedTrainLoop keeps a loader iterator of its own; capping the
    workers must rebuild both consistently."""
    result = _run(
        tmp_path,
        loader="num_workers=3, prefetch_factor=2,",
        dataset='ProbeBigSampleDataset', dataset_args='sample_mb=1.0,',
        train_cfg="type='IterBasedTrainLoop', max_iters=6, val_interval=6",
        probe="loaders=('train', ), memory_budget_mb=9, cap_workers=True")
    assert result.returncode == 0, result
    (event, ) = read_events(result.work_dir, 'dataloader_memory')
    # 3 workers x prefetch 2 x 2 MiB = 12 MiB > 9 MiB: 2 workers fit.
    assert event['inflight_bytes'] >= 12 * 2**20
    assert event['workers_that_fit'] == 2
    assert 'Capped to 2 worker(s)' in result.output
    record = _record(result)
    assert len(record['train_iters']) == 6
    assert {it['num_workers'] for it in record['train_iters']} == {2}
    workers = {w for it in record['train_iters'] for w in it['workers']}
    assert workers == {0, 1}
    _assert_no_process_left(result)


def test_find_unpicklable_names_nested_path():
    from mmengine.registry import DefaultScope
    from torch.utils.data import DataLoader

    from mmsafe.datasets.loader.pickling import find_unpicklable
    from tests.engine.probe_toys import ProbeToyDataset

    with DefaultScope.overwrite_default_scope('mmsafe'):
        ds = ProbeToyDataset(pipeline=[
            dict(type='ProbeToVector'),
            dict(type='ProbeScaleWithLambda', factor=3.0)])
        assert find_unpicklable(ProbeToyDataset(), 'dataset') is None
    path, what, error = find_unpicklable(ds, 'dataset')
    assert path == 'dataset.pipeline.transforms[1].fn'
    assert what.startswith('<lambda>') and 'pickle' in error.lower()
    loader = DataLoader(ds, collate_fn=lambda batch: batch)
    assert find_unpicklable(loader.collate_fn, 'collate_fn')[0] == \
        'collate_fn'
    assert torch.is_tensor(ds[0]['inputs'])


def test_replace_loop_loader_keeps_the_loop_invariants():
    """The loop reads from the new loader (IterBasedTrainLoop: through a
    fresh iterator of MMEngine's type on it); the old workers are gone;
    no method of the loop is touched."""
    from types import SimpleNamespace

    from mmengine.runner.loops import _InfiniteDataloaderIterator
    from torch.utils.data import DataLoader

    from mmsafe.datasets.loader import rebuild_loader
    from mmsafe.engine.loops import replace_loop_loader

    old = DataLoader(list(range(6)), batch_size=2, num_workers=1,
                     persistent_workers=True,
                     multiprocessing_context='fork')
    loop = SimpleNamespace(dataloader=old)
    # as IterBasedTrainLoop.__init__ leaves it: workers already started
    loop.dataloader_iterator = _InfiniteDataloaderIterator(old)
    started = [w.pid for w in loop.dataloader_iterator._iterator._workers]
    attributes = set(vars(loop))
    new = rebuild_loader(old, num_workers=0)
    assert new.sampler is old.sampler and new.dataset is old.dataset
    assert new.collate_fn is old.collate_fn

    assert replace_loop_loader(loop, new) == []
    assert loop.dataloader is new
    assert type(loop.dataloader_iterator) is _InfiniteDataloaderIterator
    assert loop.dataloader_iterator._dataloader is new
    assert set(vars(loop)) == attributes
    assert [next(loop.dataloader_iterator).tolist() for _ in range(4)] == [
        [0, 1], [2, 3], [4, 5], [0, 1]]
    assert started and not any(_running(pid) for pid in started)


def test_probe_names_when_it_runs_the_old_policy_key_still_works():
    """``probe`` is when the probe runs; ``policy=`` (its former name) is
    accepted with a warning that names the new key; both given, or an
    unknown value, is refused."""
    from mmsafe.engine.hooks.dataloader_probe_hook import DataLoaderProbeHook
    from tests.utils import logged_messages

    with logged_messages() as messages:
        assert DataLoaderProbeHook(probe='always').probe == 'always'
        assert DataLoaderProbeHook().probe == 'auto'
    assert not messages
    with logged_messages() as messages:
        hook = DataLoaderProbeHook(policy='off')
    assert hook.probe == 'off' and not hasattr(hook, 'policy')
    assert len(messages) == 1
    assert "policy='off' is deprecated" in messages[0]
    assert "write probe='off'" in messages[0]
    with pytest.raises(ValueError, match='give probe only'):
        DataLoaderProbeHook(probe='always', policy='off')
    with pytest.raises(ValueError, match='probe must be one of'):
        DataLoaderProbeHook(probe='warn')
    with pytest.raises(ValueError, match='probe must be one of'):
        DataLoaderProbeHook(policy='raise')
