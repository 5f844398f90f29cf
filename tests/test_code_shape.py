"""The code's shape (issue 26's targets), read with ``ast`` only: nothing is imported; it runs in about a second.

* No file in ``hf_tpu_ext/``, ``spaces_demo/``, ``benchmarks/`` and ``tests/`` (every test and helper, issue 49) over :data:`MAX_FILE_LINES` lines and no function
  (method, nested function) over :data:`MAX_FUNCTION_LINES` lines, counted from its ``def`` line to its last line
  (decorators not counted; a nested function's lines count in the outer one too).
* A ratchet: the files and functions already over a limit when this check came in are listed, with their size
  then, in :data:`FILE_OFFENDERS` and :data:`FUNCTION_OFFENDERS`. They may only shrink: a new offender fails, a
  listed one that grew fails, a listed one that is now within the limit (or gone) fails until its entry is removed.
* No import cycle among the modules of ``hf_tpu_ext`` (and of ``benchmarks``, ``spaces_demo``): every import
  counts, at module level or inside a function (a lazy import only moves the cycle to run time); imports under
  ``if TYPE_CHECKING:`` are not run and do not count. An edge goes to the most specific module named
  (``from hf_tpu_ext.hub import pusher`` -> ``hf_tpu_ext.hub.pusher``; ``from hf_tpu_ext.hub.pusher import X`` ->
  ``hf_tpu_ext.hub.pusher``), so a package ``__init__`` re-exporting its submodules is no cycle by itself.
  :data:`KNOWN_CYCLES` lists the cycles allowed for now, each with its reason; it too may only shrink.
* The save path's direction (issue 41): no module of ``hf_tpu_ext.hub`` or ``hf_tpu_ext.run`` imports a backend
  (a package under ``hf_tpu_ext/backends/``; the registry and the protocol, ``backends/__init__.py`` and
  ``base.py``, are what a run drives a backend through), and no module of ``hf_tpu_ext.backends`` imports
  ``hf_tpu_ext.run`` (a backend hands its saves up through the ``on_save`` it is given), at module level or inside
  a function.
* Where the own imports sit (at the top unless a framework or a measured start-up cost needs them in a function) and
  other libraries' private modules (one adapter each): ``tests/test_import_placement.py``, which shares this walk.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

from conftest import REPO_ROOT

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
#: the folders checked, relative to the repository root
ROOTS = ("hf_tpu_ext", "spaces_demo", "benchmarks")
#: the tests and their helpers, under the same size limits (not in the import checks: they are not product code)
TEST_FILES = "tests/**/*.py"
THIS_FILE = "tests/test_code_shape.py"

#: file -> its lines when it was last measured over the limit (only ever lower these numbers or drop entries)
FILE_OFFENDERS: Dict[str, int] = {
}
#: "file::Class.function" -> its lines when it was last measured over the limit (only ever lower or drop)
FUNCTION_OFFENDERS: Dict[str, int] = {
}
#: the members of an import cycle allowed for now -> why, and what ends it
KNOWN_CYCLES: Dict[frozenset, str] = {
}


# ============================================================================================ sizes
def _python_files(helpers: bool = False) -> Iterator[Tuple[str, Path]]:
    """The checked files (``helpers``: the :data:`TEST_FILES` too) as ``(relative path, path)``."""
    for root in ROOTS:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path.relative_to(REPO_ROOT).as_posix(), path
    if helpers:
        for path in sorted(REPO_ROOT.glob(TEST_FILES)):
            if "__pycache__" not in path.parts:
                yield path.relative_to(REPO_ROOT).as_posix(), path


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[Tuple[str, int, int]]:
    """``(qualified name, def line, lines)`` of every function in ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, node.lineno, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:  # functions under if/try/with blocks
            yield from _functions(node, prefix)


def measure() -> Tuple[Dict[str, int], Dict[str, Tuple[int, int]]]:
    """``({file: lines}, {"file::qualname": (lines, def line)})`` of every checked file and function."""
    files: Dict[str, int] = {}
    functions: Dict[str, Tuple[int, int]] = {}
    for rel, path in _python_files(helpers=True):
        text = path.read_text(encoding="utf-8")
        files[rel] = len(text.splitlines())
        for name, line, length in _functions(ast.parse(text, filename=rel)):
            key = f"{rel}::{name}"
            if length > functions.get(key, (0, 0))[0]:  # a property and its setter share a name: the longer
                functions[key] = (length, line)
    return files, functions


