"""mmsafe's own modules import each other without a cycle.

The graph is read from the source (the AST of every file under mmsafe/;
nothing is imported): every ``import`` and ``from ... import`` statement,
function-level ones included, relative ones resolved. ``import pkg.mod``
points at the module ``pkg.mod``; ``from pkg import name`` points at the
package ``pkg`` (its ``__init__``, which Python runs first), and at the
module ``pkg.name`` too when ``name`` is one. A cycle, even one that a
function-level import makes work at run time, ties the modules on it
together: each import order has to be thought through again when one of
them changes. The analysis that training hooks and the tools share
(``mmsafe.analysis``) sits below both: it reaches neither, not even
through other modules. Every module belongs to one of :data:`LAYERS` and
imports no module of a layer above its own (the tools' own code,
``mmsafe.tools_lib``, never imports a tool).
"""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = 'mmsafe'


def module_files(root: Path = ROOT,
                 package: str = PACKAGE) -> Dict[str, Path]:
    """Every module of ``package`` (dotted name -> file); a package is its
    ``__init__.py``."""
    modules = {}
    for path in sorted((root / package).rglob('*.py')):
        parts = list(path.relative_to(root).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts = parts[:-1]
        modules['.'.join(parts)] = path
    return modules


def _base(module: str, path: Path, level: int,
          name: Optional[str]) -> Optional[str]:
    """The dotted name a ``from`` statement imports from."""
    if level == 0:
        return name
    package = module.split('.')
    if path.name != '__init__.py':
        package = package[:-1]
    if level > 1:
        package = package[:len(package) - (level - 1)]
    if not package:
        return None
    return '.'.join(package + ([name] if name else []))


def _owner(dotted: str, modules: Dict[str, Path]) -> Optional[str]:
    """The longest known module that ``dotted`` names or lies in."""
    parts = dotted.split('.')
    while parts:
        candidate = '.'.join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path,
               modules: Dict[str, Path]) -> Set[str]:
    """The modules of ``modules`` that ``module`` (at ``path``) imports."""
    tree = ast.parse(path.read_text(encoding='utf-8'), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node.level, node.module)
            if base is None:
                continue
            # ``from pkg import x`` runs pkg's __init__ first; x may be a
            # module of pkg as well
            targets = [base] + [
                f'{base}.{alias.name}' for alias in node.names
                if f'{base}.{alias.name}' in modules
            ]
        else:
            continue
        for target in targets:
            owner = _owner(target, modules)
            if owner is not None and owner != module:
                found.add(owner)
    return found


def import_graph(root: Path = ROOT,
                 package: str = PACKAGE) -> Dict[str, Set[str]]:
    """``module -> the package's modules it imports``."""
    modules = module_files(root, package)
    return {
        name: imports_of(name, path, modules)
        for name, path in modules.items()
    }


