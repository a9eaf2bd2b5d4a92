"""KAIST, aligned FLIR and M3FD in their released layouts: the datasets
read what the benchmark ships, and each dataset config trains a few
iterations and evaluates through tools/train.py with every guard on."""
import glob
import json
import os.path as osp
import textwrap

import pytest

from tests.datasets.benchmark_trees import (FLIR_CLASSES, M3FD_CLASSES,
                                            build_flir, build_kaist,
                                            build_m3fd)
from tests.utils import REPO_ROOT, run_train, write_config

CONFIGS = osp.join(REPO_ROOT, 'configs')


def _build(cfg: dict):
    from mmdet.registry import DATASETS
    return DATASETS.build(cfg)


# ---------------------------------------------------------------- datasets
def test_kaist_reads_bbgt_text_and_marks_ignore_regions(tmp_path):
    root = str(tmp_path / 'kaist') + '/'
    lines = build_kaist(root, num_train=2, num_test=1)
    ds = _build(dict(type='KAISTDataset', data_root=root,
                     ann_file='imageSets/train-all-02.txt', min_height=15,
                     img_shape=None, pipeline=[]))
    assert len(ds) == 2
    info = ds.get_data_info(0)
    assert info['img_id'] == lines['train'][0]
    assert info['img_path'].endswith('set00/V000/visible/I00000.jpg')
    assert info['ir_img_path'].endswith('set00/V000/lwir/I00000.jpg')
    assert (info['height'], info['width']) == (80, 96)
    with open(osp.join(root, 'annotations/set00/V000/I00000.txt')) as f:
        rows = [r.split() for r in f.read().splitlines()[1:]]
    assert len(info['instances']) == len(rows)
    for row, inst in zip(rows, info['instances']):
        x, y, w, h = (float(v) for v in row[1:5])
        assert inst['bbox'] == [x, y, x + w, y + h]
        # people and the 10 px person are ignore regions, persons are not
        expected = 0 if row[0] == 'person' and h >= 15 else 1
        assert inst['ignore_flag'] == expected, (row, inst)


def test_kaist_missing_lwir_partner_is_named(tmp_path):
    import os
    root = str(tmp_path / 'kaist') + '/'
    build_kaist(root, num_train=2, num_test=1)
    gone = osp.join(root, 'images/set00/V000/lwir/I00002.jpg')
    os.remove(gone)
    with pytest.raises(FileNotFoundError, match='I00002.jpg'):
        _build(dict(type='KAISTDataset', data_root=root,
                    ann_file='imageSets/train-all-02.txt', pipeline=[]))
    ds = _build(dict(type='KAISTDataset', data_root=root,
                     ann_file='imageSets/train-all-02.txt',
                     on_missing_pair='skip', pipeline=[]))
    assert len(ds) == 1


def test_flir_aligned_pairs_rgb_with_preview_data(tmp_path):
    root = str(tmp_path / 'flir') + '/'
    ids = build_flir(root, num_train=2, num_test=2)
    for ann_file, split in (('align_train.txt', 'train'),
                            ('align_validation.txt', 'test')):
        ds = _build(dict(type='FLIRAlignedDataset', data_root=root,
                         ann_file=ann_file, pipeline=[]))
        assert [ds.get_data_info(i)['img_id'] for i in range(len(ds))] == \
            ids[split]
    info = ds.get_data_info(0)
    assert info['img_path'].endswith(f'JPEGImages/{ids["test"][0]}_RGB.jpg')
    assert info['ir_img_path'].endswith(
        f'JPEGImages/{ids["test"][0]}_PreviewData.jpeg')
    assert ds.metainfo['classes'] == FLIR_CLASSES
    # the 'dog' box of every xml is not a class: skipped
    labels = {i['bbox_label'] for i in info['instances']}
    assert labels <= {0, 1, 2} and info['instances']


def test_m3fd_reads_vis_ir_annotation(tmp_path):
    root = str(tmp_path / 'm3fd') + '/'
    stems = build_m3fd(root, num_train=2, num_test=1)
    ds = _build(dict(type='M3FDDataset', data_root=root,
                     ann_file='ImageSets/train.txt', pipeline=[]))
    assert ds.metainfo['classes'] == M3FD_CLASSES
    info = ds.get_data_info(1)
    assert info['img_path'].endswith(f'Vis/{stems["train"][1]}.png')
    assert info['ir_img_path'].endswith(f'Ir/{stems["train"][1]}.png')
    assert info['instances']


# ----------------------------------------------------- training, per config
PIPELINES = """
img_scale = (96, 80)
train_pipeline = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='PackPairedDetInputs')]
test_pipeline = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='PairedResize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackPairedDetInputs',
         # 'instances': the raw annotation KAISTMissRate reads
         meta_keys=('img_id', 'img_path', 'ir_img_path', 'ori_shape',
                    'img_shape', 'scale_factor', 'instances'))]
"""

