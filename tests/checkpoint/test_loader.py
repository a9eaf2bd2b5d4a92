"""Healthy checkpoints load with mmsafe's loader exactly as ``torch.load``
reads them: MMEngine runner checkpoints, MMDetection's model zoo format,
torchvision/timm-style state dicts, every tensor dtype and layout this
torch saves, numpy data; memory-mapped or read, from a path or a file
object, with every form of ``map_location``."""
import collections
import io
import os.path as osp
import zipfile

import numpy as np
import pytest
import torch

import mmsafe  # noqa: F401
from mmsafe.checkpoint import (CheckpointFormatError, checkpoint_meta,
                               load_checkpoint_file)
from mmsafe.compat import tensor_dtypes
from tests.checkpoint.fuzz import runner_like_checkpoint, same_data


def _save(obj, tmp_path, name='ckpt.pth', **kwargs):
    path = str(tmp_path / name)
    torch.save(obj, path, **kwargs)
    return path


@pytest.mark.parametrize('mmap', [False, True])
def test_runner_checkpoint_loads_as_torch_reads_it(tmp_path, mmap):
    from mmengine.logging import HistoryBuffer
    saved = runner_like_checkpoint()
    path = _save(saved, tmp_path)
    loaded = load_checkpoint_file(path, map_location='cpu', mmap=mmap)
    assert same_data(loaded, saved)
    hub = loaded['message_hub']
    loss = hub['log_scalars']['train/loss']
    assert type(loss) is HistoryBuffer
    assert loss.mean() == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert loss.statistics('max') == 1.0
    assert loaded['state_dict']._metadata['']['version'] == 1
    assert loaded['optimizer']['state'][0]['momentum_buffer'].shape == \
        (4, 3, 3, 3)
    assert loaded['param_schedulers'][1]['milestones'] == {3: 1, 5: 1}
    assert type(loaded['meta']['seed']) is np.int64


@pytest.mark.parametrize('protocol', [3, 4, 5])
def test_every_pickle_protocol_of_torch_save(tmp_path, protocol):
    saved = runner_like_checkpoint()
    path = _save(saved, tmp_path, pickle_protocol=protocol)
    assert same_data(load_checkpoint_file(path), saved)


def test_mmdetection_zoo_and_plain_state_dicts(tmp_path):
    """MMDetection's model zoo files (``state_dict`` + ``meta`` with the
    config text and class names) and torchvision/timm files (a bare state
    dict, BatchNorm's ``num_batches_tracked`` int64 scalars)."""
    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3),
                                   torch.nn.BatchNorm2d(8))
    zoo = dict(meta=dict(mmdet_version='3.3.0', CLASSES=('person', 'car'),
                         config='model = dict(type="FasterRCNN")',
                         time='Thu Jan 30 2020'),
               state_dict=backbone.state_dict())
    for obj in (zoo, backbone.state_dict()):
        loaded = load_checkpoint_file(_save(obj, tmp_path))
        assert same_data(loaded, obj)
    assert loaded['1.num_batches_tracked'].dtype == torch.int64
    assert loaded['1.num_batches_tracked'].dim() == 0


def test_every_tensor_dtype_layout_and_value_kind(tmp_path):
    base = torch.arange(24.).reshape(4, 6)
    tensors = dict(
        view=base[1:3, ::2], transposed=base.t(), empty=torch.empty(0, 5),
        scalar=torch.tensor(3.5), broadcast=torch.ones(1).expand(5),
        shared_a=base, shared_b=base[2], param=torch.nn.Parameter(base),
        frozen=torch.nn.Parameter(base.clone(), requires_grad=False),
        grad=torch.ones(3, requires_grad=True))
    for name, dtype in tensor_dtypes().items():
        try:
            tensors[name] = torch.zeros(3, dtype=dtype)
            torch.save(tensors[name], io.BytesIO())
        except (RuntimeError, TypeError, KeyError, NotImplementedError):
            tensors.pop(name, None)  # quantized or not saveable here
    values = dict(tensors=tensors, size=torch.Size([2, 3]),
                  device=torch.device('cpu'), dtype=torch.float16,
                  cplx=1 + 2j, raw=b'\x00\xff', empty_raw=b'',
                  buffer=bytearray(b'ab'), ints={1, 2}, names=frozenset('a'),
                  nan=float('nan'), big=2**70, nested=[(1, 'a'), {'k': None}],
                  array=np.arange(6, dtype='<i4').reshape(2, 3),
                  fortran=np.asfortranarray(np.ones((2, 3))),
                  text=np.array(['ab', 'c']), flags=np.array([True, False]),
                  scalars=[np.float32(0.5), np.bool_(True), np.int8(-3),
                           np.str_('x'), np.complex64(1j)],
                  dtypes=[np.dtype('f2'), np.dtype('U3'), np.dtype('>u8')])
    loaded = load_checkpoint_file(_save(values, tmp_path))
    assert same_data(loaded, values)
    got = loaded['tensors']
    assert got['shared_b'].untyped_storage().data_ptr() == \
        got['shared_a'].untyped_storage().data_ptr()
    assert got['view'].stride() == (6, 2) and got['broadcast'].stride() == \
        (0, )
    assert type(got['param']) is torch.nn.Parameter
    assert got['param'].requires_grad and not got['frozen'].requires_grad
    assert got['grad'].requires_grad
    assert loaded['fortran'].flags['F_CONTIGUOUS']
    # numpy's own unpickling turns a big-endian array into native order
    swapped = load_checkpoint_file(_save(
        np.arange(6, dtype='>i4'), tmp_path, 'big_endian_array.pth'))
    assert swapped.tolist() == list(range(6)) and swapped.dtype == np.int32


