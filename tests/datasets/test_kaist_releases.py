"""KAISTDataset reads each KAIST annotation release as it is downloaded:
kaist-cvpr15's annotations-xml-new with CRLF lists (the shipped config,
data_root changed only), the flat sanitized / improved bbGt files,
KAIST-Paired, and says what it looked for when it finds none."""
import os.path as osp
import pickle

import pytest

import mmsafe  # noqa: F401  (registers the dataset)
from tests.datasets.kaist_fixtures import (flat_folder, paired_folder, write,
                                           write_images, write_list,
                                           xml_tree)
from tests.utils import REPO_ROOT

KAIST_CONFIG = osp.join(REPO_ROOT, 'configs', 'kaist',
                        'dual_faster_rcnn_r50_fpn_macl_kaist.py')
TRAIN = ['set00/V000/I01217', 'set00/V000/I01219']
TEST = ['set06/V000/I00019', 'set09/V000/I00019']
# (label, x, y, w, h, occlusion): as in the release, person? included
XML = {
    'set00/V000/I01217': [('person', 191, 213, 20, 43, 0),
                          ('people', 0, 200, 40, 60, 1),
                          ('cyclist', 600, 220, 40, 70, 2)],
    'set00/V000/I01219': [],
    'set06/V000/I00019': [('person', 505, 212, 20, 50, 0),
                          ('person', 300, 180, 40, 90, 1)],
    'set09/V000/I00019': [('person', 483, 215, 26, 51, 1),
                          ('person?', 266, 196, 20, 28, 0)],
}


def _build(cfg: dict):
    """Build a dataset; not serialized unless asked (MMEngine's
    serialization runs gc.collect: 0.4 s a build in a large process)."""
    from mmdet.registry import DATASETS
    return DATASETS.build(dict(dict(serialize_data=False), **cfg))


def _expected(objects):
    return [(o[0], [float(o[1]), float(o[2]), float(o[1] + o[3]),
                    float(o[2] + o[4])], o[5]) for o in objects]


def _got(info):
    return [(i['label_name'], i['bbox'], i['occlusion'])
            for i in info['instances']]


def test_cvpr15_xml_tree_builds_with_the_shipped_config(tmp_path):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    root = str(tmp_path) + '/'
    xml_tree(root, XML, {'train-all-02.txt': TRAIN, 'test-all-20.txt': TEST})
    cfg = Config.fromfile(KAIST_CONFIG)
    init_default_scope('mmsafe')
    for split, frames in (('train_dataloader', TRAIN[:1]),
                          ('test_dataloader', TEST)):
        dataset_cfg = cfg[split].dataset
        dataset_cfg.data_root = root  # the only change
        ds = _build(dataset_cfg)
        assert ds.ann_source['layout'] == 'xml'
        # training drops the frame without a valid person
        assert [ds.get_data_info(i)['img_id'] for i in range(len(ds))] == \
            frames
        for i, frame in enumerate(frames):
            info = ds.get_data_info(i)
            assert _got(info) == _expected(XML[frame])
            assert info['img_path'].endswith(
                f'{frame[:10]}/visible/{frame[11:]}.jpg')
            assert all(inst['ign'] == 0 for inst in info['instances'])
    test = {ds.get_data_info(i)['img_id']: ds.get_data_info(i)
            for i in range(len(ds))}
    # the test split's "reasonable" flags: h 50 and person? are ignored
    assert [i['ignore_flag'] for i in
            test['set06/V000/I00019']['instances']] == [1, 0]
    assert [i['ignore_flag'] for i in
            test['set09/V000/I00019']['instances']] == [1, 1]


def test_xml_reader_fields_and_the_converter_variant(tmp_path):
    from mmsafe.datasets.kaist_annotations import parse_kaist_xml
    objects = parse_kaist_xml(
        '<annotation><object><name>person</name><bndbox><xmin>10.5</xmin>'
        '<ymin>20</ymin><xmax>40</xmax><ymax>80</ymax></bndbox>'
        '<difficult>1</difficult></object></annotation>', 'a.xml')
    assert objects == [dict(label='person', bbox=[10.5, 20.0, 40.0, 80.0],
                            occlusion=0, ign=1)]
    with pytest.raises(ValueError, match=r'b\.xml.*<w>'):
        parse_kaist_xml('<annotation><object><name>person</name><bndbox>'
                        '<x>1</x><y>2</y><h>3</h></bndbox></object>'
                        '</annotation>', 'b.xml')
    with pytest.raises(ValueError, match=r'c\.xml:1: <object> is not '
                       'well-formed xml'):
        parse_kaist_xml('<annotation><object>', 'c.xml')