def ratchet_failures(limit: int, measured: Dict[str, int], offenders: Dict[str, int], labels: Dict[str, str],
                     table: str, advice: str) -> List[str]:
    """The ratchet's verdicts, one line each: new offenders, grown ones, and entries to remove.

    Args:
        limit: the most lines allowed.
        measured: name (a key of ``offenders``' kind) -> lines now.
        offenders: the ratchet's table, name -> lines allowed.
        labels: name -> how a message names it (``"path:line: function f"``).
        table: the table's name in this file; advice: what to do about an offender.
    """
    failures = []
    for name, size in sorted(measured.items()):
        if size <= limit:
            continue
        recorded = offenders.get(name)
        if recorded is None:
            failures.append(f"{labels[name]} is {size} lines, over the {limit}-line limit. {advice} ({table} in "
                            f"{THIS_FILE} lists only what was over the limit when the check came in: add nothing "
                            "to it.)")
        elif size > recorded:
            failures.append(f"{labels[name]} grew to {size} lines; {table} in {THIS_FILE} allows it at most "
                            f"{recorded} (an offender may only shrink). {advice} Do not raise the number.")
    for name, recorded in sorted(offenders.items()):
        size = measured.get(name)
        if size is None:
            failures.append(f"{name} no longer exists: remove its entry from {table} in {THIS_FILE} (what moved "
                            "or was renamed is checked under its new name).")
        elif size <= limit:
            failures.append(f"{labels[name]} is now {size} lines, within the {limit}-line limit: remove its entry "
                            f"from {table} in {THIS_FILE} so that it stays there.")
    return failures


def test_no_file_over_600_lines_beyond_the_ratchet():
    files, _ = measure()
    assert len(files) > 50 and "hf_tpu_ext/cli.py" in files and "spaces_demo/app.py" in files
    assert "tests/loopback_hub.py" in files and "tests/loopback_hub_handler.py" in files
    assert THIS_FILE in files and "tests/current/test_keras3_callbacks.py" in files  # the tests, tests/current too
    failures = ratchet_failures(MAX_FILE_LINES, files, FILE_OFFENDERS, {f: f"{f}: the file" for f in files},
                                "FILE_OFFENDERS", "Split it by job into modules of at most 600 lines.")
    assert not failures, "\n".join(failures)


def test_no_function_over_80_lines_beyond_the_ratchet():
    _, functions = measure()
    assert functions["hf_tpu_ext/cli.py::main"][0] > 1  # the walk finds functions
    labels = {k: f"{k.split('::')[0]}:{line}: function {k.split('::')[1]}" for k, (_, line) in functions.items()}
    failures = ratchet_failures(MAX_FUNCTION_LINES, {k: v[0] for k, v in functions.items()}, FUNCTION_OFFENDERS,
                                labels, "FUNCTION_OFFENDERS", "Move its steps into functions of at most 80 lines.")
    assert not failures, "\n".join(failures)


def test_ratchet_verdicts():
    """The ratchet itself: each way to fail says what to do; shrinking while still over the limit passes."""
    labels = {n: f"{n}: the file" for n in ("a.py", "b.py", "c.py", "d.py", "e.py")}
    failures = ratchet_failures(10, {"a.py": 12, "b.py": 30, "c.py": 9, "d.py": 18},
                                {"b.py": 20, "c.py": 15, "d.py": 25, "e.py": 11}, labels, "T", "Split it.")
    assert failures == [
        f"a.py: the file is 12 lines, over the 10-line limit. Split it. (T in {THIS_FILE} lists only what was over "
        "the limit when the check came in: add nothing to it.)",
        f"b.py: the file grew to 30 lines; T in {THIS_FILE} allows it at most 20 (an offender may only shrink). "
        "Split it. Do not raise the number.",
        f"c.py: the file is now 9 lines, within the 10-line limit: remove its entry from T in {THIS_FILE} so that "
        "it stays there.",
        f"e.py no longer exists: remove its entry from T in {THIS_FILE} (what moved or was renamed is checked "
        "under its new name).",
    ]  # d.py shrank from 25 to 18 lines, still over 10: allowed


