"""FirstBatchStatsHook in a real Runner on a tiny LLVIP tree: silent and
informative on healthy pairs; flags a black (constant / all-zero) infrared,
visible loaded twice, and an RGB/BGR order against the preprocessor's
mean; sends the first pairs to the visualizer backends."""
import glob
import os.path as osp
import shutil
import uuid

import cv2
import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.runner import Runner

from mmdet.registry import MODELS
from mmsafe.events import read_events
from tests.tools.check_dataset_toys import (synthetic_demo_tree,
                                            write_llvip_tree)


@MODELS.register_module(force=True)
class FirstBatchToyPairDetector(BaseModel):
    """Smallest model that trains on paired inputs."""

    def __init__(self, data_preprocessor=None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.conv = nn.Conv2d(6, 1, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        x = torch.cat([inputs['visible'], inputs['infrared']], 1)
        out = self.conv(x).mean()
        if mode == 'loss':
            return dict(loss=out**2)
        return out


PIPELINE = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=(64, 48), keep_ratio=True),
    dict(type='PackPairedDetInputs')
]


def _run(tmp_path, data_root, preprocessor=None, hook=None, iters=2,
         pipeline=None):
    name = f'fbs_{uuid.uuid4().hex[:8]}'
    pre = dict(type='PairedDetDataPreprocessor', pad_size_divisor=32)
    pre.update(preprocessor or {})
    cfg = Config(dict(
        default_scope='mmsafe',
        experiment_name=name,
        env_cfg=dict(dist_cfg=dict(backend='nccl')),  # MMEngine 0.7
        work_dir=str(tmp_path / 'work'),
        model=dict(type='FirstBatchToyPairDetector', data_preprocessor=pre),
        train_dataloader=dict(
            batch_size=2,
            num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            dataset=dict(
                type='LLVIPDataset',
                data_root=data_root,
                data_prefix=dict(img='visible/train/', ann='Annotations/'),
                filter_cfg=None,
                pipeline=pipeline or PIPELINE)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.0)),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[dict(type='FirstBatchStatsHook', **(hook or {}))],
        visualizer=dict(type='DetLocalVisualizer', name=name,
                        vis_backends=[dict(type='LocalVisBackend')]),
        log_level='INFO'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    hook = [h for h in runner.hooks
            if type(h).__name__ == 'FirstBatchStatsHook'][0]
    return runner, hook


def _tree(tmp_path, num=4):
    root = str(tmp_path / 'llvip')
    write_llvip_tree(root, num=num, size=(64, 48))
    return root


def test_healthy_pairs_logged_silent_and_visualized(tmp_path, capsys):
    runner, hook = _run(tmp_path, _tree(tmp_path), hook=dict(num_batches=2))
    assert hook.flags == []
    assert len(hook.stats) == 2
    stats = hook.stats[0]
    vis, ir = stats['modalities']['visible'], stats['modalities']['infrared']
    # default preprocessor: ImageNet mean/std, bgr_to_rgb -> RGB model input
    assert vis['channel_order'] == 'rgb' and vis['swapped'] is True
    np.testing.assert_allclose(vis['fitted_mean'], [123.675, 116.28, 103.53],
                               atol=0.05)
    assert ir['channel_order'].startswith('grey')
    assert -3 < vis['min'] < vis['max'] < 3 and 0.3 < vis['std'] < 3
    assert stats['boxes_per_image'] == [1, 1]
    assert stats['img_shapes'] == [[48, 64], [48, 64]]
    out = capsys.readouterr().out
    assert 'FirstBatchStatsHook: batch 1' in out and 'boxes per image' in out
    events = read_events(runner.work_dir, 'first_batch_stats')
    assert [e['batch'] for e in events] == [1, 2]
    assert read_events(runner.work_dir, 'first_batch_flag') == []
    # the first batch's pairs reach the visualizer backend as images
    images = glob.glob(osp.join(runner.log_dir, 'vis_data', 'vis_image',
                                'first_batch_pair_*.png'))
    assert len(images) == 2, images
    img = cv2.imread(images[0])
    assert img.shape == (48, 2 * 64 + 4, 3)
    hub = runner.message_hub.get_info('mmsafe/first_batch_stats')
    assert hub['batches'] == 2 and hub['flags'] == 0


def test_black_infrared_and_all_zero_are_flagged(tmp_path):
    root = _tree(tmp_path, num=2)
    for path in glob.glob(osp.join(root, 'infrared/train/*.jpg')):
        cv2.imwrite(path, np.zeros((48, 64, 3), np.uint8))
    _, hook = _run(tmp_path, root, iters=1)
    kinds = {(f['kind'], f['modality']) for f in hook.flags}
    assert kinds == {('constant', 'infrared')}, hook.flags
    assert 'black' in hook.flags[0]['message']
    assert hook.flags[0]['file'].endswith('000001.jpg')
    # no normalisation for infrared: the black image stays all zeros
    _, hook = _run(tmp_path, root, iters=1, preprocessor=dict(
        infrared=dict(mean=None, std=None)))
    assert {f['kind'] for f in hook.flags} == {'all_zero'}, hook.flags


def test_visible_loaded_twice_is_flagged_and_can_raise(tmp_path):
    root = _tree(tmp_path, num=2)
    for path in glob.glob(osp.join(root, 'visible/train/*.jpg')):
        shutil.copy(path, osp.join(root, 'infrared', 'train',
                                   osp.basename(path)))
    _, hook = _run(tmp_path, root, iters=1)
    assert [f['kind'] for f in hook.flags] == ['identical', 'identical']
    with pytest.raises(RuntimeError, match='same image'):
        _run(tmp_path, root, iters=1, hook=dict(on_fault='raise'))


def test_bgr_input_with_rgb_mean_is_flagged(tmp_path):
    root = _tree(tmp_path, num=2)
    _, hook = _run(tmp_path, root, iters=1, preprocessor=dict(
        visible=dict(mean=[123.675, 116.28, 103.53],
                     std=[58.395, 57.12, 57.375], bgr_to_rgb=False)))
    flags = [f for f in hook.flags if f['modality'] == 'visible']
    assert [f['kind'] for f in flags] == ['channel_order'], hook.flags
    assert 'BGR' in flags[0]['message']
    # caffe-style: BGR mean with BGR input is consistent
    _, hook = _run(tmp_path, root, iters=1, preprocessor=dict(
        visible=dict(mean=[103.53, 116.28, 123.675], std=[1, 1, 1],
                     bgr_to_rgb=False)))
    assert hook.flags == []


# ---------------------------------------------------------------- alignment
DEMO_PIPELINE = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=(160, 128), keep_ratio=True),
    dict(type='PairedRandomFlip', prob=0.5),
    dict(type='PackPairedDetInputs')
]
PAIR_KINDS = {'pair_mirrored', 'pair_shifted', 'pair_unrelated'}


