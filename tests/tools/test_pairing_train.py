"""The pairing faults of the CPU demo, put in through the public config
interface and tools/train.py: a plain RandomFlip, and RandomFlip inside
ModalityTransform, stop the run before its first iteration with an error
that names the transform and the fix."""
import os.path as osp
import textwrap

import pytest

from tests.utils import REPO_ROOT, run_train, write_config

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
FLIP_IN_MODALITY = ("dict(type='ModalityTransform', modality='visible', "
                    "transform=dict(type='RandomFlip', prob=1.0))")


def small_demo(tmp_path, step: str) -> str:
    """The demo on a small synthetic tree, with ``step`` in place of its
    PairedRandomFlip."""
    return write_config(str(tmp_path / 'cfg.py'), textwrap.dedent(f"""
        _base_ = [{DEMO!r}]
        data_root = {str(tmp_path / 'llvip') + '/'!r}
        synthetic = dict(num_train=8, num_test=4, img_size=(160, 128),
                         seed=0)
        train_pipeline = [
            dict(type='LoadPairedImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True),
            dict(type='PairedResize', scale=(160, 128), keep_ratio=True),
            {step},
            dict(type='PackPairedDetInputs')
        ]
        train_dataloader = dict(dataset=dict(
            data_root=data_root, synthetic=synthetic,
            pipeline=train_pipeline))
        val_dataloader = dict(dataset=dict(
            data_root=data_root, synthetic=synthetic))
        test_dataloader = val_dataloader
        """))


@pytest.mark.parametrize('step,named', [
    ("dict(type='RandomFlip', prob=0.5)", 'pipeline[3] RandomFlip'),
    (FLIP_IN_MODALITY, "ModalityTransform(modality='visible') holds "
     'RandomFlip'),
], ids=['RandomFlip', 'ModalityTransform-RandomFlip'])
def test_demo_with_one_modality_flip_is_refused(tmp_path, step, named):
    result = run_train(small_demo(tmp_path, step), timeout=300,
                       args=['--work-dir', str(tmp_path / 'work')])
    assert not result.timed_out, result
    assert result.returncode != 0, result
    assert named in result.output, result
    assert 'PairedRandomFlip' in result.output, result
    assert 'Epoch(train)' not in result.output, result


def test_demo_with_paired_flip_trains(tmp_path):
    """Healthy control: the same config with the demo's PairedRandomFlip
    gets past the dataset and trains its first iterations."""
    cfg = small_demo(tmp_path, "dict(type='PairedRandomFlip', prob=0.5)")
    result = run_train(cfg, timeout=600, args=[
        '--work-dir', str(tmp_path / 'work'), '--cfg-options',
        'train_cfg.max_epochs=1', 'default_hooks.logger.interval=1'])
    assert not result.timed_out, result
    assert result.returncode == 0, result
    assert 'Epoch(train)' in result.output
    assert 'pair_mirrored' not in result.output
    assert 'pair_shifted' not in result.output
    assert 'pair_unrelated' not in result.output