FLAT = {
    # border boxes (x = 0, right edge 640), the bbGt ignore flag, person?a
    'set06/V000/I00019': [('person', 0, 200, 25, 60, 0),
                          ('person', 615, 190, 25, 70, 2),
                          ('person', 300, 180, 40, 90, 0, 1),
                          ('person?a', 100, 200, 20, 50, 0)],
    'set06/V000/I00039': [],
}


@pytest.mark.parametrize('folder', ['annotations_KAIST_test_set',
                                    'sanitized_annotations'])
def test_flat_bbgt_release_loads_to_the_pixel(tmp_path, folder):
    root = str(tmp_path) + '/'
    flat_folder(osp.join(root, folder), FLAT)
    write_list(root, 'test-all-20.txt', list(FLAT))
    write_images(root, FLAT)
    ds = _build(dict(type='KAISTDataset', data_root=root,
                     ann_file='imageSets/test-all-20.txt',
                     data_prefix=dict(ann=folder + '/'), min_height=55,
                     max_occlusion=1, pipeline=[]))
    assert ds.ann_source['layout'] == 'flat'
    info = ds.get_data_info(0)
    assert _got(info) == _expected(FLAT['set06/V000/I00019'])
    assert [i['ign'] for i in info['instances']] == [0, 0, 1, 0]
    # counted: the border person only; flagged, occluded, person?a ignored
    assert [i['ignore_flag'] for i in info['instances']] == [0, 1, 1, 1]
    assert ds.get_data_info(1)['instances'] == []
    # the old way of naming flat files still works
    named = _build(dict(type='KAISTDataset', data_root=root,
                        ann_file='imageSets/test-all-20.txt',
                        data_prefix=dict(ann=folder + '/'),
                        ann_name='{set}_{video}_{frame}.txt', pipeline=[]))
    assert named.get_data_info(0)['instances'] == [
        dict(i, ignore_flag=int(i['ign'] or i['label_name'] != 'person'))
        for i in info['instances']]


VIS = {'set00/V000/I01217': [('person', 100, 200, 20, 50, 0),
                             ('cyclist', 300, 190, 30, 60, 1)]}
IR = {'set00/V000/I01217': [('person', 104, 198, 20, 52, 0),
                            ('cyclist', 297, 190, 30, 60, 2)]}


@pytest.mark.parametrize('folder', ['annotations', 'annotations_paired'])
def test_kaist_paired_keeps_both_boxes_and_their_offset(tmp_path, folder):
    root = str(tmp_path) + '/'
    paired_folder(osp.join(root, folder), VIS, IR)
    write_list(root, 'train-all-02.txt', list(VIS))
    write_images(root, VIS)
    cfg = dict(type='KAISTDataset', data_root=root,
               ann_file='imageSets/train-all-02.txt', pipeline=[])
    info = _build(cfg).get_data_info(0)
    person, cyclist = info['instances']
    assert person['bbox'] == person['vis_bbox'] == [100., 200., 120., 250.]
    assert person['ir_bbox'] == [104., 198., 124., 250.]
    # infrared centre minus visible centre: (114, 224) - (110, 225)
    assert person['ir_offset'] == [4.0, -1.0]
    assert cyclist['ir_offset'] == [-3.0, 0.0]
    assert (person['ignore_flag'], cyclist['ignore_flag']) == (0, 1)
    assert cyclist['occlusion'] == 1  # the visible file's
    infrared = _build(dict(cfg, paired_box='infrared')).get_data_info(0)
    person, cyclist = infrared['instances']
    assert person['bbox'] == person['ir_bbox'] == [104., 198., 124., 250.]
    assert cyclist['occlusion'] == 2  # the infrared file's
    assert person['ir_offset'] == [4.0, -1.0]


def test_kaist_paired_files_must_list_the_same_objects(tmp_path):
    root = str(tmp_path) + '/'
    paired_folder(osp.join(root, 'annotations'), VIS,
                  {k: v[:1] for k, v in IR.items()})
    write_list(root, 'train-all-02.txt', list(VIS))
    write_images(root, VIS)
    with pytest.raises(ValueError, match=r'visible/I01217\.txt: the object '
                       r'list has 2 objects and .*lwir/I01217\.txt 1'):
        _build(dict(type='KAISTDataset', data_root=root,
                    ann_file='imageSets/train-all-02.txt', pipeline=[]))


