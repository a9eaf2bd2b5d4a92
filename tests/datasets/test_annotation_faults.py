"""What users' annotation files really hold, read by the LLVIP, aligned
FLIR, M3FD and KAIST readers: each malformed field is one mmsafe error
naming the file, the element and its line (all malformed files of a split
together), documented defaults are applied and counted, and objects whose
name is not a class are counted by name, with the class that differs only
in case or spacing, and read as it through ``class_aliases``."""
import os.path as osp

import pytest

from mmsafe.datasets.annotation_reader import MalformedAnnotationError
from mmsafe.datasets.annotation_tally import MalformedAnnotationsError
from mmsafe.errors import MMSafeError
from tests.datasets.kaist_fixtures import (bbgt, kaist_xml, write,
                                           write_images, write_list)
from tests.datasets.voc_release_files import (write_flir_frame,
                                              write_llvip_frame,
                                              write_m3fd_frame, write_text)
from tests.utils import logged_messages

SIZE = (64, 48)


def _build(cfg: dict):
    from mmsafe.compat.mmengine_features import error_as_raised
    from mmsafe.registry import DATASETS
    try:
        return DATASETS.build(dict(dict(serialize_data=False, pipeline=[],
                                        _scope_='mmsafe'), **cfg))
    except Exception as err:  # the dataset's own error, on every MMEngine
        raise error_as_raised(err)


# ------------------------------------------------------------ VOC formats
# release -> (dataset type, frame writer, xml path of a frame, convention)
RELEASES = {
    'llvip': ('LLVIPDataset', write_llvip_frame,
              lambda root, stem: osp.join(root, 'Annotations', stem + '.xml'),
              "LLVIP's xml (PASCAL VOC format)"),
    'flir': ('FLIRAlignedDataset', write_flir_frame,
             lambda root, stem: osp.join(root, 'Annotations',
                                         stem + '_PreviewData.xml'),
             "the aligned FLIR release's xml (PASCAL VOC format)"),
    'm3fd': ('M3FDDataset', write_m3fd_frame,
             lambda root, stem: osp.join(root, 'Annotation', stem + '.xml'),
             "M3FD's xml (PASCAL VOC format)"),
}
STEMS = {'llvip': ('010001', '010002', '010003'),
         'flir': ('FLIR_00001', 'FLIR_00002', 'FLIR_00003'),
         'm3fd': ('00001', '00002', '00003')}
CLASS = {'llvip': 'person', 'flir': 'car', 'm3fd': 'People'}


def _voc_tree(root: str, release: str, objects=None) -> list:
    """Three frames of ``release`` with one box each; their xml paths."""
    _, writer, _, _ = RELEASES[release]
    return [writer(root, stem, SIZE, objects or [(CLASS[release],
                                                  (5, 6, 20, 30))])
            for stem in STEMS[release]]


def _voc_cfg(root: str, release: str, **kwargs) -> dict:
    return dict(type=RELEASES[release][0], data_root=root, **kwargs)


def _line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count('\n') + 1


# name -> (edit of the xml text, the element named, the marker of the
# named line in the edited text, what the message says is wrong)
VOC_FAULTS = {
    'empty name': (lambda t, c: t.replace(f'<name>{c}</name>', '<name/>'),
                   '<name>', '<name/>', 'is empty'),
    'no name': (lambda t, c: t.replace(f'<name>{c}</name>', ''),
                '<object>', '<object>', 'has no <name>'),
    'decimal comma': (lambda t, c: t.replace('<xmin>5</xmin>',
                                             '<xmin>5,5</xmin>'),
                      '<xmin>', '<xmin>', "'5,5', written with a decimal "
                      'comma'),
    'empty ymax': (lambda t, c: t.replace('<ymax>30</ymax>', '<ymax></ymax>'),
                   '<ymax>', '<ymax>', 'is empty'),
    'not a number': (lambda t, c: t.replace('<xmax>20</xmax>',
                                            '<xmax>twenty</xmax>'),
                     '<xmax>', '<xmax>', "'twenty', not a number"),
    'nan': (lambda t, c: t.replace('<ymin>6</ymin>', '<ymin>nan</ymin>'),
            '<ymin>', '<ymin>', "'nan', not a finite number"),
    'difficult word': (lambda t, c: t.replace('<difficult>0</difficult>',
                                              '<difficult>yes</difficult>'),
                       '<difficult>', '<difficult>', "'yes', not one of 0, "
                       '1'),
    'size word': (lambda t, c: t.replace(f'<width>{SIZE[0]}</width>',
                                         '<width>wide</width>'),
                  '<width>', '<width>', "'wide', not a whole number"),
    'trailing text': (lambda t, c: t + 'written by tool v2\n',
                      'the text after </annotation>', 'written by',
                      'junk after document element'),
    'unclosed tag': (lambda t, c: t.replace('</bndbox>', ''),
                     '<bndbox>', '</object>', 'mismatched tag'),
}


