"""Rows and reports of ``tools/preflight.py``.

A preflight check yields :class:`CheckRow` objects: a status, what was found,
where in the config it comes from (a key path such as
``train_dataloader.dataset.pipeline[2].type``) and how to fix it. A
:class:`PreflightReport` collects the rows of all checks and renders them as a
text table or as JSON.
"""
import json
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, TextIO

from mmsafe.errors import MMSafeValueError

#: Row states, least to most severe. ``info`` and ``warn`` never fail a run;
#: ``error`` does (``tools/preflight.py`` exits 1, ``train.py --preflight``
#: refuses to start).
STATUSES = ('ok', 'info', 'warn', 'error')


@dataclass
class CheckRow:
    """One finding of a preflight check.

    Args:
        status (str): ``'ok'``, ``'info'``, ``'warn'`` or ``'error'``.
        check (str): name of the check that produced the row.
        what (str): what was found, in one sentence.
        where (str): the config key path it concerns ('' when global).
        fix (str): how to fix it ('' for ok rows).
    """
    status: str
    check: str
    what: str
    where: str = ''
    fix: str = ''

    def __post_init__(self):
        if self.status not in STATUSES:
            raise MMSafeValueError(f'status must be one of {STATUSES}, '
                                   f'got {self.status!r}')


@dataclass
class PreflightReport:
    """All rows of one preflight run.

    Args:
        config (str): the config file the rows are about.
        launcher (str): the launcher the checks assumed.
        rows (list[CheckRow]): the findings, in check order.
        seconds (float): wall time of the whole run.
        timings (dict): wall time per check, in seconds.
    """
    config: str = ''
    launcher: str = 'none'
    rows: List[CheckRow] = field(default_factory=list)
    seconds: float = 0.0
    timings: Dict[str, float] = field(default_factory=dict)

    def add(self, row: CheckRow) -> None:
        self.rows.append(row)

    @property
    def errors(self) -> List[CheckRow]:
        return [r for r in self.rows if r.status == 'error']

    @property
    def warnings(self) -> List[CheckRow]:
        return [r for r in self.rows if r.status == 'warn']

    @property
    def has_errors(self) -> bool:
        """True when any row is an error: training must not start."""
        return bool(self.errors)

    def counts(self) -> Dict[str, int]:
        return {s: sum(r.status == s for r in self.rows) for s in STATUSES}

    def find(self, check: Optional[str] = None,
             status: Optional[str] = None) -> List[CheckRow]:
        """Rows of one check and/or one status."""
        return [
            r for r in self.rows if (check is None or r.check == check) and (
                status is None or r.status == status)
        ]

    def to_dict(self) -> Dict:
        return dict(
            config=self.config,
            launcher=self.launcher,
            ok=not self.has_errors,
            counts=self.counts(),
            seconds=round(self.seconds, 3),
            timings={k: round(v, 3)
                     for k, v in self.timings.items()},
            rows=[asdict(r) for r in self.rows])

    def to_json(self, indent: Optional[int] = 2) -> str:
        # ensure_ascii: the JSON must survive any console encoding.
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=True)

    def format_text(self, width: int = 100, show_ok: bool = True) -> str:
        """Render the report as a table; each non-ok row gets its fix below.

        Args:
            width (int): wrap long cells at this many characters.
            show_ok (bool): include ok and info rows.
        """
        rows = [r for r in self.rows if show_ok or r.status in ('warn',
                                                                 'error')]
        check_w = max([len('CHECK')] + [len(r.check) for r in rows])
        head = (f'mmsafe preflight: {self.config or "<config>"} '
                f'(launcher {self.launcher}, {self.seconds:.1f} s)')
        lines = [head, f'{"STATUS":<6}  {"CHECK":<{check_w}}  WHAT  [WHERE]']
        indent = ' ' * (6 + 2 + check_w + 2)
        body_w = max(30, width - len(indent))
        for row in rows:
            text = row.what + (f'  [{row.where}]' if row.where else '')
            wrapped = textwrap.wrap(text, body_w) or ['']
            lines.append(f'{row.status.upper():<6}  {row.check:<{check_w}}  '
                         f'{wrapped[0]}')
            lines.extend(indent + w for w in wrapped[1:])
            if row.fix and row.status != 'ok':
                fix = textwrap.wrap('fix: ' + row.fix, body_w)
                lines.extend(indent + w for w in fix)
        c = self.counts()
        verdict = ('FAILED: fix the errors above before training'
                   if self.has_errors else 'passed')
        lines.append(f'{c["error"]} error(s), {c["warn"]} warning(s), '
                     f'{c["info"]} note(s), {c["ok"]} ok: '
                     f'preflight {verdict}.')
        return '\n'.join(lines)

    def __str__(self) -> str:
        return self.format_text()

    def print(self, stream: Optional[TextIO] = None, as_json: bool = False,
              show_ok: bool = True) -> None:
        """Write the report to ``stream`` without ever failing on encoding.

        A console that cannot encode a character (one of the things the
        report may be about) gets a backslash escape instead of a crash.
        """
        stream = stream or sys.stdout
        text = self.to_json() if as_json else self.format_text(
            show_ok=show_ok)
        encoding = getattr(stream, 'encoding', None) or 'utf-8'
        try:
            text.encode(encoding)
        except (UnicodeEncodeError, LookupError):
            text = text.encode(encoding, 'backslashreplace').decode(
                encoding, 'replace')
        stream.write(text + '\n')
        stream.flush()