@pytest.mark.parametrize('map_location', [
    None, 'cpu', torch.device('cpu'), {'cpu': 'cpu'},
    lambda storage, location: storage, lambda storage, location: None])
def test_map_location_forms(tmp_path, map_location):
    path = _save(dict(w=torch.arange(4.)), tmp_path)
    loaded = load_checkpoint_file(path, map_location=map_location)
    assert torch.equal(loaded['w'], torch.arange(4.))


def test_map_location_callable_sees_each_storage_and_its_location(tmp_path):
    path = _save(dict(a=torch.ones(2), b=torch.zeros(3, dtype=torch.int8)),
                 tmp_path)
    seen = []

    def where(storage, location):
        seen.append((storage.nbytes(), location))
        return storage

    load_checkpoint_file(path, map_location=where)
    assert sorted(seen) == [(3, 'cpu'), (8, 'cpu')]
    with pytest.raises(TypeError, match='map_location'):
        load_checkpoint_file(path, map_location=lambda s, loc: 'not one')


def test_file_objects_and_mmap_semantics(tmp_path):
    path = _save(dict(w=torch.arange(4.)), tmp_path)
    with open(path, 'rb') as f:
        assert torch.equal(load_checkpoint_file(f)['w'], torch.arange(4.))
    data = io.BytesIO()
    torch.save(dict(w=torch.arange(4.)), data)
    data.seek(0)
    assert torch.equal(load_checkpoint_file(data)['w'], torch.arange(4.))
    with pytest.raises(ValueError, match='file name'):
        load_checkpoint_file(io.BytesIO(data.getvalue()), mmap=True)
    # a memory-mapped tensor is private: writing it leaves the file as it is
    mapped = load_checkpoint_file(path, mmap=True)['w']
    mapped += 1
    assert torch.equal(load_checkpoint_file(path)['w'], torch.arange(4.))


def test_checkpoint_meta_reads_the_meta_only(tmp_path):
    path = _save(dict(meta=dict(seed=5, epoch=2),
                      state_dict=dict(w=torch.ones(3))), tmp_path)
    assert checkpoint_meta(path) == dict(seed=5, epoch=2)
    assert checkpoint_meta(_save(dict(w=torch.ones(1)), tmp_path, 'x')) == {}


def test_preemption_stop_checkpoint_state_loads(tmp_path):
    """A stop checkpoint's meta holds every generator's state (lists of
    ints, a uint8 tensor, a numpy key tensor) and per-rank buffers."""
    from mmsafe.rng import RNGState
    state = RNGState().state_dict()
    meta = dict(mmsafe_resume=dict(
        rng=state, ranks=[dict(rank=0, iter=7, buffers=dict(
            running_mean=torch.zeros(4)))], signals=['SIGTERM']))
    saved = dict(meta=meta, state_dict={})
    loaded = load_checkpoint_file(_save(saved, tmp_path))
    assert same_data(loaded, saved)
    RNGState.from_state_dict(loaded['meta']['mmsafe_resume']['rng'])