@pytest.mark.parametrize('release', sorted(RELEASES))
@pytest.mark.parametrize('fault', sorted(VOC_FAULTS))
def test_malformed_voc_field_names_file_element_and_line(
        tmp_path, release, fault):
    root = str(tmp_path / release) + '/'
    paths = _voc_tree(root, release)
    edit, element, marker, problem = VOC_FAULTS[fault]
    with open(paths[1], encoding='utf-8') as f:
        text = edit(f.read(), CLASS[release])
    write_text(paths[1], text)
    with pytest.raises(MalformedAnnotationsError) as info:
        _build(_voc_cfg(root, release))
    error = info.value
    assert isinstance(error, MMSafeError) and isinstance(error, ValueError)
    assert '1 of 3 annotation files are malformed' in str(error)
    (one, ) = error.errors
    assert (one.path, one.element) == (paths[1], element)
    assert one.line == _line_of(text, marker), (one, text)
    assert problem in one.problem
    # the message names the file and line, the element, and the
    # release's convention
    assert f'{paths[1]}:{one.line}: {element} ' in str(error)
    assert RELEASES[release][3] in str(error)


def test_wrong_encoding_names_the_line_and_the_fix(tmp_path):
    root = str(tmp_path / 'llvip') + '/'
    paths = _voc_tree(root, 'llvip')
    with open(paths[0], encoding='utf-8') as f:
        text = f.read().replace('<database>Unknown</database>',
                                '<database>Caf\xe9</database>')
    with open(paths[0], 'wb') as f:  # latin-1, no encoding declared
        f.write(text.encode('latin-1'))
    with pytest.raises(MalformedAnnotationsError) as info:
        _build(_voc_cfg(root, 'llvip'))
    (one, ) = info.value.errors
    assert one.line == _line_of(text, 'Caf') and one.element == '<database>'
    assert 'not utf-8' in one.problem and 'encoding="ISO-8859-1"' in str(one)
    # declared, the same bytes read
    with open(paths[0], 'wb') as f:
        f.write(text.replace('<?xml version="1.0" ?>',
                             '<?xml version="1.0" encoding="ISO-8859-1"?>')
                .encode('latin-1'))
    assert len(_build(_voc_cfg(root, 'llvip'))) == 3


def test_every_malformed_file_is_named_and_skip_leaves_them_out(tmp_path):
    root = str(tmp_path / 'llvip') + '/'
    paths = _voc_tree(root, 'llvip')
    for path, edit in ((paths[0], ('<difficult>0', '<difficult>2')),
                       (paths[2], ('<name>person</name>', '<name> </name>'))):
        with open(path) as f:
            write_text(path, f.read().replace(*edit))
    with pytest.raises(MalformedAnnotationsError) as info:
        _build(_voc_cfg(root, 'llvip'))
    assert [e.path for e in info.value.errors] == [paths[0], paths[2]]
    assert "on_malformed_annotation='skip'" in str(info.value)
    ds = _build(_voc_cfg(root, 'llvip', on_malformed_annotation='skip'))
    assert [ds.get_data_info(i)['img_id'] for i in range(len(ds))] == \
        ['010002']
    assert [(m['path'], m['element']) for m in
            ds.annotation_tally.malformed] == [(paths[0], '<difficult>'),
                                               (paths[2], '<name>')]
    with pytest.raises(ValueError, match='on_malformed_annotation'):
        _build(_voc_cfg(root, 'llvip', on_malformed_annotation='drop'))


