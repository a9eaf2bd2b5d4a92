"""tools/check_dataset.py --stats: per-modality, per-channel mean and std of
the images as loaded, equal to numpy's over the same files, printed as the
PairedDetDataPreprocessor lines."""
import glob
import json
import os.path as osp
import sys

import cv2
import numpy as np
import pytest

from tests.utils import REPO_ROOT, run_command, write_config

CHECK = osp.join(REPO_ROOT, 'tools', 'check_dataset.py')
DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')


@pytest.fixture(scope='module')
def tree(tmp_path_factory):
    """A tiny LLVIP tree whose images differ in size (64x48 and 80x64)."""
    from mmsafe.datasets.synthetic_llvip import ensure_synthetic_llvip
    tmp = tmp_path_factory.mktemp('stats')
    root = str(tmp / 'LLVIP')
    ensure_synthetic_llvip(root, num_train=7, num_test=2, img_size=(64, 48),
                           seed=3)
    # two pairs of another size: pixels, not images, are averaged
    for path in sorted(glob.glob(osp.join(root, 'visible', 'train',
                                          '*.jpg')))[:2]:
        for side in (path, path.replace('visible', 'infrared')):
            img = cv2.imread(side)
            cv2.imwrite(side, cv2.resize(img, (80, 64)))
    config = write_config(str(tmp / 'cfg.py'), f"""
        _base_ = [{DEMO!r}]
        train_dataloader = dict(dataset=dict(
            data_root={root + '/'!r}, synthetic=None, filter_cfg=None))
        """)
    return root, config


def numpy_stats(paths):
    pixels = np.concatenate(
        [cv2.imread(p).reshape(-1, 3).astype(np.float64) for p in paths])
    return pixels.mean(0), pixels.std(0)


def test_stats_match_numpy_over_the_same_files(tree, tmp_path):
    root, config = tree
    out = str(tmp_path / 'stats.json')
    result = run_command([sys.executable, CHECK, config, '--stats',
                          '--workers', '2', '--json', out], timeout=300)
    assert result.returncode == 0, result
    with open(out) as f:
        stats = json.load(f)
    visible = sorted(glob.glob(osp.join(root, 'visible', 'train', '*.jpg')))
    assert stats['pairs'] == len(visible) == 7
    for modality, paths in (
            ('visible', visible),
            ('infrared', [p.replace('visible', 'infrared')
                          for p in visible])):
        mean, std = numpy_stats(paths)
        np.testing.assert_allclose(stats[modality]['mean'], mean, rtol=1e-9)
        np.testing.assert_allclose(stats[modality]['std'], std, rtol=1e-9)
    # the printed config lines: RGB order, as bgr_to_rgb=True expects
    vis_mean, vis_std = numpy_stats(visible)
    rgb = ', '.join(f'{v:.3f}' for v in vis_mean[::-1])
    assert f'visible=dict(mean=[{rgb}]' in result.output, result
    assert 'bgr_to_rgb=True' in result.output
    assert 'PairedDetDataPreprocessor' in result.output
    assert 'infrared=dict(mean=[' in result.output


def test_stats_samples_use_evenly_spaced_pairs(tree, capsys):
    from mmengine.config import Config

    from mmsafe.tools_lib.dataset_stats import run_stats, sample_indices
    root, config = tree
    stats = run_stats(Config.fromfile(config), 'train', samples=3,
                      workers=0, progress=False)
    indices = sample_indices(7, 3)
    assert indices == [0, 3, 6]
    visible = sorted(glob.glob(osp.join(root, 'visible', 'train', '*.jpg')))
    mean, std = numpy_stats([visible[i] for i in indices])
    np.testing.assert_allclose(stats['visible']['mean'], mean, rtol=1e-9)
    np.testing.assert_allclose(stats['visible']['std'], std, rtol=1e-9)
    assert stats['pairs'] == 3 and stats['dataset_size'] == 7
    assert '3 of 7 pairs' in capsys.readouterr().out


