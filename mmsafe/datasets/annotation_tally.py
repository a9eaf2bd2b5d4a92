"""What a dataset met while reading its annotation files: object names
that are not classes, documented defaults applied, malformed files.

Released datasets name the same class differently (``Person`` for
``person``), add classes in a later release, or leave a field empty. An
object whose name is not a class must not vanish without a word, and a
file that cannot be read must not end in a library traceback. Each
dataset that reads annotation files keeps an :class:`AnnotationTally`
(``dataset.annotation_tally``):

* every object whose name is not in ``classes`` is counted by name, with
  the first files, and the class it matches when only case or spacing
  (spaces, ``_``, ``-``) differs; ``class_aliases={'Person': 'person'}``
  in the dataset config reads such names as the class (opt-in, counted);
* every documented default applied (a missing or empty ``<difficult>``
  is 0) is counted by field;
* every malformed file (:class:`~.annotation_reader.MalformedAnnotationError`)
  is collected; the dataset raises them together
  (:class:`MalformedAnnotationsError`), or with
  ``on_malformed_annotation='skip'`` leaves those images out, counted and
  logged.

The dataset's load log states the counts; ``tools/check_dataset.py`` and
``tools/preflight.py`` report them.
"""
import copy
import logging
import re
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence

from mmsafe.errors import MMSafeValueError
from mmsafe.events import log
from .annotation_reader import MalformedAnnotationError

MALFORMED_POLICIES = ('error', 'skip')
#: how many files a message or report names per finding
NUM_NAMED = 5
_SPACING = re.compile(r'[\s_-]+')


def check_malformed_policy(policy: str) -> str:
    """Validate ``on_malformed_annotation``; returns it."""
    if policy not in MALFORMED_POLICIES:
        raise MMSafeValueError(f'on_malformed_annotation must be one of '
                               f'{MALFORMED_POLICIES}, got {policy!r}')
    return policy


def spacing_free(name: str) -> str:
    """``name`` without case, spaces, ``_`` and ``-`` (the differences a
    suggestion looks through)."""
    return _SPACING.sub('', name).casefold()


class ClassNames:
    """Resolve an annotation's object name to a known name.

    Args:
        classes (Sequence[str]): the dataset's classes.
        aliases (dict, optional): ``{name in the files: known name}``
            (``class_aliases`` of the dataset config).
        owner (str): the dataset, for messages.
        vocabulary (Sequence[str]): names the release uses beyond the
            classes (KAIST's ignore-region labels), known but not classes.
    """

    def __init__(self, classes: Sequence[str],
                 aliases: Optional[Dict[str, str]], owner: str,
                 vocabulary: Sequence[str] = ()) -> None:
        self.classes = tuple(classes)
        self.known = tuple(dict.fromkeys(tuple(classes) + tuple(vocabulary)))
        aliases = dict(aliases or {})
        for name, target in aliases.items():
            if not isinstance(name, str) or not isinstance(target, str):
                raise MMSafeValueError(
                    f'{owner}: class_aliases maps names to names, got '
                    f'{name!r}: {target!r}')
            if target not in self.known:
                raise MMSafeValueError(
                    f'{owner}: class_aliases maps {name!r} to {target!r}, '
                    f'which is not one of {list(self.known)}')
            if name in self.known:
                raise MMSafeValueError(
                    f'{owner}: class_aliases renames {name!r}, which is '
                    f'itself one of {list(self.known)}')
        self.aliases = aliases
        self._by_key: Dict[str, str] = {}
        for known in self.known:
            self._by_key.setdefault(spacing_free(known), known)

    def resolve(self, name: str) -> Optional[str]:
        """The known name ``name`` stands for (itself, or its alias), or
        None."""
        if name in self.known:
            return name
        return self.aliases.get(name)

    def suggestion(self, name: str) -> Optional[str]:
        """The known name that differs from ``name`` only in case or
        spacing, or None."""
        return self._by_key.get(spacing_free(name))


class MalformedAnnotationsError(MMSafeValueError):
    """Annotation files of a dataset that cannot be read, all of them;
    :meth:`of` makes one with its message.

    Args:
        message (str): the whole message (MMEngine's registry may rebuild
            an error from its message alone).
        errors (list[MalformedAnnotationError]): one per file.
    """

    def __init__(self, message: str,
                 errors: Sequence[MalformedAnnotationError] = ()) -> None:
        super().__init__(message)
        self.errors = list(errors)

    @classmethod
    def of(cls, owner: str, errors: Sequence[MalformedAnnotationError],
           total: int) -> 'MalformedAnnotationsError':
        """The error of ``owner`` (the dataset) for ``errors`` among
        ``total`` annotation files read."""
        listing = '\n'.join(f'  {e}' for e in list(errors)[:NUM_NAMED])
        more = len(errors) - NUM_NAMED
        if more > 0:
            listing += f'\n  ... and {more} more'
        return cls(
            f'{owner}: {len(errors)} of {total} annotation files are '
            f'malformed:\n{listing}\nFix them (tools/check_dataset.py '
            'CONFIG lists every one in one run), or set '
            "on_malformed_annotation='skip' on the dataset to leave their "
            'images out (counted and logged).', errors)

    def __reduce__(self):
        return (type(self), (str(self), self.errors))


def _named(entry: dict, path: str) -> None:
    entry['count'] += 1
    if len(entry['files']) < NUM_NAMED and path not in entry['files']:
        entry['files'].append(path)


