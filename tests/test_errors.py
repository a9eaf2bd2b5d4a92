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
