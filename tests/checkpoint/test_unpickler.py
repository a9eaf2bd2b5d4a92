"""The minimal unpickler and its allowlist: the opcodes and calls of plain
data only, every argument checked, and a result that is plain data.

Every pickle here is assembled by hand and harmless whatever happens: the
payloads that would run code or damage files are loaded only in the
sandbox (test_payloads.py)."""
import collections
import pickle
import struct

import numpy as np
import pytest
import torch

import mmsafe  # noqa: F401
from mmsafe.checkpoint import (CheckpointFormatError,
                               UntrustedCheckpointError,
                               load_checkpoint_file)
from mmsafe.checkpoint.plain_data import MAX_DEPTH
from tests.checkpoint import payloads as p

HB = ('mmengine.logging.history_buffer', 'HistoryBuffer')


def _load_pickle(tmp_path, body, storages=None, proto=p.PROTO2):
    path = p.write_zip(str(tmp_path / 'x.pth'), proto + body + p.STOP,
                       storages)
    return load_checkpoint_file(path)


def _untrusted(tmp_path, body, match, storages=None, proto=p.PROTO2):
    with pytest.raises(UntrustedCheckpointError, match=match):
        _load_pickle(tmp_path, body, storages, proto)


def _malformed(tmp_path, body, match, proto=p.PROTO2):
    with pytest.raises(CheckpointFormatError, match=match):
        _load_pickle(tmp_path, body, proto=proto)


@pytest.mark.parametrize('opcode,name', [
    (b'\x92', 'NEWOBJ_EX'), (b'i', 'INST'), (b'o', 'OBJ'),
    (b'\x82', 'EXT1'), (b'\x83', 'EXT2'), (b'\x84', 'EXT4'),
    (b'P', 'PERSID'), (b'\x97', 'NEXT_BUFFER'), (b'\x98', 'READONLY_BUFFER'),
    (b'I', 'INT'), (b'S', 'STRING'), (b'V', 'UNICODE'), (b'p', 'PUT'),
    (b'g', 'GET'), (b'T', 'BINSTRING'), (b'U', 'SHORT_BINSTRING')])
def test_object_building_and_text_opcodes_are_refused(tmp_path, opcode,
                                                      name):
    _untrusted(tmp_path, p.EMPTY_TUPLE + opcode + b'0\n',
               f'pickle opcode {name} ')


def test_newobj_only_for_message_hub_buffers(tmp_path):
    _untrusted(tmp_path, p.op_global('collections', 'OrderedDict') +
               p.EMPTY_TUPLE + p.NEWOBJ, 'NEWOBJ')
    _untrusted(tmp_path, p.op_global(*HB) + p.op_int(1) + p.TUPLE1 +
               p.NEWOBJ, 'HistoryBuffer created with arguments')
    _untrusted(tmp_path, p.op_global(*HB) + p.EMPTY_TUPLE + p.NEWOBJ,
               'never given its state')


@pytest.mark.parametrize('key,what', [
    (p.EMPTY_TUPLE, 'of type tuple'), (b'G' + struct.pack('>d', 0.5),
                                       'of type float'),
    (p.op_int(2**61), 'beyond the hash modulus'),
    (p.EMPTY_TUPLE + p.EMPTY_TUPLE + p.TUPLE2, 'of type tuple')])
def test_only_cheap_hashable_keys(tmp_path, key, what):
    _untrusted(tmp_path, p.EMPTY_DICT + key + p.op_int(1) + p.SETITEM, what)
    _untrusted(tmp_path, b'\x8f(' + key + b'\x90', what, proto=b'\x80\x04')
    _untrusted(tmp_path, b'(' + key + b'\x91', what, proto=b'\x80\x04')


