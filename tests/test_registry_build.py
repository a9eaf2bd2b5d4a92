"""Every type name mmsafe registers builds from a config, by the rule of
:mod:`mmsafe.registry`: mmsafe's machinery (runner, loops, hooks, optim
wrappers) by its plain name under ``default_scope='mmdet'``; the detection
stack (datasets, transforms, models, metrics) as ``mmsafe.<Name>`` there,
its own parts by plain names, and by its plain name under
``default_scope='mmsafe'``. A newly registered name without an example
here fails the completeness test, so the table stays complete."""
import os.path as osp

import pytest
import torch

from tests.utils import REPO_ROOT

TINY_MODEL = osp.join(REPO_ROOT, 'configs', '_base_', 'models',
                      'dual_faster_rcnn_r18w16_fpn_tiny.py')


def _llvip(root, **extra):
    cfg = dict(type='LLVIPDataset', data_root=root,
               synthetic=dict(num_train=4, num_test=2, img_size=(160, 128)),
               data_prefix=dict(img='visible/train/'), pipeline=[])
    cfg.update(extra)
    return cfg


def _benchmark(kind, root, **cfg):
    """A dataset config on a tiny tree in the benchmark's own layout."""
    from tests.datasets import benchmark_trees
    getattr(benchmark_trees, f'build_{kind}')(root, 2, 1)
    return dict(data_root=root + '/', pipeline=[], **cfg)


def _tiny_model():
    from mmengine.config import Config
    return Config.fromfile(TINY_MODEL).model  # ConfigDict: attribute access


EXAMPLES = {
    'dataset': {
        'LLVIPDataset': lambda root: _llvip(root),
        'PairedModalityDataset': lambda root: dict(
            type='PairedModalityDataset',
            dataset=_llvip(root, return_modality_pair=False),
            partner=dict(find='/visible/', replace='/infrared/')),
        'ValidInstanceResampleDataset': lambda root: dict(
            type='ValidInstanceResampleDataset', dataset=_llvip(root)),
        'KAISTDataset': lambda root: _benchmark(
            'kaist', root, type='KAISTDataset', img_shape=None,
            ann_file='imageSets/train-all-02.txt'),
        'FLIRAlignedDataset': lambda root: _benchmark(
            'flir', root, type='FLIRAlignedDataset',
            ann_file='align_train.txt'),
        'M3FDDataset': lambda root: _benchmark(
            'm3fd', root, type='M3FDDataset', ann_file='ImageSets/train.txt'),
    },
    'metric': {
        'CocoStyleMetric': dict(type='CocoStyleMetric'),
        'LogAverageMissRate': dict(type='LogAverageMissRate'),
        'KAISTMissRate': dict(type='KAISTMissRate'),
    },
    'hook': {
        'DataLoaderProbeHook': dict(type='DataLoaderProbeHook'),
        'DivergenceRollbackHook': dict(type='DivergenceRollbackHook'),
        'EmptyBatchSyncHook': dict(type='EmptyBatchSyncHook'),
        'SkipAwareParamSchedulerHook': dict(
            type='SkipAwareParamSchedulerHook'),
        'EvalCoverageHook': dict(type='EvalCoverageHook'),
        'FirstBatchStatsHook': dict(type='FirstBatchStatsHook'),
        'HangWatchdogHook': dict(type='HangWatchdogHook'),
        'LossDictLintHook': dict(type='LossDictLintHook'),
        'MACLCheckHook': dict(type='MACLCheckHook'),
        'RankFaultHook': dict(type='RankFaultHook', policy='raise'),
        'PreemptionHook': dict(type='PreemptionHook', signals=['SIGUSR1'],
                               exit_code=3),
        'SafetyReportHook': dict(type='SafetyReportHook'),
        'ScalarBandsHook': dict(
            type='ScalarBandsHook',
            bands=[dict(key='loss*', finite=True, action='warn')]),
        'ValidInstanceResampleHook': dict(type='ValidInstanceResampleHook'),
    },
    'model': {
        'AddFusion': dict(type='AddFusion'),
        'ConcatConvFusion': dict(type='ConcatConvFusion', in_channels=8),
        'WeightedAddFusion': dict(type='WeightedAddFusion'),
        'MACLHead': dict(type='MACLHead'),
        'PairedDetDataPreprocessor': dict(type='PairedDetDataPreprocessor'),
        'DualStreamFasterRCNN': lambda root: _tiny_model(),
    },
    'runner': {
        'SafeRunner': lambda root: dict(
            runner_type='SafeRunner', model=_tiny_model(),
            work_dir=osp.join(root, 'work'), default_scope='mmdet',
            experiment_name='registry_build_safe_runner'),
    },
    # Built by SafeRunner from MMEngine's loop names (and from their own).
    'loop': {
        'ResumableEpochBasedTrainLoop': dict(type='EpochBasedTrainLoop',
                                             max_epochs=1),
        'ResumableIterBasedTrainLoop': dict(type='IterBasedTrainLoop',
                                            max_iters=2),
    },
    'optim_wrapper': {
        'NaNSkipOptimWrapper': dict(type='NaNSkipOptimWrapper'),
        'AmpNaNSkipOptimWrapper': dict(type='AmpNaNSkipOptimWrapper'),
    },
    'transform': {
        'LoadImageFromFileReduced': dict(
            type='LoadImageFromFileReduced',
            reduced_decode=dict(scale=(96, 64))),
        'DecodeAwareResize': dict(type='DecodeAwareResize', scale=(96, 64)),
        'KeepFreedMemory': dict(type='KeepFreedMemory'),
        'LoadPairedImageFromFile': dict(type='LoadPairedImageFromFile'),
        'ModalityTransform': dict(
            type='ModalityTransform', modality='infrared',
            transform=dict(type='PhotoMetricDistortion')),
        'PackPairedDetInputs': dict(type='PackPairedDetInputs'),
        'PairedFixShapeResize': dict(type='PairedFixShapeResize', width=64,
                                     height=48),
        'PairedGeometric': dict(type='PairedGeometric',
                                transform=dict(type='RandomShift', prob=1.)),
        'PairedPad': dict(type='PairedPad', size_divisor=32),
        'PairedRandomChoiceResize': dict(type='PairedRandomChoiceResize',
                                         scales=[(64, 48), (96, 64)]),
        'PairedRandomCrop': dict(type='PairedRandomCrop', crop_size=(32, 32)),
        'PairedRandomFlip': dict(type='PairedRandomFlip', prob=0.5),
        'PairedRandomResize': dict(type='PairedRandomResize', scale=(96, 64),
                                   ratio_range=(0.8, 1.2)),
        'PairedResize': dict(type='PairedResize', scale=(96, 64)),
    },
}


