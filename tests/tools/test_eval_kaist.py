"""tools/eval_kaist.py scores detection files in the KAIST devkit's
formats (combined file, per-frame folders in both per-frame formats) with
the shipped KAIST config's dataset and evaluator, on a tiny tree of flat
improved-style annotations without images."""
import json
import math
import os.path as osp

import pytest

from tests.datasets.kaist_fixtures import flat_folder, write, write_list
from tests.utils import REPO_ROOT

CONFIG = osp.join(REPO_ROOT, 'configs', 'kaist',
                  'dual_faster_rcnn_r50_fpn_macl_kaist.py')
FRAMES = ['set06/V000/I00019', 'set09/V000/I00019']
ANNOTATIONS = {f: [('person', 100, 100, 30, 60, 0),
                   ('people', 300, 100, 60, 60, 0)] for f in FRAMES}
# frame 1 (set06, day): the person found; frame 2 (set09, night): a false
# positive (.9) before the hit (.5), a detection on the people region
COMBINED = ('1,100,100,30,60,0.5\n'
            '2,400,100,30,60,0.9\n'
            '2 100 100 30 60 0.5\n'
            '2,300,100,60,60,0.95\n')


def mr(misses):
    return math.exp(sum(math.log(max(1e-10, m)) for m in misses) / 9)


EXPECTED = {
    'kaist/MR-2_day': mr([0] * 9),
    'kaist/MR-2_night': mr([1] * 8 + [0]),
    # both frames: the false positive at FPPI .5, then the two hits
    'kaist/MR-2': mr([1] * 7 + [0, 0]),
}


def _cli():
    from mmsafe.tools import eval_kaist
    return eval_kaist


@pytest.fixture
def tree(tmp_path):
    root = str(tmp_path / 'kaist') + '/'
    flat_folder(osp.join(root, 'annotations_KAIST_test_set'), ANNOTATIONS)
    write_list(root, 'test-all-20.txt', FRAMES)
    return root


def score(tmp_path, root, detections):
    out = str(tmp_path / 'metrics.json')
    code = _cli().main([
        CONFIG, detections, '--data-root', root, '--out', out,
        '--cfg-options', 'test_dataloader.dataset.data_prefix.ann='
        'annotations_KAIST_test_set/'])
    assert code == 0
    with open(out) as f:
        return json.load(f)


def test_combined_file(tmp_path, tree, capsys):
    path = write(str(tmp_path / 'MBNet_result.txt'), COMBINED)
    metrics = score(tmp_path, tree, path)
    for key, value in EXPECTED.items():
        assert metrics[key] == pytest.approx(value), key
    assert 'kaist/MR-2_all' in metrics and 'coco/bbox_mAP' in metrics
    out = capsys.readouterr().out
    assert f'kaist/MR-2{" " * 15}{EXPECTED["kaist/MR-2"] * 100:.2f}%' in out


@pytest.mark.parametrize('rows', [
    # the devkit's per-frame format, as is
    {FRAMES[0]: '100 100 30 60 0.5\n',
     FRAMES[1]: '400 100 30 60 0.9\n100 100 30 60 0.5\n'
                '300 100 60 60 0.95\n'},
    # the devkit wrapper's 0-based 'person x1 y1 x2 y2 score': +1 on x1, y1
    {FRAMES[0]: 'person 99 99 129 159 0.5\n',
     FRAMES[1]: 'person 399 99 429 159 0.9\nperson 99 99 129 159 0.5\n'
                'person 299 99 359 159 0.95\n'},
])
def test_per_frame_folders(tmp_path, tree, rows):
    folder = str(tmp_path / 'det')
    for frame, text in rows.items():
        write(osp.join(folder, frame.replace('/', '_') + '.txt'), text)
    metrics = score(tmp_path, tree, folder)
    for key, value in EXPECTED.items():
        assert metrics[key] == pytest.approx(value), key


def test_missing_frame_file_and_bad_ids_are_reported(tmp_path, tree,
                                                     capsys):
    folder = str(tmp_path / 'det')
    write(osp.join(folder, 'set09_V000_I00019.txt'), '100 100 30 60 0.5\n')
    metrics = score(tmp_path, tree, folder)
    assert '1 of 2 frames have no file' in capsys.readouterr().out
    # the day frame's person is missed: no detection there
    assert metrics['kaist/MR-2_day'] == pytest.approx(1.0)
    bad = write(str(tmp_path / 'bad.txt'), '3,1,1,10,10,0.5\n')
    assert _cli().main([CONFIG, bad, '--data-root', tree, '--cfg-options',
                        'test_dataloader.dataset.data_prefix.ann='
                        'annotations_KAIST_test_set/']) == 2
    err = capsys.readouterr().err
    assert 'bad.txt:1: frame id 3 is not one of 1..2' in err


def test_per_frame_lines_read_as_the_devkit_reads_them(tmp_path):
    from mmsafe.evaluation.kaist_det_files import read_frame_file
    path = write(str(tmp_path / 'set06_V000_I00019.txt'),
                 'person 500.4471 210.2053 521.6678 255.9434 0.09562081\n'
                 '501.4471 211.2053 21.2207 45.7381 -0.5\n\n')
    rows = read_frame_file(path)
    # the wrapper's 0-based x1 y1 x2 y2 -> x1 + 1, y1 + 1, x2 - x1, y2 - y1
    assert rows[0] == pytest.approx([501.4471, 211.2053, 21.2207, 45.7381,
                                     0.09562081])
    assert rows[1].tolist() == [501.4471, 211.2053, 21.2207, 45.7381, -0.5]
    bad = write(str(tmp_path / 'bad.txt'), 'person 1 2 3 4\n')
    with pytest.raises(ValueError, match=r'bad\.txt:1: expected "person x1'):
        read_frame_file(bad)