def test_appends_and_setitems_reach_only_lists_dicts_and_sets(tmp_path):
    _untrusted(tmp_path, p.EMPTY_TUPLE + p.op_int(1) + b'a',
               'adding items to a tuple')
    _untrusted(tmp_path, p.op_str('x') + p.op_int(1) + p.op_int(2) +
               p.SETITEM, 'adding items to a str')
    _untrusted(tmp_path, p.EMPTY_LIST + b'(' + p.op_int(1) + b'\x90',
               'ADDITEMS on a list', proto=b'\x80\x04')


@pytest.mark.parametrize('body,match', [
    (b'', 'pops an empty stack'), (p.op_int(1) + p.op_int(2),
                                   'objects left on its stack'),
    (p.op_get(3), 'memo entry 3'), (b'e', 'no MARK'),
    (p.op_str('a')[:-1], 'truncated'), (b'\xff', 'not a pickle opcode'),
    (p.EMPTY_DICT + p.MARK + p.op_int(1) + b'u', 'odd number'),
    (b'X\x02\x00\x00\x00\xff\xfe', 'not UTF-8')])
def test_malformed_pickles(tmp_path, body, match):
    _malformed(tmp_path, body, match)


def test_pickle_framing(tmp_path):
    _malformed(tmp_path, p.NONE, 'protocol 9', proto=b'\x80\x09')
    path = p.write_zip(str(tmp_path / 'y.pth'),
                       p.PROTO2 + p.NONE + p.STOP + b'junk')
    with pytest.raises(CheckpointFormatError, match='follow the end'):
        load_checkpoint_file(path)
    path = p.write_zip(str(tmp_path / 'z.pth'), p.PROTO2 + p.NONE)
    with pytest.raises(CheckpointFormatError, match='without STOP'):
        load_checkpoint_file(path)


def test_protocol_4_and_5_pickles_of_plain_data_load(tmp_path):
    data = dict(a=[1, 2.5, 'x', b'y', None, True], s={1, 2},
                f=frozenset({'a'}), t=(1, (2, 3)), big=2**100,
                nested={'k': {'j': [()]}})
    for protocol in (4, 5):
        path = p.write_zip(str(tmp_path / f'{protocol}.pth'),
                           pickle.dumps(data, protocol=protocol))
        assert load_checkpoint_file(path) == data


