"""tools/check_dataset.py and the pairing: a transform acting on one
modality is reported from the config; an infrared folder mirrored on disk
and permuted partners are flagged pair by pair (image content), named and
drawn with --show-dir; the healthy synthetic demo data is not flagged."""
import glob
import json
import os
import os.path as osp
import sys
import textwrap

import pytest

from tests.tools.check_dataset_toys import (DEMO_SYNTHETIC,
                                            synthetic_demo_tree)
from tests.utils import REPO_ROOT, run_command, write_config

TOOL = osp.join(REPO_ROOT, 'tools', 'check_dataset.py')
DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
ALIGNMENT_KINDS = {'pair_mirrored', 'pair_shifted', 'pair_unrelated',
                   'pair_objects_offset'}
NUM_TRAIN = DEMO_SYNTHETIC['num_train']


def make_tree(root, fault=None):
    return synthetic_demo_tree(root, fault)


def config(tmp_path, root):
    return write_config(str(tmp_path / 'cfg.py'), textwrap.dedent(f"""
        _base_ = [{DEMO!r}]
        data_root = {root + '/'!r}
        train_dataloader = dict(
            dataset=dict(data_root=data_root, synthetic=None))
        """))


def check(tmp_path, cfg, *args):
    out = str(tmp_path / 'report.json')
    result = run_command([sys.executable, TOOL, cfg, '--json', out,
                          '--no-progress', *args], timeout=300)
    assert not result.timed_out, result
    report = None
    if osp.exists(out):
        with open(out) as f:
            report = json.load(f)
    return result, report


def alignment_findings(report):
    return [i for i in report['issues'] if i['kind'] in ALIGNMENT_KINDS]


def test_healthy_demo_data_is_not_flagged(tmp_path):
    root = make_tree(str(tmp_path / 'llvip'))
    result, report = check(tmp_path, config(tmp_path, root), '--workers',
                           '2')
    assert result.returncode == 0, result
    assert alignment_findings(report) == [], report['issues']
    assert not any(i['kind'] == 'unpaired_transform'
                   for i in report['issues'])
    # the per-box offsets were measured, and are small
    offsets = report['object_offsets']
    assert offsets['pairs'] >= NUM_TRAIN // 2 and offsets['confident'] > 0
    assert offsets['median'] < 2.0 and offsets['flagged_pairs'] == 0


@pytest.mark.parametrize('fault,kind', [('mirrored', 'pair_mirrored'),
                                        ('permuted', 'pair_unrelated')])
def test_misaligned_partners_are_flagged_and_drawn(tmp_path, fault, kind):
    root = make_tree(str(tmp_path / 'llvip'), fault)
    show = str(tmp_path / 'show')
    result, report = check(tmp_path, config(tmp_path, root), '--workers',
                           '0', '--show-dir', show, '--show', '2')
    assert result.returncode == 1, result
    found = alignment_findings(report)
    # most pairs are named, each with both files
    assert len({i['img_path'] for i in found}) >= NUM_TRAIN // 2
    assert {i['kind'] for i in found} >= {kind}, found
    for i in found:
        assert i['img_path'].endswith('.jpg') and \
            i['ir_img_path'].endswith('.jpg')
        assert 'infrared' in i['message'] and '--show-dir' in i['message']
    assert kind in result.output
    drawn = glob.glob(osp.join(show, 'misaligned_*.png'))
    assert len(drawn) >= 2, os.listdir(show)


def test_one_modality_transform_reported_from_the_config(tmp_path):
    root = make_tree(str(tmp_path / 'llvip'))
    result, report = check(
        tmp_path, config(tmp_path, root), '--workers', '0', '--cfg-options',
        'train_dataloader.dataset.pipeline.3.type=RandomFlip')
    assert result.returncode == 2, result
    static = [i for i in report['issues']
              if i['kind'] == 'unpaired_transform']
    assert len(static) == 1, report['issues']
    assert 'train_dataloader.dataset.pipeline[3] RandomFlip' in \
        static[0]['message'] and 'PairedRandomFlip' in static[0]['message']
    assert 'unpaired_transform' in result.output
