"""The aligned FLIR, M3FD and LLVIP xml files load as their releases mean
them: each box to the pixel in its release's coordinate base, each image
with its own size, M3FD's labels in TarDAL's class order."""
import os
import os.path as osp

import pytest

from tests.datasets.voc_release_files import (release_xml, write_flir_frame,
                                              write_llvip_frame,
                                              write_m3fd_frame, write_text)


def _build(cfg: dict):
    import mmsafe  # noqa: F401  registers the datasets
    from mmdet.registry import DATASETS
    return DATASETS.build(cfg)


def _boxes(info):
    return [inst['bbox'] for inst in info['instances']]


# ------------------------------------------------------------ aligned FLIR
def test_flir_aligned_xml_counts_from_zero(tmp_path):
    """A box from the left border (xmin 0) to the right one (xmax 639) of a
    640x512 frame is loaded as it is: x from 0 to the last pixel."""
    root = str(tmp_path / 'align') + '/'
    write_flir_frame(root, 'FLIR_08865', (640, 512), [
        ('car', (0, 230, 639, 330)),
        ('person', (301, 0, 322, 511)),
        ('bicycle', (120.5, 200, 160, 260.5)),
        ('dog', (10, 10, 20, 20))])
    write_text(osp.join(root, 'align_validation.txt'),
               'FLIR_08865_PreviewData\n')
    ds = _build(dict(type='FLIRAlignedDataset', data_root=root,
                     ann_file='align_validation.txt', pipeline=[]))
    assert ds.bbox_base == 0 == type(ds).BBOX_BASE
    info = ds.get_data_info(0)
    assert (info['width'], info['height']) == (640, 512)
    assert _boxes(info) == [[0, 230, 639, 330], [301, 0, 322, 511],
                            [120.5, 200, 160, 260.5]]
    assert [i['bbox_label'] for i in info['instances']] == [1, 0, 2]
    # read as PASCAL VOC's 1-based files, the border boxes start at -1
    voc = _build(dict(type='FLIRAlignedDataset', data_root=root,
                      ann_file='align_validation.txt', bbox_base=1,
                      pipeline=[]))
    assert _boxes(voc.get_data_info(0))[:2] == [[-1, 229, 638, 329],
                                                 [300, -1, 321, 510]]


# -------------------------------------------------------------------- M3FD
def test_m3fd_sizes_come_from_each_xml_and_classes_follow_tardal(tmp_path):
    from mmsafe.datasets.m3fd import M3FD_CLASSES
    root = str(tmp_path / 'M3FD_Detection') + '/'
    # a 1024x768 frame and one of the 274 smaller ones; xml 1-based
    write_m3fd_frame(root, '00000', (1024, 768), [
        ('People', (1, 300, 40, 420)), ('Truck', (900, 500, 1024, 768))])
    write_m3fd_frame(root, '02890', (880, 520), [
        ('Lamp', (861, 1, 880, 90)), ('Motorcycle', (10, 400, 60, 520))])
    # no <size> in the xml: the image header says it
    write_m3fd_frame(root, '02891', (880, 520), [('Bus', (1, 1, 880, 520))],
                     xml_size=None)
    write_text(osp.join(root, 'ImageSets', 'train.txt'),
               '00000\n02890\n02891\n')
    ds = _build(dict(type='M3FDDataset', data_root=root,
                     ann_file='ImageSets/train.txt', pipeline=[]))
    assert M3FD_CLASSES == ('People', 'Car', 'Bus', 'Lamp', 'Motorcycle',
                            'Truck')
    assert ds.metainfo['classes'] == M3FD_CLASSES
    assert ds.bbox_base == 1
    big, small, unsized = (ds.get_data_info(i) for i in range(3))
    assert (big['width'], big['height']) == (1024, 768)
    assert (small['width'], small['height']) == (880, 520)
    assert (unsized['width'], unsized['height']) == (880, 520)
    assert _boxes(big) == [[0, 299, 39, 419], [899, 499, 1023, 767]]
    assert _boxes(small) == [[860, 0, 879, 89], [9, 399, 59, 519]]
    assert _boxes(unsized) == [[0, 0, 879, 519]]
    labels = [[i['bbox_label'] for i in info['instances']]
              for info in (big, small, unsized)]
    assert labels == [[0, 5], [3, 4], [2]]