def test_every_allowed_callable_checks_its_arguments(tmp_path):
    bad_calls = [
        (p.call('__builtin__', 'bytearray', p.op_int(10)), 'never of a size'),
        (p.call('__builtin__', 'bytes', p.op_int(10)), 'bytes called with 1'),
        (p.call('__builtin__', 'set', p.op_int(10)), 'set of a int'),
        (p.call('__builtin__', 'complex', p.op_str('1j'), p.op_int(0)),
         'must be a number'),
        (p.call('_codecs', 'encode', p.op_str('x'), p.op_str('rot13')),
         'latin-1 or UTF-8'),
        (p.call('collections', 'OrderedDict', p.op_int(1)),
         'called with 1'),
        (p.call('collections', 'Counter', p.EMPTY_DICT + p.op_int(1) +
                p.op_str('x') + p.SETITEM), 'must be a number'),
        (p.call('torch', 'device', p.op_str('gpu')), "torch.device of 'gpu'"),
        (p.call('torch', 'device', p.op_str('cuda'), p.op_int(-1)),
         'device index'),
        (p.call('torch', 'Size', p.op_int(-1) + p.TUPLE1), 'torch.Size'),
        (p.call('numpy', 'dtype', p.op_str('O8'), p.FALSE, p.TRUE),
         'codes of plain data'),
        (p.call('numpy', 'dtype', p.op_str('V8'), p.FALSE, p.TRUE),
         'codes of plain data'),
        (p.call('numpy', 'dtype', p.op_str('M8'), p.FALSE, p.TRUE),
         'codes of plain data'),
        (p.call('numpy', 'dtype', p.op_str('f8'), p.op_int(0), p.TRUE),
         'align must be True or False'),
        (p.call('numpy.core.multiarray', 'scalar',
                p.call('numpy', 'dtype', p.op_str('f8'), p.FALSE, p.TRUE),
                p.op_bytes(b'\0' * 3)), 'not 8 bytes'),
        (p.call('numpy._core.multiarray', '_reconstruct',
                p.op_global('numpy', 'ndarray'), p.op_int(0) + p.TUPLE1,
                p.op_str('b')), 'empty numpy.ndarray'),
        (p.call('numpy.core.multiarray', '_reconstruct',
                p.op_global('collections', 'OrderedDict'),
                p.op_int(0) + p.TUPLE1, p.op_bytes(b'b')),
         'empty numpy.ndarray'),
        (p.call('__builtin__', 'getattr', p.op_global(*HB),
                p.op_str('__init__')), 'only the statistics methods'),
        (p.call('__builtin__', 'getattr', p.op_global('collections',
                                                      'OrderedDict'),
                p.op_str('mean')), 'only the statistics methods'),
        (p.call('numpy.core.numeric', '_frombuffer', p.op_bytes(b'\0' * 4),
                p.call('numpy', 'dtype', p.op_str('f8'), p.FALSE, p.TRUE),
                p.op_int(1) + p.TUPLE1, p.op_str('C')), 'with 4 bytes'),
        (p.call('numpy._core.numeric', '_frombuffer', p.op_bytes(b''),
                p.call('numpy', 'dtype', p.op_str('f8'), p.FALSE, p.TRUE),
                p.op_int(0) + p.TUPLE1, p.op_str('K')), "order 'C' or 'F'"),
        (p.call('torch._utils', '_rebuild_parameter', p.op_int(1),
                p.FALSE, p.EMPTY_DICT), 'something other than a tensor'),
        (p.op_global('numpy', 'ndarray') + p.EMPTY_TUPLE + p.REDUCE,
         'not an allowed function'),
        (p.op_global('torch', 'FloatStorage') + p.EMPTY_TUPLE + p.REDUCE,
         'not an allowed function'),
    ]
    for body, match in bad_calls:
        _untrusted(tmp_path, body, match)


def _tensor_args(offset, size, stride, grad=p.FALSE, hooks=None,
                 extra=b''):
    hooks = hooks if hooks is not None else \
        p.op_global('collections', 'OrderedDict') + p.EMPTY_TUPLE + p.REDUCE
    return (p.op_global('torch._utils', '_rebuild_tensor_v2') + p.MARK +
            p.storage_pid('0', 4) + offset + size + stride + grad + hooks +
            extra + p.TUPLE + p.REDUCE)


def test_tensor_views_stay_inside_their_storage(tmp_path):
    four = {'0': p._float_bytes(4)}
    one = p.op_int(1) + p.TUPLE1
    good = _load_pickle(tmp_path, _tensor_args(
        p.op_int(1), p.op_int(3) + p.TUPLE1, one), four)
    assert good.tolist() == [1., 2., 3.]
    cases = [
        (p.op_int(2), p.op_int(3) + p.TUPLE1, one, 'reaches element 4'),
        (p.op_int(0), p.op_int(2) + p.op_int(2) + p.TUPLE2,
         p.op_int(3) + p.op_int(1) + p.TUPLE2, 'reaches element 4'),
        (p.op_int(5), p.op_int(0) + p.TUPLE1, one, 'past the 4 elements'),
        (p.op_int(-1), p.op_int(1) + p.TUPLE1, one, 'tensor offset'),
        (p.op_int(0), p.op_int(2) + p.TUPLE1, p.op_int(-1) + p.TUPLE1,
         'tensor stride'),
        (p.op_int(0), p.op_int(2) + p.TUPLE1, p.EMPTY_TUPLE, '1 sizes and 0'),
        (p.op_int(0), p.EMPTY_LIST, p.EMPTY_TUPLE, 'must be a tuple'),
    ]
    for offset, size, stride, match in cases:
        with pytest.raises((UntrustedCheckpointError, CheckpointFormatError),
                           match=match):
            _load_pickle(tmp_path, _tensor_args(offset, size, stride), four)
    hook = (p.op_global('collections', 'OrderedDict') + p.EMPTY_TUPLE +
            p.REDUCE + p.op_int(0) + p.op_str('hook') + p.SETITEM)
    _untrusted(tmp_path, _tensor_args(p.op_int(0), p.op_int(4) + p.TUPLE1,
                                      one, hooks=hook), 'backward hooks',
               four)
    _untrusted(tmp_path, _tensor_args(
        p.op_int(0), p.op_int(4) + p.TUPLE1, one,
        extra=p.EMPTY_DICT + p.op_str('conj') + p.TRUE + p.SETITEM),
        'metadata', four)


