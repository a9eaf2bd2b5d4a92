"""tools/check_dataset.py on 16-bit thermal trees: the default loader's
refusal is reported for every pair, naming the rules that keep the depth;
a frame cut to its high byte is nearly constant, and the pairing checks
abstain on it instead of blaming the pairing. In-process, no workers."""
import json

import cv2
import numpy as np

from tests.datasets.thermal16 import write_thermal_tree
from tests.tools.check_dataset_toys import write_config


def _check(tmp_path, data, capsys, *args):
    from mmsafe.tools import check_dataset
    cfg = write_config(str(tmp_path / 'cfg.py'), data)
    out = str(tmp_path / 'report.json')
    code = check_dataset.main([cfg, '--workers', '0', '--no-progress',
                               '--json', out, *args])
    capsys.readouterr()
    with open(out) as f:
        return code, json.load(f)


def test_16bit_refusal_is_reported_per_pair(tmp_path, capsys):
    data = str(tmp_path / 'llvip')
    write_thermal_tree(data, '.png')
    code, report = _check(tmp_path, data, capsys)
    assert code == 1
    errors = [i for i in report['issues'] if i['kind'] == 'pipeline_error']
    assert len(errors) == 2, report['issues']
    for found in errors:
        assert '16 bits per channel (values 51300-52150)' in \
            found['message'] and 'high_depth' in found['message']


def test_high_byte_frames_are_nearly_constant_not_misaligned(tmp_path,
                                                             capsys):
    data = str(tmp_path / 'llvip')
    for path, counts in write_thermal_tree(data, '.png').items():
        cv2.imwrite(path, (counts >> 8).astype(np.uint8))
    code, report = _check(tmp_path, data, capsys)
    kinds = [i['kind'] for i in report['issues']]
    assert kinds == ['nearly_constant_modality'] * 2, report['issues']
    assert report['issues'][0]['modalities'] == ['infrared']
    assert code == 0 and report['warnings'] == 2
    assert report['object_offsets']['pairs'] == 0