def test_other_torch_layouts_load(tmp_path):
    """What torch 2.1 writes (no .format_version, .storage_alignment) and
    what newer torch writes (those two records; dtypes without a storage
    class as an untyped storage and ``_rebuild_tensor_v3``) both load,
    whichever torch this is."""
    path = _save(dict(w=torch.arange(3.)), tmp_path)
    with zipfile.ZipFile(path) as archive:
        records = [(i.filename, archive.read(i))
                   for i in archive.infolist()]
    folder = records[0][0].split('/')[0]
    plain = [(n, d) for n, d in records
             if not n.endswith(('.format_version', '.storage_alignment'))]
    newer = plain + [(f'{folder}/.format_version', b'1'),
                     (f'{folder}/.storage_alignment', b'64')]
    for name, layout in (('plain', plain), ('newer', newer)):
        target = str(tmp_path / f'{name}.pth')
        with zipfile.ZipFile(target, 'w') as archive:
            for record, data in layout:
                archive.writestr(record, data)
        assert torch.equal(load_checkpoint_file(target)['w'],
                           torch.arange(3.))
    v3 = _v3_checkpoint(str(tmp_path / 'v3.pth'))
    assert load_checkpoint_file(v3)['w'].tolist() == [1, 2]


def _v3_checkpoint(path):
    """``_rebuild_tensor_v3`` of an untyped storage as int16, as newer
    torch pickles uint16/uint32/float8 tensors."""
    from tests.checkpoint import payloads as p
    pid = (p.MARK + p.op_str('storage') +
           p.op_global('torch.storage', 'UntypedStorage') + p.op_str('0') +
           p.op_str('cpu') + p.op_int(4) + p.TUPLE + p.BINPERSID)
    tensor = (p.op_global('torch._utils', '_rebuild_tensor_v3') + p.MARK +
              pid + p.op_int(0) + p.op_int(2) + p.TUPLE1 + p.op_int(1) +
              p.TUPLE1 + p.FALSE + p.op_global('collections', 'OrderedDict')
              + p.EMPTY_TUPLE + p.REDUCE + p.op_global('torch', 'int16') +
              p.TUPLE + p.REDUCE)
    return p.write_zip(path, p.in_dict(('w', tensor)),
                       {'0': np.array([1, 2], np.int16).tobytes()})


@pytest.mark.slow
def test_checkpoints_of_the_other_torch_venv(tmp_path):
    """Files saved by the other torch of this checkout (``.venv`` /
    ``.venv-newest``), where its set-up finished (tools/setup_env.sh
    writes ``.mmsafe-setup`` last; a set-up stopped before torch leaves a
    bare venv): a real cross-version check."""
    import subprocess
    import sys
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    venvs = [osp.join(root, v) for v in ('.venv', '.venv-newest')]
    others = [osp.join(v, 'bin', 'python') for v in venvs
              if osp.exists(osp.join(v, 'bin', 'python'))
              and osp.exists(osp.join(v, '.mmsafe-setup'))
              and osp.realpath(v) != osp.realpath(sys.prefix)]
    if not others:
        pytest.skip('no other torch venv in this checkout')
    script = ('import sys, torch, numpy as np, collections\n'
              'torch.save(dict(w=torch.arange(6.).reshape(2, 3)[:, 1:], '
              'h=torch.zeros(2, dtype=torch.bfloat16), a=np.arange(3), '
              's=np.float64(0.5), c=collections.Counter({3: 1}), '
              'sd=torch.nn.Linear(2, 2).state_dict()), sys.argv[1])\n')
    for index, python in enumerate(others):
        path = str(tmp_path / f'other_{index}.pth')
        subprocess.run([python, '-c', script, path], check=True,
                       timeout=300)
        loaded = load_checkpoint_file(path)
        assert loaded['w'].tolist() == [[1., 2.], [4., 5.]]
        assert loaded['h'].dtype == torch.bfloat16
        assert loaded['a'].tolist() == [0, 1, 2] and loaded['s'] == 0.5
        assert loaded['sd']._metadata['']['version'] == 1


def test_a_dtype_this_torch_lacks_is_named(tmp_path):
    from tests.checkpoint import payloads as p
    path = p.write_zip(str(tmp_path / 'x.pth'), p.in_dict(
        ('d', p.op_global('torch', 'uint77'))))
    with pytest.raises(CheckpointFormatError, match='torch.uint77, which '
                       'this torch'):
        load_checkpoint_file(path)


def test_counter_and_ordered_dict_without_items(tmp_path):
    path = _save(dict(c=collections.Counter(), o=collections.OrderedDict()),
                 tmp_path)
    loaded = load_checkpoint_file(path)
    assert loaded == dict(c=collections.Counter(),
                          o=collections.OrderedDict())