def test_missing_or_empty_difficult_reads_0_and_is_counted(tmp_path):
    root = str(tmp_path / 'llvip') + '/'
    paths = _voc_tree(root, 'llvip', [('person', (5, 6, 20, 30)),
                                      ('person', (30, 6, 50, 40))])
    with open(paths[0]) as f:
        text = f.read()
    first = text.index('<difficult>0</difficult>')
    text = (text[:first] + '<difficult/>' +
            text[first + len('<difficult>0</difficult>'):])
    write_text(paths[0], text.replace('<difficult>0</difficult>', ''))
    ds = _build(_voc_cfg(root, 'llvip'))
    info = ds.get_data_info(0)
    assert [i['ignore_flag'] for i in info['instances']] == [0, 0]
    assert [i['bbox'] for i in info['instances']] == [[4, 5, 19, 29],
                                                      [29, 5, 49, 39]]
    defaults = ds.annotation_tally.defaults
    assert list(defaults) == ['<difficult>']
    assert defaults['<difficult>']['count'] == 2
    assert defaults['<difficult>']['files'] == [paths[0]]
    assert ds.annotation_tally.files == 3
    assert ds.annotation_tally.objects == 6


# ----------------------------------------------------------- class names
def _named_tree(root: str) -> list:
    objects = [('person', (5, 6, 20, 30)), ('Person', (30, 6, 50, 40)),
               (' PERSON ', (2, 2, 9, 9)), ('dog', (40, 30, 60, 45))]
    paths = _voc_tree(root, 'llvip', objects)
    # an image whose only box is misnamed
    write_llvip_frame(root, '010004', SIZE, [('Person', (1, 1, 30, 30))])
    return paths


def test_unknown_names_are_counted_by_name_with_suggestions(tmp_path):
    root = str(tmp_path / 'llvip') + '/'
    paths = _named_tree(root)
    with logged_messages() as messages:
        ds = _build(_voc_cfg(root, 'llvip'))
    out = '\n'.join(messages)
    # only the class's own name is read; the rest is dropped and counted
    assert [len(ds.get_data_info(i)['instances']) for i in range(4)] == \
        [1, 1, 1, 0]
    unknown = ds.annotation_tally.unknown
    assert {n: (e['count'], e['suggestion']) for n, e in unknown.items()} \
        == {'Person': (4, 'person'), 'PERSON': (3, 'person'),
            'dog': (3, None)}
    assert unknown['Person']['files'] == paths + [
        osp.join(root, 'Annotations', '010004.xml')]
    assert ds.annotation_tally.objects == 13
    # the load log says how many objects were dropped, why, and the fix
    assert "10 of 13 objects dropped: their names are not in classes " \
        "('person',)" in out
    assert "'Person' x4 (differs from 'person' only in case or spacing: " \
        "add class_aliases={'Person': 'person'}" in out
    assert f"'dog' x3; first: {', '.join(paths)}" in out


def test_class_aliases_read_names_as_the_class(tmp_path):
    root = str(tmp_path / 'llvip') + '/'
    _named_tree(root)
    ds = _build(_voc_cfg(root, 'llvip', class_aliases={
        'Person': 'person', 'PERSON': 'person'}))
    info = ds.get_data_info(0)
    assert [i['bbox'] for i in info['instances']] == [
        [4, 5, 19, 29], [29, 5, 49, 39], [1, 1, 8, 8]]
    assert {i['bbox_label'] for i in info['instances']} == {0}
    assert ds.get_data_info(3)['instances'][0]['bbox'] == [0, 0, 29, 29]
    tally = ds.annotation_tally
    assert {n: e['count'] for n, e in tally.aliased.items()} == {
        'Person': 4, 'PERSON': 3}
    assert list(tally.unknown) == ['dog']
    for aliases, match in (({'Person': 'human'}, "'human', which is not"),
                           ({'person': 'person'}, 'renames'),
                           ({'Person': 1}, 'maps names to names')):
        with pytest.raises(ValueError, match=match):
            _build(_voc_cfg(root, 'llvip', class_aliases=aliases))


# ------------------------------------------------------------------ KAIST
FRAMES = ['set00/V000/I00001', 'set00/V000/I00002']
GOOD = [('person', 100, 200, 20, 50, 0)]


def _kaist_xml_tree(root: str, second: str) -> str:
    write(osp.join(root, 'annotations-xml-new', FRAMES[0] + '.xml'),
          kaist_xml(FRAMES[0], GOOD))
    path = write(osp.join(root, 'annotations-xml-new', FRAMES[1] + '.xml'),
                 second)
    write_list(root, 'train.txt', FRAMES)
    write_images(root, FRAMES)
    return path


