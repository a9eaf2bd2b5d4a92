"""tools/check_dataset.py's coordinate checks, in process on small files in
the releases' formats: a split read with the wrong coordinate base is
named with its files and the dataset argument to set, a box past its own
image's border is reported per sample (each image with its own size), and
a healthy split is silent."""
import os.path as osp

import pytest

from tests.utils import REPO_ROOT
from tests.datasets.voc_release_files import (write_flir_frame,
                                              write_m3fd_frame, write_text)

PIPELINE = [
    dict(type='LoadPairedImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackPairedDetInputs'),
]
FRAMES = 12
W, H = 640, 512


@pytest.fixture(scope='module')
def flir_root(tmp_path_factory):
    """Aligned FLIR frames (0-based xml) whose cars are cut by the left and
    right borders, as in the release."""
    root = str(tmp_path_factory.mktemp('flir') / 'align') + '/'
    frames = []
    for i in range(FRAMES):
        frame = f'FLIR_{8865 + i:05d}'
        write_flir_frame(root, frame, (W, H), [
            ('car', (0, 200 + i, 80, 300)),
            ('car', (560 - i, 210, W - 1, 290)),
            ('person', (300, 150, 320, 230 + i))])
        frames.append(frame)
    write_text(osp.join(root, 'align_validation.txt'),
               ''.join(f'{f}_PreviewData\n' for f in frames))
    return root


def _audit(cfg: dict):
    import mmsafe  # noqa: F401  registers the datasets
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope

    from mmsafe.tools_lib import dataset_check as dc
    init_default_scope('mmsafe')
    dataset = DATASETS.build(dict(cfg, pipeline=PIPELINE))
    return dc.audit(dataset, workers=0, progress=False, alignment=False)


def _kinds(report):
    return [i['kind'] for i in report['issues']]


def test_healthy_release_is_silent(flir_root):
    report = _audit(dict(type='FLIRAlignedDataset', data_root=flir_root,
                         ann_file='align_validation.txt'))
    assert report['issues'] == [], report['issues']
    [borders] = report['box_borders']
    assert borders['dataset'] == 'FLIRAlignedDataset'
    assert borders['bbox_base'] == 0 and borders['shift'] == 0
    assert borders['boxes'] == 3 * FRAMES
    # every left car starts at x = 0, every right car ends at W - 1
    assert borders['low'] == {'-1': 0, '0': FRAMES, '1': 0}
    assert borders['high'] == {'-2': 0, '-1': FRAMES, '0': 0, '1': 0}


def test_wrong_base_is_named_with_files_and_the_argument(flir_root):
    from mmsafe.tools_lib.dataset_check import format_report
    report = _audit(dict(type='FLIRAlignedDataset', data_root=flir_root,
                         ann_file='align_validation.txt', bbox_base=1))
    base = [i for i in report['issues'] if i['kind'] == 'coordinate_base']
    assert len(base) == 1, report['issues']
    finding = base[0]
    assert finding['severity'] == 'warning' and finding['shift'] == -1
    assert 'set bbox_base=0 on FLIRAlignedDataset' in finding['message']
    assert f'{FRAMES} box coordinates start at x or y = -1' in \
        finding['message']
    assert sorted(osp.basename(f) for f in finding['files']) == sorted(
        f'FLIR_{8865 + i:05d}_PreviewData.xml' for i in range(FRAMES))
    assert report['box_borders'][0]['shift'] == -1
    # and every frame's box at x = -1 is reported with its files
    past = [i for i in report['issues'] if i['kind'] == 'box_past_border']
    assert len(past) == FRAMES
    assert all(i['img_path'] and i['ir_img_path'] for i in past)
    assert all(b[0] == -1 for i in past for b in i['boxes'])
    assert report['errors'] == 0 and report['warnings'] == FRAMES + 1
    text = format_report(report)
    assert 'coordinate_base' in text and 'set bbox_base=0' in text
    assert 'box borders (FLIRAlignedDataset, bbox_base=1' in text


def test_one_too_few_subtracted_is_named(tmp_path):
    """Corner coordinates counted from 1 (a border box runs from 1 to
    width + 1) read as they are: every box is 1 px right/down."""
    root = str(tmp_path / 'M3FD_Detection') + '/'
    for i in range(FRAMES):
        write_m3fd_frame(root, f'{i:05d}', (96, 80), [
            ('Car', (1, 20, 30, 40 + i)), ('Truck', (60 - i, 30, 97, 81))])
    report = _audit(dict(type='M3FDDataset', data_root=root, bbox_base=0))
    [finding] = [i for i in report['issues'] if i['kind'] == 'coordinate_base']
    assert finding['shift'] == 1
    assert 'set bbox_base=1 on M3FDDataset' in finding['message']
    assert len(finding['files']) == FRAMES
    # the right/bottom borders are passed by one pixel: per sample too
    assert _kinds(report).count('box_past_border') == FRAMES


def test_box_outside_its_own_smaller_image(tmp_path):
    """A box that fits a 1024x768 frame but not its own 440x320 one is out
    of the image; the frames of the main size stay silent."""
    root = str(tmp_path / 'M3FD_Detection') + '/'
    write_m3fd_frame(root, '01796', (1024, 768), [('Car', (400, 200, 500,
                                                           300))])
    write_m3fd_frame(root, '01797', (440, 320), [('Car', (400, 200, 500,
                                                          300))])
    report = _audit(dict(type='M3FDDataset', data_root=root))
    found = [(i['kind'], osp.basename(i['img_path'])) for i in
             report['issues'] if i['source'] == 'annotation']
    assert found == [('out_of_image_box', '01797.png')], report['issues']
    assert '440x320' in report['issues'][0]['message']
    assert report['box_borders'][0]['shift'] == 0


