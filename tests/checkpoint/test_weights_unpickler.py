"""Weights-only loading on every supported torch.

The same checkpoints load and the same malicious payloads are refused,
without running, through each mechanism this torch can use: torch's own
``weights_only=True`` with mmsafe's allowlist (where ``add_safe_globals``
takes ``(object, name)`` pairs) and mmsafe's weights-only unpickler (the
only one on older torch; tested on every torch by forcing it).
"""
import collections
import io
import os
import os.path as osp

import numpy as np
import pytest
import torch

import mmsafe  # noqa: F401
from mmsafe.checkpoint import trust, weights_unpickler
from mmsafe.compat import native_safe_globals
from tests.engine import ckpt_toys


class _CallOsSystem:

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}', )


class _Eval:

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return eval, (f"open({self.marker!r}, 'w')", )


class _GetattrCallable:
    """Pickles as ``getattr(owner, name)``; callable, so that pickle lets
    it stand as the function of another object's reduce."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __call__(self, *args):
        raise AssertionError('never called while pickling')

    def __reduce__(self):
        return getattr, (self.owner, self.name)


class _GetattrThenCall:
    """``getattr(HistoryBuffer, '__init__')(marker)``: a getattr chain that
    reaches a method outside HistoryBuffer's statistics and calls it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        from mmengine.logging import HistoryBuffer
        return _GetattrCallable(HistoryBuffer, '__init__'), (self.marker, )


def _history_hub():
    from mmengine.logging import HistoryBuffer
    buffer = HistoryBuffer()
    buffer.update(1.5)
    buffer.update(2.5)
    return buffer


def _checkpoint(extra=None):
    """What an MMEngine/MMDetection checkpoint holds (message hub buffers,
    numpy arrays, scalars and dtypes, Counter milestones, bytes)."""
    ckpt = dict(
        meta=dict(epoch=2, iter=8, seed=np.int64(7), note=b'\x00\xffbytes',
                  dataset_meta=dict(classes=('person', ))),
        state_dict=collections.OrderedDict(
            w=torch.arange(6.).reshape(2, 3),
            b=torch.zeros(3, dtype=torch.bfloat16)),
        message_hub=dict(log_scalars={'train/loss': _history_hub()},
                         runtime_info=dict(arr=np.arange(4, dtype=np.int16),
                                           dtype=np.dtype('float32'),
                                           scale=np.float64(0.5)),
                         resumed_keys={}),
        param_schedulers=[dict(milestones=collections.Counter({8: 1}))],
        device=torch.device('cpu'))
    ckpt.update(extra or {})
    return ckpt


def _save(obj, tmp_path, name='ckpt.pth'):
    path = str(tmp_path / name)
    torch.save(obj, path)
    return path


def _load_native(path):
    with trust.trusted_checkpoint_globals():
        return torch.load(path, map_location='cpu', weights_only=True)


def _load_mmsafe_unpickler(path):
    items = [*trust.allowed_globals(), *trust._env_trusted()]
    return torch.load(path, map_location='cpu',
                      pickle_module=weights_unpickler.pickle_module(
                          weights_unpickler.allowlist(items)))


LOADERS = {
    'load_checkpoint_file': lambda path: trust.load_checkpoint_file(path),
    'mmsafe_unpickler': _load_mmsafe_unpickler,
    'torch_weights_only': _load_native,
}


def _loader(name):
    if name == 'torch_weights_only' and not native_safe_globals():
        pytest.skip('this torch cannot extend weights_only with (object, '
                    'name) pairs; mmsafe_unpickler is its mechanism')
    return LOADERS[name]


@pytest.mark.parametrize('how', sorted(LOADERS))
def test_mmengine_checkpoint_content_loads(tmp_path, how):
    load = _loader(how)
    loaded = load(_save(_checkpoint(), tmp_path))
    assert loaded['meta']['epoch'] == 2 and loaded['meta']['seed'] == 7
    assert loaded['meta']['note'] == b'\x00\xffbytes'
    assert torch.equal(loaded['state_dict']['w'],
                       torch.arange(6.).reshape(2, 3))
    assert loaded['state_dict']['b'].dtype == torch.bfloat16
    hub = loaded['message_hub']
    assert hub['log_scalars']['train/loss'].mean() == 2.0
    assert hub['runtime_info']['arr'].dtype == np.int16
    assert hub['runtime_info']['dtype'] == np.dtype('float32')
    assert loaded['param_schedulers'][0]['milestones'] == {8: 1}
    assert loaded['device'] == torch.device('cpu')


