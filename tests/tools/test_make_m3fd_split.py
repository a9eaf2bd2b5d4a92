"""tools/make_m3fd_split.py: M3FD's split, deterministic and readable by
the M3FD config (in process: the script's main())."""
import json
import os
import os.path as osp

import pytest

from tests.utils import REPO_ROOT



@pytest.fixture(scope='module')
def tool():
    from mmsafe.tools import make_m3fd_split
    return make_m3fd_split


def _vis_tree(root: str, num: int) -> str:
    """Empty ``Vis/NNNNN.png`` files: the tool lists names only."""
    os.makedirs(osp.join(root, 'Vis'))
    for i in range(num):
        open(osp.join(root, 'Vis', f'{i:05d}.png'), 'wb').close()
    return root


def _read(root: str, name: str):
    with open(osp.join(root, 'ImageSets', f'{name}.txt')) as f:
        return f.read().split('\n')[:-1]


def test_default_split_is_8_1_1_sorted_disjoint_and_stable(
        tool, tmp_path, capsys):
    root = _vis_tree(str(tmp_path / 'M3FD_Detection'), 4200)
    assert tool.main([root]) == 0
    lists = {n: _read(root, n) for n in ('train', 'val', 'test')}
    assert {n: len(v) for n, v in lists.items()} == dict(
        train=3360, val=420, test=420)
    assert all(v == sorted(v) for v in lists.values())
    every = lists['train'] + lists['val'] + lists['test']
    assert sorted(every) == [f'{i:05d}' for i in range(4200)]
    assert 'train: 3360 frames' in capsys.readouterr().out
    # the lists depend on the frames and the seed only: the same again
    from mmsafe.tools_lib.m3fd_split import split_by_ratios
    assert split_by_ratios(every) == lists
    other = split_by_ratios(every, seed=1)
    assert other['val'] != lists['val'] and len(other['val']) == 420
    # frames shuffled, not taken in order
    assert lists['val'][0] != '03780' and lists['test'][-1] != '04199'
    # a frame fewer moves at most the frames at the cuts
    fewer = split_by_ratios(every[1:])
    side = {s: n for n, v in lists.items() for s in v}
    moved = [s for n, v in fewer.items() for s in v if side[s] != n]
    assert len(moved) <= 2


def test_blocks_keep_consecutive_frames_together(tool, tmp_path):
    from mmsafe.tools_lib.m3fd_split import split_by_ratios
    stems = [f'{i:05d}' for i in range(400)]
    lists = split_by_ratios(stems, (0.8, 0.2), seed=3, block=20)
    assert list(lists) == ['train', 'val']
    assert len(lists['train']) == 320 and len(lists['val']) == 80
    for found in lists.values():
        blocks = {int(s) // 20 for s in found}
        assert sum(1 for s in stems if int(s) // 20 in blocks) == \
            len(found)
    with pytest.raises(ValueError, match='not a number'):
        split_by_ratios(['a', 'b'], block=2)


def test_existing_lists_are_kept_unless_forced(tool, tmp_path, capsys):
    root = _vis_tree(str(tmp_path / 'M3FD_Detection'), 50)
    assert tool.main([root]) == 0
    first = _read(root, 'val')
    assert tool.main([root]) == 0  # the same lists: nothing to protect
    assert tool.main([root, '--seed', '7']) == 1
    assert 'train.txt exists with other frames' in capsys.readouterr().err
    assert _read(root, 'val') == first
    assert tool.main([root, '--seed', '7', '--force']) == 0
    assert _read(root, 'val') != first
    assert tool.main([str(tmp_path / 'nowhere')]) == 1
    assert 'M3FD_Detection folder' in capsys.readouterr().err
    assert tool.main([root, '--ratios', '1']) == 1


def test_tardal_scenario_file(tool, tmp_path):
    root = _vis_tree(str(tmp_path / 'M3FD_Detection'), 30)
    scenario = str(tmp_path / 'scenario.json')
    with open(scenario, 'w') as f:
        json.dump([{'name': 'road', 'scene': [
            {'name': 'a', 'mode': 'train', 'range': [{'min': 0, 'max': 9},
                                                     {'min': 20, 'max': 24}]},
            {'name': 'b', 'mode': 'val', 'range': [{'min': 10, 'max': 19}]},
        ]}], f)
    assert tool.main([root, '--scenario', scenario]) == 0
    assert _read(root, 'train') == [f'{i:05d}' for i in
                                    list(range(10)) + list(range(20, 25))]
    assert _read(root, 'val') == [f'{i:05d}' for i in range(10, 20)]
    assert not osp.exists(osp.join(root, 'ImageSets', 'test.txt'))
    with open(scenario, 'w') as f:
        json.dump([{'name': 'x', 'scene': [
            {'name': 'c', 'mode': 'val', 'range': [{'min': 28, 'max': 31}]}
        ]}], f)
    with pytest.raises(ValueError, match='2 frames that are not among'):
        from mmsafe.tools_lib.m3fd_split import make_split
        make_split(root, scenario=scenario, force=True)


def test_the_config_reads_the_lists(tmp_path):
    """The lists the tool writes are the ones the M3FD config reads."""
    from mmengine.config import Config
    from mmsafe.tools_lib.m3fd_split import make_split
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', '_base_',
                                   'datasets', 'm3fd.py'))
    root = _vis_tree(str(tmp_path / 'M3FD_Detection'), 20)
    paths = make_split(root)
    assert osp.relpath(paths['train'], root) == \
        cfg.train_dataloader.dataset.ann_file
    assert osp.relpath(paths['val'], root) == \
        cfg.val_dataloader.dataset.ann_file
