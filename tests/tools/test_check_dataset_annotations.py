"""tools/check_dataset.py on annotation files as users' tools write them:
every malformed file is reported in one run (file, element, line), the
rest of the split is still audited, object names that are not classes are
counted per name (the class that differs only in case or spacing named),
and documented defaults applied are counted. In-process, no workers."""
import json
import os.path as osp

from tests.tools.check_dataset_toys import write_config, write_llvip_tree


def _edit(path: str, old: str, new: str) -> str:
    with open(path, encoding='utf-8') as f:
        text = f.read()
    assert old in text, (old, text)
    text = text.replace(old, new, 1)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)
    return text


def _line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count('\n') + 1


PERSON = '<object><name>person</name>'


def test_every_malformed_file_and_unknown_name_in_one_run(tmp_path,
                                                          capsys):
    data = str(tmp_path / 'llvip')
    write_llvip_tree(data, num=6)
    ann = osp.join(data, 'Annotations')
    xml = {i: osp.join(ann, f'{i:06d}.xml') for i in range(1, 7)}
    # one line per element, so that lines tell elements apart
    for path in xml.values():
        _edit(path, '><', '>\n<')
    bad_name = _edit(xml[2], '<name>person</name>', '<name/>')
    bad_number = _edit(xml[3], '<xmin>16</xmin>', '<xmin>16,5</xmin>')
    _edit(xml[4], '</annotation>', PERSON.replace('person', 'Person') +
          '<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax>'
          '</bndbox></object></annotation>')
    _edit(xml[5], '</annotation>', PERSON.replace('person', 'dog') +
          '<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax>'
          '</bndbox></object></annotation>')
    _edit(xml[6], '<difficult>0</difficult>', '<difficult/>')
    cfg = write_config(str(tmp_path / 'cfg.py'), data)
    out = str(tmp_path / 'report.json')
    from mmsafe.tools import check_dataset
    code = check_dataset.main([cfg, '--workers', '0', '--no-progress',
                               '--no-alignment', '--json', out])
    text = capsys.readouterr().out
    assert code == 1, text
    with open(out) as f:
        report = json.load(f)
    # the four other images are audited through the pipeline
    assert report['num_samples'] == 4
    by_kind = {}
    for found in report['issues']:
        by_kind.setdefault(found['kind'], []).append(found)
    malformed = sorted(by_kind['malformed_annotation'],
                       key=lambda i: i['path'])
    assert [(i['path'], i['element'], i['line']) for i in malformed] == [
        (xml[2], '<name>', _line_of(bad_name, '<name/>')),
        (xml[3], '<xmin>', _line_of(bad_number, '<xmin>'))]
    assert all(i['severity'] == 'error' for i in malformed)
    assert f'{xml[3]}:{malformed[1]["line"]}: <xmin> is \'16,5\', ' \
        'written with a decimal comma' in text
    (variant, ) = by_kind['class_name_variant']
    assert (variant['name'], variant['count'], variant['suggestion'],
            variant['files']) == ('Person', 1, 'person', [xml[4]])
    assert "class_aliases={'Person': 'person'}" in variant['message']
    (unknown, ) = by_kind['unknown_class']
    assert (unknown['name'], unknown['count'], unknown['severity']) == \
        ('dog', 1, 'warning')
    (tally, ) = report['annotations']
    assert tally['defaults']['<difficult>']['count'] == 1
    assert tally['defaults']['<difficult>']['files'] == [xml[6]]
    assert [m['path'] for m in tally['malformed']] == [xml[2], xml[3]]
    assert report['errors'] == 3 and report['warnings'] == 1
    # the console names each malformed file and the annotation counts
    assert f'{xml[2]}:{malformed[0]["line"]}: <name> is empty' in text
    assert f"annotations (LLVIPDataset({data}/visible/train/)): 4 files, " \
        "6 objects read; <difficult> without a value 1x, read as 0 (not " \
        "difficult); 2 objects dropped, names not known: 'Person' x1, " \
        "'dog' x1; 2 malformed files left out" in text
    assert 'check_dataset: FAILED (3 errors, 1 warnings)' in text