def strongly_connected(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's strongly connected components of ``graph`` with more than
    one module (iterative: no recursion limit), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def _describe(component: List[str], graph: Dict[str, Set[str]]) -> str:
    members = set(component)
    edges = [
        f'    {a} -> {b}' for a in component
        for b in sorted(graph[a] & members)
    ]
    return (f'  {len(component)} modules: {", ".join(component)}\n' +
            '\n'.join(edges))


def test_the_graph_is_read_as_documented(tmp_path):
    pkg = tmp_path / 'pkg'
    (pkg / 'sub').mkdir(parents=True)
    (pkg / '__init__.py').write_text('from . import a\n')
    (pkg / 'a.py').write_text('from .sub import name\n'
                              'def f():\n    from .sub import b\n')
    (pkg / 'sub' / '__init__.py').write_text('from ..a import thing\n')
    (pkg / 'sub' / 'b.py').write_text('import pkg.sub.c.deep\n'
                                      'from .. import a\nimport os\n')
    (pkg / 'sub' / 'c.py').write_text('from pkg import x\n')
    graph = import_graph(tmp_path, 'pkg')
    assert graph == {
        'pkg': {'pkg.a'},
        'pkg.a': {'pkg.sub', 'pkg.sub.b'},
        'pkg.sub': {'pkg.a'},
        'pkg.sub.b': {'pkg', 'pkg.a', 'pkg.sub.c'},
        'pkg.sub.c': {'pkg'},
    }
    assert strongly_connected(graph) == [['pkg', 'pkg.a', 'pkg.sub',
                                          'pkg.sub.b', 'pkg.sub.c']]
    assert strongly_connected({'x': {'y'}, 'y': set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50, sorted(graph)
    cycles = strongly_connected(graph)
    assert not cycles, (
        f'{len(cycles)} import cycle(s) among mmsafe\'s modules (each a '
        'strongly connected component, with its edges):\n' +
        '\n'.join(_describe(c, graph) for c in cycles))


def _reachable(graph: Dict[str, Set[str]], start: str) -> Set[str]:
    """Every module that importing ``start`` may import, directly or
    through others (``start`` itself excluded)."""
    seen: Set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    seen.discard(start)
    return seen


# The analysis shared by training hooks and the tools sits below both.
ANALYSIS = 'mmsafe.analysis'
ABOVE_ANALYSIS = ('mmsafe.engine', 'mmsafe.tools', 'mmsafe.tools_lib')


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + '.')


def test_analysis_imports_neither_the_engine_nor_the_tools():
    graph = import_graph()
    analysis = sorted(m for m in graph if _within(m, ANALYSIS))
    assert 'mmsafe.analysis.object_offsets' in analysis, analysis
    # used from both sides: the training hook and the dataset checker
    assert any(_within(m, 'mmsafe.engine') and graph[m] & set(analysis)
               for m in graph)
    assert any(_within(m, 'mmsafe.tools_lib') and graph[m] & set(analysis)
               for m in graph)
    upward = {
        f'{module} -> {target}'
        for module in analysis for target in _reachable(graph, module)
        if any(_within(target, above) for above in ABOVE_ANALYSIS)
    }
    assert not upward, (
        f'{ANALYSIS} imports, directly or through other modules, what is '
        'built on it:\n  ' + '\n  '.join(sorted(upward)))


def test_reachable_follows_imports_through_other_modules():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': set()}
    assert _reachable(graph, 'a') == {'b', 'c'}
    assert _reachable(graph, 'd') == set()


# The layers of mmsafe, lowest first. A module imports its own layer and
# those below it, never one above: what a layer is built on does not
# depend on it. ``mmsafe`` is the package itself (importing it registers
# every component); the tools import it, nothing below them does.
LAYERS = (
    ('foundation', ('mmsafe.errors', 'mmsafe.version', 'mmsafe._deps',
                    'mmsafe.compat', 'mmsafe.registry', 'mmsafe.registry_help',
                    'mmsafe.dist', 'mmsafe.rng', 'mmsafe.guard_outputs',
                    'mmsafe.modalities', 'mmsafe.events')),
    ('components', ('mmsafe.checkpoint', 'mmsafe.datasets', 'mmsafe.models',
                    'mmsafe.evaluation')),
    ('analysis', (ANALYSIS, )),
    ('engine', ('mmsafe.engine', )),
    ('package', ('mmsafe', )),
    ('tool support', ('mmsafe.configs', 'mmsafe.preflight',
                      'mmsafe.tools_lib')),
    ('tools', ('mmsafe.tools', )),
)


def layer_of(module: str, layers=LAYERS) -> Optional[int]:
    """The index in ``layers`` of the layer that ``module`` belongs to (its
    longest listed package; the root package only as itself)."""
    best, found = -1, None
    for index, (_, packages) in enumerate(layers):
        for package in packages:
            own = module == package if '.' not in package else \
                _within(module, package)
            if own and len(package) > best:
                best, found = len(package), index
    return found


def upward_imports(graph: Dict[str, Set[str]], layers=LAYERS) -> List[str]:
    """``a -> b`` for every import of a module of a higher layer."""
    return sorted(
        f'{module} ({layers[layer_of(module, layers)][0]}) -> {target} '
        f'({layers[layer_of(target, layers)][0]})'
        for module, targets in graph.items() for target in targets
        if layer_of(target, layers) > layer_of(module, layers))


def test_the_layer_rule_is_read_as_documented():
    layers = (('low', ('pkg.a', )), ('high', ('pkg.b', 'pkg')))
    assert layer_of('pkg.a.x', layers) == 0
    assert layer_of('pkg.b', layers) == 1 and layer_of('pkg', layers) == 1
    assert layer_of('pkg.c', layers) is None
    graph = {'pkg.a.x': {'pkg.b.y'}, 'pkg.b.y': {'pkg.a'}, 'pkg.a': set(),
             'pkg': {'pkg.a'}}
    assert upward_imports(graph, layers) == ['pkg.a.x (low) -> pkg.b.y (high)']


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not unplaced, (
        'modules in no layer of LAYERS (add their package where it '
        f'belongs): {unplaced}')


def test_no_module_imports_a_layer_above_it():
    assert layer_of('mmsafe.tools_lib.cli') < layer_of('mmsafe.tools')
    upward = upward_imports(import_graph())
    assert not upward, (
        'imports of a higher layer (move the shared code down, into the '
        'lower layer, and import it from there):\n  ' + '\n  '.join(upward))
