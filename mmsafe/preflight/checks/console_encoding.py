"""The console can print the config's characters.

MMEngine logs the whole config at start-up. On a Windows console with a
legacy code page (cp1252, cp936 ...) a character outside it (a comment in
another script, a class name with an accent, a typographic dash) raises
``UnicodeEncodeError`` in every ``print`` and garbles the log handlers.
"""
import sys
from typing import Iterator, Optional, Tuple

from mmengine.config import Config

from ..context import PreflightContext
from ..report import CheckRow

NAME = 'console'


def _first_unencodable(text: str, encoding: str) -> Optional[Tuple[str, int]]:
    """The first character ``encoding`` cannot encode, and its line."""
    try:
        text.encode(encoding)
        return None
    except UnicodeEncodeError as err:
        return text[err.start], text.count('\n', 0, err.start) + 1
    except LookupError:
        return None


def _config_dump(cfg, formatted: bool) -> str:
    """What the Runner logs as the config (``cfg.pretty_text``), or, with
    ``formatted=False``, the same text before yapf breaks its lines: the
    same characters, without yapf's cost (seconds for a config whose long
    strings overflow a line), so the line numbers are only right with
    ``formatted=True``."""
    try:
        if formatted:
            return cfg.pretty_text
        return Config(cfg.to_dict(), format_python_code=False).pretty_text
    except Exception:  # yapf cannot format some values; the dump then
        return str(cfg.to_dict())  # falls back to plain text, as here


def check_console_encoding(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Encode the config text with stdout's and stderr's encodings."""
    cfg = ctx.cfg
    texts = []
    try:
        texts.append(('config file', getattr(cfg, 'text', '') or ''))
    except Exception:  # a config built from a dict has no file text
        pass
    texts.append(('work_dir', str(cfg.get('work_dir', ''))))
    # What the Runner logs: the merged config, --cfg-options included.
    texts.append(('config dump', _config_dump(cfg, formatted=False)))
    for stream_name in ('stdout', 'stderr'):
        stream = getattr(sys, stream_name)
        encoding = getattr(stream, 'encoding', None)
        if not encoding:
            continue
        for what, text in texts:
            bad = _first_unencodable(text, encoding)
            if bad is None:
                continue
            if what == 'config dump':  # the line as the log will show it
                bad = _first_unencodable(
                    _config_dump(cfg, formatted=True), encoding) or bad
            char, line = bad
            yield CheckRow(
                'error', NAME, f'The console ({stream_name}, encoding '
                f'{encoding}) cannot print the character {ascii(char)} '
                f'(U+{ord(char):04X}) on line {line} of the {what}: the '
                'config dump at start-up and every log line with it fail '
                'with UnicodeEncodeError.', 'config',
                'Run with PYTHONUTF8=1 (or PYTHONIOENCODING=utf-8); on '
                'Windows also `chcp 65001` (the launcher '
                'tools/train_with_tensorboard.bat sets a UTF-8 console); or '
                f'remove {ascii(char)} from the config.')
            return
    encodings = sorted({getattr(s, 'encoding', None) or '?'
                        for s in (sys.stdout, sys.stderr)})
    yield CheckRow('ok', NAME, f'The console ({"/".join(encodings)}) can '
                   "print the config's characters.", 'config')
