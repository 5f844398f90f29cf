"""Where the package imports its own modules (issue 49 item 3), read with ``ast`` only, like
``tests/test_code_shape.py`` (whose import walk it shares; that file is near its 600-line limit).

* At most :data:`MAX_IN_FUNCTION` imports of the project's own modules sit inside functions (``if TYPE_CHECKING:``
  imports do not count).
* None of them imports a framework-free module: one whose top-level imports, followed through the package's own
  modules (and the packages above them, whose ``__init__`` runs first), reach no :data:`FRAMEWORKS` module. Such a
  module costs no framework at start-up, so it is imported at the top where the reader sees it. The set is computed
  here from the code, never listed. Exceptions:
  :data:`START_UP`, the modules a command imports inside a function for a measured start-up cost (each with its
  reason; an entry no longer used fails until removed), and :data:`PENDING`, a ratchet of the files other
  developers were editing when this check came in: their count may only shrink, and an entry at 0 fails until
  removed.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Set, Tuple

from test_code_shape import PRODUCT_ROOTS, THIS_FILE as SHAPE_FILE, _imports, _module_name, _python_files, _resolve, \
    import_targets

THIS_FILE = "tests/test_import_placement.py"
#: what a framework-free module never imports at its top, directly or through the package's own top imports
FRAMEWORKS = ("tensorflow", "tf_keras", "keras", "keras_hub", "jax", "torch", "torch_xla", "transformers", "gradio",
              "datasets", "apache_beam")
#: the most imports of the project's own modules inside functions (issue 49: 322, then 270 before this check, 89
#: with the last files pending, 56 after them)
MAX_IN_FUNCTION = 60
_NUMPY_HELP = "numpy (+0.15 s measured) stays out of the command's --help"
#: file -> the framework-free modules it imports inside functions for a measured start-up cost, and why (a command,
#: or a module ``hf-tpu train`` imports at its top before it parses the command line)
START_UP: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "hf_tpu_ext/args/training_arguments.py": (("hf_tpu_ext.probes",), "numpy (+0.1 s measured) stays out of "
                                                                       "hf-tpu train --help"),
    "hf_tpu_ext/commands/early_checks.py": (("hf_tpu_ext.backends.keras.checkpoint", "hf_tpu_ext.run.checks",
                                             "hf_tpu_ext.run.pushes", "hf_tpu_ext.run.resume", "hf_tpu_ext.run.state"),
                                            "the run's modules and the Keras checkpoint (numpy: +0.2 s measured) stay "
                                            "out of hf-tpu train --help (commands/train.py imports this at its top)"),
    "hf_tpu_ext/commands/train.py": (("hf_tpu_ext.run",), "the run's modules (numpy, yaml: +0.15 s measured) stay "
                                                          "out of hf-tpu train --help"),
    "hf_tpu_ext/commands/demo.py": (("hf_tpu_ext.fill_mask.quiet",), _NUMPY_HELP),
    "hf_tpu_ext/commands/deploy_space.py": (("hf_tpu_ext.hub.space",), _NUMPY_HELP),
    "hf_tpu_ext/commands/probe.py": (("hf_tpu_ext.fill_mask", "hf_tpu_ext.fill_mask.report", "hf_tpu_ext.probes"),
                                     _NUMPY_HELP),
    "hf_tpu_ext/commands/prepare_data.py": (("hf_tpu_ext.data.block_shards", "hf_tpu_ext.data.blocks",
                                             "hf_tpu_ext.data.loading", "hf_tpu_ext.data.sharding",
                                             "hf_tpu_ext.data.tfrecord"), _NUMPY_HELP),
}
#: file -> its in-function imports of framework-free modules when this check came in (files being edited by other
#: developers then; only ever lower these numbers or drop entries): every file done
PENDING: Dict[str, int] = {}


def _ancestors(module: str) -> List[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def framework_free(sources: Dict[str, str]) -> Set[str]:
    """The modules of ``sources`` (``{relative path: text}``) whose top-level imports reach no :data:`FRAMEWORKS`
    module, through the package's own modules and the packages above each (imports in functions not followed)."""
    modules = {_module_name(rel): rel for rel in sources}
    known = set(modules)
    own: Dict[str, Set[str]] = {}
    heavy: Set[str] = set()
    for module, rel in modules.items():
        package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
        own[module] = {a for a in _ancestors(module) if a in known}
        for node, in_function in _imports([ast.parse(sources[rel], filename=rel)]):
            for name in ([] if in_function else import_targets(node, package, known)):
                target = _resolve(name, known)
                if target:
                    own[module] |= {target} | {a for a in _ancestors(target) if a in known}
                elif name.split(".")[0] in FRAMEWORKS:
                    heavy.add(module)
    grown = True
    while grown:  # a module importing a heavy one at its top is heavy too
        before = len(heavy)
        heavy |= {m for m, targets in own.items() if targets & heavy}
        grown = len(heavy) > before
    return known - heavy


