"""A run that only evaluates (``tools/test.py``: ``runner.test()``;
``runner.val()``) with every guard on never builds the training loop, so
it needs no training data: MMEngine's ``runner.iter`` / ``runner.epoch``
would build the loop (and its dataset) just to read 0, and a machine with
the test split only would fail. tests/tools/test_train_cli.py runs
tools/test.py itself that way."""
import json
import os.path as osp

from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import BaseLoop

from tests.utils import REPO_ROOT

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')


def test_val_and_test_without_training_data(tmp_path):
    import mmsafe  # noqa: F401  (registers the demo's components)
    cfg = Config.fromfile(DEMO)
    for name in ('val', 'test'):
        dataset = cfg[f'{name}_dataloader'].dataset
        dataset.data_root = str(tmp_path / 'llvip') + '/'
        dataset.synthetic = dict(num_train=2, num_test=4, img_size=(96, 80),
                                 seed=0)
        dataset.indices = 4
    cfg.train_dataloader.dataset.data_root = str(tmp_path / 'absent') + '/'
    cfg.train_dataloader.dataset.synthetic = None
    # bands watch training: before its first iteration none is active
    cfg.custom_hooks = cfg.custom_hooks + [dict(
        type='ScalarBandsHook', bands=[
            dict(key='pascal_voc/mAP', min=2.0, action='warn'),
            dict(key='coco/bbox_mAP', min=2.0, action='stop')])]
    # MMEngine's own CheckpointHook with save_best reads runner.epoch after
    # a validation (it builds the training loop in runner.val() with or
    # without mmsafe); keeping the best checkpoint only means something in
    # training
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=1)
    cfg.work_dir = str(tmp_path / 'work')
    # MMEngine keys the run's default scope by the experiment name (the
    # config's file name and the second): a run of the same config in
    # the same second of this process would find another scope
    cfg.experiment_name = f'eval_only_{osp.basename(str(tmp_path))}'
    runner = RUNNERS.build(cfg)
    assert type(runner).__name__ == 'SafeRunner'
    val = runner.val()
    test = runner.test()
    assert 'pascal_voc/mAP' in val and 'pascal_voc/mAP' in test
    assert not isinstance(runner._train_loop, BaseLoop)  # never built
    with open(osp.join(cfg.work_dir, 'mmsafe_events.jsonl')) as f:
        events = [json.loads(line) for line in f]
    coverage = [e for e in events if e['kind'] == 'eval_coverage']
    assert {(e['stage'], e['metric'], e['scored'], e['iter'])
            for e in coverage} == {
        (stage, metric, 4, None) for stage in ('val', 'test')
        for metric in ('VOCMetric', 'CocoStyleMetric')}, coverage
    assert not [e for e in events if e['kind'] == 'band_violation']
    assert runner.message_hub.get_info('mmsafe/scalar_bands') == dict(
        violations=0, warnings=0)  # the hook checked the validation