def test_m3fd_config_and_docs_use_the_class_constant():
    from mmengine.config import Config

    from mmsafe.datasets.m3fd import M3FD_CLASSES
    from tests.utils import REPO_ROOT
    cfg = Config.fromfile(osp.join(
        REPO_ROOT, 'configs', 'm3fd', 'dual_faster_rcnn_r50_fpn_macl_m3fd.py'))
    assert cfg.model.roi_head.bbox_head.num_classes == len(M3FD_CLASSES)
    # the dataset config leaves the classes to M3FDDataset
    assert 'metainfo' not in cfg.train_dataloader.dataset
    with open(osp.join(REPO_ROOT, 'docs', 'user_guides', 'datasets.md'),
              encoding='utf-8') as f:
        docs = f.read()
    assert ', '.join(M3FD_CLASSES) in docs


def test_m3fd_another_class_order_through_metainfo(tmp_path):
    root = str(tmp_path / 'm3fd') + '/'
    write_m3fd_frame(root, '00001', (64, 48), [
        ('Lamp', (1, 1, 10, 20)), ('Motorcycle', (20, 5, 40, 30))])
    old = ('People', 'Car', 'Bus', 'Motorcycle', 'Lamp', 'Truck')
    ds = _build(dict(type='M3FDDataset', data_root=root, pipeline=[],
                     metainfo=dict(classes=old)))
    assert [i['bbox_label'] for i in ds.get_data_info(0)['instances']] == \
        [4, 3]


# ------------------------------------------------------------------- LLVIP
def test_llvip_xml_is_one_based_unless_told(tmp_path):
    root = str(tmp_path / 'LLVIP') + '/'
    write_llvip_frame(root, '010001', (1280, 1024), [
        ('person', (1, 428, 64, 662)), ('person', (1210, 391, 1280, 1024))])
    ds = _build(dict(type='LLVIPDataset', data_root=root, pipeline=[]))
    info = ds.get_data_info(0)
    assert (info['width'], info['height']) == (1280, 1024)
    assert _boxes(info) == [[0, 427, 63, 661], [1209, 390, 1279, 1023]]
    as_is = _build(dict(type='LLVIPDataset', data_root=root, bbox_base=0,
                        pipeline=[]))
    assert _boxes(as_is.get_data_info(0)) == [[1, 428, 64, 662],
                                              [1210, 391, 1280, 1024]]


@pytest.mark.parametrize('base', [2, -1, True, '0'])
def test_a_base_other_than_0_or_1_is_refused(tmp_path, base):
    root = str(tmp_path / 'LLVIP') + '/'
    write_llvip_frame(root, '010001', (64, 48), [('person', (1, 1, 9, 9))])
    with pytest.raises(ValueError, match=r'LLVIPDataset: bbox_base='):
        _build(dict(type='LLVIPDataset', data_root=root, bbox_base=base,
                    pipeline=[]))


def test_a_box_without_xmin_names_its_file(tmp_path):
    root = str(tmp_path / 'LLVIP') + '/'
    xml = write_llvip_frame(root, '010002', (64, 48),
                            [('person', (1, 1, 9, 9))])
    with open(xml, encoding='utf-8') as f:
        text = f.read().replace('<xmin>1</xmin>', '')
    with open(xml, 'w', encoding='utf-8') as f:
        f.write(text)
    with pytest.raises(ValueError, match=r'010002\.xml.*<xmin>'):
        _build(dict(type='LLVIPDataset', data_root=root, pipeline=[]))


def test_zero_size_in_xml_reads_the_image(tmp_path):
    root = str(tmp_path / 'LLVIP') + '/'
    write_llvip_frame(root, '010003', (96, 80), [('person', (5, 5, 20, 40))])
    path = osp.join(root, 'Annotations', '010003.xml')
    write_text(path, release_xml('010003.jpg', (0, 0),
                                 [('person', (5, 5, 20, 40))]))
    info = _build(dict(type='LLVIPDataset', data_root=root,
                       pipeline=[])).get_data_info(0)
    assert (info['width'], info['height']) == (96, 80)
    os.remove(osp.join(root, 'visible', 'train', '010003.jpg'))
    write_text(osp.join(root, 'visible', 'train', '010003.jpg'), 'no image')
    with pytest.raises(ValueError, match=r'010003\.jpg.*cannot be decoded'):
        _build(dict(type='LLVIPDataset', data_root=root, pipeline=[]))
