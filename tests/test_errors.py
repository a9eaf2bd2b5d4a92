"""Errors raised on purpose reach the user as one block; others keep
their traceback (mmsafe/errors.py, used by tools/train.py and test.py)."""
import io

import pytest

from mmsafe.checkpoint.remote_weights import WeightsUnavailableError
from mmsafe.errors import explained_errors, is_explained, report


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
