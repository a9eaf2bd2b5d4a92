"""LoadPairedImageFromFile: both images, clear errors naming the pair."""
import os.path as osp

import cv2
import numpy as np
import pytest

import mmsafe  # noqa: F401  (registers)
from mmdet.registry import TRANSFORMS
from .tree import infrared_image, visible_image, write_img


@pytest.fixture
def pair(tmp_path):
    vis = str(tmp_path / 'visible' / 'a.png')
    ir = str(tmp_path / 'infrared' / 'a.png')
    write_img(vis, visible_image(40, 30))
    write_img(ir, infrared_image(40, 30))
    return vis, ir


def load(results, **kwargs):
    return TRANSFORMS.build(dict(type='LoadPairedImageFromFile',
                                 **kwargs))(dict(results))


def test_loads_both_modalities(pair):
    vis, ir = pair
    out = load(dict(img_path=vis, ir_img_path=ir))
    assert np.array_equal(out['img'], visible_image(40, 30))
    assert np.array_equal(out['ir_img'], infrared_image(40, 30))
    assert out['img_shape'] == out['ori_shape'] == (30, 40)


def test_missing_partner_names_both_paths(pair):
    vis, _ = pair
    ghost = osp.join(osp.dirname(vis), '..', 'infrared', 'missing.png')
    with pytest.raises(OSError) as err:
        load(dict(img_path=vis, ir_img_path=ghost))
    msg = str(err.value)
    assert 'infrared' in msg and vis in msg and ghost in msg


def test_unreadable_visible_names_both_paths(pair, tmp_path):
    _, ir = pair
    bad = str(tmp_path / 'bad.png')
    with open(bad, 'wb') as f:
        f.write(b'not an image')
    with pytest.raises(OSError, match='cannot read the visible image') as err:
        load(dict(img_path=bad, ir_img_path=ir))
    assert ir in str(err.value)
    # opt-in: the dataset resamples in training
    assert load(dict(img_path=bad, ir_img_path=ir), ignore_empty=True) is None


def test_unpaired_sample_is_refused(pair):
    with pytest.raises(KeyError, match='not paired'):
        load(dict(img_path=pair[0]))


def test_size_mismatch_error_or_resize(pair, tmp_path):
    vis, _ = pair
    ir = str(tmp_path / 'big_ir.png')
    write_img(ir, infrared_image(80, 60))
    with pytest.raises(ValueError, match='sizes differ'):
        load(dict(img_path=vis, ir_img_path=ir))
    out = load(dict(img_path=vis, ir_img_path=ir), on_size_mismatch='resize')
    assert out['ir_img'].shape == (30, 40, 3)
    assert out['ir_ori_shape'] == (60, 80)


def test_single_channel_infrared_becomes_three_channels(pair, tmp_path):
    vis, _ = pair
    ir = str(tmp_path / 'grey.png')
    assert cv2.imwrite(ir, infrared_image(40, 30)[..., 0])
    out = load(dict(img_path=vis, ir_img_path=ir),
               ir_color_type='grayscale')
    assert out['ir_img'].shape == (30, 40, 3)
    assert np.array_equal(out['ir_img'], infrared_image(40, 30))