def test_an_xml_size_other_than_the_image_is_named(tmp_path):
    root = str(tmp_path / 'M3FD_Detection') + '/'
    write_m3fd_frame(root, '00010', (96, 80), [('People', (5, 5, 20, 40))],
                     xml_size=(1024, 768))
    report = _audit(dict(type='M3FDDataset', data_root=root))
    [mismatch] = [i for i in report['issues']
                  if i['kind'] == 'annotation_size_mismatch']
    assert 'annotation says 1024x768, the visible image is 96x80' in \
        mismatch['message']
    assert mismatch['img_path'].endswith('00010.png')


@pytest.mark.parametrize('low,high,shift', [
    # aligned FLIR's totals read 1-based, then with its own base
    ([1363, 302, 113], [1047, 0, 1, 0], -1),
    ([0, 1363, 302], [279, 1047, 0, 1], 0),
    # M3FD with either base: starts at 1 / ends at the width is no verdict
    ([0, 974, 99], [313, 2256, 0, 0], 0),
    ([0, 0, 974], [209, 313, 2256, 0], 0),
    # KAIST's xml read plus one
    ([0, 0, 956], [245, 769, 1454, 1259], 1),
    # too few contacts for a verdict
    ([9, 0, 0], [0, 0, 0, 0], 0),
    ([10, 0, 0], [0, 0, 0, 0], -1),
    # boxes spilling on both sides: a per-box matter, not the base
    ([500, 100, 0], [0, 0, 100, 500], 0),
])
def test_base_shift_on_the_real_releases_totals(low, high, shift):
    from mmsafe.tools_lib.dataset_check import base_shift
    assert base_shift(low, high) == shift


def test_border_contacts_use_each_image_size():
    import numpy as np

    from mmsafe.tools_lib.dataset_check import border_contacts
    boxes = np.array([[-1, 0, 439, 319], [0, 1, 440, 320], [1, 5, 441, 10]])
    assert border_contacts(boxes, 440, 320) == dict(
        low=[1, 2, 2], high=[0, 2, 2, 1])


def test_kaist_boxes_cut_by_the_frame_are_warnings(tmp_path):
    """KAIST annotates pedestrians cut by the right border by their full
    extent (as released: up to 6 px, 22% of the box, past x = 640): a
    warning, since the transforms clip them; a box mostly outside its image
    stays an error."""
    from tests.datasets.kaist_fixtures import write_images, xml_tree
    root = str(tmp_path) + '/'
    frames = {
        # as in set07/V002/I00799 and set07/V001/I03399 of the release
        'set07/V002/I00799': [('person?', 619, 227, 27, 78, 0),
                              ('person', 100, 200, 30, 60, 0)],
        'set07/V001/I03399': [('person', 589, 209, 57, 105, 0)],
        # 30 of 40 px past the border: wrong coordinates, not a cut object
        'set07/V001/I03400': [('person', 630, 200, 40, 80, 0)],
    }
    xml_tree(root, frames, {'train-all-02.txt': list(frames)}, images=False)
    write_images(root, frames, size=(W, H))
    report = _audit(dict(type='KAISTDataset', data_root=root,
                         ann_file='imageSets/train-all-02.txt',
                         data_prefix=dict(img='images/'), filter_cfg=None))
    def frame(issue):  # images/setNN/VNNN/visible/INNNNN.jpg
        parts = issue['img_path'].split('/')
        return '/'.join(parts[-4:-2] + [parts[-1][:-4]])

    found = sorted((i['kind'], frame(i)) for i in report['issues']
                   if i['source'] == 'annotation')
    assert found == [('box_past_border', 'set07/V001/I03399'),
                     ('box_past_border', 'set07/V002/I00799'),
                     ('out_of_image_box', 'set07/V001/I03400')], found
    past = {frame(i): i for i in report['issues']
            if i['kind'] == 'box_past_border'}
    assert past['set07/V002/I00799']['boxes'] == [[619.0, 227.0, 646.0,
                                                   305.0]]
    assert 'by up to 6 px' in past['set07/V001/I03399']['message']
    # the pipeline (no resize here) delivers the same boxes: same verdicts
    assert sorted((i['kind'], frame(i)) for i in report['issues']
                  if i['source'] == 'pipeline') == [
                      ('out_of_image_box', 'set07/V001/I03400')]
    assert report['errors'] == 2
    # the KAIST recipe's training pipeline clips them (and the flip keeps
    # them inside)
    from mmdet.registry import DATASETS
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', '_base_',
                                   'datasets', 'kaist.py'))
    pipeline = [dict(t, prob=1.0) if t['type'] == 'PairedRandomFlip' else t
                for t in cfg.train_pipeline]
    dataset = DATASETS.build(dict(
        type='KAISTDataset', data_root=root, pipeline=pipeline,
        ann_file='imageSets/train-all-02.txt',
        data_prefix=dict(img='images/'), filter_cfg=None))
    assert dataset.get_data_info(1)['img_id'] == 'set07/V001/I03399'
    boxes = dataset[1]['data_samples'].gt_instances.bboxes.tensor
    assert boxes.tolist() == [[0.0, 209.0, 51.0, 314.0]]  # 589 + 57 -> 640
