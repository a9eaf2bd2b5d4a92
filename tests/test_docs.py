"""README.md and docs/**/*.md stay true to the repository: every relative
link leads to a file, every repository path given in backticks exists, and
every command-line option given with one of the tools or benchmarks is one
that script accepts (read from its argparse calls). A tool named as the
clone's ``tools/<name>.py``, as its command ``mmsafe-<name>`` or as ``-m
mmsafe.tools.<name>`` is read from ``mmsafe/tools/<name>.py``."""
import ast
import glob
import itertools
import pathlib
import re

import pytest

# the scripts (launchers, benchmarks), the planner and the docs do not
# depend on the stack: run at one end (tests/conftest.py)
pytestmark = pytest.mark.one_end

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

# Paths in backticks that start with one of these must exist.
PATH_PREFIXES = ('configs/', 'tools/', 'benchmarks/', 'mmsafe/', 'tests/')
# Scripts whose options the docs give; each option must be accepted.
SCRIPT_PATTERNS = ('mmsafe/tools/*.py', 'benchmarks/*.py')

_LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
_SPAN = re.compile(r'(`+)(.+?)\1', re.S)
_OPTION = re.compile(r'(?<![\w-])(--[A-Za-z][\w-]*)')
_SCRIPT = re.compile(r'(?<![\w./-])((?:tools|benchmarks)/[\w./-]+\.py|'
                     r'mmsafe-[a-z][a-z-]*|mmsafe\.tools\.\w+)\b')
# Where a command ends: a shell separator or the end of the code.
_COMMAND_END = re.compile(r'\||;|&&|\n')
# Programs other than mmsafe's whose options the docs may give alone in a
# code span, in a paragraph that names the program.
_OTHER_PROGRAM = re.compile(r'\b(pip|srun|sbatch|torchrun|conda|docker)\b')
# The script of an option given alone with no script or other program
# named in its paragraph: it must be an option of one of the scripts.
ANY_SCRIPT = '(any script)'


def doc_files(root=REPO_ROOT):
    """README.md and every markdown file under docs/."""
    root = pathlib.Path(root)
    files = [root / 'README.md']
    files += sorted((root / 'docs').rglob('*.md'))
    return [f for f in files if f.is_file()]


def _strip_fences(text):
    """(prose, code blocks): the text with fenced blocks blanked out, and
    the list of the fenced blocks' bodies."""
    prose, blocks, block, fence = [], [], None, None
    for line in text.split('\n'):
        stripped = line.strip()
        if fence is None and stripped.startswith('```'):
            fence, block = stripped[:3], []
            prose.append('')
        elif fence is not None and stripped.startswith(fence):
            blocks.append('\n'.join(block))
            fence = None
            prose.append('')
        elif fence is not None:
            block.append(line)
            prose.append('')
        else:
            prose.append(line)
    return '\n'.join(prose), blocks


def _code_pieces(text):
    """Inline code spans of the prose and the lines of fenced blocks."""
    prose, blocks = _strip_fences(text)
    pieces = [m.group(2) for m in _SPAN.finditer(prose)]
    for block in blocks:
        pieces += block.split('\n')
    return pieces


def anchors(text):
    """The anchors GitHub gives the headings of a markdown text."""
    prose, _ = _strip_fences(text)
    seen, result = {}, set()
    for m in re.finditer(r'^#{1,6}\s+(.*?)\s*#*\s*$', prose, re.M):
        slug = re.sub(r'[^\w\- ]', '', m.group(1).lower()).replace(' ', '-')
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f'{slug}-{n}')
    return result


def broken_links(text, md_path, root=REPO_ROOT):
    """Relative link targets of `text` (a file at md_path) that do not
    exist, or whose #anchor names no heading of the markdown file they
    lead to; URLs are skipped."""
    prose, _ = _strip_fences(text)
    prose = _SPAN.sub('', prose)
    md_path = pathlib.Path(md_path)
    found = []
    for target in _LINK.findall(prose):
        if re.match(r'[a-z][a-z0-9+.-]*:', target):
            continue
        path, _, anchor = target.partition('#')
        dest = md_path.parent / path if path else md_path
        if path and not dest.exists():
            found.append(target)
        elif anchor and dest.suffix == '.md':
            dest_text = text if not path else dest.read_text()
            if anchor not in anchors(dest_text):
                found.append(target)
    return found


def _expand_braces(token):
    m = re.search(r'\{([^{}]*,[^{}]*)\}', token)
    if not m:
        return [token]
    return list(itertools.chain.from_iterable(
        _expand_braces(token[:m.start()] + alt + token[m.end():])
        for alt in m.group(1).split(',')))