def _kaist_cfg(root: str, **kwargs) -> dict:
    return dict(type='KAISTDataset', data_root=root,
                ann_file='imageSets/train.txt', **kwargs)


GOOD_XML = kaist_xml(FRAMES[1], [('person', 10, 20, 30, 60, 1)])
# name -> (the file's text, element, line marker, problem)
KAIST_XML_FAULTS = {
    'empty name': (GOOD_XML.replace('<name>person</name>', '<name></name>'),
                   '<name>', '<name>', 'is empty'),
    'decimal comma': (GOOD_XML.replace('<w>30</w>', '<w>30,5</w>'), '<w>',
                      '<w>', 'decimal comma'),
    'occlusion 7': (GOOD_XML.replace('<occlusion>1</occlusion>',
                                     '<occlusion>7</occlusion>'),
                    '<occlusion>', '<occlusion>', "'7', not one of 0, 1, 2"),
    'no h': (GOOD_XML.replace('<h>60</h>', ''), '<bndbox>', '<bndbox>',
             'has no <h>'),
    'second root end': (GOOD_XML + '</annotation>\n',
                        'the text after </annotation>',
                        '</annotation>\n</', 'not well-formed'),
    'trailing text': (GOOD_XML + 'exported\n',
                      'the text after </annotation>', '</annotation>\ne',
                      'junk after document element'),
}


@pytest.mark.parametrize('fault', sorted(KAIST_XML_FAULTS))
def test_malformed_kaist_xml_names_file_element_and_line(tmp_path, fault):
    root = str(tmp_path) + '/'
    text, element, marker, problem = KAIST_XML_FAULTS[fault]
    path = _kaist_xml_tree(root, text)
    with pytest.raises(MalformedAnnotationsError) as info:
        _build(_kaist_cfg(root))
    (one, ) = info.value.errors
    line = _line_of(text, marker) + (marker.startswith('</annotation>'))
    assert (one.path, one.element, one.line) == (path, element, line)
    assert problem in one.problem
    assert "kaist-cvpr15's annotations-xml-new" in str(one)


# (the bbGt line of the second frame, field named, problem)
BBGT_FAULTS = {
    'nan': ('person nan 200 20 50 0 0 0 0 0 0 0', 'field x',
            "'nan', not a finite number"),
    'decimal comma': ('person 10 200 20,5 50 0 0 0 0 0 0 0', 'field w',
                      'decimal comma'),
    'occlusion 3': ('person 10 200 20 50 3 0 0 0 0 0 0', 'field occ',
                    "'3', not one of 0, 1, 2"),
    'ign word': ('person 10 200 20 50 0 0 0 0 0 yes 0', 'field ign',
                 "'yes', not one of 0, 1"),
    'too few': ('person 10 200 20', 'the object line', 'has 4 fields'),
    'inf': ('person 10 200 inf 50 0 0 0 0 0 0 0', 'field w',
            "'inf', not a finite number"),
}


@pytest.mark.parametrize('fault', sorted(BBGT_FAULTS))
def test_malformed_bbgt_line_names_file_field_and_line(tmp_path, fault):
    root = str(tmp_path) + '/'
    folder = osp.join(root, 'sanitized')
    write(osp.join(folder, 'set00_V000_I00001.txt'), bbgt(GOOD))
    bad, field, problem = BBGT_FAULTS[fault]
    path = write(osp.join(folder, 'set00_V000_I00002.txt'),
                 '% bbGt version=3\nperson 1 2 3 4 0 0 0 0 0 0 0\n' + bad +
                 '\n')
    write_list(root, 'train.txt', FRAMES)
    write_images(root, FRAMES)
    with pytest.raises(MalformedAnnotationsError) as info:
        _build(_kaist_cfg(root, data_prefix=dict(ann='sanitized/')))
    (one, ) = info.value.errors
    assert (one.path, one.element, one.line) == (path, field, 3)
    assert problem in one.problem
    assert 'KAIST bbGt text (version 3)' in str(one)


