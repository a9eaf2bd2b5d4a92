"""The synthetic LLVIP-like demo data: layout, determinism, learnable
content, and race-safe creation by two processes at once."""
import filecmp
import multiprocessing as mp
import os
import os.path as osp

import numpy as np
import pytest

import mmsafe  # noqa: F401  (registers)
import mmsafe.datasets.synthetic_llvip as synth
from mmdet.registry import DATASETS
from mmsafe.datasets import ensure_synthetic_llvip

SMALL = dict(num_train=6, num_test=3, img_size=(96, 80), seed=3)


def tree_files(root):
    out = []
    for base, _, files in os.walk(root):
        out += [osp.relpath(osp.join(base, f), root) for f in files]
    return sorted(out)


def test_layout_is_llvip_and_dataset_reads_it(tmp_path):
    root = str(tmp_path / 'llvip')
    ensure_synthetic_llvip(root, **SMALL)
    files = tree_files(root)
    assert sum(f.startswith('visible/train/') for f in files) == 6
    assert sum(f.startswith('infrared/test/') for f in files) == 3
    assert sum(f.startswith('Annotations/') for f in files) == 9
    assert 'visible/train/010001.jpg' in files
    assert 'infrared/test/190001.jpg' in files
    ds = DATASETS.build(dict(type='LLVIPDataset', data_root=root,
                             synthetic=SMALL))
    test = DATASETS.build(dict(type='LLVIPDataset', data_root=root,
                               data_prefix=dict(img='visible/test/'),
                               test_mode=True))
    assert (len(ds), len(test)) == (6, 3)
    info = ds.get_data_info(0)
    assert (info['width'], info['height']) == (96, 80)
    assert info['ir_img_path'].endswith('infrared/train/010001.jpg')


def test_deterministic_bytes_and_seed_dependent(tmp_path):
    a, b, c = (str(tmp_path / n) for n in 'abc')
    ensure_synthetic_llvip(a, **SMALL)
    ensure_synthetic_llvip(b, **SMALL)
    ensure_synthetic_llvip(c, **dict(SMALL, seed=4))
    files = tree_files(a)
    assert files == tree_files(b)
    match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert mismatch == [] and errors == []
    _, mismatch_c, _ = filecmp.cmpfiles(a, c, files, shallow=False)
    assert len(mismatch_c) > len(files) // 2


def test_content_is_learnable_person_like():
    params = synth.synthetic_params(num_train=80, num_test=0)
    counts, heights, aspects, ir_contrast, vis_contrast = [], [], [], [], []
    for i in range(80):
        vis, ir, boxes = synth.render_pair(params, 'train', i)
        assert vis.shape == ir.shape == (128, 160, 3)
        assert np.array_equal(ir[..., 0], ir[..., 1])  # grey, 3 channels
        counts.append(len(boxes))
        fg = np.zeros(ir.shape[:2], bool)
        for x1, y1, x2, y2 in boxes:
            assert 0 <= x1 < x2 < 160 and 0 <= y1 < y2 < 128
            heights.append(y2 - y1 + 1)
            aspects.append((x2 - x1 + 1) / (y2 - y1 + 1))
            fg[y1 + (y2 - y1) // 4:y2 - (y2 - y1) // 4,
               x1 + (x2 - x1) // 3:x2 - (x2 - x1) // 3 + 1] = True
        if boxes:
            bg = ~fg
            ir_contrast.append(ir[..., 0][fg].mean() - ir[..., 0][bg].mean())
            grey = vis.mean(-1)
            vis_contrast.append(abs(grey[fg].mean() - grey[bg].mean()))
    counts = np.array(counts)
    assert counts.max() <= 4 and 0.05 <= (counts == 0).mean() <= 0.35
    assert {1, 2, 3, 4} <= set(counts.tolist())
    assert 12 <= min(heights) and max(heights) <= 61
    assert 0.3 <= min(aspects) and max(aspects) <= 0.85
    # warm, bright people in infrared; dim, low-contrast ones in visible
    assert np.mean(ir_contrast) > 80
    assert np.mean(vis_contrast) < 30
    assert np.mean(ir_contrast) > 3 * np.mean(vis_contrast)


def test_refuses_to_write_into_real_data(tmp_path):
    root = tmp_path / 'LLVIP'
    (root / 'visible').mkdir(parents=True)
    with pytest.raises(FileExistsError, match='not a synthetic'):
        ensure_synthetic_llvip(str(root), **SMALL)


def test_other_parameters_are_an_error(tmp_path):
    root = str(tmp_path / 'llvip')
    ensure_synthetic_llvip(root, **SMALL)
    with pytest.raises(ValueError, match='other parameters'):
        ensure_synthetic_llvip(root, **dict(SMALL, num_train=7))


def test_loser_of_the_race_uses_the_winners_tree(tmp_path, monkeypatch):
    """Deterministic race: another process renames its tree into place
    while this one is still writing its own."""
    root = str(tmp_path / 'llvip')
    real_write = synth.write_tree
    lines = []
    monkeypatch.setattr(synth, 'log', lambda m, level=None: lines.append(m))

    def write_then_lose(tmp, params):
        stats = real_write(tmp, params)
        real_write(root + '.winner', params)
        os.rename(root + '.winner', root)
        with open(osp.join(root, 'winner'), 'w') as f:
            f.write('x')
        return stats

    monkeypatch.setattr(synth, 'write_tree', write_then_lose)
    assert ensure_synthetic_llvip(root, **SMALL) == osp.abspath(root)
    assert osp.exists(osp.join(root, 'winner'))
    assert any('another process created' in m for m in lines), lines
    assert sorted(os.listdir(tmp_path)) == ['llvip']  # no temp left over


def _create(root, barrier, queue):
    lines = []
    synth.log = lambda m, level=None: lines.append(m)
    barrier.wait(timeout=120)
    try:
        ensure_synthetic_llvip(root, **dict(SMALL, num_train=120))
        queue.put(('ok', lines))
    except Exception as e:  # reported to the parent, which fails the test
        queue.put(('error', repr(e)))


@pytest.mark.timeout(300)
def test_two_processes_create_at_once(tmp_path):
    root = str(tmp_path / 'data' / 'llvip')
    ctx = mp.get_context('spawn')
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_create, args=(root, barrier, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [r[0] for r in results] == ['ok', 'ok'], results
    logs = [' '.join(r[1]) for r in results]
    assert sum(f'created {osp.abspath(root)}:' in log for log in logs) == 1
    # the other one lost the race (usual) or came after the rename
    assert sum(('another process created' in log) or
               ('using existing' in log) for log in logs) == 1
    assert os.listdir(osp.dirname(root)) == ['llvip']
    ds = DATASETS.build(dict(type='LLVIPDataset', data_root=root))
    assert len(ds) == 120
