"""16-bit thermal images: the paired loader reads each file's real depth,
keeps a 16-bit modality by the documented rule the config names (recorded
in the meta) or refuses it naming those rules; never cuts it to its high
byte. 8-bit files decode exactly as before."""
import cv2
import mmcv
import numpy as np
import pytest

from mmsafe.datasets.transforms import (LoadPairedImageFromFile,
                                        PackPairedDetInputs)
from mmsafe.datasets.transforms.bit_depth import (check_high_depth_cfg,
                                                  file_bit_depth)
from tests.datasets.thermal16 import (HIGH, HIGH_AT, LOW, LOW_AT, MID,
                                      MID_AT, write_thermal_tree)
from tests.utils import logged_messages


def _load(paths, **kwargs):
    vis, ir = paths
    return LoadPairedImageFromFile(**kwargs).transform(
        dict(img_path=vis, ir_img_path=ir))


@pytest.fixture(params=['.png', '.tif'])
def thermal(request, tmp_path):
    """(visible path, 16-bit infrared path, its counts)."""
    written = write_thermal_tree(str(tmp_path / 'llvip'), request.param)
    ir, counts = sorted(written.items())[0]
    return ir.replace('infrared', 'visible'), ir, counts


def test_file_bit_depth_reads_the_header(tmp_path, thermal):
    vis, ir, _ = thermal
    assert file_bit_depth(open(ir, 'rb').read()) == 16
    assert file_bit_depth(open(vis, 'rb').read()) == 8
    jpg = str(tmp_path / 'a.jpg')
    cv2.imwrite(jpg, np.zeros((4, 4, 3), np.uint8))
    assert file_bit_depth(open(jpg, 'rb').read()) == 8
    assert file_bit_depth(b'not an image') == 8


def test_16bit_is_refused_naming_the_rules(thermal):
    vis, ir, _ = thermal
    for kwargs in ({}, dict(ir_color_type='grayscale'),
                   dict(ignore_empty=True)):
        with pytest.raises(ValueError) as info:
            _load((vis, ir), **kwargs)
        message = str(info.value)
        assert f'the infrared image {ir} has 16 bits per channel (values ' \
            f'{LOW}-{HIGH}); decoded to 8 bits it would keep its high ' \
            'byte only (4 grey levels)' in message
        for rule in ("high_depth on LoadPairedImageFromFile: dict(rule="
                     "'percentile', low=1, high=99)", "rule='minmax'",
                     "rule='fixed', low=..., high=...", "rule='raw'",
                     'check_dataset.py CONFIG --stats'):
            assert rule in message


@pytest.mark.parametrize('rule', ['fixed', 'minmax', 'percentile', 'raw'])
def test_16bit_is_kept_by_each_rule_and_recorded(thermal, rule):
    vis, ir, counts = thermal
    cfg = dict(rule=rule)
    if rule == 'fixed':
        cfg.update(low=LOW, high=HIGH)
    results = _load((vis, ir), high_depth=cfg)
    img = results['ir_img']
    assert img.dtype == np.float32 and img.shape == counts.shape + (3, )
    assert all(np.array_equal(img[..., 0], img[..., c]) for c in (1, 2))
    record = results['bit_depth']['infrared']
    assert (record['bits'], record['min'], record['max'], record['rule']) \
        == (16, LOW, HIGH, rule)
    assert 'visible' not in results['bit_depth']
    if rule == 'raw':
        np.testing.assert_array_equal(img[..., 0], counts)
        return
    low, high = ((LOW, HIGH) if rule != 'percentile' else
                 np.percentile(counts.astype(np.float32), (1, 99)))
    assert (record['low'], record['high']) == pytest.approx((low, high))
    expected = np.clip((counts - low) * (255 / (high - low)), 0, 255)
    np.testing.assert_allclose(img[..., 0], expected, rtol=1e-5, atol=1e-3)
    if rule != 'percentile':
        # 51,300 -> 0, 52,150 -> 255, 51,725 -> 127.5: all 851 counts kept
        assert (img[LOW_AT][0], img[HIGH_AT][0]) == (0, 255)
        assert img[MID_AT][0] == pytest.approx((MID - LOW) * 255 /
                                               (HIGH - LOW))
        assert len(np.unique(img)) > 200
    # the record reaches the data sample's meta; the tensor keeps the depth
    packed = PackPairedDetInputs().transform(dict(
        results, img_id='x', scale_factor=(1., 1.), flip=False,
        flip_direction=None))
    assert packed['data_samples'].metainfo['bit_depth'] == \
        results['bit_depth']
    assert str(packed['inputs']['infrared'].dtype) == 'torch.float32'


def test_unchanged_reads_raw_counts_and_says_so(thermal):
    vis, ir, counts = thermal
    load = LoadPairedImageFromFile(ir_color_type='unchanged')
    with logged_messages() as messages:
        results = load.transform(dict(img_path=vis, ir_img_path=ir))
        load.transform(dict(img_path=vis, ir_img_path=ir))
    np.testing.assert_array_equal(results['ir_img'][..., 0], counts)
    assert results['bit_depth']['infrared']['rule'] == 'raw'
    said = [m for m in messages if 'its counts are kept as float32' in m]
    assert len(said) == 1, messages


def test_8bit_files_decode_as_before(tmp_path):
    written = write_thermal_tree(str(tmp_path / 'llvip'), '.png')
    vis = sorted(written)[0].replace('infrared', 'visible')
    jpg = str(tmp_path / 'v.jpg')
    cv2.imwrite(jpg, cv2.imread(vis))
    for path in (vis, jpg):
        data = open(path, 'rb').read()
        for flag in ('color', 'grayscale'):
            results = _load((path, path), color_type=flag,
                            ir_color_type=flag)
            expected = mmcv.imfrombytes(data, flag=flag)
            assert results['img'].dtype == np.uint8
            np.testing.assert_array_equal(results['img'], expected)
            assert 'bit_depth' not in results


def test_high_depth_settings_are_checked():
    for cfg, match in ((dict(rule='log'), 'rule one of'),
                       (dict(rule='fixed', low=5), 'needs low < high'),
                       (dict(rule='fixed', low=5, high=5), 'low < high'),
                       (dict(rule='percentile', low=99, high=1),
                        '0 <= low < high <= 100'),
                       (dict(rule='minmax', low=1), 'takes no other keys')):
        with pytest.raises(ValueError, match=match):
            check_high_depth_cfg(cfg, 'X')
    assert check_high_depth_cfg(dict(rule='percentile'), 'X') == dict(
        rule='percentile', low=1.0, high=99.0)