def test_bbgt_bytes_not_utf8_and_older_versions(tmp_path):
    root = str(tmp_path) + '/'
    folder = osp.join(root, 'sanitized')
    # an older bbGt line without occlusion and ignore fields: both read 0,
    # counted
    write(osp.join(folder, 'set00_V000_I00001.txt'),
          '% bbGt version=1\nperson 100 200 20 50\n')
    path = osp.join(folder, 'set00_V000_I00002.txt')
    with open(path, 'wb') as f:
        f.write(b'% bbGt version=3\nperson 1 2 3 4 0 0 0 0 0 0 0\n'
                b'pi\xe9ton 1 2 3 4 0 0 0 0 0 0 0\n')
    write_list(root, 'train.txt', FRAMES)
    write_images(root, FRAMES)
    cfg = _kaist_cfg(root, data_prefix=dict(ann='sanitized/'))
    with pytest.raises(MalformedAnnotationsError) as info:
        _build(cfg)
    (one, ) = info.value.errors
    assert (one.path, one.element, one.line) == (path, 'the text', 3)
    assert "b'\\xe9'" in one.problem and 'not utf-8' in one.problem
    ds = _build(dict(cfg, on_malformed_annotation='skip'))
    assert len(ds) == 1
    (inst, ) = ds.get_data_info(0)['instances']
    assert (inst['occlusion'], inst['ign'], inst['ignore_flag']) == (0, 0, 0)
    defaults = ds.annotation_tally.defaults
    assert {f: e['count'] for f, e in defaults.items()} == {
        'occlusion': 1, 'ign': 1}


def test_kaist_pair_with_different_object_counts_is_named(tmp_path):
    root = str(tmp_path) + '/'
    folder = osp.join(root, 'annotations_paired')
    for modality, objects in (('visible', GOOD), ('lwir', GOOD * 2)):
        for frame in FRAMES:
            set_id, video, name = frame.split('/')
            write(osp.join(folder, set_id, video, modality, name + '.txt'),
                  bbgt(objects if frame == FRAMES[1] else GOOD))
    write_list(root, 'train.txt', FRAMES)
    write_images(root, FRAMES)
    with pytest.raises(MalformedAnnotationsError) as info:
        _build(_kaist_cfg(root))
    (one, ) = info.value.errors
    assert one.path.endswith('visible/I00002.txt')
    assert 'has 1 objects and' in str(one) and 'lwir/I00002.txt 2' in str(one)


def test_kaist_unknown_labels_are_counted_and_aliased(tmp_path):
    root = str(tmp_path) + '/'
    objects = [('person', 100, 200, 20, 60, 0), ('Person', 300, 200, 20, 60,
                                                 0),
               ('ped', 400, 200, 20, 60, 0), ('person?', 10, 10, 9, 9, 0)]
    _kaist_xml_tree(root, kaist_xml(FRAMES[1], objects))
    with logged_messages() as messages:
        ds = _build(_kaist_cfg(root))
    out = '\n'.join(messages)
    insts = ds.get_data_info(1)['instances']
    # kept as ignore regions, as every label but person
    assert [(i['label_name'], i['ignore_flag']) for i in insts] == [
        ('person', 0), ('Person', 1), ('ped', 1), ('person?', 1)]
    unknown = ds.annotation_tally.unknown
    assert {n: (e['count'], e['suggestion']) for n, e in unknown.items()} \
        == {'Person': (1, 'person'), 'ped': (1, None)}
    assert '2 of 5 objects kept as ignore regions (not trained on): ' \
        "their names are not in the releases' labels" in out
    ds = _build(_kaist_cfg(root, class_aliases={'Person': 'person',
                                                'ped': 'person'}))
    insts = ds.get_data_info(1)['instances']
    assert [(i['label_name'], i['ignore_flag']) for i in insts] == [
        ('person', 0), ('person', 0), ('person', 0), ('person?', 1)]
    assert not ds.annotation_tally.unknown


def test_the_errors_pickle_with_their_fields():
    import pickle
    error = MalformedAnnotationError.at('a.xml', '<name>', 4, 'is empty',
                                        'conv')
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.path, again.line) == (str(error), 'a.xml', 4)
    many = pickle.loads(pickle.dumps(
        MalformedAnnotationsError.of('X', [error], 3)))
    assert many.errors[0].element == '<name>'
    # rebuilt from its message alone, as MMEngine's registry re-raises
    assert str(MalformedAnnotationError('class `X`: ' + str(error))) \
        .endswith(str(error))
