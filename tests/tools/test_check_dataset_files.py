"""``tools/check_dataset.py --files``: which samples a run's files name
(in process; tests/engine/test_spike_injection.py runs the tool on a real
run's event log)."""
import json

import pytest

from mmsafe.tools_lib.dataset_check.file_list import (read_file_list,
                                                      select_indices)


class _Dataset:
    """Map-style dataset of data infos (what the selection reads)."""

    def __init__(self, infos):
        self.infos = infos

    def __len__(self):
        return len(self.infos)

    def get_data_info(self, index):
        return self.infos[index]


def test_event_log_report_and_text_lists(tmp_path):
    events = tmp_path / 'mmsafe_events.jsonl'
    events.write_text('\n'.join(json.dumps(r) for r in [
        dict(kind='step_skip',
             files=['d/vis/1.jpg | d/ir/1.jpg', 'd/vis/2.jpg']),
        dict(kind='empty_batch', files=['d/vis/9.jpg']),
        dict(kind='rollback', files=['d/vis/3.jpg', 'd/vis/2.jpg']),
    ]) + '\n{"kind": "step_sk')  # a line cut short by a killed writer
    assert read_file_list(str(events)) == [
        'd/vis/1.jpg', 'd/ir/1.jpg', 'd/vis/2.jpg', 'd/vis/3.jpg']
    report = tmp_path / 'safety_report.json'
    report.write_text(json.dumps(dict(repeated_offenders=[
        dict(file='d/vis/4.jpg', skips=2)])))
    assert read_file_list(str(report)) == ['d/vis/4.jpg']
    listed = tmp_path / 'list.txt'
    listed.write_text('# from the log\nd/vis/5.jpg  # the spike\n\n')
    assert read_file_list(str(listed)) == ['d/vis/5.jpg']
    empty = tmp_path / 'empty.txt'
    empty.write_text('# nothing\n')
    with pytest.raises(ValueError, match='no image path'):
        read_file_list(str(empty))


def test_a_sample_is_selected_by_either_image_and_any_spelling():
    dataset = _Dataset([
        dict(img_path='/data/LLVIP/visible/train/1.jpg',
             ir_img_path='/data/LLVIP/infrared/train/1.jpg'),
        dict(img_path='/data/LLVIP/visible/train/2.jpg',
             ir_img_path='/data/LLVIP/infrared/train/2.jpg'),
        dict(img_path='/data/LLVIP/visible/train/12.jpg',
             ir_img_path='/data/LLVIP/infrared/train/12.jpg'),
    ])
    found, missing = select_indices(dataset, [
        'LLVIP/infrared/train/2.jpg',  # relative, infrared
        '/data/LLVIP/visible/train/1.jpg',
        'visible/train/7.jpg'])
    # 2.jpg does not select 12.jpg: whole path components only
    assert found == [0, 1]
    assert missing == ['visible/train/7.jpg']