def test_stats_follow_the_loaders_reduced_decode(tree, tmp_path, capsys):
    """With ``reduced_decode`` the images are counted as the loader decodes
    them: at 1/2 here (64x48 and 80x64 files for a 32x24 resize)."""
    from mmengine.config import Config

    from mmsafe.tools_lib.dataset_stats import run_stats
    root, _ = tree
    config = write_config(str(tmp_path / 'reduced.py'), f"""
        _base_ = [{DEMO!r}]
        train_dataloader = dict(dataset=dict(
            data_root={root + '/'!r}, synthetic=None, filter_cfg=None,
            pipeline=[
                dict(type='LoadPairedImageFromFile',
                     reduced_decode=dict(scale=(32, 24), keep_ratio=True)),
                dict(type='LoadAnnotations', with_bbox=True),
                dict(type='PairedResize', scale=(32, 24), keep_ratio=True),
                dict(type='PackPairedDetInputs')]))
        """)
    stats = run_stats(Config.fromfile(config), 'train', workers=0,
                      progress=False)
    visible = sorted(glob.glob(osp.join(root, 'visible', 'train', '*.jpg')))
    for modality, paths in (
            ('visible', visible),
            ('infrared', [p.replace('visible', 'infrared')
                          for p in visible])):
        pixels = np.concatenate([
            cv2.imread(p, cv2.IMREAD_REDUCED_COLOR_2).reshape(-1, 3)
            for p in paths]).astype(np.float64)
        # 5 files of 32x24 and 2 of 40x32 once decoded
        assert stats[modality]['pixels'] == len(pixels) == \
            5 * 32 * 24 + 2 * 40 * 32
        np.testing.assert_allclose(stats[modality]['mean'], pixels.mean(0),
                                   rtol=1e-9)
        np.testing.assert_allclose(stats[modality]['std'], pixels.std(0),
                                   rtol=1e-9)
    assert ("JPEGs decoded reduced, as the loader's reduced_decode (scale "
            "(32, 24)) decodes them" in capsys.readouterr().out)


def test_stats_report_16bit_depth_and_range(tmp_path, capsys):
    """16-bit thermal PNGs: their depth and raw range; without a
    ``high_depth`` rule the loader refuses them and the line to keep them
    is printed; with one, the statistics are of the mapped values."""
    from mmengine.config import Config

    from mmsafe.tools_lib.dataset_stats import run_stats
    from tests.datasets.thermal16 import HIGH, LOW, write_thermal_tree
    root = str(tmp_path / 'llvip')
    counts = [c for _, c in sorted(write_thermal_tree(root, '.png').items())]
    text = """
        default_scope = 'mmdet'
        custom_imports = dict(imports=['mmsafe'], allow_failed_imports=False)
        train_dataloader = dict(
            batch_size=1, num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            dataset=dict(type='mmsafe.LLVIPDataset', data_root={root!r},
                         data_prefix=dict(img='visible/train/'),
                         filter_cfg=None, pipeline=[
                             dict(type='LoadPairedImageFromFile'{rule}),
                             dict(type='PackPairedDetInputs')]))
        """
    config = write_config(str(tmp_path / 'raw.py'),
                          text.format(root=root + '/', rule=''))
    stats = run_stats(Config.fromfile(config), 'train', workers=0,
                      progress=False)
    out = capsys.readouterr().out
    ir, vis = stats['infrared'], stats['visible']
    assert (ir['bits'], ir['range'], ir['refused']) == ([16], [LOW, HIGH], 2)
    assert (vis['bits'], vis['refused']) == ([8], 0)
    raw = np.concatenate([c.reshape(-1) for c in counts]).astype(np.float64)
    np.testing.assert_allclose(ir['mean'], [raw.mean()] * 3, rtol=1e-9)
    np.testing.assert_allclose(ir['std'], [raw.std()] * 3, rtol=1e-9)
    assert f'infrared (BGR as loaded, {raw.size} px, 16-bit files, values ' \
        f'{LOW}-{HIGH})' in out
    assert '2 files have more than 8 bits per channel and the loader ' \
        "refuses them" in out
    assert "high_depth=dict(rule='fixed', low=51300, high=52150)" in out
    # kept by that rule: statistics of the values the model receives
    config = write_config(str(tmp_path / 'fixed.py'), text.format(
        root=root + '/', rule=f", high_depth=dict(rule='fixed', low={LOW}, "
        f'high={HIGH})'))
    stats = run_stats(Config.fromfile(config), 'train', workers=0,
                      progress=False)
    mapped = (raw - LOW) * 255 / (HIGH - LOW)
    assert stats['infrared']['refused'] == 0
    np.testing.assert_allclose(stats['infrared']['mean'], [mapped.mean()] * 3,
                               rtol=1e-5)
    np.testing.assert_allclose(stats['infrared']['std'], [mapped.std()] * 3,
                               rtol=1e-4)
