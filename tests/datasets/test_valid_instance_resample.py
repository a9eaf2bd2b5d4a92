"""ValidInstanceResampleDataset on a tiny LLVIP tree with empty images:
replacements are deterministic under (seed, index), marked, bounded, and
counted by ValidInstanceResampleHook in the main process while the data come
from real DataLoader worker processes."""
import uuid

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.runner import Runner

from mmdet.registry import DATASETS, MODELS
from mmsafe.events import read_events
from tests.tools.check_dataset_toys import write_llvip_tree

PIPELINE = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PairedResize', scale=(64, 48), keep_ratio=True),
    dict(type='PackPairedDetInputs')
]
EMPTY = {'000002': 'empty', '000005': 'empty'}


@MODELS.register_module(force=True)
class ResampleToyPairDetector(BaseModel):
    """Smallest model that trains on paired inputs."""

    def __init__(self, data_preprocessor=None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.conv = nn.Conv2d(6, 1, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.conv(torch.cat([inputs['visible'], inputs['infrared']],
                                  1)).mean()
        return dict(loss=out**2) if mode == 'loss' else out


def _inner(root, pipeline=PIPELINE, test_mode=False):
    return dict(type='LLVIPDataset', data_root=root,
                data_prefix=dict(img='visible/train/', ann='Annotations/'),
                filter_cfg=None, test_mode=test_mode, pipeline=pipeline)


@pytest.fixture(scope='module')
def tree(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('resample') / 'llvip')
    write_llvip_tree(root, num=6, size=(64, 48), faults=EMPTY)
    return root


def _wrapper(root, **kwargs):
    return DATASETS.build(dict(type='ValidInstanceResampleDataset',
                               dataset=_inner(root), **kwargs))


def test_empty_samples_are_replaced_deterministically(tree):
    ds = _wrapper(tree, seed=7)
    assert len(ds) == 6
    healthy = ds[0]
    assert 'resampled_from' not in healthy['data_samples'].metainfo
    first = ds[1]  # 000002 has no person
    meta = first['data_samples'].metainfo
    assert meta['resampled_from'] == 1
    assert meta['resampled_from_path'].endswith('000002.jpg')
    assert not meta['img_path'].endswith(('000002.jpg', '000005.jpg'))
    assert len(first['data_samples'].gt_instances) >= 1
    assert 1 <= meta['resample_tries'] <= 10
    # same (seed, index): same replacement, in a new wrapper as well
    again = _wrapper(tree, seed=7)[1]['data_samples'].metainfo
    assert again['img_path'] == meta['img_path']
    assert again['resample_tries'] == meta['resample_tries']
    # the candidate sequence depends on the seed
    paths = {_wrapper(tree, seed=s)[1]['data_samples'].img_path
             for s in range(8)}
    assert len(paths) > 1


def test_seed_defaults_to_the_run_seed(tree):
    torch.manual_seed(1234)
    assert _wrapper(tree).seed == 1234


def test_exhausted_tries_raise_a_clear_error(tmp_path):
    root = str(tmp_path / 'llvip')
    write_llvip_tree(root, num=3, faults={f'{i:06d}': 'empty'
                                          for i in range(1, 4)})
    ds = _wrapper(root, seed=0, max_tries=3)
    with pytest.raises(RuntimeError, match=r'all 3 resampled candidates'):
        ds[0]


def test_test_mode_passes_samples_through(tree):
    ds = DATASETS.build(dict(type='ValidInstanceResampleDataset',
                             dataset=_inner(tree, test_mode=True)))
    sample = ds[1]['data_samples']
    assert len(sample.gt_instances) == 0
    assert 'resampled_from' not in sample.metainfo


def test_runner_with_workers_counts_replacements(tree, tmp_path, capsys):
    name = f'resample_{uuid.uuid4().hex[:8]}'
    # FilterAnnotations(keep_empty=False) returns None for the empty
    # images: the wrapper handles None like an empty sample
    pipeline = PIPELINE[:2] + [
        dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1),
             keep_empty=False)
    ] + PIPELINE[2:]
    cfg = Config(dict(
        default_scope='mmsafe',
        experiment_name=name,
        env_cfg=dict(dist_cfg=dict(backend='nccl')),  # MMEngine 0.7
        work_dir=str(tmp_path / 'work'),
        randomness=dict(seed=11),
        model=dict(type='ResampleToyPairDetector',
                   data_preprocessor=dict(type='PairedDetDataPreprocessor')),
        train_dataloader=dict(
            batch_size=2,
            num_workers=2,
            persistent_workers=False,
            sampler=dict(type='DefaultSampler', shuffle=False),
            dataset=dict(type='ValidInstanceResampleDataset',
                         dataset=_inner(tree, pipeline))),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.0)),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=1),
                           checkpoint=dict(type='CheckpointHook',
                                           interval=100)),
        custom_hooks=[dict(type='ValidInstanceResampleHook', log_first=3)],
        log_level='INFO'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.train_dataloader.dataset.seed == 11  # the run's seed
    hook = [h for h in runner.hooks
            if type(h).__name__ == 'ValidInstanceResampleHook'][0]
    # 2 empty images x 2 epochs, counted in the main process
    assert hook.resampled == 4
    info = runner.message_hub.get_info('mmsafe/valid_instance_resample')
    assert info['resampled'] == 4 and info['all_ranks'] == 4
    events = read_events(runner.work_dir, 'instance_resample')
    assert sorted(e['index'] for e in events) == [1, 1, 4, 4]
    # deterministic: the same replacement for an index in both epochs,
    # and the one the wrapper gives in this process
    by_index = {}
    for e in events:
        by_index.setdefault(e['index'], set()).add(e['replacement'])
    assert all(len(v) == 1 for v in by_index.values()), by_index
    local = runner.train_dataloader.dataset[1]['data_samples']
    assert by_index[1] == {local.img_path}
    out = capsys.readouterr().out
    assert out.count('ValidInstanceResampleDataset replaced sample') == 3
    assert 'counted, not logged one by one' in out
    # Single process: the all-rank count is reported at every iteration.
    assert out.count('without valid instances were replaced up to ') == 4
    assert '(4 in all)' in out