PAYLOADS = {
    'os.system': (_CallOsSystem, r'posix\.system|os\.system|nt\.system'),
    'eval': (_Eval, 'eval'),
    'getattr chain': (_GetattrThenCall, 'getattr'),
    'exec': (ckpt_toys.ExecPayload, 'exec'),
    'marker function': (ckpt_toys.MarkerPayload, 'create_marker'),
}


@pytest.mark.parametrize('how', sorted(LOADERS))
@pytest.mark.parametrize('payload', sorted(PAYLOADS))
def test_malicious_payload_refused_without_running(tmp_path, how, payload):
    import pickle
    load = _loader(how)
    cls, named = PAYLOADS[payload]
    marker = str(tmp_path / 'pwned')
    path = _save(_checkpoint(dict(evil=cls(marker))), tmp_path)
    with pytest.raises(pickle.UnpicklingError, match=named):
        load(path)
    assert not osp.exists(marker), 'the checkpoint ran code while loading'
    # explain_refusals names the object and the opt-in (the getattr
    # stand-in names the attribute it refuses and what does resolve)
    with pytest.raises(trust.UntrustedCheckpointError,
                       match='mmsafe_trusted_globals|only the statistics '
                       'methods of mmengine.logging.HistoryBuffer'):
        with trust.explain_refusals(path):
            load(path)
    assert not osp.exists(marker)


@pytest.mark.parametrize('how', sorted(LOADERS))
def test_numpy_object_array_refused(tmp_path, how):
    import pickle
    load = _loader(how)
    path = _save(_checkpoint(dict(
        evil=np.array([1, 'text', None], dtype=object))), tmp_path)
    with pytest.raises(pickle.UnpicklingError):
        load(path)


def test_unpickler_refuses_class_attribute_writes_and_old_opcodes():
    """What a restricted ``find_class`` alone would let through."""
    import pickle
    from mmengine.logging import HistoryBuffer
    module = weights_unpickler.pickle_module(
        weights_unpickler.allowlist(trust.allowed_globals()))
    # BUILD on a class object: would set HistoryBuffer.min = 1
    build_on_class = (b'\x80\x02cmmengine.logging.history_buffer\n'
                      b'HistoryBuffer\nN}X\x03\x00\x00\x00minK\x01s\x86b.')
    # INST (protocol 0 object creation) and EXT1 (copyreg registry)
    inst = b'(icollections\nOrderedDict\n.'
    ext = b'\x80\x02\x82\x01.'
    for data in (build_on_class, inst, ext):
        with pytest.raises(pickle.UnpicklingError):
            module.load(io.BytesIO(data))
    assert not isinstance(HistoryBuffer.__dict__.get('min'), int)
    # calling an object that is not allowed (a bound method from the stack)
    with pytest.raises(pickle.UnpicklingError, match='unrecognized function'):
        module.load(io.BytesIO(
            b'\x80\x02cbuiltins\ngetattr\ncmmengine.logging.history_buffer'
            b'\nHistoryBuffer\nX\x03\x00\x00\x00min\x86R)R.'))


def test_trust_opt_in_reaches_mmsafe_unpickler(tmp_path):
    """A config's mmsafe_trusted_globals works on both mechanisms."""
    from mmengine.config import Config
    path = _save(dict(meta=dict(note=ckpt_toys.TrustedNote('hi')),
                      state_dict={}), tmp_path)
    name = 'tests.engine.ckpt_toys.TrustedNote'
    with pytest.raises(trust.UntrustedCheckpointError, match=name):
        with trust.explain_refusals(path):
            trust.load_checkpoint_file(path)
    with trust.trusted_checkpoint_globals(
            cfg=Config(dict(mmsafe_trusted_globals=[name]))):
        assert trust.load_checkpoint_file(path)['meta']['note'].text == 'hi'
    with pytest.raises(Exception):
        trust.load_checkpoint_file(path)
