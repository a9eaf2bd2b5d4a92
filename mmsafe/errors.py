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

An error counts as raised on purpose when it is an :class:`MMSafeError`:
mmsafe's own error classes derive from it, and where mmsafe raises one of
Python's error types it raises the subclass of this module that is both
(:class:`MMSafeValueError` is a ``ValueError``, so ``except ValueError``
still catches it). MMEngine's registry re-raises a constructor's error as
``type(e)(f'class `X` in file: {e}')``, the same class, so it counts too.
A message that carries mmsafe's ``[mmsafe]`` prefix counts as well (an
error that crossed a process boundary or a library as another type). An
error that Python or a library raises, inside mmsafe's code or not (a
bug), and a user's own error keep their traceback.
"""
import builtins
import contextlib
import logging
import os
import sys
import traceback
from typing import Iterator, Optional

DEBUG_ENV = 'MMSAFE_DEBUG'
PREFIX = '[mmsafe]'


__all__ = [
    'MMSafeError', 'MMSafeValueError', 'MMSafeTypeError', 'MMSafeKeyError',
    'MMSafeIndexError', 'MMSafeAttributeError', 'MMSafeRuntimeError',
    'MMSafeNotImplementedError', 'MMSafeImportError', 'MMSafeOSError',
    'MMSafeFileNotFoundError', 'MMSafeFileExistsError', 'MMSafeTimeoutError',
    'is_explained', 'debug_requested', 'report', 'explained_errors'
]


class MMSafeError(Exception):
    """Base of every error mmsafe raises on purpose: its message says what
    failed, where, and what to do, so the tools show it as one block
    (:func:`explained_errors`)."""


def is_explained(exc: BaseException) -> bool:
    """Whether ``exc`` is an error mmsafe raised on purpose (see the module
    docstring)."""
    if not isinstance(exc, Exception):
        return False  # KeyboardInterrupt, SystemExit: not ours
    return isinstance(exc, MMSafeError) or PREFIX in str(exc)


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


# ---------------------------------------------------------------------------
# Python's error types as mmsafe raises them. Each is the builtin type (so
# ``except ValueError`` catches it) and an MMSafeError, under a name of its
# own (``MMSafeValueError``: nothing here shadows a builtin). Its
# ``__name__`` is the builtin's, so that messages and logs that print
# ``type(e).__name__`` read ``ValueError`` as Python's would; its qualified
# name stays its own, which pickles (a DataLoader worker's or a spawned
# rank's error, sent back) and tracebacks use.
def _named_as_builtin(cls: type) -> type:
    cls.__name__ = cls.__bases__[-1].__name__
    return cls


@_named_as_builtin
class MMSafeValueError(MMSafeError, builtins.ValueError):
    """A ``ValueError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeTypeError(MMSafeError, builtins.TypeError):
    """A ``TypeError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeKeyError(MMSafeError, builtins.KeyError):
    """A ``KeyError`` that mmsafe raises on purpose."""

    def __str__(self) -> str:
        # a message of several lines (a DataLoader worker's error, re-raised
        # with its traceback) reads as written, as torch shows a KeyError's
        message = self.args[0] if len(self.args) == 1 else None
        if isinstance(message, str) and '\n' in message:
            return message
        return super().__str__()


@_named_as_builtin
class MMSafeIndexError(MMSafeError, builtins.IndexError):
    """An ``IndexError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeAttributeError(MMSafeError, builtins.AttributeError):
    """An ``AttributeError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeRuntimeError(MMSafeError, builtins.RuntimeError):
    """A ``RuntimeError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeNotImplementedError(MMSafeError, builtins.NotImplementedError):
    """A ``NotImplementedError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeImportError(MMSafeError, builtins.ImportError):
    """An ``ImportError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeOSError(MMSafeError, builtins.OSError):
    """An ``OSError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeFileNotFoundError(MMSafeError, builtins.FileNotFoundError):
    """A ``FileNotFoundError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeFileExistsError(MMSafeError, builtins.FileExistsError):
    """A ``FileExistsError`` that mmsafe raises on purpose."""


@_named_as_builtin
class MMSafeTimeoutError(MMSafeError, builtins.TimeoutError):
    """A ``TimeoutError`` that mmsafe raises on purpose."""
