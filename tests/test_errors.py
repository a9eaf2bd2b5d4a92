"""Errors raised on purpose reach the user as one block; others keep
their traceback (mmsafe/errors.py, used by tools/train.py and test.py).

Raised on purpose means of type :class:`mmsafe.errors.MMSafeError`: every
error class of mmsafe derives from it, and mmsafe raises Python's own error
types only as the subclasses of mmsafe.errors (a structure test below reads
every ``raise`` under mmsafe/)."""
import ast
import builtins
import io
import pathlib
import pickle

import pytest

from mmsafe.checkpoint.remote_weights import WeightsUnavailableError
from mmsafe.errors import (MMSafeError, MMSafeFileNotFoundError,
                           MMSafeKeyError, MMSafeValueError, explained_errors,
                           is_explained, report)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _raised(exc):
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 (the object is the point)
        return caught


def test_which_errors_count_as_raised_on_purpose():
    assert is_explained(WeightsUnavailableError('no file'))
    assert is_explained(RuntimeError('[mmsafe] MACLCheckHook ...'))
    # MMEngine's registry puts the class in front of a constructor's error
    assert is_explained(ValueError('class `LLVIPDataset` in x.py: '
                                   '[mmsafe] the pair ...'))
    assert not is_explained(RuntimeError('CUDA out of memory'))
    assert not is_explained(KeyboardInterrupt())


def test_report_is_one_block_with_the_message_first():
    out = io.StringIO()
    exc = _raised(ValueError('class `LLVIPDataset` in x.py: [mmsafe] the '
                             'pair is broken'))
    block = report(exc, out)
    lines = block.strip().splitlines()
    assert lines[0] == 'ValueError: [mmsafe] the pair is broken'
    assert '(raised while building class `LLVIPDataset` in x.py:' in block
    assert 'MMSAFE_DEBUG=1' in lines[-1]
    assert 'Traceback' not in block and out.getvalue() == block


def test_explained_error_exits_1_other_errors_propagate(capsys,
                                                         monkeypatch):
    monkeypatch.delenv('MMSAFE_DEBUG', raising=False)
    with pytest.raises(SystemExit) as info:
        with explained_errors():
            raise RuntimeError('[mmsafe] stop here') from OSError('under')
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert 'RuntimeError: [mmsafe] stop here' in err
    assert 'OSError' not in err
    with pytest.raises(RuntimeError, match='CUDA'):
        with explained_errors():
            raise RuntimeError('CUDA out of memory')
    # asked for: the full chain, as Python raises it
    with pytest.raises(RuntimeError, match='stop here'):
        with explained_errors(debug=True):
            raise RuntimeError('[mmsafe] stop here')
    monkeypatch.setenv('MMSAFE_DEBUG', '1')
    with pytest.raises(RuntimeError, match='stop here'):
        with explained_errors():
            raise RuntimeError('[mmsafe] stop here')


def test_a_raise_in_mmsafe_counts_a_python_error_in_it_does_not(tmp_path):
    from mmsafe.datasets.llvip import LLVIPDataset
    missing = str(tmp_path / 'nowhere') + '/'
    exc = _raised_lazily(lambda: LLVIPDataset(data_root=missing,
                                              pipeline=[]))
    assert isinstance(exc, FileNotFoundError), exc
    assert is_explained(exc)
    # MMEngine's registry wraps a constructor's error with the class
    from mmdet.registry import DATASETS
    wrapped = _raised_lazily(lambda: DATASETS.build(
        dict(type='LLVIPDataset', data_root=missing, pipeline=[])))
    if str(wrapped).startswith('class `'):
        assert is_explained(wrapped)
        block = report(wrapped, io.StringIO())
        assert block.strip().startswith('FileNotFoundError: LLVIPDataset:')
    # a bug: Python raises inside mmsafe's code, no raise statement
    from mmsafe.events import batch_file_names
    bug = _raised_lazily(lambda: batch_file_names(dict(data_samples=5)))
    assert isinstance(bug, TypeError) and not is_explained(bug)


def _raised_lazily(call):
    try:
        call()
    except Exception as caught:  # noqa: BLE001 (the object is the point)
        return caught
    raise AssertionError('nothing was raised')


class _UsersOwnError(Exception):
    """An error class of a user's code (a model, a dataset, a script)."""


