"""The framework-free core installs beside the main environment's pins (transformers 4.57, huggingface_hub 0.36);
each extra declares what its code imports (read from pyproject.toml and the sources: no installs).

tests/current/test_core_install.py checks the same beside transformers 5 and huggingface_hub 2.x.
"""

import json
import subprocess
import sys
import tomllib
from importlib.metadata import version

import pytest

from conftest import REPO_ROOT


def test_pip_install_core_changes_nothing_beside_transformers_4(tmp_path):
    assert version("transformers").startswith("4.") and version("huggingface_hub").startswith("0.")
    report = tmp_path / "report.json"
    # --no-index: a requirement this environment does not already satisfy would fail the resolution
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet",
         "--report", str(report), str(REPO_ROOT)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    installs = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    ours = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installs == {"hf-tpu-ext": ours}


def test_tensorflow_demo_extra_resolves_without_backtracking(tmp_path):
    """`.[tensorflow-demo,test]` (scripts/test.sh) names the gradio that allows huggingface_hub<1.0 (6.17.x), so pip
    takes it at once; `.[tensorflow,demo]` reaches the same set only after fetching every newer gradio wheel."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet",
         "--report", str(report), f"{REPO_ROOT}[tensorflow-demo,test]"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    installs = {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert set(installs) == {"hf-tpu-ext"}  # this environment (built from the same extras) already fits
    assert version("gradio").startswith("6.17.") and version("huggingface_hub").startswith("0.")


# ---------------------------------------------------------------- every extra installs what its paths import

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
# extra -> the code it is for (`hf-tpu train` backends also write outputs.py's loss curve)
EXTRA_PATHS = {
    "tensorflow": ["hf_tpu_ext/backends/tensorflow", "hf_tpu_ext/callbacks/tf_keras/masked_lm_metrics.py",
                   "hf_tpu_ext/callbacks/tf_keras/push_to_hub.py", "hf_tpu_ext/outputs.py"],
    "jax": ["hf_tpu_ext/backends/keras", "hf_tpu_ext/callbacks/keras", "hf_tpu_ext/data/numpy_batches.py",
            "hf_tpu_ext/outputs.py"],
    "torch-xla": ["hf_tpu_ext/backends/torch_xla", "hf_tpu_ext/outputs.py"],
    "keras": ["hf_tpu_ext/callbacks/keras"],
    "torch": ["hf_tpu_ext/callbacks/torch"],
    "demo": ["spaces_demo"],
}
# imports an extra leaves out on purpose: each is behind a flag or a choice the user makes
OPTIONAL_IMPORTS = {
    "tensorflow": {"torch", "trackio"},  # torch: PyTorch-side checks when installed; --report_to trackio
    # the Keras 3 callbacks on KERAS_BACKEND=tensorflow; torch-format weights with torch; keras_hub/ with [keras]
    "jax": {"tensorflow", "torch", "keras_hub"},
    "keras": {"jax", "tensorflow", "torch"},  # the Keras backend the user installs
    "torch": {"torch_xla"},  # XLA devices ([torch-xla])
    "demo": {"torch", "tensorflow"},  # the model's framework: [demo,torch] or [tensorflow-demo]
}
BROUGHT_BY = {"pandas": "gradio", "yaml": "pyyaml"}  # import name -> the declared distribution that brings it


def _requirements(extra: str) -> dict:
    """canonical distribution name -> Requirement, for the core and ``extra`` (nested hf-tpu-ext[...] followed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found = {canonicalize_name(r.name): r for r in map(Requirement, PYPROJECT["dependencies"])}
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            for req in map(Requirement, PYPROJECT["optional-dependencies"][name]):
                if canonicalize_name(req.name) == "hf-tpu-ext":
                    todo += sorted(req.extras)
                else:
                    found.setdefault(canonicalize_name(req.name), req)
    return found


def _third_party_imports(paths) -> set:
    import ast

    names = set()
    for path in paths:
        path = REPO_ROOT / path
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    ours = ("hf_tpu_ext", "spaces_demo", "__future__")
    return {n for n in names if n not in sys.stdlib_module_names and n not in ours}


@pytest.mark.parametrize("extra", sorted(EXTRA_PATHS))
def test_each_extra_installs_what_its_paths_import(extra):
    from packaging.utils import canonicalize_name

    declared = set(_requirements(extra))
    imported = _third_party_imports(EXTRA_PATHS[extra]) - OPTIONAL_IMPORTS.get(extra, set())
    missing = sorted(m for m in imported if canonicalize_name(BROUGHT_BY.get(m, m)) not in declared)
    assert missing == [], f"[{extra}] does not install what {EXTRA_PATHS[extra]} import"


def test_checked_modules_and_later_phase_packages_are_in_their_extras():
    """What extras.py checks for an extra (and, before training, for a backend's later phases) is what the extra
    installs: jinja2 for the card in every `hf-tpu train` extra, evaluate in [keras] and [jax]."""
    from packaging.utils import canonicalize_name

    from hf_tpu_ext.extras import EXTRA_MODULES, RUN_PHASE_MODULES

    for extra, modules in EXTRA_MODULES.items():
        assert {canonicalize_name(m) for m in modules} <= set(_requirements(extra)), extra
    for module, _, extras in RUN_PHASE_MODULES:
        assert [e for e in extras if canonicalize_name(module) not in _requirements(e)] == [], module
    assert {"jinja2", "evaluate"} <= set(_requirements("jax")) and "evaluate" in _requirements("keras")


def test_extra_pins_in_extras_py_are_the_pyproject_pins():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    from hf_tpu_ext.extras import EXTRA_PINS

    for extra, pins in EXTRA_PINS.items():
        direct = {r.name: r.specifier for r in map(Requirement, PYPROJECT["optional-dependencies"][extra])}
        assert {dist: SpecifierSet(spec) for dist, spec in pins} == {dist: direct[dist] for dist, _ in pins}, extra


def test_tensorflow_demo_states_the_tensorflow_pins_where_pip_reads_them_first():
    """pip reads a nested extra's requirements only after picking a version for the core's transformers>=4.57:
    [tensorflow-demo] states [tensorflow]'s transformers and huggingface_hub pins itself (set-up command 1 used to
    fetch transformers 5.23 ... 5.0, 42 wheels, before settling on 4.57)."""
    from packaging.requirements import Requirement

    direct = {r.name: r.specifier for r in map(Requirement, PYPROJECT["optional-dependencies"]["tensorflow-demo"])}
    tensorflow = {r.name: r.specifier for r in map(Requirement, PYPROJECT["optional-dependencies"]["tensorflow"])}
    for dist in ("transformers", "huggingface_hub"):
        assert direct[dist] == tensorflow[dist], dist


# ---------------------------------------------------------------- the extras of this environment, as installed


@pytest.mark.parametrize("extra", ["tensorflow", "demo", "tensorflow-demo", "test"])
def test_main_environment_meets_each_of_its_extras(extra):
    """.venv is built from ``.[tensorflow-demo,test]``: each of those extras on its own is met by what it holds
    (tests/extras_resolution.py; .venv-current and .venv-xla check theirs), and ``pip check`` is clean."""
    from extras_resolution import unmet_requirements

    assert unmet_requirements(extra) == []
    if extra == "tensorflow-demo":  # once: nothing installed conflicts
        from extras_resolution import pip_check

        assert pip_check() == "No broken requirements found."


def test_unmet_requirements_names_what_this_environment_lacks():
    # [jax] pins what the TensorFlow stack excludes: the check names each requirement and the installed version
    from extras_resolution import unmet_requirements

    unmet = unmet_requirements("jax")
    assert f"transformers>=5 (installed: {version('transformers')})" in unmet
    assert f"huggingface_hub>=1.0 (installed: {version('huggingface_hub')})" in unmet
    assert any(u.startswith("jax[cpu]>=0.10 (installed: none)") for u in unmet)


def test_packages_are_listed_explicitly_and_every_module_folder_is_one():
    """pyproject.toml names every package (no namespace-package scan): each folder of modules under hf_tpu_ext/ and
    spaces_demo/ has an ``__init__.py`` and is in the list, so the wheel holds every module."""
    listed = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = sorted({p.parent for root in ("hf_tpu_ext", "spaces_demo") for p in (REPO_ROOT / root).rglob("*.py")
                      if "__pycache__" not in p.parts})
    assert [str(f.relative_to(REPO_ROOT)) for f in folders if not (f / "__init__.py").is_file()] == []
    assert sorted(listed) == sorted(".".join(f.relative_to(REPO_ROOT).parts) for f in folders)
    assert "hf_tpu_ext.backends.keras" in listed
