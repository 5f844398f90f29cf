"""Every backend of the registry satisfies :class:`hf_tpu_ext.backends.base.Backend`, read with ``ast``.

No backend module is imported (nor TensorFlow, JAX, torch or torch_xla), so the three backends are checked in
every environment. What is checked:

* the run (the modules outside ``hf_tpu_ext/backends/`` that import the backends package) reads only members
  that ``Backend`` declares: ``backend.x``, ``self.backend.x``, ``getattr(backend, "x", ...)``;
* each class of :data:`hf_tpu_ext.backends.BACKEND_REGISTRY`, with its base classes in this package, implements
  every member of ``Backend``: a data member as a class attribute, a property or an attribute set on ``self`` in
  one of its methods; a method as a method (not a property) whose parameters accept every call the protocol
  allows: the same positional names in the same order, the protocol's optional parameters optional, any extra
  parameter optional (or ``*args``/``**kwargs``), sync or async as declared. Annotations are not compared.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from conftest import REPO_ROOT

from hf_tpu_ext.backends import BACKEND_REGISTRY

PACKAGE = "hf_tpu_ext"
BASE_MODULE = "hf_tpu_ext.backends.base"
#: how the run's code names the backend object
BACKEND_NAMES = ("backend", "_backend")


def _module_file(module: str) -> Optional[Path]:
    path = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parse(module: str) -> ast.Module:
    path = _module_file(module)
    assert path is not None, f"{module} has no source file in the repository"
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _class(tree: ast.Module, name: str) -> Optional[ast.ClassDef]:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _imported_names(tree: ast.Module, module: str) -> Dict[str, str]:
    """Module-level ``from X import Name [as alias]`` of ``module``: alias -> ``"X:Name"`` (relative X resolved)."""
    package = module.rpartition(".")[0]
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}:{alias.name}"
    return names


# ============================================================================================ members
class Member:
    """One member of a class as ``ast`` shows it: ``kind`` is ``"method"``, ``"property"`` or ``"attribute"``."""

    def __init__(self, kind: str, owner: str, node: Optional[ast.AST] = None):
        self.kind, self.owner, self.node = kind, owner, node


def _decorator_names(node) -> List[str]:
    names = []
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.append(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


def _own_members(cls: ast.ClassDef, owner: str, protocol: bool = False) -> Dict[str, Member]:
    """The members a class body defines: methods, properties, class attributes (an annotation without a value
    is one only in a protocol) and the attributes its methods set on ``self``."""
    members: Dict[str, Member] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = _decorator_names(node)
            is_property = any(d in ("property", "cached_property", "setter", "getter") for d in decorators)
            members.setdefault(node.name, Member("property" if is_property else "method", owner, node))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        members.setdefault(name.id, Member("attribute", owner, node))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None or protocol:
                members.setdefault(node.target.id, Member("attribute", owner, node))
    for function in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                for attr in ast.walk(target):
                    if (isinstance(attr, ast.Attribute) and isinstance(attr.value, ast.Name)
                            and attr.value.id == "self" and attr.attr not in members):
                        members[attr.attr] = Member("attribute", f"{owner} (set on self)", attr)
    return members


def class_members(module: str, name: str) -> Tuple[Dict[str, Member], List[str]]:
    """``(members, unread bases)``: a class's members in method resolution order (depth first, own ones first)
    through its bases in this package; ``unread bases`` names the bases outside it (their members unknown)."""
    tree = _parse(module)
    cls = _class(tree, name)
    assert cls is not None, f"{module} defines no class {name}"
    members = _own_members(cls, f"{module}:{name}")
    unread: List[str] = []
    imported = _imported_names(tree, module)
    for base in cls.bases:
        base_name = ast.unparse(base)
        if base_name == "object":
            continue
        if isinstance(base, ast.Name) and _class(tree, base.id) is not None:
            target = f"{module}:{base.id}"
        else:
            target = imported.get(base_name, "")
        base_module, _, base_class = target.partition(":")
        if not base_module.startswith(PACKAGE + ".") or _module_file(base_module) is None:
            unread.append(base_name)
            continue
        inherited, more = class_members(base_module, base_class)
        unread += more
        for key, member in inherited.items():
            members.setdefault(key, member)
    return members, unread


def protocol_members() -> Dict[str, Member]:
    cls = _class(_parse(BASE_MODULE), "Backend")
    assert cls is not None
    return _own_members(cls, f"{BASE_MODULE}:Backend", protocol=True)


# ============================================================================================ signatures
def signature_problem(declared: ast.FunctionDef, impl: ast.FunctionDef) -> Optional[str]:
    """Why ``impl`` cannot take every call ``declared`` allows (None when it can)."""
    if isinstance(declared, ast.AsyncFunctionDef) != isinstance(impl, ast.AsyncFunctionDef):
        return "is async where the protocol's is not (or the reverse)"
    d, i = declared.args, impl.args
    d_pos = (d.posonlyargs + d.args)[1:]  # without self
    static = "staticmethod" in _decorator_names(impl)
    i_pos = (i.posonlyargs + i.args)[0 if static else 1:]
    d_optional = {a.arg for a in d_pos[len(d_pos) - len(d.defaults):]} if d.defaults else set()
    i_optional = {a.arg for a in i_pos[len(i_pos) - len(i.defaults):]} if i.defaults else set()
    for index, arg in enumerate(d_pos):
        if index >= len(i_pos):
            if i.vararg is None:
                return f"takes no parameter {arg.arg!r} (position {index + 1})"
            continue
        if i_pos[index].arg != arg.arg:  # the run may pass it by name
            return f"has {i_pos[index].arg!r} where the protocol has {arg.arg!r} (position {index + 1})"
        if arg.arg in d_optional and i_pos[index].arg not in i_optional:
            return f"requires {i_pos[index].arg!r}, which the protocol makes optional"
    for extra in i_pos[len(d_pos):]:
        if extra.arg not in i_optional:
            return f"requires {extra.arg!r}, which the protocol does not pass"
    i_kwonly = {a.arg: default is not None for a, default in zip(i.kwonlyargs, i.kw_defaults)}
    for arg, default in zip(d.kwonlyargs, d.kw_defaults):
        names = {a.arg for a in i_pos} | set(i_kwonly)
        if arg.arg not in names and i.kwarg is None:
            return f"takes no keyword {arg.arg!r}"
        if default is not None and arg.arg in i_kwonly and not i_kwonly[arg.arg]:
            return f"requires keyword {arg.arg!r}, which the protocol makes optional"
    for name, has_default in i_kwonly.items():
        if not has_default and name not in {a.arg for a in d.kwonlyargs}:
            return f"requires keyword {name!r}, which the protocol does not pass"
    return None


def conformance_failures(cls_label: str, members: Dict[str, Member], unread: List[str],
                         protocol: Dict[str, Member]) -> List[str]:
    """One line per protocol member the class lacks or implements incompatibly."""
    failures = []
    for name, declared in sorted(protocol.items()):
        member = members.get(name)
        if member is None:
            hint = f" (its bases {', '.join(unread)} are not read by this check)" if unread else ""
            failures.append(f"{cls_label} lacks Backend.{name}{hint}: implement it, or inherit BackendDefaults' "
                            "value where the member is optional.")
        elif declared.kind == "method" and member.kind != "method":
            failures.append(f"{cls_label}.{name} is a {member.kind} ({member.owner}); Backend.{name} is a method.")
        elif declared.kind == "attribute" and member.kind == "method":
            failures.append(f"{cls_label}.{name} is a method ({member.owner}); Backend.{name} is read as a value: "
                            "make it an attribute or a property.")
        elif declared.kind == "method":
            problem = signature_problem(declared.node, member.node)
            if problem:
                failures.append(f"{cls_label}.{name} ({member.owner}, line {member.node.lineno}) {problem}: "
                                f"match Backend.{name}{ast.unparse(declared.node.args).join('()')}.")
    return failures


# ============================================================================================ tests
@pytest.mark.parametrize("name", sorted(BACKEND_REGISTRY))
def test_registered_backend_implements_every_protocol_member(name):
    module, cls = BACKEND_REGISTRY[name].target.split(":")
    members, unread = class_members(module, cls)
    protocol = protocol_members()
    assert {"setup", "build", "fit", "export", "name", "is_chief", "num_replicas"} <= set(protocol)
    failures = conformance_failures(f"{module}:{cls}", members, unread, protocol)
    assert not failures, "\n".join(failures)


def _run_modules() -> List[Tuple[str, ast.Module]]:
    """The modules outside ``hf_tpu_ext/backends/`` that import the backends package, and every module of
    ``hf_tpu_ext/run/`` (the training run: its jobs read the backend they are handed)."""
    found = []
    for path in sorted((REPO_ROOT / PACKAGE).rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if rel.startswith(f"{PACKAGE}/backends/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        if rel.startswith(f"{PACKAGE}/run/"):
            found.append((rel, tree))
            continue
        module = rel[:-3].replace("/", ".").removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            if any(n == f"{PACKAGE}.backends" or n.startswith(f"{PACKAGE}.backends.") for n in names):
                found.append((rel, tree))
                break
    return found


def _is_backend(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in BACKEND_NAMES
    return (isinstance(node, ast.Attribute) and node.attr in BACKEND_NAMES and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "run"))


def run_reads(tree: ast.Module) -> Dict[str, int]:
    """Members read on the backend in ``tree``: name -> first line."""
    reads: Dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_backend(node.value):
            reads.setdefault(node.attr, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and _is_backend(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            reads.setdefault(str(node.args[1].value), node.lineno)
    return reads


def test_the_run_reads_only_members_the_protocol_declares():
    protocol = protocol_members()
    modules = _run_modules()
    assert modules, "no module outside hf_tpu_ext/backends/ imports the backends package: the run was not found"
    reads: Dict[str, str] = {}
    for rel, tree in modules:
        for name, line in run_reads(tree).items():
            reads.setdefault(name, f"{rel}:{line}")
    assert {"setup", "build", "fit", "export", "is_chief"} <= set(reads)  # the scan sees the run's calls
    undeclared = [f"{where}: the run reads backend.{name}, which {BASE_MODULE}.Backend does not declare: declare it "
                  "there (with its docstring) and give it a value in BackendDefaults if it is optional."
                  for name, where in sorted(reads.items()) if name not in protocol]
    assert not undeclared, "\n".join(undeclared)


def test_conformance_check_catches_what_a_backend_gets_wrong():
    protocol = _own_members(ast.parse(
        "class Backend(Protocol):\n"
        "    name: str\n"
        "    def fit(self, callbacks, on_save, start_step, log_history): ...\n"
        "    def evaluate(self, *, full: bool = True): ...\n"
        "    def export(self, folder, tokenizer=None): ...\n").body[0], "base:Backend", protocol=True)
    good = ast.parse(
        "class Good:\n"
        "    def __init__(self):\n"
        "        self.name = 'x'\n"
        "    def fit(self, callbacks, on_save, start_step, log_history, extra=1): ...\n"
        "    def evaluate(self, **kwargs): ...\n"
        "    def export(self, *args, **kwargs): ...\n").body[0]
    assert conformance_failures("Good", _own_members(good, "m:Good"), [], protocol) == []
    bad = ast.parse(
        "class Bad:\n"
        "    @property\n"
        "    def fit(self): ...\n"
        "    def evaluate(self, *, full): ...\n"
        "    def export(self, path, tokenizer=None): ...\n").body[0]
    assert conformance_failures("Bad", _own_members(bad, "m:Bad"), ["Mixin"], protocol) == [
        "Bad.evaluate (m:Bad, line 4) requires keyword 'full', which the protocol makes optional: match "
        "Backend.evaluate(self, *, full: bool=True).",
        "Bad.export (m:Bad, line 5) has 'path' where the protocol has 'folder' (position 1): match "
        "Backend.export(self, folder, tokenizer=None).",
        "Bad.fit is a property (m:Bad); Backend.fit is a method.",
        "Bad lacks Backend.name (its bases Mixin are not read by this check): implement it, or inherit "
        "BackendDefaults' value where the member is optional.",
    ]
