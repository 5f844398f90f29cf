"""Per-extra install check at CI cost (issue 30 leftover 3). CI installs each environment from the extras
(scripts/test.sh: .venv from ``.[tensorflow-demo,test]``; scripts/test_env_current.sh: .venv-current from
``.[jax,keras,torch,demo]``; scripts/test_env_torch_xla.sh: .venv-xla from ``.[torch-xla]``) and runs each path's tests
there. These helpers then check, in seconds and without the network, that every extra on its own is satisfied by
what the environment holds (each requirement of the core and the extra, nested ``hf-tpu-ext[...]`` followed, met
by the installed version) and that ``pip check`` is clean (nothing installed conflicts). The fresh-venv
resolution (backtracking, wheels fetched) costs minutes per extra and needs an index:
``bash scripts/check_extras_resolve.sh``.
"""

import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import List

REPO_ROOT = Path(__file__).resolve().parent.parent


def requirements(extra: str) -> list:
    """``packaging.requirements.Requirement`` of the core and ``extra`` (nested ``hf-tpu-ext[...]`` followed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    found = list(map(Requirement, project["dependencies"]))
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in map(Requirement, project["optional-dependencies"][name]):
            if canonicalize_name(req.name) == "hf-tpu-ext":
                todo += sorted(req.extras)
            else:
                found.append(req)
    return found


def unmet_requirements(extra: str) -> List[str]:
    """The requirements of ``extra`` this environment does not meet, as ``"name spec (installed: X)"``; ``[]``
    when ``pip install ".[extra]"`` here would install this package alone."""
    unmet = []
    for req in requirements(extra):
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            unmet.append(f"{req} (installed: none)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (installed: {have})")
    return unmet


def pip_check() -> str:
    """``pip check``'s output; raises AssertionError when it reports a broken requirement."""
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()