def own_imports_in_functions(sources: Dict[str, str], roots: Tuple[str, ...] = PRODUCT_ROOTS[:1]
                             ) -> List[Tuple[str, int, Tuple[str, ...]]]:
    """``(file, line, modules)`` of each import statement inside a function that brings in modules of ``sources``
    under ``roots`` (those modules, in the statement's order)."""
    known = {_module_name(rel) for rel in sources}
    found = []
    for rel, text in sorted(sources.items()):
        module = _module_name(rel)
        package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
        for node, in_function in _imports([ast.parse(text, filename=rel)]):
            targets = [_resolve(n, known) for n in import_targets(node, package, known) if n.split(".")[0] in roots]
            if in_function and any(targets):
                found.append((rel, node.lineno, tuple(t for t in targets if t)))
    return found


def placement_failures(sources: Dict[str, str], limit: int, start_up: Dict[str, Tuple[Tuple[str, ...], str]],
                       pending: Dict[str, int], roots: Tuple[str, ...] = PRODUCT_ROOTS[:1]) -> List[str]:
    """One line per finding: over ``limit``, a framework-free module imported in a function (beyond ``start_up``
    and ``pending``), a ``start_up`` module no longer imported so, a ``pending`` count grown or at 0."""
    found = own_imports_in_functions(sources, roots)
    free = framework_free(sources)
    failures = [f"{len(found)} imports of the project's own modules inside functions, over the {limit} allowed: "
                "move framework-free ones to the top of the module."] if len(found) > limit else []
    late: Dict[str, List[Tuple[int, str]]] = {}
    for rel, line, targets in found:
        early = [t for t in targets if t in free and t not in start_up.get(rel, ((), ""))[0]]
        if early:
            late.setdefault(rel, []).append((line, early[0]))
    for rel, hits in sorted(late.items()):
        if rel not in pending:
            failures += [f"{rel}:{line}: {target} is framework-free (its top imports load no framework): import it "
                         f"at the top of the module" for line, target in hits]
        elif len(hits) > pending[rel]:
            failures.append(f"{rel} imports framework-free modules inside functions {len(hits)} times; PENDING in "
                            f"{THIS_FILE} allows at most {pending[rel]} (it may only shrink): move them to the top.")
    failures += [f"{rel} is in PENDING but imports no framework-free module inside a function: remove its "
                 f"entry from PENDING in {THIS_FILE}." for rel in sorted(pending) if rel not in late]
    used = {(rel, target) for rel, _, targets in found for target in targets}
    failures += [f"{rel} no longer imports {target} inside a function: remove it from START_UP in {THIS_FILE}."
                 for rel, (targets, _) in sorted(start_up.items()) for target in targets if (rel, target) not in used]
    return failures


def _product_sources() -> Dict[str, str]:
    return {rel: path.read_text(encoding="utf-8") for rel, path in _python_files() if rel.startswith("hf_tpu_ext/")}


def test_framework_free_modules_are_imported_at_the_top():
    sources = _product_sources()
    free = framework_free(sources)
    # the ground is framework-free; a module importing a framework (or one that does) at its top is not
    assert {"hf_tpu_ext.errors", "hf_tpu_ext.fileio", "hf_tpu_ext.flops", "hf_tpu_ext.args.parser"} <= free
    assert not {"hf_tpu_ext.backends.tensorflow.trainer", "hf_tpu_ext.tf_model_folder", "hf_tpu_ext.data.masking",
                "hf_tpu_ext.callbacks.keras.throughput"} & free
    assert 0 < len(own_imports_in_functions(sources)) <= MAX_IN_FUNCTION
    failures = placement_failures(sources, MAX_IN_FUNCTION, START_UP, PENDING)
    assert not failures, "\n".join(failures)


def test_placement_check_names_each_finding():
    sources = {
        "pkg/__init__.py": "",
        "pkg/errors.py": "class E(Exception):\n    pass\n",
        "pkg/deep/__init__.py": "import torch\n",
        "pkg/deep/model.py": "from pkg import errors\n",  # framework-free itself, but its package is not
        "pkg/heavy.py": "import os\nfrom pkg.errors import E\nimport keras\n",
        "pkg/wraps.py": "from . import heavy\n",  # heavy through a top import
        "pkg/a.py": ("def f():\n    from pkg.errors import E\n    from pkg import wraps\n    import pkg.deep.model\n"
                     "    from .errors import E as F\n"),
        "pkg/b.py": "def g():\n    from pkg import errors, heavy\n",
    }
    assert framework_free(sources) == {"pkg", "pkg.errors", "pkg.a", "pkg.b"}  # imports in functions not followed
    assert own_imports_in_functions(sources, ("pkg",)) == [
        ("pkg/a.py", 2, ("pkg.errors",)), ("pkg/a.py", 3, ("pkg.wraps",)), ("pkg/a.py", 4, ("pkg.deep.model",)),
        ("pkg/a.py", 5, ("pkg.errors",)), ("pkg/b.py", 2, ("pkg.errors", "pkg.heavy"))]
    assert placement_failures(sources, 4, {"pkg/b.py": (("pkg.errors", "pkg.gone"), "why")}, {"pkg/c.py": 1},
                              ("pkg",)) == [
        "5 imports of the project's own modules inside functions, over the 4 allowed: move framework-free ones to the "
        "top of the module.",
        "pkg/a.py:2: pkg.errors is framework-free (its top imports load no framework): import it at the top of the "
        "module",
        "pkg/a.py:5: pkg.errors is framework-free (its top imports load no framework): import it at the top of the "
        "module",
        f"pkg/c.py is in PENDING but imports no framework-free module inside a function: remove its entry "
        f"from PENDING in {THIS_FILE}.",
        f"pkg/b.py no longer imports pkg.gone inside a function: remove it from START_UP in {THIS_FILE}."]
    assert placement_failures(sources, 9, {}, {"pkg/a.py": 1, "pkg/b.py": 1}, ("pkg",)) == [
        f"pkg/a.py imports framework-free modules inside functions 2 times; PENDING in {THIS_FILE} allows at most 1 "
        "(it may only shrink): move them to the top."]
    assert SHAPE_FILE == "tests/test_code_shape.py"