def test_healthy_demo_pairs_give_no_pairing_warning(tmp_path, capsys):
    root = synthetic_demo_tree(str(tmp_path / 'llvip'))
    runner, hook = _run(tmp_path, root, iters=8, pipeline=DEMO_PIPELINE)
    assert len(hook.alignments) == 16
    assert hook.flags == [], hook.flags
    out = capsys.readouterr().out
    assert 'pair_' not in out
    assert read_events(runner.work_dir, 'first_batch_flag') == []
    # the per-box offsets of the pairs with people: small, and logged
    summary = hook.object_offset_summary
    assert len(hook.object_offsets) == summary['pairs'] >= 8
    assert summary['confident'] > 0 and summary['median'] < 2.0
    assert summary['flagged_pairs'] == 0
    assert 'per-box visible/infrared offsets' in out


@pytest.mark.parametrize('fault,kind', [('mirrored', 'pair_mirrored'),
                                        ('permuted', 'pair_unrelated')])
def test_misaligned_partners_warn_naming_the_files(tmp_path, capsys, fault,
                                                   kind):
    root = synthetic_demo_tree(str(tmp_path / 'llvip'), fault)
    runner, hook = _run(tmp_path, root, iters=8, pipeline=DEMO_PIPELINE)
    flagged = [f for f in hook.flags if f['kind'] in PAIR_KINDS]
    assert {f['kind'] for f in flagged} >= {kind}, hook.flags
    assert len(flagged) >= 4
    out = capsys.readouterr().out
    first = [f for f in flagged if f['kind'] == kind][0]
    assert f'FirstBatchStatsHook: {kind}' in out
    assert first['file'] in out and first['ir_file'] in out
    assert first['ir_file'].endswith('.jpg') and 'infrared' in first['ir_file']
    events = read_events(runner.work_dir, 'first_batch_flag')
    assert kind in {e['flag'] for e in events}