# ============================================================================================ import cycles
def _module_name(rel: str) -> str:
    parts = rel[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(nodes, in_function: bool = False) -> Iterator[Tuple[ast.stmt, bool]]:
    """Every import statement under ``nodes`` that runs (``if TYPE_CHECKING:`` bodies skipped), with whether it is
    inside a function."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse, in_function)
        else:
            inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _imports(ast.iter_child_nodes(node), inner)


def _resolve(name: str, modules: Set[str]) -> Optional[str]:
    """The most specific checked module that ``name`` (dotted) is or lies in; None outside the checked ones."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_targets(node: ast.stmt, package: str, known: Set[str]) -> List[str]:
    """The absolute dotted names an import statement in ``package`` brings in, one per alias: ``from a import b``
    -> ``a.b`` when that is a module of ``known``, else ``a``; relative imports resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from .x import y / from .. import z
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def import_graph(sources: Dict[str, str]) -> Dict[str, Dict[str, str]]:
    """``{module: {imported module: "file:line"}}`` among the modules of ``sources`` (``{relative path: text}``)."""
    modules = {_module_name(rel): rel for rel in sources}
    known = set(modules)
    graph: Dict[str, Dict[str, str]] = {m: {} for m in modules}
    for module, rel in modules.items():
        package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
        for node, in_function in _imports([ast.parse(sources[rel], filename=rel)]):
            for target in (_resolve(name, known) for name in import_targets(node, package, known)):
                if target and target != module and target not in graph[module]:
                    graph[module][target] = f"{rel}:{node.lineno}" + (" (in a function)" if in_function else "")
    return graph


def strongly_connected(graph: Dict[str, Dict[str, str]]) -> List[List[str]]:
    """Tarjan's strongly connected components with more than one module (each an import cycle), sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(start: str) -> None:  # iterative: no recursion limit on deep graphs
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def cycle_path(graph: Dict[str, Dict[str, str]], members: List[str]) -> str:
    """One cycle through the component's first member, each edge with where it is imported."""
    start, inside = members[0], set(members)
    previous: Dict[str, str] = {}
    frontier = [start]
    while frontier and start not in previous:  # breadth-first back to the start, inside the component
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child in inside and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    hops, node = [start], previous[start]
    while node != start:  # walk the discoveries back: start <- ... <- start
        hops.append(node)
        node = previous[node]
    hops = [start] + hops[::-1]
    return " -> ".join(f"{a} ({graph[a][b]})" for a, b in zip(hops, hops[1:])) + f" -> {start}"


def cycle_failures(graph: Dict[str, Dict[str, str]], known: Dict[frozenset, str]) -> List[str]:
    """One line per import cycle not in ``known`` and per ``known`` cycle that is gone."""
    components = strongly_connected(graph)
    failures = [f"import cycle among {', '.join(c)}: {cycle_path(graph, c)}. Break it: move what both sides need "
                "into a module below them (the layering in pyproject.toml [tool.importlinter]) or pass it in as an "
                "argument; a lazy import inside a function is still a cycle." for c in components
                if frozenset(c) not in known]
    failures += [f"the known import cycle {', '.join(sorted(c))} is gone: remove it from KNOWN_CYCLES in "
                 f"{THIS_FILE}." for c in known if sorted(c) not in components]
    return failures


def test_no_import_cycle_beyond_the_known_ones():
    sources = {rel: path.read_text(encoding="utf-8") for rel, path in _python_files()}
    graph = import_graph(sources)
    # the graph holds module-level and function-level edges of every root
    assert graph["hf_tpu_ext.backends.tensorflow.backend"]["hf_tpu_ext.backends.tensorflow.trainer"].endswith(
        " (in a function)")
    assert "benchmarks.common" in graph["benchmarks.keras_recipes"]
    assert "hf_tpu_ext.fill_mask" in graph["spaces_demo.app"]
    failures = cycle_failures(graph, KNOWN_CYCLES)
    assert not failures, "\n".join(failures)


def test_cycle_check_finds_lazy_and_relative_cycles():
    sources = {
        "pkg/__init__.py": "from pkg.a import f\n",
        "pkg/a.py": "from . import b\ndef f():\n    pass\n",
        "pkg/b.py": "def g():\n    from pkg.a import f\n    return f\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "pkg/d.py": "import pkg.c\n",
        "pkg/e.py": "from pkg import f\n",
        "pkg/f.py": "from .e import x\n",
    }
    graph = import_graph(sources)
    assert graph["pkg.a"] == {"pkg.b": "pkg/a.py:1"} and graph["pkg.b"] == {"pkg.a": "pkg/b.py:2 (in a function)"}
    assert graph["pkg.c"] == {} and graph["pkg"] == {"pkg.a": "pkg/__init__.py:1"}
    assert strongly_connected(graph) == [["pkg.a", "pkg.b"], ["pkg.e", "pkg.f"]]
    assert cycle_path(graph, ["pkg.a", "pkg.b"]) == (
        "pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:2 (in a function)) -> pkg.a")
    failures = cycle_failures(graph, {frozenset({"pkg.a", "pkg.b"}): "known", frozenset({"pkg.x", "pkg.y"}): "old"})
    assert failures[0].startswith("import cycle among pkg.e, pkg.f: pkg.e (pkg/e.py:1) -> pkg.f (pkg/f.py:1) -> "
                                  "pkg.e. Break it: move what both sides need")
    assert failures[1] == f"the known import cycle pkg.x, pkg.y is gone: remove it from KNOWN_CYCLES in {THIS_FILE}."
    assert len(failures) == 2


# ============================================================================================ framework-free ground
#: deep-learning frameworks (and their runtimes) a ground module must never import
FRAMEWORKS = ("jax", "jaxlib", "tensorflow", "tf_keras", "keras", "torch", "torch_xla", "flax")


def framework_imports(source: str, filename: str) -> List[str]:
    """``"<module> (line N)"`` for every import of a :data:`FRAMEWORKS` module in ``source``, in a function too."""
    found = []
    for node, _ in _imports([ast.parse(source, filename=filename)]):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if not node.level else [])
        found += [f"{n} (line {node.lineno})" for n in names if n.split(".")[0] in FRAMEWORKS]
    return found