def missing_paths(text, root=REPO_ROOT):
    """Repository paths (configs/, tools/, benchmarks/, mmsafe/, tests/)
    given in backticks or code blocks of `text` that do not exist."""
    root = pathlib.Path(root)
    found = []
    for piece in _code_pieces(text):
        for token in re.split(r'[\s=]+', piece):
            token = token.lstrip('(["\'').rstrip('.,:;)]"\'')
            if not token.startswith(PATH_PREFIXES):
                continue
            if re.search(r'[<>]|\{[A-Za-z]\}', token):
                continue   # a placeholder: <file>, {R}
            for path in _expand_braces(token):
                if any(c in path for c in '*?'):
                    ok = bool(glob.glob(str(root / path)))
                else:
                    ok = (root / path).exists()
                if not ok:
                    found.append(path)
    return found


def script_source(script, root=REPO_ROOT):
    """The file that holds a script's argparse calls: ``mmsafe/tools/x.py``
    for ``tools/x.py`` (an entry point to it), ``mmsafe-x`` and
    ``mmsafe.tools.x``; ``script`` itself otherwise."""
    name = None
    if script.startswith('mmsafe-'):
        name = script[len('mmsafe-'):].replace('-', '_')
    elif script.startswith('mmsafe.tools.'):
        name = script[len('mmsafe.tools.'):]
    elif script.startswith('tools/'):
        name = script[len('tools/'):-len('.py')]
    if name and (pathlib.Path(root) / 'mmsafe' / 'tools' /
                 f'{name}.py').is_file():
        return f'mmsafe/tools/{name}.py'
    return script


def script_options(script, root=REPO_ROOT):
    """The option strings ('--x') a script's argparse accepts, read from
    its add_argument calls."""
    tree = ast.parse((pathlib.Path(root) /
                      script_source(script, root)).read_text())
    options = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == 'add_argument'):
            for arg in node.args:
                if (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                        and arg.value.startswith('--')):
                    options.add(arg.value)
    return options


def known_scripts(root=REPO_ROOT):
    root = pathlib.Path(root)
    scripts = set()
    for pattern in SCRIPT_PATTERNS:
        for path in glob.glob(str(root / pattern)):
            scripts.add(pathlib.Path(path).relative_to(root).as_posix())
    return scripts


def _attributed_options(text):
    """(script, option) pairs: options that follow a script's name in the
    same command (a code span or a code line, up to |, ; or &&), and, in a
    paragraph or list item that names a script in a code span of its own
    (`tools/train.py`: `--work-dir`, ...), options in the code spans that
    follow it. An option alone in a code span of a paragraph that names
    neither a script nor another program is paired with
    :data:`ANY_SCRIPT`."""
    pairs = []
    for piece in _code_pieces(text):
        for command in _COMMAND_END.split(piece):
            matches = list(_SCRIPT.finditer(command))
            for i, m in enumerate(matches):
                end = matches[i + 1].start() if i + 1 < len(matches) else None
                for opt in _OPTION.findall(command[m.end():end]):
                    pairs.append((m.group(1), opt))
    prose, _ = _strip_fences(text)
    for block in _blocks(prose):
        current = None
        for m in _SPAN.finditer(block):
            span = m.group(2).strip()
            scripts = _SCRIPT.findall(span)
            if scripts:
                current = scripts[-1]
            elif current and _OPTION.match(span):
                pairs.append((current, _OPTION.match(span).group(1)))
            elif (_OPTION.match(span)
                  and not _OTHER_PROGRAM.search(_SPAN.sub(' ', block))):
                pairs.append((ANY_SCRIPT, _OPTION.match(span).group(1)))
    return pairs


def _blocks(prose):
    """Paragraphs and top-level list items, each with the indented
    paragraphs that continue it."""
    blocks, lines = [], []
    previous_blank = False
    for line in prose.split('\n'):
        # a list item or a table row
        starts_item = re.match(r'([-*]|\d+\.) |\|', line)
        starts_paragraph = previous_blank and line[:1] not in ('', ' ')
        if (starts_item or starts_paragraph) and lines:
            blocks.append('\n'.join(lines))
            lines = []
        lines.append(line)
        previous_blank = not line.strip()
    blocks.append('\n'.join(lines))
    return blocks


def unknown_options(text, root=REPO_ROOT):
    """'script --option' for each option the text gives with one of the
    checked scripts that the script does not accept, '(any script)
    --option' for an option alone that no checked script accepts, and
    'script (no such file)' for a checked script that does not exist."""
    scripts = known_scripts(root)
    cache = {}
    found = []
    for script, opt in _attributed_options(text):
        if script == ANY_SCRIPT:
            if 'all' not in cache:
                cache['all'] = set().union(*(script_options(s, root)
                                             for s in scripts))
            if opt not in cache['all']:
                found.append(f'{script} {opt}')
            continue
        source = script_source(script, root)
        checked = script.startswith('mmsafe') or any(
            pathlib.PurePosixPath(source).match(p) for p in SCRIPT_PATTERNS)
        if not checked:
            continue
        if source not in scripts:
            found.append(f'{script} (no such file)')
            continue
        if script not in cache:
            cache[script] = script_options(source, root)
        if opt not in cache[script]:
            found.append(f'{script} {opt}')
    return found