def test_storage_ids_are_checked(tmp_path):
    def pid(kind='FloatStorage', key='0', location='cpu', numel=4):
        return p.storage_pid(key, numel, kind, location)

    four = {'0': p._float_bytes(4)}
    for body, match in [
            (pid(location='http://x'), 'storage at location'),
            (pid(kind='QInt8Storage'), 'QInt8Storage'),
            (pid(kind='float32'), 'storage of class'),
            (pid(numel=-4), 'storage size'),
            (p.MARK + p.op_str('module') + p.TUPLE + p.BINPERSID,
             'persistent id other than')]:
        _untrusted(tmp_path, body, match, four)
    with pytest.raises(CheckpointFormatError, match='names storage 0 twice'):
        _load_pickle(tmp_path, pid() + pid(kind='IntStorage') + p.TUPLE2,
                     four)
    # a storage that no tensor uses is not data
    _untrusted(tmp_path, pid(), 'StorageRef', four)


def test_object_arrays_are_refused_every_way(tmp_path):
    bodies = [
        # a NEWOBJ of an object dtype
        p.op_global('numpy', 'dtype') + p.op_str('O8') + p.TUPLE1 + p.NEWOBJ,
        # _reconstruct of an object array
        p.call('numpy.core.multiarray', '_reconstruct',
               p.op_global('numpy', 'ndarray'), p.op_int(2) + p.TUPLE1,
               p.op_str('O')),
        # an array state whose data is a list of objects
        p._ndarray(p.EMPTY_LIST + p.MARK + p.op_str('a') + p.NONE + b'e',
                   2, 'f8'),
        # a dtype state of an object dtype (flags 63)
        p.call('numpy', 'dtype', p.op_str('f8'), p.FALSE, p.TRUE) + p.MARK +
        p.op_int(3) + p.op_str('|') + p.NONE + p.NONE + p.NONE +
        p.op_int(-1) + p.op_int(-1) + p.op_int(63) + p.TUPLE + p.BUILD,
        # ndarray.__setstate__ through torch's _rebuild_from_type_v2
        p.call('torch._tensor', '_rebuild_from_type_v2',
               p.op_global('numpy.core.multiarray', '_reconstruct'),
               p.op_global('numpy', 'ndarray'), p.EMPTY_TUPLE, p.NONE),
    ]
    for body in bodies:
        with pytest.raises(UntrustedCheckpointError):
            _load_pickle(tmp_path, body)
    for code in ('f8', 'U3', 'b1', 'c16'):
        plain = np.zeros(2, dtype=code)
        path = p.write_zip(str(tmp_path / 'ok.pth'),
                           pickle.dumps(dict(a=plain), protocol=2))
        assert load_checkpoint_file(path)['a'].dtype == plain.dtype


def test_array_data_must_match_its_shape(tmp_path):
    _untrusted(tmp_path, p._ndarray(p.op_bytes(b'\0' * 8), 2, 'f8'),
               'with 8 bytes of data')
    _untrusted(tmp_path, p._ndarray(p.op_bytes(b'\0' * 16), 2**40, 'f8'),
               'with 16 bytes of data')


