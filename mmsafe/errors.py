"""Errors that mmsafe raises on purpose reach the user as one block.

A missing pretrained file offline, an unpaired transform, a MACL check with
``policy='raise'``, an untrusted checkpoint, DDP's unused-parameter error
explained: each message already says what failed, where, and what to do.
Printed the usual way, it comes after tens of lines of chained tracebacks
of the libraries underneath (``socket.gaierror`` -> ``urllib`` -> ...), and
a user reads the first screen. :func:`explained_errors` (used by the
command-line tools) prints such an error as its type and message only;
the full chain goes to the run's log file when there is one, and to the
console with ``MMSAFE_DEBUG=1`` (or a tool's ``--debug``). Any other error
keeps its full traceback.

An error counts as raised on purpose when it is one of mmsafe's error
classes, its message carries mmsafe's ``[mmsafe]`` prefix, or a ``raise``
statement in mmsafe's own code raised it (a missing image folder, an
unknown option...); MMEngine's registry re-raises a constructor's error
with the class name in front, which counts the same. An error that
Python itself raises inside mmsafe's code (a bug) keeps its traceback.
"""
import contextlib
import linecache
import logging
import os
import os.path as osp
import sys
import traceback
from typing import Iterator, Optional

DEBUG_ENV = 'MMSAFE_DEBUG'
PREFIX = '[mmsafe]'


def _mmsafe_classes() -> tuple:
    from mmsafe.checkpoint.remote_weights import WeightsUnavailableError
    from mmsafe.checkpoint.trust import UntrustedCheckpointError
    from mmsafe.datasets.pipeline_check import UnpairedTransformError
    from mmsafe.datasets.transforms.compose import PairGeometryError
    from mmsafe.engine.runner.errors import (DDPParameterError,
                                             PeerRankFailedError)
    return (WeightsUnavailableError, UntrustedCheckpointError,
            UnpairedTransformError, PairGeometryError, DDPParameterError,
            PeerRankFailedError)


_PACKAGE_DIR = osp.dirname(osp.abspath(__file__)) + os.sep


def _raised_by_mmsafe(exc: BaseException) -> bool:
    """Whether a ``raise`` statement in mmsafe's code raised ``exc``."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = osp.abspath(tb.tb_frame.f_code.co_filename)
    if not filename.startswith(_PACKAGE_DIR):
        return False
    line = linecache.getline(filename, tb.tb_lineno).strip()
    return line.startswith('raise ')


def is_explained(exc: BaseException) -> bool:
    """Whether ``exc`` is an error mmsafe raised on purpose (see the module
    docstring)."""
    if not isinstance(exc, Exception):
        return False  # KeyboardInterrupt, SystemExit: not ours
    if isinstance(exc, _mmsafe_classes()) or PREFIX in str(exc):
        return True
    if _raised_by_mmsafe(exc):
        return True
    # MMEngine's registry: raise type(e)(f'class `X` in file: {e}')
    context = exc.__context__
    return (str(exc).startswith('class `') and context is not None
            and type(context) is type(exc) and _raised_by_mmsafe(context))


def debug_requested(flag: bool = False) -> bool:
    """``--debug`` given, or ``MMSAFE_DEBUG`` set to anything but 0."""
    return flag or os.environ.get(DEBUG_ENV, '0') not in ('', '0')


def _log_file() -> Optional[str]:
    from mmengine.logging import MMLogger
    if not MMLogger._instance_dict:
        return None
    for handler in MMLogger.get_current_instance().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return None


def _short(exc: BaseException) -> str:
    text = str(exc)
    # MMEngine's registry puts "class `X` in file: " in front
    context = exc.__context__
    at = text.find(PREFIX)
    if at < 0 and text.startswith('class `') and context is not None:
        at = text.find(str(context))
    if at > 0 and text[:at].startswith('class `'):
        text = text[at:] + f'\n(raised while building {text[:at].strip()})'
    return f'{type(exc).__name__}: {text}'


def report(exc: BaseException, stream=None) -> str:
    """Print ``exc`` as one block (the full traceback to the log file);
    returns the block."""
    stream = stream or sys.stderr
    full = ''.join(traceback.format_exception(type(exc), exc,
                                              exc.__traceback__))
    where = _log_file()
    if where is not None:
        with open(where, 'a', encoding='utf-8') as f:
            f.write(full)
    tail = (f'full traceback: in {where}, or run again with '
            f'{DEBUG_ENV}=1' if where else
            f'full traceback: run again with {DEBUG_ENV}=1')
    block = f'\n{_short(exc)}\n({tail})\n'
    stream.write(block)
    stream.flush()
    return block


@contextlib.contextmanager
def explained_errors(debug: bool = False) -> Iterator[None]:
    """Around a tool's main work: an error mmsafe raised on purpose ends
    the process with exit code 1 after one message block (see the module
    docstring); anything else propagates unchanged."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 (re-raised unless explained)
        if debug_requested(debug) or not is_explained(exc):
            raise
        report(exc)
        raise SystemExit(1) from None
