"""tools/check_dataset.py on generated LLVIP trees: each injected fault is
reported per sample with its files, in the table and the JSON report, and
the exit code fails; a healthy tree passes and --show-dir draws pairs."""
import json
import os
import os.path as osp
import sys

import cv2
import pytest

from tests.tools.check_dataset_toys import write_config, write_llvip_tree
from tests.utils import REPO_ROOT, run_command

TOOL = osp.join(REPO_ROOT, 'tools', 'check_dataset.py')

FAULTS = {
    '000005': 'missing_partner',
    '000006': 'unreadable',
    '000007': 'size_mismatch',
    '000008': 'empty',
    '000009': 'degenerate',
    '000010': 'out_of_image',
}
BAD_LABEL = '000011'
# fault -> the finding it must produce
EXPECTED = {
    'missing_partner': 'missing_partner',
    'unreadable': 'unreadable_image',
    'size_mismatch': 'size_mismatch',
    'empty': 'no_valid_instances',
    'degenerate': 'degenerate_box',
    'out_of_image': 'out_of_image_box',
}


VAL_LOADER = """
val_dataloader = dict(
    batch_size=1,
    dataset=dict(
        type='LLVIPDataset',
        data_root={data_root!r},
        data_prefix=dict(img='visible/train/', ann='Annotations/'),
        test_mode=True,
        pipeline=[
            dict(type='LoadPairedImageFromFile'),
            dict(type='PairedResize', scale=(32, 24), keep_ratio=True),
            dict(type='LoadAnnotations', with_bbox=True),
            dict(type='PackPairedDetInputs')
        ]))
"""


def _run(args, timeout=300):
    return run_command([sys.executable, TOOL, *args, '--no-progress'],
                       timeout=timeout)


@pytest.fixture(scope='module')
def faulty_report(tmp_path_factory):
    root = tmp_path_factory.mktemp('faulty')
    data = str(root / 'llvip')
    write_llvip_tree(data, num=12, faults=FAULTS)
    cfg = write_config(
        str(root / 'cfg.py'), data, 'BadLabelLLVIPDataset',
        f",\n        bad_label_stems=['{BAD_LABEL}']")
    out = str(root / 'report.json')
    result = _run([cfg, '--workers', '2', '--json', out])
    assert not result.timed_out, result
    with open(out) as f:
        return result, json.load(f)


def _kinds_by_stem(report):
    found = {}
    for i in report['issues']:
        stem = osp.splitext(osp.basename(i['img_path'] or ''))[0]
        found.setdefault(stem, set()).add(i['kind'])
    return found


def test_each_fault_is_reported_with_its_files(faulty_report):
    result, report = faulty_report
    assert result.returncode == 1, result
    found = _kinds_by_stem(report)
    for stem, fault in FAULTS.items():
        assert EXPECTED[fault] in found.get(stem, set()), (stem, found)
    assert 'label_out_of_range' in found[BAD_LABEL]
    # the sizes clash is also what the loader raises on: both reported
    assert 'pipeline_error' in found['000007']
    # healthy samples are silent
    for stem in ('000001', '000002', '000003', '000004', '000012'):
        assert stem not in found, found[stem]
    # every finding names both files of its pair
    for i in report['issues']:
        assert i['img_path'] and i['ir_img_path'], i
    assert report['exit_code'] == 1
    assert report['errors'] >= 7 and report['warnings'] >= 1
    assert report['summary']['no_valid_instances']['severity'] == 'warning'
    assert report['pairs_per_second'] > 0 and report['workers'] == 2
    # the summary table and the per-sample lines reach the console
    for kind in set(EXPECTED.values()) | {'label_out_of_range'}:
        assert kind in result.output
    assert '000006.jpg' in result.output
    assert 'check_dataset: FAILED' in result.output


def test_healthy_tree_passes_and_show_dir_draws_pairs(tmp_path):
    data = str(tmp_path / 'llvip')
    write_llvip_tree(data, num=5, size=(64, 48))
    cfg = write_config(str(tmp_path / 'cfg.py'), data)
    show = str(tmp_path / 'show')
    out = str(tmp_path / 'report.json')
    result = _run([cfg, '--workers', '2', '--json', out, '--show-dir',
                   show, '--show', '3'])
    assert result.returncode == 0, result
    with open(out) as f:
        report = json.load(f)
    assert report['issues'] == [] and report['num_samples'] == 5
    files = sorted(os.listdir(show))
    # the histogram of the per-box offsets, and the pairs drawn
    assert 'object_offsets_hist.png' in files, files
    files.remove('object_offsets_hist.png')
    assert len(files) == 3, files
    img = cv2.imread(osp.join(show, files[0]))
    # the pipeline resizes 64x48 to 96x72: visible | gap | infrared
    assert img.shape[0] == 72 and img.shape[1] == 2 * 96 + 4, img.shape
    # boxes are drawn in green on both halves at the same place
    green = (img[..., 1] > 200) & (img[..., 0] < 80) & (img[..., 2] < 80)
    left, right = green[:, :96], green[:, 100:]
    assert left.sum() > 20 and right.sum() > 20
    assert abs(int(left.sum()) - int(right.sum())) < 0.2 * left.sum()
    assert 'check_dataset: OK' in result.output
    # a test pipeline loads boxes after the (down)scaling, in the original
    # frame for the metric: they are not out of the image
    with open(cfg, 'a') as f:
        f.write(VAL_LOADER.format(data_root=data))
    val = _run([cfg, '--split', 'val', '--workers', '0'])
    assert val.returncode == 0, val
    assert 'dataset LLVIPDataset: 5 samples' in val.output


def test_warnings_pass_unless_strict_even_through_a_wrapper(tmp_path):
    data = str(tmp_path / 'llvip')
    write_llvip_tree(data, num=3, faults={'000002': 'empty'})
    # a resampling wrapper in the config must not hide the empty sample
    cfg = write_config(str(tmp_path / 'cfg.py'), data,
                       wrap='ValidInstanceResampleDataset')
    out = str(tmp_path / 'report.json')
    ok = _run([cfg, '--workers', '0', '--json', out])
    assert ok.returncode == 0, ok  # an image without people is a warning
    with open(out) as f:
        report = json.load(f)
    assert [(i['kind'], osp.basename(i['img_path']))
            for i in report['issues']] == [('no_valid_instances',
                                            '000002.jpg')]
    strict = _run([cfg, '--workers', '0', '--strict'])
    assert strict.returncode == 1, strict
    no_val = _run([cfg, '--split', 'val'])
    assert no_val.returncode == 2 and 'val_dataloader' in no_val.output