def test_build_states_are_those_of_each_class(tmp_path):
    od = p.op_global('collections', 'OrderedDict') + p.EMPTY_TUPLE + \
        p.REDUCE
    for attribute in ('items', 'copy', 'keys', '__class__'):
        _untrusted(tmp_path, od + p.EMPTY_DICT + p.op_str(attribute) +
                   p.op_str('x') + p.SETITEM + p.BUILD, 'shadow a method')
    ok = od + p.EMPTY_DICT + p.op_str('_metadata') + p.EMPTY_DICT + \
        p.SETITEM + p.BUILD
    assert vars(_load_pickle(tmp_path, ok)) == {'_metadata': {}}
    _untrusted(tmp_path, ok + p.EMPTY_DICT + p.BUILD, 'BUILD')
    _untrusted(tmp_path, p.op_str('x') + p.EMPTY_DICT + p.BUILD, 'BUILD')
    _untrusted(tmp_path, p.op_global(*HB) + p.EMPTY_DICT + p.BUILD,
               'BUILD')
    _untrusted(tmp_path, p.call('numpy', 'dtype', p.op_str('f8'), p.FALSE,
                                p.TRUE) + p.MARK + p.op_int(3) +
               p.op_str('<') + p.NONE + p.NONE + p.NONE + p.op_int(4) +
               p.op_int(-1) + p.op_int(0) + p.TUPLE + p.BUILD,
               'does not write')


def _history_buffer(statistics=b'', extra=b'', logs=None):
    logs = logs or p._ndarray(p.op_bytes(struct.pack('<2d', 1.0, 3.0)), 2,
                              'f8')
    counts = p._ndarray(p.op_bytes(struct.pack('<2q', 1, 1)), 2, 'i8')
    state = (p.EMPTY_DICT + p.MARK + p.op_str('max_length') +
             p.op_int(10) + p.op_str('_log_history') + logs +
             p.op_str('_count_history') + counts + extra + p.SETITEMS)
    if statistics:
        state += p.op_str('statistics_methods') + statistics + p.SETITEM
    return p.op_global(*HB) + p.EMPTY_TUPLE + p.NEWOBJ + state + p.BUILD


def _statistic(key, name):
    return (p.op_str(key) + p.call('__builtin__', 'getattr',
                                   p.op_global(*HB), p.op_str(name)))


def test_history_buffer_is_rebuilt_without_writing_its_class(tmp_path):
    from mmengine.logging import HistoryBuffer
    HistoryBuffer()  # the built-in statistics, as any run has them
    table = dict(HistoryBuffer._statistics_methods)
    try:
        own = p.EMPTY_DICT + p.MARK + _statistic('mean', 'mean') + \
            _statistic('max', 'max') + p.SETITEMS
        buffer = _load_pickle(tmp_path, _history_buffer(own))
        assert type(buffer) is HistoryBuffer and buffer.mean() == 2.0
        assert buffer.statistics('max') == 3.0
        assert 'statistics_methods' not in vars(buffer)
        swapped = p.EMPTY_DICT + _statistic('mean', 'max') + p.SETITEM
        _untrusted(tmp_path, _history_buffer(swapped),
                   'statistics this process has registered')
        _untrusted(tmp_path, _history_buffer(
            p.EMPTY_DICT + p.op_str('mean') + p.op_int(1) + p.SETITEM),
            'statistics this process has registered')
        _untrusted(tmp_path, _history_buffer(extra=p.op_str('update') +
                                             p.NONE),
                   'HistoryBuffer state other than')
        _untrusted(tmp_path, _history_buffer(
            logs=p._ndarray(p.op_bytes(b'\0' * 8), 1, 'f8')),
            'HistoryBuffer of 1 values and 2 counts')
        # a statistics method outside a buffer's state is not data
        _untrusted(tmp_path, p.call('__builtin__', 'getattr',
                                    p.op_global(*HB), p.op_str('mean')),
                   'StatisticsMethod')
        assert HistoryBuffer._statistics_methods == table
    finally:
        HistoryBuffer._statistics_methods.clear()
        HistoryBuffer._statistics_methods.update(table)