def test_distributed_imports_no_framework():
    """``hf_tpu_ext/distributed.py`` answers every backend's "which process am I" without loading a framework: JAX's
    multi-process code is ``backends/keras/processes.py``'s (issue 41 item 4)."""
    source = (REPO_ROOT / "hf_tpu_ext" / "distributed.py").read_text()
    assert framework_imports(source, "distributed.py") == []
    assert framework_imports("def f():\n    import jax.numpy as jnp\n    from jax._src import distributed\n",
                             "x.py") == ["jax.numpy (line 2)", "jax._src (line 3)"]


# ============================================================================================ the save path's direction
def backend_packages() -> List[str]:
    """The backends: every folder of modules under ``hf_tpu_ext/backends/`` (``hf_tpu_ext.backends.keras``, ...)."""
    folder = REPO_ROOT / "hf_tpu_ext" / "backends"
    return sorted(f"hf_tpu_ext.backends.{p.name}" for p in folder.iterdir() if p.is_dir() and any(p.glob("*.py")))


def direction_failures(graph: Dict[str, Dict[str, str]], backends: List[str]) -> List[str]:
    """One line per import against the save path's direction: ``hub``/``run`` -> a module of ``backends`` (the
    backend packages), a module of ``hf_tpu_ext.backends`` -> ``run``."""
    def under(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    failures = []
    for module, targets in sorted(graph.items()):
        for target, where in sorted(targets.items()):
            if (under(module, "hf_tpu_ext.hub") or under(module, "hf_tpu_ext.run")) and any(
                    under(target, b) for b in backends):
                failures.append(f"{module} imports the backend module {target} ({where}): hub/ and run/ take a "
                                "backend's work as arguments (e.g. export_checkpoint), never import a backend.")
            if under(module, "hf_tpu_ext.backends") and under(target, "hf_tpu_ext.run"):
                failures.append(f"{module} imports {target} ({where}): a backend hands its saves up through the "
                                "on_save it is given, never imports run/.")
    return failures


def test_hub_and_run_import_no_backend_and_no_backend_imports_run():
    sources = {rel: path.read_text(encoding="utf-8") for rel, path in _python_files()}
    graph = import_graph(sources)
    backends = backend_packages()
    assert {"hf_tpu_ext.backends.keras", "hf_tpu_ext.backends.tensorflow", "hf_tpu_ext.backends.torch_xla"} <= set(
        backends)
    assert "hf_tpu_ext.backends" in graph["hf_tpu_ext.run.lifecycle"]  # the graph sees run/'s (lazy) imports
    failures = direction_failures(graph, backends)
    assert not failures, "\n".join(failures)


def test_direction_check_names_each_wrong_import():
    graph = {"hf_tpu_ext.hub.x": {"hf_tpu_ext.backends.keras.checkpoint": "hf_tpu_ext/hub/x.py:3 (in a function)"},
             "hf_tpu_ext.run.y": {"hf_tpu_ext.backends.tensorflow": "hf_tpu_ext/run/y.py:1",
                                  "hf_tpu_ext.backends.base": "hf_tpu_ext/run/y.py:2"},
             "hf_tpu_ext.backends.keras.loop": {"hf_tpu_ext.run.state": "hf_tpu_ext/backends/keras/loop.py:9"},
             "hf_tpu_ext.backends.loop": {"hf_tpu_ext.runner": "hf_tpu_ext/backends/loop.py:1"}}
    assert direction_failures(graph, ["hf_tpu_ext.backends.keras", "hf_tpu_ext.backends.tensorflow"]) == [
        "hf_tpu_ext.backends.keras.loop imports hf_tpu_ext.run.state (hf_tpu_ext/backends/keras/loop.py:9): a backend "
        "hands its saves up through the on_save it is given, never imports run/.",
        "hf_tpu_ext.hub.x imports the backend module hf_tpu_ext.backends.keras.checkpoint (hf_tpu_ext/hub/x.py:3 (in a "
        "function)): hub/ and run/ take a backend's work as arguments (e.g. export_checkpoint), never import a backend.",
        "hf_tpu_ext.run.y imports the backend module hf_tpu_ext.backends.tensorflow (hf_tpu_ext/run/y.py:1): hub/ and "
        "run/ take a "
        "backend's work as arguments (e.g. export_checkpoint), never import a backend."]


# ============================================================================================ environment variables
#: the product code whose environment reads are counted (the benchmarks and tests are not the product)
PRODUCT_ROOTS = ("hf_tpu_ext", "spaces_demo")


def _strings(node: ast.expr, known: Dict[str, Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
    """The strings ``node`` stands for: a literal, a tuple of them (``*T`` spread), a name of ``known``; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.Starred):
        return _strings(node.value, known)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
        whole = _strings(node.value, known)  # JAX_TIMEOUTS[0]
        return (whole[node.slice.value],) if whole and -len(whole) <= node.slice.value < len(whole) else None
    if isinstance(node, (ast.Tuple, ast.List)):
        parts = [_strings(e, known) for e in node.elts]
        return None if any(p is None for p in parts) else tuple(s for p in parts for s in p)
    return None


def module_constants(tree: ast.Module, imported: Dict[str, Tuple[str, ...]]) -> Dict[str, Tuple[str, ...]]:
    """Names bound to strings (or tuples of strings) in ``tree``, beside ``imported`` ones: module-level
    assignments (``A = "X"``, ``A, B = "X", "Y"``) and loop variables over such tuples (``for v in ("X", T)``)."""
    known = dict(imported)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and _strings(node.value, known) is not None:
                    known[target.id] = _strings(node.value, known)
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for name, value in zip(target.elts, node.value.elts):
                        if isinstance(name, ast.Name) and _strings(value, known) is not None:
                            known[name.id] = _strings(value, known)
    for node in ast.walk(tree):
        loop = [(node.target, node.iter)] if isinstance(node, ast.For) else [
            (g.target, g.iter) for g in getattr(node, "generators", [])]
        for target, values in loop:
            if isinstance(target, ast.Name) and _strings(values, known) is not None:
                known[target.id] = _strings(values, known)
    return known


def _is_environ(node: ast.expr, aliases: Set[str]) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id in aliases)


def environment_reads(tree: ast.Module, known: Dict[str, Tuple[str, ...]]) -> List[Tuple[str, int]]:
    """``(variable, line)`` of each read of ``os.environ`` in ``tree``: ``.get(v)``, ``.pop(v)``, ``[v]``, ``v in``,
    ``os.getenv(v)``, through a name bound to an expression holding ``os.environ`` too (``setdefault`` and item
    assignment are writes). A variable that cannot be told is ``"?"``."""
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and any(isinstance(n, ast.Attribute) and n.attr == "environ" for n in ast.walk(node.value))
               for t in node.targets if isinstance(t, ast.Name)} | {"environ"} & {
        a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "os"
        for a in node.names}
    found = []
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "pop") and _is_environ(node.func.value, aliases):
                arg = node.args[0]
            elif node.func.attr == "getenv":
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value, aliases):
            arg = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) and _is_environ(
                node.comparators[0], aliases):
            arg = node.left
        if arg is not None:
            found += [(name, node.lineno) for name in (_strings(arg, known) or ("?",))]
    return found


def environment_readers(sources: Dict[str, str]) -> Dict[str, Dict[str, List[int]]]:
    """``{variable: {file: [lines]}}`` of every environment read in ``sources`` (``{relative path: text}``); a
    name imported from another module of ``sources`` resolves to that module's constant."""
    trees = {rel: ast.parse(text, filename=rel) for rel, text in sources.items()}
    own = {_module_name(rel): module_constants(tree, {}) for rel, tree in trees.items()}
    readers: Dict[str, Dict[str, List[int]]] = {}
    for rel, tree in trees.items():
        imported = {a.asname or a.name: own[node.module][a.name] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module in own
                    for a in node.names if a.name in own[node.module]}
        for name, line in environment_reads(tree, module_constants(tree, imported)):
            readers.setdefault(name, {}).setdefault(rel, []).append(line)
    return readers


def test_every_environment_variable_has_one_reader_and_a_row():
    sources = {rel: path.read_text(encoding="utf-8") for rel, path in _python_files() if rel.startswith(
        tuple(root + "/" for root in PRODUCT_ROOTS))}
    readers = environment_readers(sources)
    assert {"JAX_PROCESS_ID", "KERAS_BACKEND", "MODEL_ID", "HF_TOKEN", "XLA_FLAGS"} <= set(readers)  # the scan sees them
    several = [f"{name} is read in {len(files)} modules ({', '.join(sorted(files))}): read it in one and ask "
               "that one" for name, files in sorted(readers.items()) if len(files) > 1]
    unknown = [f"{rel}:{lines[0]}" for rel, lines in readers.get("?", {}).items()]
    assert not several and not unknown, "\n".join(several + [f"an environment read of a variable that cannot be "
                                                             f"told (name it with a constant): {u}" for u in unknown])
    text = (REPO_ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("### Environment variables", 1)[1].split("\n### ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `"))
    missing = [name for name in sorted(readers) if f"`{name}`" not in table]
    assert not missing, f"ARCHITECTURE.md's environment table lacks: {', '.join(missing)}"


def test_environment_scan_resolves_names():
    sources = {
        "pkg/names.py": 'A = "A_VAR"\nB, C = "B_VAR", "C_VAR"\nBOTH = (A, B)\n',
        "pkg/one.py": ("import os\nfrom pkg.names import BOTH, C\n"
                       "def f(environ=None):\n    env = os.environ if environ is None else environ\n"
                       "    return env.get(C), [os.environ.get(n) for n in BOTH], os.environ['D_VAR']\n"),
        "pkg/two.py": ("import os\ndef g(name):\n    os.environ.setdefault('E_VAR', '1')\n"
                       "    return 'A_VAR' in os.environ, os.getenv(name)\n"),
    }
    assert environment_readers(sources) == {
        "C_VAR": {"pkg/one.py": [5]}, "A_VAR": {"pkg/one.py": [5], "pkg/two.py": [4]}, "B_VAR": {"pkg/one.py": [5]},
        "D_VAR": {"pkg/one.py": [5]}, "?": {"pkg/two.py": [4]}}


# ============================================================================================ private names
def private_name_imports(sources: Dict[str, str], roots: Tuple[str, ...] = PRODUCT_ROOTS) -> List[str]:
    """``"file:line: module._name"`` for every import of another module's private name (``_x``, not ``__x__``)
    among the project's own modules (absolute or relative), in a function too."""
    found = []
    for rel, text in sorted(sources.items()):
        for node, _ in _imports([ast.parse(text, filename=rel)]):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in roots):
                found += [f"{rel}:{node.lineno}: {'.' * node.level}{node.module or ''}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_name():
    sources = {rel: path.read_text(encoding="utf-8") for rel, path in _python_files() if rel.startswith(
        tuple(root + "/" for root in PRODUCT_ROOTS))}
    found = private_name_imports(sources)
    assert not found, "\n".join(f"{f}: a private name of another module; make it public (named, documented) or "
                                "ask the module a public question" for f in found)
    assert private_name_imports({"pkg/a.py": "def f():\n    from pkg.b import _x, y, __all__\nfrom .c import _z\n"},
                                ("pkg",)) == ["pkg/a.py:2: pkg.b._x", "pkg/a.py:3: .c._z"]
