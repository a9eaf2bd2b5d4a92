"""Read the fields of a release's annotation file, or say exactly what is
wrong with it.

Annotation files come from many tools: an empty ``<difficult/>``, an empty
``<name/>``, ``12,5`` with a decimal comma, text after the root element, a
file saved in another encoding than it declares. Read with bare
``int(node.text)`` each ends in a library traceback without a file name.
Every field mmsafe reads from a release's annotation file goes through
this module instead; anything malformed raises one
:class:`MalformedAnnotationError` naming the file, the element (or field)
and its line, what it holds, and how the release writes that field.

* :func:`parse_xml`: an xml file as an ``ElementTree`` element with the
  line of every element (the standard library's expat parser, whose own
  errors carry line and column);
* :class:`XMLFields`: the fields of one parsed file (text, number, 0/1
  flag), each read with the release's convention;
* :func:`decode_text`: a text annotation's bytes as str, or the line of
  the first byte that is not in its encoding;
* :func:`read_number`: one number as a release writes it.
"""
import math
import re
import xml.etree.ElementTree as ET
import xml.parsers.expat as expat
from typing import Callable, Dict, List, Optional, Sequence, Union

from mmsafe.errors import MMSafeValueError

_DECIMAL_COMMA = re.compile(r'[+-]?\d+,\d+')
_DECLARED_ENCODING = re.compile(rb'^\s*<\?xml[^>]*encoding\s*=\s*["\']'
                                rb'([A-Za-z0-9._-]+)["\']')