def test_result_limits(tmp_path):
    # nesting deeper than MAX_DEPTH lists
    deep = p.EMPTY_LIST * (MAX_DEPTH + 1) + b'a' * MAX_DEPTH
    _untrusted(tmp_path, deep, 'nesting deeper')
    ok = p.EMPTY_LIST * (MAX_DEPTH - 1) + b'a' * (MAX_DEPTH - 2)
    assert _load_pickle(tmp_path, ok)
    # a list that holds itself
    _untrusted(tmp_path, p.EMPTY_LIST + p.op_put(0) + p.op_get(0) + b'a',
               'holds itself')
    # l_{i+1} = [l_i, l_i] through the memo: 2**40 nodes from ~800 bytes
    body = p.EMPTY_LIST + p.op_put(0) + b'0'
    for i in range(40):
        body += p.EMPTY_LIST + p.op_get(i) + b'a' + p.op_get(i) + b'a' + \
            p.op_put(i + 1) + b'0'
    _untrusted(tmp_path, body + p.op_get(40), 'nodes')
    # the same value shared many times is fine
    shared = p.op_str('x' * 100) + p.op_put(0) + b'0' + p.EMPTY_LIST + \
        p.MARK + p.op_get(0) * 1000 + b'e'
    assert _load_pickle(tmp_path, shared) == ['x' * 100] * 1000


def test_counter_set_and_bytes_forms(tmp_path):
    body = (p.EMPTY_DICT + p.MARK +
            p.op_str('c') + p.call('collections', 'Counter', p.EMPTY_DICT +
                                   p.op_int(3) + p.op_int(2) + p.SETITEM) +
            p.op_str('s') + p.call('__builtin__', 'set', p.EMPTY_LIST +
                                   p.op_int(1) + b'a') +
            p.op_str('b') + p.call('_codecs', 'encode', p.op_str('\xff'),
                                   p.op_str('latin1')) +
            p.op_str('a') + p.call('__builtin__', 'bytearray',
                                   p.op_str('ab'), p.op_str('latin-1')) +
            p.SETITEMS)
    loaded = _load_pickle(tmp_path, body)
    assert loaded == dict(c=collections.Counter({3: 2}), s={1}, b=b'\xff',
                          a=bytearray(b'ab'))
    assert type(loaded['c']) is collections.Counter


def test_storage_class_dtypes_and_tensor_dtype_values(tmp_path):
    loaded = _load_pickle(tmp_path, p.op_global('torch', 'bfloat16') +
                          p.op_global('torch', 'float') + p.TUPLE2)
    assert loaded == (torch.bfloat16, torch.float32)
    _untrusted(tmp_path, p.op_global('torch', 'FloatStorage'),
               'torch.FloatStorage>, which is not plain data')


def test_refusals_describe_values_without_running_or_printing_them(
        tmp_path):
    """A refusal names the types of what a pickle made: a tensor's repr
    could import modules and print megabytes, a long string is cut."""
    import sys
    four = {'0': p._float_bytes(4)}
    one = p.op_int(1) + p.TUPLE1
    tensor = _tensor_args(p.op_int(0), p.op_int(4) + p.TUPLE1, one)
    modules = set(sys.modules)
    with pytest.raises(UntrustedCheckpointError) as info:
        _load_pickle(tmp_path, p.MARK + tensor + p.op_str('x' * 100000) +
                     p.TUPLE + p.BINPERSID, four)
    message = str(info.value)
    assert "(a torch.Tensor, 'xxxx" in message and len(message) < 1200
    assert set(sys.modules) == modules