def _rel(path):
    return pathlib.Path(path).relative_to(REPO_ROOT).as_posix()


DOCS = doc_files()


def test_docs_are_found():
    names = {_rel(f) for f in DOCS}
    assert 'README.md' in names
    assert 'docs/faq.md' in names
    assert len(names) > 5, names


@pytest.mark.parametrize('md', DOCS, ids=_rel)
def test_relative_links_exist(md):
    assert not broken_links(md.read_text(), md), \
        f'{_rel(md)}: links to missing files'


@pytest.mark.parametrize('md', DOCS, ids=_rel)
def test_repository_paths_exist(md):
    assert not missing_paths(md.read_text()), \
        f'{_rel(md)}: paths that do not exist'


@pytest.mark.parametrize('md', DOCS, ids=_rel)
def test_script_options_are_accepted(md):
    assert not unknown_options(md.read_text()), \
        f'{_rel(md)}: options the scripts do not accept'


def test_every_docs_page_is_reachable_from_readme():
    seen, todo = set(), [REPO_ROOT / 'README.md']
    while todo:
        md = todo.pop().resolve()
        if md in seen:
            continue
        seen.add(md)
        prose, _ = _strip_fences(md.read_text())
        for target in _LINK.findall(_SPAN.sub('', prose)):
            path = target.split('#', 1)[0]
            if path.endswith('.md') and not re.match(r'[a-z]+:', path):
                todo.append(md.parent / path)
    unreached = [_rel(f) for f in DOCS if f.resolve() not in seen]
    assert not unreached, unreached


def test_script_options_are_read_from_argparse():
    options = script_options('tools/train.py')
    assert {'--work-dir', '--resume', '--amp', '--preflight',
            '--ignore-preflight-errors', '--local-rank'} <= options
    assert '--show-dir' in script_options('tools/check_dataset.py')
    assert script_options('mmsafe-train') == options
    assert script_options('mmsafe.tools.check_dataset') == script_options(
        'mmsafe-check-dataset') == script_options('tools/check_dataset.py')


def test_checkers_report_a_broken_sample(tmp_path):
    """A page with a link to a missing file, a missing config path and an
    unknown option: each is reported, and their good neighbours are not."""
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 'there.md').write_text('# there\n')
    sample = '\n'.join([
        '# sample',
        '',
        'See [here](there.md#there), [gone](missing_page.md#b), '
        '[web](https://example.org/x.md), [top](#sample), '
        '[no such heading](there.md#elsewhere) and [nor here](#nowhere).',
        '',
        'Train `configs/llvip/demo_cpu.py` or `configs/llvip/no_such.py`.',
        '',
        '```bash',
        'python tools/train.py configs/llvip/demo_cpu.py --amp --no-such-flag',
        'python tools/check_dataset.py CONFIG --show-dir out/ | head --lines 3',
        'mmsafe-preflight CONFIG --json --no-such-check',
        'torchrun -m mmsafe.tools.train CONFIG --launcher pytorch --nope',
        'mmsafe-nothing CONFIG --x',
        '```',
        '',
        '- `tools/test.py`: `--work-dir`, `--bogus-option`;',
        '- `benchmarks/not_there.py --rounds 1`',
        '- `tools/check_dataset.py CONFIG --show-dir DIR` draws pairs.',
        '',
        '  Its continuation: `--max-offset` and `--no-such-offset`.',
        '',
        'A new paragraph: `--not-attributed` and `--resume`.',
        '',
        'Paragraphs naming another program: pip\'s `--no-build-isolation`,',
        'srun `--kill-on-bad-exit`.',
    ])
    md = tmp_path / 'docs' / 'sample.md'
    assert broken_links(sample, md) == [
        'missing_page.md#b', 'there.md#elsewhere', '#nowhere']
    assert missing_paths(sample) == ['configs/llvip/no_such.py',
                                     'benchmarks/not_there.py']
    assert sorted(unknown_options(sample)) == [
        '(any script) --not-attributed',
        'benchmarks/not_there.py (no such file)',
        'mmsafe-nothing (no such file)',
        'mmsafe-preflight --no-such-check',
        'mmsafe.tools.train --nope',
        'tools/check_dataset.py --no-such-offset',
        'tools/test.py --bogus-option',
        'tools/train.py --no-such-flag']