# ============================================================================================ other libraries' privates
def _is_private_module(name: str) -> bool:
    parts = name.split(".")
    return (any(p.startswith("_") and not p.startswith("__") for p in parts) or "src" in parts[1:2]
            or name.startswith("tensorflow.python"))


def private_module_imports(sources: Dict[str, str], own: Tuple[str, ...] = PRODUCT_ROOTS
                           ) -> List[Tuple[str, int, str, str]]:
    """``(file, line, private name, "function: its docstring")`` (``""`` at module level) of every import of another library's private
    module or name (``keras.src``, ``jax._src``, ``tensorflow.python``, ``from x import _y``)."""
    found = []

    def visit(rel: str, node: ast.AST, doc: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(rel, child, f"{child.name}: {' '.join((ast.get_docstring(child) or '').split())}")
            elif isinstance(child, ast.Import):
                found.extend((rel, child.lineno, a.name, doc) for a in child.names
                             if a.name.split(".")[0] not in own and _is_private_module(a.name))
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module.split(".")[0] not in own:
                names = [f"{child.module}.{a.name}" for a in child.names
                         if _is_private_module(child.module) or _is_private_module(a.name)]
                found.extend((rel, child.lineno, name, doc) for name in names)
            else:
                visit(rel, child, doc)

    for rel, text in sorted(sources.items()):
        visit(rel, ast.parse(text, filename=rel), "")
    return found


def private_module_failures(sources: Dict[str, str], pending: Dict[str, int]) -> List[str]:
    """One line per import of another library's private module outside an adapter (a function whose docstring
    names ``The public alternative``) beyond ``pending``, and per private module reached from two functions."""
    found = private_module_imports(sources)
    bare: Dict[str, List[str]] = {}
    for rel, line, name, doc in found:
        if "public alternative" not in doc.lower():
            bare.setdefault(rel, []).append(f"{rel}:{line}: {name}")
    failures = [f"{where}: another library's private module, imported outside an adapter: import it in one function "
                "whose docstring names the public alternative (or use that)" for rel, hits in sorted(bare.items())
                if len(hits) > pending.get(rel, 0) for where in hits]
    adapters: Dict[str, Set[str]] = {}
    for rel, line, name, doc in found:
        if "public alternative" in doc.lower():
            adapters.setdefault(name, set()).add(f"{rel}:{doc.split(':')[0]}")
    failures += [f"{name} is imported by {len(places)} adapters: keep one and call it" for name, places
                 in sorted(adapters.items()) if len(places) > 1]
    return failures


def test_other_libraries_private_modules_sit_in_one_adapter_each():
    sources = {rel: path.read_text(encoding="utf-8") for rel, path in _python_files() if rel.startswith(
        tuple(root + "/" for root in PRODUCT_ROOTS))}
    found = {name for _, _, name, _ in private_module_imports(sources)}
    assert {"jax._src.distributed", "keras.src.backend.jax.nn", "torch_xla._internal.tpu"} <= found  # the scan sees them
    failures = private_module_failures(sources, {})  # every one in an adapter
    assert not failures, "\n".join(failures)
    example = {"a.py": ('def f():\n    """The public alternative: x."""\n    from keras.src import y\n'
                        'def g():\n    from jax._src import z\n    from jax import _w, v\n'),
               "b.py": 'def h():\n    """The public alternative: x."""\n    import keras.src\nimport torch._dynamo\n',
               "c.py": 'def k():\n    """The public\n    alternative: y."""\n    from keras.src import y\n'}
    assert private_module_failures(example, {"b.py": 1}) == [
        "a.py:5: jax._src.z: another library's private module, imported outside an adapter: import it in one function "
        "whose docstring names the public alternative (or use that)",
        "a.py:6: jax._w: another library's private module, imported outside an adapter: import it in one function "
        "whose docstring names the public alternative (or use that)",
        "keras.src.y is imported by 2 adapters: keep one and call it"]