def test_infrared_from_other_moments_warns_per_box(tmp_path, capsys):
    from tests.tools.offset_scenes import write_llvip_scene_tree
    root = write_llvip_scene_tree(str(tmp_path / 'scene'), (320, 256), 8,
                                  other_moment=True)
    pipeline = [dict(DEMO_PIPELINE[0]), dict(DEMO_PIPELINE[1]),
                dict(type='PairedResize', scale=(320, 256),
                     keep_ratio=True),
                dict(type='PairedRandomFlip', prob=0.5),
                dict(type='PackPairedDetInputs')]
    runner, hook = _run(tmp_path, root, iters=4, pipeline=pipeline,
                        hook=dict(alignment_pairs=8))
    flagged = [f for f in hook.flags if f['kind'] == 'pair_objects_offset']
    # the whole images line up (same background); the people do not
    assert not [f for f in hook.flags if f['kind'] in PAIR_KINDS], hook.flags
    assert len(flagged) >= 5, [o['median_d'] for o in hook.object_offsets]
    out = capsys.readouterr().out
    assert 'FirstBatchStatsHook: pair_objects_offset' in out
    assert flagged[0]['file'] in out and 'median |d|' in out
    assert hook.object_offset_summary['median'] > 12.0
    events = read_events(runner.work_dir, 'first_batch_flag')
    assert 'pair_objects_offset' in {e['flag'] for e in events}


# ------------------------------------------------------------ bit depth
def _thermal_pipeline(**load):
    return [dict(type='LoadPairedImageFromFile', **load)] + PIPELINE[1:]


def test_16bit_thermal_trains_with_its_full_depth(tmp_path):
    """Raw counts 51,300-52,150 kept by a rule reach the model with their
    range; without one the run stops naming the rules."""
    from tests.datasets.thermal16 import HIGH, LOW, write_thermal_tree
    root = str(tmp_path / 'llvip')
    write_thermal_tree(root, '.png')
    _, hook = _run(tmp_path, root, iters=1, pipeline=_thermal_pipeline(
        high_depth=dict(rule='fixed', low=LOW, high=HIGH)))
    assert hook.flags == [], hook.flags
    ir = hook.stats[0]['modalities']['infrared']
    # 0-255 after the rule, then ImageNet's normalisation: about 4.4 wide
    assert ir['max'] - ir['min'] > 4 and ir['std'] > 0.5, ir
    with pytest.raises(ValueError, match=r"16 bits per channel \(values "
                       r"51300-52150\).*high_depth"):
        _run(tmp_path, root, iters=1, pipeline=_thermal_pipeline())


def test_high_byte_infrared_is_nearly_constant_and_pairing_abstains(
        tmp_path, capsys):
    """A 16-bit frame cut to its high byte (3 grey levels): flagged
    nearly_constant, and no pairing verdict is drawn from it."""
    from tests.datasets.thermal16 import write_thermal_tree
    root = str(tmp_path / 'llvip')
    for path, counts in write_thermal_tree(root, '.png').items():
        cv2.imwrite(path, cv2.cvtColor((counts >> 8).astype(np.uint8),
                                       cv2.COLOR_GRAY2BGR))
    _, hook = _run(tmp_path, root, iters=1)
    assert [(f['kind'], f['modality'], f['sample']) for f in hook.flags] == \
        [('nearly_constant', 'infrared', 0), ('nearly_constant', 'infrared',
                                              1)], hook.flags
    assert 'raw values 200-203' in hook.flags[0]['message']
    assert 'high_depth' in hook.flags[0]['message']
    assert [a['modalities'] for a in hook.abstained_pairs] == [
        ['infrared'], ['infrared']]
    assert hook.alignments == [] and hook.object_offsets == []
    out = capsys.readouterr().out
    assert 'the pairing checks abstained on 2 of 2 pairs' in out
    assert out.index('nearly_constant') < out.index('abstained')
