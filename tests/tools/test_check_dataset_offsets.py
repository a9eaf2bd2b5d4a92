"""tools/check_dataset.py and the per-box visible/infrared offsets: an
infrared folder holding other moments of the same fixed-camera scene (the
background matches, the people moved) is flagged pair_objects_offset,
named, drawn with its offsets and summarised, while the whole-image
alignment stays clean; the same scene paired right is not flagged."""
import glob
import json
import os
import os.path as osp
import sys
import textwrap

import cv2

from tests.tools.offset_scenes import write_llvip_scene_tree
from tests.utils import REPO_ROOT, run_command, write_config

TOOL = osp.join(REPO_ROOT, 'tools', 'check_dataset.py')
DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
WHOLE_IMAGE = {'pair_mirrored', 'pair_shifted', 'pair_unrelated'}
NUM = 12


def config(tmp_path, root):
    # the demo's pipeline at the tree's own size (320x256)
    return write_config(str(tmp_path / 'cfg.py'), textwrap.dedent(f"""
        _base_ = [{DEMO!r}]
        data_root = {root + '/'!r}
        train_dataloader = dict(
            dataset=dict(data_root=data_root, synthetic=None, pipeline=[
                dict(type='LoadPairedImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True),
                dict(type='PairedResize', scale=(320, 256), keep_ratio=True),
                dict(type='PairedRandomFlip', prob=0.5),
                dict(type='PackPairedDetInputs')]))
        """))


def check(tmp_path, root, *args):
    out = str(tmp_path / 'report.json')
    result = run_command([sys.executable, TOOL, config(tmp_path, root),
                          '--json', out, '--no-progress', '--workers', '0',
                          *args], timeout=300)
    assert not result.timed_out, result
    with open(out) as f:
        return result, json.load(f)


def test_other_moment_partners_are_flagged_per_box(tmp_path):
    root = write_llvip_scene_tree(str(tmp_path / 'scene'), (320, 256), NUM,
                                  other_moment=True)
    show = str(tmp_path / 'show')
    result, report = check(tmp_path, root, '--show-dir', show, '--show',
                           '2')
    # a warning (a per-box estimate, not a proof): exit 0, 1 with --strict
    assert result.returncode == 0, result
    kinds = [i['kind'] for i in report['issues']]
    assert not WHOLE_IMAGE & set(kinds), report['issues']
    found = [i for i in report['issues'] if i['kind'] == 'pair_objects_offset']
    assert len(found) >= NUM * 2 // 3, [i['img_path'] for i in found]
    assert {i['severity'] for i in found} == {'warning'}
    for i in found:
        assert i['img_path'].endswith('.jpg') and \
            i['ir_img_path'].endswith('.jpg')
        # the people moved 15-35 px sideways, up to 3 px up or down: each
        # box matched that far, or its place empty in infrared
        assert i['median_d'] is None or i['median_d'] > 8.0
        assert all(abs(dy) <= 5.0 and abs(dx) > 8.0
                   for dx, dy in i['offsets'])
        assert 'disagree' in i['message']
        if i['offsets']:
            assert 'median |d|' in i['message']
    summary = report['object_offsets']
    assert summary['pairs'] == NUM
    assert summary['flagged_pairs'] == len(found)
    assert summary['verdicts'] >= 0.8 * summary['boxes'], summary
    assert summary['by_verdict']['matched'] + summary['by_verdict'][
        'empty'] >= 0.8 * summary['boxes'], summary
    assert 12.0 < summary['median'] < 38.0, summary
    folder = osp.join(root, 'visible', 'train')
    assert list(summary['per_folder']) == [folder]
    assert summary['per_folder'][folder]['median'] == summary['median']
    assert 'per-box visible/infrared offsets' in result.output
    assert 'pair_objects_offset' in result.output
    # the flagged pairs drawn with their offsets, and the histogram
    drawn = glob.glob(osp.join(show, 'misaligned_*.png'))
    assert len(drawn) >= 2, os.listdir(show)
    hist = cv2.imread(osp.join(show, 'object_offsets_hist.png'))
    assert hist is not None and hist.shape == (360, 640, 3)
    assert summary['histogram'] == osp.join(show,
                                            'object_offsets_hist.png')
    img = cv2.imread(drawn[0])
    # offsets above max_offset are drawn in red on the infrared half
    red = (img[..., 2] == 255) & (img[..., 1] == 0) & (img[..., 0] == 0)
    assert red[:, img.shape[1] // 2:].sum() > 10


def test_same_scene_paired_right_is_not_flagged_and_switch_off(tmp_path):
    root = write_llvip_scene_tree(str(tmp_path / 'scene'), (320, 256), NUM)
    result, report = check(tmp_path, root)
    assert result.returncode == 0, result
    assert not any(i['kind'] == 'pair_objects_offset'
                   for i in report['issues'])
    summary = report['object_offsets']
    assert summary['confident'] >= NUM and summary['median'] < 2.0
    assert summary['disagree'] == 0 and summary['by_verdict']['empty'] == 0
    # a threshold below the registration noise flags pairs; --no-alignment
    # switches the measure off
    result, report = check(tmp_path, root, '--max-offset', '0.01',
                           '--strict')
    assert result.returncode == 1, result
    assert any(i['kind'] == 'pair_objects_offset' for i in report['issues'])
    result, report = check(tmp_path, root, '--max-offset', '0.01',
                           '--no-alignment')
    assert result.returncode == 0, result
    assert 'object_offsets' not in report