def test_the_rule_is_the_type_not_where_it_was_raised():
    # mmsafe's deliberate errors: its own classes and the builtin types as
    # mmsafe raises them
    assert is_explained(_raised(MMSafeValueError('bad option')))
    assert is_explained(MMSafeKeyError('no such key'))
    assert is_explained(_raised(WeightsUnavailableError('no file')))
    # a user's errors, raised anywhere, with a message of its own
    assert not is_explained(_raised(_UsersOwnError('my dataset broke')))
    assert not is_explained(_raised(ValueError('my transform broke')))
    # a bug: Python or a library raises, even when mmsafe's code called it
    import numpy as np
    bug = _raised_lazily(lambda: np.zeros('three'))
    assert isinstance(bug, TypeError) and not is_explained(bug)
    # mmsafe's own check, in mmsafe's code
    from mmsafe.datasets.annotation_reader import parse_xml
    exc = _raised_lazily(lambda: parse_xml(b'<a>', 'x.xml', 'VOC'))
    assert isinstance(exc, ValueError) and is_explained(exc)
    assert '[mmsafe]' not in str(exc)  # the type decides, not the text


def test_every_mmsafe_error_class_is_an_mmsafe_error():
    from mmsafe.checkpoint.errors import (CheckpointFormatError,
                                          UntrustedCheckpointError)
    from mmsafe.datasets.transforms.compose import PairGeometryError
    from mmsafe.datasets.transforms.pairing_rules import \
        UnpairedTransformError
    from mmsafe.engine.runner.errors import (DDPParameterError,
                                             PeerRankFailedError)
    from mmsafe.engine.runner.stop import StopTraining
    from mmsafe.guard_outputs import UnknownGuardError
    for cls in (CheckpointFormatError, UntrustedCheckpointError,
                PairGeometryError, UnpairedTransformError, DDPParameterError,
                PeerRankFailedError, StopTraining, WeightsUnavailableError,
                UnknownGuardError):
        assert issubclass(cls, MMSafeError), cls
    # code that catches what torch.load raises for a refusal still does
    assert issubclass(UntrustedCheckpointError, pickle.UnpicklingError)


def test_builtin_types_as_mmsafe_raises_them_keep_their_name():
    err = _raised(MMSafeFileNotFoundError('LLVIPDataset: no folder'))
    assert isinstance(err, FileNotFoundError) and isinstance(err, OSError)
    assert type(err).__name__ == 'FileNotFoundError'
    assert str(err) == 'LLVIPDataset: no folder'
    # what a DataLoader worker or a spawned rank sends back: the same type
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert is_explained(back)
    # KeyError's own str (quoted) for one line; a worker's re-raised
    # traceback reads as written
    assert str(MMSafeKeyError('a')) == str(KeyError('a')) == "'a'"
    assert str(MMSafeKeyError('Caught in worker\nTraceback')) == \
        'Caught in worker\nTraceback'
    with pytest.raises(KeyError):
        raise MMSafeKeyError('a')


def _builtin_raises(path: pathlib.Path):
    """(line, name) of each ``raise`` of one of Python's error types by its
    builtin name in ``path``."""
    errors = {name for name in dir(builtins)
              if isinstance(getattr(builtins, name), type)
              and issubclass(getattr(builtins, name), BaseException)}
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) \
                else node.exc
            if isinstance(exc, ast.Name) and exc.id in errors:
                yield node.lineno, exc.id


# SystemExit is an exit, not an error.
NOT_CHECKED = {'mmsafe/errors.py'}


def test_mmsafe_raises_python_error_types_only_as_its_own():
    found = []
    for path in sorted((ROOT / 'mmsafe').rglob('*.py')):
        rel = path.relative_to(ROOT).as_posix()
        if rel in NOT_CHECKED:
            continue
        found += [f'{rel}:{line}: raise {name}'
                  for line, name in _builtin_raises(path)
                  if name != 'SystemExit']
    assert not found, (
        'raise the subclass from mmsafe.errors (e.g. MMSafeValueError for '
        'ValueError), so that the tools show the message as one block:\n' +
        '\n'.join(found))


def test_the_raise_scan_finds_builtin_raises(tmp_path):
    module = tmp_path / 'm.py'
    module.write_text('def f(x):\n'
                      '    if x:\n'
                      '        raise ValueError("x")\n'
                      '    raise KeyError\n'
                      'def g():\n'
                      '    raise MMSafeValueError("y")\n')
    assert sorted(_builtin_raises(module)) == [(3, 'ValueError'),
                                               (4, 'KeyError')]