class MalformedAnnotationError(MMSafeValueError):
    """A field of an annotation file that mmsafe cannot read as the
    release writes it; :meth:`at` makes one with its message.

    Args:
        message (str): the whole message (MMEngine's registry may rebuild
            an error from its message alone).
        path (str, optional): the annotation file.
        element (str, optional): the element or field, e.g.
            ``'<difficult>'``.
        line (int, optional): its line in the file (1-based).
        problem (str, optional): what is wrong, e.g. ``'is empty'``.
    """

    def __init__(self, message: str, path: Optional[str] = None,
                 element: Optional[str] = None, line: Optional[int] = None,
                 problem: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path
        self.element = element
        self.line = line
        self.problem = problem

    @classmethod
    def at(cls, path: str, element: str, line: Optional[int], problem: str,
           convention: str) -> 'MalformedAnnotationError':
        """The error for ``element`` of ``path`` at ``line``: ``problem``
        (what is wrong) and ``convention`` (how the release writes it)."""
        where = f'{path}:{line}' if line else path
        end = '' if convention.endswith('.') else '.'
        return cls(f'{where}: {element} {problem}. {convention}{end}', path,
                   element, line, problem)

    def __reduce__(self):
        # unpickled in another process (a DataLoader worker's error) with
        # its fields
        return (type(self), (str(self), self.path, self.element, self.line,
                             self.problem))

    def as_dict(self) -> dict:
        """The error's fields, for reports."""
        return dict(path=self.path, element=self.element, line=self.line,
                    problem=self.problem, message=str(self))


def read_number(text: Optional[str]) -> float:
    """A finite number written with a decimal point (``12``, ``12.5``,
    ``-3``, ``1e3``).

    Raises:
        ValueError: with what is wrong (empty, a decimal comma, not a
            number, not finite) as its message.
    """
    value = (text or '').strip()
    if not value:
        raise MMSafeValueError('is empty')
    if _DECIMAL_COMMA.fullmatch(value):
        raise MMSafeValueError(f'is {value!r}, written with a decimal comma')
    try:
        number = float(value)
    except ValueError:
        raise MMSafeValueError(f'is {value!r}, not a number') from None
    if not math.isfinite(number):
        raise MMSafeValueError(f'is {value!r}, not a finite number')
    return number


def _encoding_hint(data: Union[str, bytes]) -> str:
    """Why the bytes may not read: an encoding they are not in."""
    if isinstance(data, str):
        return ''
    match = _DECLARED_ENCODING.match(data)
    encoding = match.group(1).decode('ascii') if match else 'utf-8'
    try:
        data.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        declared = (f'declares {encoding}' if match else
                    'declares no encoding, so XML reads it as UTF-8')
        return (f'; the file {declared} but holds bytes that are not '
                f'{encoding} (save it as UTF-8, or declare its encoding: '
                '<?xml version="1.0" encoding="ISO-8859-1"?>)')
    return ''


def parse_xml(data: Union[str, bytes], path: str,
              convention: str) -> 'XMLFields':
    """Parse an xml annotation file; its elements keep their lines.

    Args:
        data (bytes | str): the file's bytes (the xml declaration says the
            encoding; UTF-8 without one), or its decoded text.
        path (str): the file, for messages.
        convention (str): how the release writes its files, for messages.

    Returns:
        XMLFields: the root element and the line of every element.

    Raises:
        MalformedAnnotationError: the bytes are not well-formed xml (text
            after the root element, a tag left open, bytes not in the
            file's encoding ...), naming the line and the element open
            there.
    """
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()
    parser.buffer_text = True
    lines: Dict[ET.Element, int] = {}
    open_tags: List[str] = []
    closed: List[str] = []

    def start(tag, attrs):
        lines[builder.start(tag, attrs)] = parser.CurrentLineNumber
        open_tags.append(tag)

    def end(tag):
        builder.end(tag)
        closed.append(open_tags.pop())

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(data, True)
    except expat.ExpatError as err:
        if open_tags:
            element = f'<{open_tags[-1]}>'
        elif closed:
            element = f'the text after </{closed[-1]}>'
        else:
            element = 'the document'
        raise MalformedAnnotationError.at(
            path, element, err.lineno,
            f'is not well-formed xml ({expat.ErrorString(err.code)} at '
            f'column {err.offset + 1}{_encoding_hint(data)})',
            convention) from None
    return XMLFields(builder.close(), lines, path, convention)


class XMLFields:
    """The fields of one parsed xml file, read with the release's
    convention.

    Args:
        root (Element): the root element.
        lines (dict): element -> its line.
        path (str): the file, for messages.
        convention (str): how the release writes its files, for messages
            (the field's own convention is added to it).
    """

    def __init__(self, root: ET.Element, lines: Dict[ET.Element, int],
                 path: str, convention: str) -> None:
        self.root = root
        self.lines = lines
        self.path = path
        self.convention = convention

    def line(self, element: Optional[ET.Element]) -> Optional[int]:
        """The line where ``element`` starts (None for None)."""
        return None if element is None else self.lines.get(element)

    def error(self, element: str, line: Optional[int], problem: str,
              field_convention: str = '') -> MalformedAnnotationError:
        """The error for ``element`` (a description such as
        ``'<difficult>'``); ``field_convention`` says how the release
        writes it."""
        convention = self.convention
        if field_convention:
            convention = f'{convention}: {field_convention}'
        return MalformedAnnotationError.at(self.path, element, line, problem,
                                        convention)

    def text(self, parent: ET.Element, tag: str,
             field_convention: str) -> str:
        """The stripped text of ``parent``'s ``<tag>``, which must be there
        and not empty."""
        node = parent.find(tag)
        if node is None:
            raise self.error(f'<{parent.tag}>', self.line(parent),
                             f'has no <{tag}>', field_convention)
        value = (node.text or '').strip()
        if not value:
            raise self.error(f'<{tag}>', self.line(node), 'is empty',
                             field_convention)
        return value

    def number(self, parent: ET.Element, tag: str,
               field_convention: str) -> float:
        """``parent``'s ``<tag>`` as a finite number (see
        :func:`read_number`); it must be there."""
        node = parent.find(tag)
        if node is None:
            raise self.error(f'<{parent.tag}>', self.line(parent),
                             f'has no <{tag}>', field_convention)
        try:
            return read_number(node.text)
        except ValueError as err:
            raise self.error(f'<{tag}>', self.line(node), str(err),
                             field_convention) from None

    def optional_int(self, parent: ET.Element, tag: str,
                     allowed: Sequence[int], default: int,
                     field_convention: str,
                     on_default: Optional[Callable[[str], None]] = None
                     ) -> int:
        """``parent``'s ``<tag>`` as one of ``allowed`` integers;
        ``default`` when the element is missing or empty (the format's
        documented default), reported to ``on_default(tag)``."""
        node = parent.find(tag)
        value = '' if node is None else (node.text or '').strip()
        if not value:
            if on_default is not None:
                on_default(tag)
            return default
        try:
            number = read_number(value)
        except ValueError:
            number = None
        if number is None or number != int(number) or \
                int(number) not in allowed:
            raise self.error(f'<{tag}>', self.line(node),
                             f'is {value!r}, not one of '
                             f'{", ".join(str(a) for a in allowed)}',
                             field_convention)
        return int(number)


def decode_text(data: bytes, path: str, convention: str,
                encoding: str = 'utf-8') -> str:
    """A text annotation file's bytes as str (a UTF-8 BOM dropped).

    Raises:
        MalformedAnnotationError: a byte is not in ``encoding``, naming
            its line.
    """
    try:
        return data.decode('utf-8-sig' if encoding == 'utf-8' else encoding)
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b'\n') + 1
        raise MalformedAnnotationError.at(
            path, 'the text', line,
            f'holds byte(s) {data[err.start:err.end]!r} that are not '
            f'{encoding} (save the file as {encoding})', convention) from None