def test_nothing_found_names_every_path_looked_for(tmp_path):
    root = str(tmp_path) + '/'
    write_list(root, 'test-all-20.txt', TEST)
    write_images(root, TEST)
    write(osp.join(root, 'annotations-xml-new', 'set06', 'V000',
                   'I99999.xml'), '<annotation/>')
    with pytest.raises(FileNotFoundError) as err:
        _build(dict(type='KAISTDataset', data_root=root,
                    ann_file='imageSets/test-all-20.txt', pipeline=[]))
    message = str(err.value)
    for looked in ('annotations/set06/V000/visible/I00019.txt',
                   'annotations/set06/V000/I00019.txt',
                   'annotations/set06_V000_I00019.txt',
                   'annotations-xml-new/set06/V000/I00019.xml',
                   'annotations_paired/set06/V000/lwir/I00019.txt',
                   "data_prefix=dict(ann="):
        assert looked in message, message
    with pytest.raises(ValueError, match='ann_layout'):
        _build(dict(type='KAISTDataset', data_root=root, ann_layout='voc',
                    ann_file='imageSets/test-all-20.txt', pipeline=[]))


def test_first_release_found_wins_unless_one_is_named(tmp_path):
    root = str(tmp_path) + '/'
    xml_tree(root, {k: XML[k] for k in TEST}, {'test-all-20.txt': TEST})
    # the original per-frame bbGt with other boxes beside it
    for frame in TEST:
        write(osp.join(root, 'annotations', frame + '.txt'),
              '% bbGt version=3\nperson 1 2 30 60 0 0 0 0 0 0 0\n')
    cfg = dict(type='KAISTDataset', data_root=root,
               ann_file='imageSets/test-all-20.txt', pipeline=[])
    auto = _build(cfg)
    assert auto.ann_source['layout'] == 'bbgt'
    assert _got(auto.get_data_info(0)) == [('person', [1., 2., 31., 62.],
                                            0)]
    xml = _build(dict(cfg, ann_layout='xml'))
    assert xml.ann_source['folder'].endswith('annotations-xml-new/')
    assert _got(xml.get_data_info(0)) == _expected(XML[TEST[0]])


def test_annotations_alone_without_images(tmp_path):
    root = str(tmp_path) + '/'
    xml_tree(root, {k: XML[k] for k in TEST}, {'test-all-20.txt': TEST},
             images=False)
    cfg = dict(type='KAISTDataset', data_root=root,
               ann_file='imageSets/test-all-20.txt', pipeline=[])
    with pytest.raises(FileNotFoundError, match='I00019.jpg'):
        _build(cfg)
    ds = _build(dict(cfg, require_images=False))
    assert len(ds) == 2


def test_data_infos_are_small_and_picklable(tmp_path):
    root = str(tmp_path) + '/'
    paired_folder(osp.join(root, 'annotations'), VIS, IR)
    write_list(root, 'train-all-02.txt', list(VIS))
    write_images(root, VIS)
    ds = _build(dict(type='KAISTDataset', data_root=root,
                     ann_file='imageSets/train-all-02.txt', pipeline=[]))
    info = ds.get_data_info(0)
    assert pickle.loads(pickle.dumps(info)) == info
    per_instance = len(pickle.dumps(info['instances'])) / 2
    assert per_instance < 400, per_instance


def test_sanitized_config_trains_and_tests_on_the_flat_releases(tmp_path):
    """configs/kaist/*_sanitized.py: sanitized training annotations for
    training, the improved test annotations for testing."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    root = str(tmp_path) + '/'
    train = {TRAIN[0]: [('person', 10, 20, 30, 60, 0)]}
    test = {TEST[0]: [('person', 40, 50, 30, 70, 1)]}
    flat_folder(osp.join(root, 'sanitized_annotations'), train)
    flat_folder(osp.join(root, 'annotations_KAIST_test_set'), test)
    write_list(root, 'train-all-02.txt', list(train))
    write_list(root, 'test-all-20.txt', list(test))
    write_images(root, list(train) + list(test))
    cfg = Config.fromfile(KAIST_CONFIG.replace('.py', '_sanitized.py'))
    init_default_scope('mmsafe')
    for split, expected in (('train_dataloader', train),
                            ('val_dataloader', test),
                            ('test_dataloader', test)):
        dataset_cfg = cfg[split].dataset
        dataset_cfg.data_root = root
        ds = _build(dataset_cfg)
        assert ds.ann_source['layout'] == 'flat'
        frame, objects = next(iter(expected.items()))
        assert _got(ds.get_data_info(0)) == _expected(objects)