def _files(files: Sequence[str], count: int) -> str:
    shown = ', '.join(files)
    return shown + (' ...' if count > len(files) else '')


class AnnotationTally:
    """Counts of what a dataset met in its annotation files.

    Args:
        owner (str): the dataset, for messages.
        unknown_fate (str): what happens to an object with an unknown
            name, e.g. ``'dropped'``.
    """

    def __init__(self, owner: str, unknown_fate: str = 'dropped') -> None:
        self.owner = owner
        self.unknown_fate = unknown_fate
        self.files = 0
        self.objects = 0
        #: field -> dict(count, files, default): documented defaults
        #: applied
        self.defaults: Dict[str, dict] = {}
        #: name -> dict(count, files, suggestion): names not known
        self.unknown: Dict[str, dict] = {}
        #: name -> dict(count, files, target): names read through an alias
        self.aliased: Dict[str, dict] = {}
        #: the malformed files left out (on_malformed_annotation='skip')
        self.malformed: List[dict] = []

    # --------------------------------------------------------- counting
    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around the reading of one sample's annotation file(s): counted
        when they read, left out of every count when one is malformed."""
        saved = copy.deepcopy((self.objects, self.defaults, self.unknown,
                               self.aliased))
        try:
            yield
        except MalformedAnnotationError:
            (self.objects, self.defaults, self.unknown,
             self.aliased) = saved
            raise
        self.files += 1

    def default_applied(self, field: str, path: str, default: str) -> None:
        """``field`` of ``path`` is missing or empty and reads as its
        documented ``default`` (a description, e.g. ``'0 (not
        difficult)'``)."""
        _named(self.defaults.setdefault(field, dict(
            count=0, files=[], default=default)), path)

    def read_name(self, names: ClassNames, name: str,
                  path: str) -> Optional[str]:
        """The known name of an object named ``name`` in ``path``, counting
        aliases used and names not known (None for those)."""
        self.objects += 1
        known = names.resolve(name)
        if known is None:
            entry = self.unknown.setdefault(name, dict(
                count=0, files=[], suggestion=names.suggestion(name)))
            _named(entry, path)
        elif known != name:
            _named(self.aliased.setdefault(name, dict(
                count=0, files=[], target=known)), path)
        return known

    def skipped(self, error: MalformedAnnotationError) -> None:
        """A malformed file whose image is left out."""
        self.malformed.append(error.as_dict())

    # -------------------------------------------------------- reporting
    def unknown_lines(self) -> List[str]:
        """One line per unknown name, most frequent first."""
        lines = []
        for name, entry in sorted(self.unknown.items(),
                                  key=lambda kv: -kv[1]['count']):
            hint = ''
            if entry['suggestion'] is not None:
                hint = (f" (differs from {entry['suggestion']!r} only in "
                        'case or spacing: add class_aliases='
                        f"{{{name!r}: {entry['suggestion']!r}}} to the "
                        'dataset to read it as that class)')
            lines.append(f"{name!r} x{entry['count']}{hint}; first: "
                         f"{_files(entry['files'], entry['count'])}")
        return lines

    def log_summary(self, known: Sequence[str],
                    noun: str = 'classes') -> None:
        """Log what was met: unknown names (a warning), aliases used and
        defaults applied.

        Args:
            known (Sequence[str]): the names known, for the message.
            noun (str): what they are, e.g. ``'classes'``.
        """
        if self.unknown:
            count = sum(e['count'] for e in self.unknown.values())
            log(f'{self.owner}: {count} of {self.objects} objects '
                f'{self.unknown_fate}: their names are not in {noun} '
                f'{tuple(known)}:\n  ' + '\n  '.join(self.unknown_lines()),
                logging.WARNING)
        for name, entry in self.aliased.items():
            log(f"{self.owner}: {entry['count']} objects named {name!r} "
                f"read as {entry['target']!r} (class_aliases)")
        for field, entry in self.defaults.items():
            log(f"{self.owner}: {field} has no value {entry['count']} "
                'times (missing or empty), read as its documented default '
                f"{entry['default']}; first: "
                f"{_files(entry['files'], entry['count'])}")

    def as_dict(self) -> dict:
        """Everything counted, for reports (JSON-ready)."""
        return dict(owner=self.owner, files=self.files,
                    objects=self.objects, unknown_fate=self.unknown_fate,
                    defaults=self.defaults, unknown=self.unknown,
                    aliased=self.aliased, malformed=self.malformed)


def handle_malformed(tally: AnnotationTally,
                     errors: List[MalformedAnnotationError], total: int,
                     policy: str) -> None:
    """Raise or log for the malformed files of a dataset.

    Args:
        tally (AnnotationTally): the dataset's tally (the files left out
            are recorded in it).
        errors (list): one :class:`MalformedAnnotationError` per file.
        total (int): annotation files read.
        policy (str): ``'error'`` raises :class:`MalformedAnnotationsError`;
            ``'skip'`` logs them (the caller leaves their images out).
            Every file malformed is an error under both.
    """
    if not errors:
        return
    if policy == 'error' or len(errors) == total:
        raise MalformedAnnotationsError.of(tally.owner, errors, total)
    for error in errors:
        tally.skipped(error)
    listing = '\n'.join(f'  {e}' for e in errors[:NUM_NAMED])
    log(f'{tally.owner}: left out {len(errors)} of {total} images whose '
        "annotation file is malformed (on_malformed_annotation='skip'). "
        f'First:\n{listing}', logging.WARNING)