def _registered():
    import mmsafe  # noqa: F401
    from mmsafe.registry_help import mmsafe_registered_names
    return mmsafe_registered_names()


def test_every_registered_name_has_a_build_example():
    registered = _registered()
    assert set(registered) == set(EXAMPLES)
    for group, names in registered.items():
        assert set(names) == set(EXAMPLES[group]), group


CASES = [(group, name) for group in EXAMPLES for name in EXAMPLES[group]]


STACK_GROUPS = ('dataset', 'transform', 'model', 'metric')


def test_the_machinery_answers_in_the_mmdet_scope_and_the_stack_does_not():
    registered = _registered()
    from mmdet import registry as mmdet_registry
    from mmengine.registry import RUNNERS
    targets = {'runner': RUNNERS, 'loop': mmdet_registry.LOOPS,
               'hook': mmdet_registry.HOOKS,
               'optim_wrapper': mmdet_registry.OPTIM_WRAPPERS,
               'dataset': mmdet_registry.DATASETS,
               'transform': mmdet_registry.TRANSFORMS,
               'model': mmdet_registry.MODELS,
               'metric': mmdet_registry.METRICS}
    for group, names in registered.items():
        for name in names:
            there = targets[group].module_dict.get(name)
            if group in STACK_GROUPS:
                # only a project's own class may hold the name there
                assert there is None or not there.__module__.startswith(
                    'mmsafe'), (group, name)
            else:
                assert there is not None and there.__module__.startswith(
                    'mmsafe'), (group, name)


@pytest.mark.parametrize('scope', ['mmdet', 'mmsafe'])
@pytest.mark.parametrize('group,name', CASES)
def test_builds_from_config(group, name, scope, tmp_path):
    import mmsafe  # noqa: F401
    from mmdet import registry
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope

    example = EXAMPLES[group][name]
    cfg = example(str(tmp_path / 'llvip')) if callable(example) else dict(
        example)
    if group in STACK_GROUPS and scope == 'mmdet':
        # the outer name with the scope prefix; its parts by plain names
        cfg['type'] = f'mmsafe.{cfg["type"]}'
    model = _tiny_model()
    if scope == 'mmdet':
        model['type'] = f'mmsafe.{model["type"]}'
    if group == 'runner':
        from mmengine.config import Config
        from mmengine.registry import RUNNERS

        from mmsafe.engine.run_context import run_context
        obj = RUNNERS.build(Config(dict(
            cfg, model=model, default_scope=scope,
            experiment_name=f'{cfg["experiment_name"]}_{scope}')))
        assert type(obj).__name__ == name
        assert run_context(obj).monitor_sync is not None
        return
    if group == 'loop':
        from mmengine.config import Config
        from mmengine.registry import RUNNERS
        dataset = _llvip(str(tmp_path / 'llvip'))
        if scope == 'mmdet':
            dataset['type'] = 'mmsafe.LLVIPDataset'
        runner = RUNNERS.build(Config(dict(
            runner_type='SafeRunner', model=model,
            work_dir=osp.join(str(tmp_path), 'work'), default_scope=scope,
            experiment_name=f'registry_build_{name}_{scope}',
            train_dataloader=dict(
                batch_size=1, num_workers=0,
                sampler=dict(type='DefaultSampler', shuffle=False),
                dataset=dataset),
            train_cfg=cfg,
            optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)))))
        assert type(runner.train_loop).__name__ == name
        return
    with DefaultScope.overwrite_default_scope(scope):
        if group == 'optim_wrapper':
            model = torch.nn.Linear(2, 2)
            cfg['optimizer'] = dict(type='SGD', lr=0.01)
            obj = build_optim_wrapper(model, cfg)
        else:
            reg = {'dataset': registry.DATASETS, 'hook': registry.HOOKS,
                   'metric': registry.METRICS, 'model': registry.MODELS,
                   'transform': registry.TRANSFORMS}[group]
            obj = reg.build(cfg)
    assert type(obj).__name__ == name
    if group == 'dataset':
        assert len(obj) > 0
        info = obj.get_data_info(0)
        assert osp.exists(info['img_path'])
        assert osp.exists(info['ir_img_path'])