BENCHMARKS = {
    'kaist': dict(
        build=build_kaist, base='kaist.py', num_classes=1,
        dataset_extra="img_shape=None, min_height=15,",
        extra="default_hooks = dict(checkpoint=dict(save_best='kaist/MR-2', "
        "rule='less'))\n",
        keys=('kaist/MR-2', 'kaist/MR-2_day', 'kaist/MR-2_all',
              'coco/bbox_mAP', 'coco/bbox_mAP_50')),
    'flir': dict(
        build=build_flir, base='flir_aligned.py', num_classes=3,
        dataset_extra='', extra='',
        keys=('pascal_voc/mAP', 'coco/bbox_mAP', 'coco/bbox_mAP_50')),
    'm3fd': dict(
        build=build_m3fd, base='m3fd.py', num_classes=6,
        dataset_extra='', extra='',
        keys=('pascal_voc/mAP', 'coco/bbox_mAP', 'coco/bbox_mAP_50')),
}


def benchmark_config(directory: str, name: str, data_root: str) -> str:
    """The benchmark's dataset config with the tiny CPU model, the LLVIP
    runtime and every mmsafe guard (configs/_base_/safety_runtime.py)."""
    spec = BENCHMARKS[name]
    bases = [
        osp.join(CONFIGS, '_base_/models/dual_faster_rcnn_r18w16_fpn_tiny.py'),
        osp.join(CONFIGS, '_base_/datasets', spec['base']),
        osp.join(CONFIGS, 'llvip/_base_/runtime_tensorboard.py'),
        osp.join(CONFIGS, '_base_/safety_runtime.py'),
    ]
    extra = spec['dataset_extra']
    text = f"""
_base_ = {bases!r}
custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)
data_root = {data_root!r}
{PIPELINES}
model = dict(roi_head=dict(bbox_head=dict(num_classes={spec['num_classes']})))
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    batch_sampler=None,
    dataset=dict(data_root=data_root, {extra} pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, {extra} pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='NaNSkipOptimWrapper',
    optimizer=dict(type='AdamW', lr=0.001, weight_decay=0.0001),
    clip_grad=dict(max_norm=10, norm_type=2))
default_hooks = dict(logger=dict(type='LoggerHook', interval=1))
randomness = dict(seed=0)
{spec['extra']}
"""
    return write_config(osp.join(directory, f'{name}_tiny.py'),
                        textwrap.dedent(text))


@pytest.mark.parametrize('name', sorted(BENCHMARKS))
def test_dataset_config_trains_and_evaluates_with_every_guard(tmp_path, name):
    spec = BENCHMARKS[name]
    data_root = str(tmp_path / name) + '/'
    spec['build'](data_root)
    config = benchmark_config(str(tmp_path), name, data_root)
    work_dir = str(tmp_path / 'work')
    result = run_train(config, timeout=600, args=['--work-dir', work_dir])
    assert result.returncode == 0, result
    # every guard of the safety runtime was on
    for hook in ('DataLoaderProbeHook', 'HangWatchdogHook',
                 'EmptyBatchSyncHook', 'LossDictLintHook', 'MACLCheckHook',
                 'EvalCoverageHook', 'SafetyReportHook'):
        assert hook in result.output, (hook, result)
    assert 'evaluated 4 samples' in result.output, result
    scalars = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    assert scalars, result
    with open(scalars[0]) as f:
        records = [json.loads(line) for line in f if line.strip()]
    keys = set().union(*records)
    assert 'loss_macl' in keys or 'train/loss_macl' in keys, keys
    for key in spec['keys']:
        assert key in keys or f'val/{key}' in keys, (key, keys)
    with open(osp.join(work_dir, 'safety_report.json')) as f:
        report = json.load(f)
    assert report, report


def _check_dataset_cli():
    from mmsafe.tools import check_dataset
    return check_dataset


@pytest.mark.parametrize('name', sorted(BENCHMARKS))
def test_check_dataset_audits_and_measures_each_benchmark(tmp_path, name,
                                                          capsys):
    """tools/check_dataset.py: the audit finds nothing wrong in a healthy
    tree of each layout, and --stats reads its pairs."""
    spec = BENCHMARKS[name]
    data_root = str(tmp_path / name) + '/'
    spec['build'](data_root)
    config = benchmark_config(str(tmp_path), name, data_root)
    cli = _check_dataset_cli()
    # the FLIR tree's 'dog' boxes are not a class: counted, a warning
    warnings = 1 if name == 'flir' else 0
    for split in ('train', 'val'):
        assert cli.main([config, '--split', split, '--workers', '0',
                         '--no-progress']) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
        assert f'check_dataset: OK (0 errors, {warnings} warnings)' in out
        if warnings:
            assert "[warning] unknown_class: 1\n" in out
            assert "objects named 'dog' dropped" in out
    assert cli.main([config, '--stats', '--workers', '0',
                     '--no-progress']) == 0
    out = capsys.readouterr().out
    assert '6 of 6 pairs' in out and 'infrared=dict(mean=[' in out, out


def test_kaist_refuses_a_geometric_transform_on_one_modality(tmp_path):
    root = str(tmp_path / 'kaist') + '/'
    build_kaist(root, num_train=2, num_test=1)
    with pytest.raises(ValueError, match='PairedRandomFlip'):
        _build(dict(type='KAISTDataset', data_root=root,
                    ann_file='imageSets/train-all-02.txt', img_shape=None,
                    pipeline=[dict(type='LoadPairedImageFromFile'),
                              dict(type='RandomFlip', prob=0.5)]))
