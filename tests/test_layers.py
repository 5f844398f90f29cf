"""The package's layering is a contract: `lint-imports` (import-linter, config in pyproject.toml) must pass.

ground -> data, hub -> backends -> callbacks -> training run -> commands/cli; inside the run (``hf_tpu_ext/run/``)
the lifecycle above its jobs; hub and callbacks never import a backend; hub imports no deep-learning framework; the
model-type records (``hf_tpu_ext/model_types/``) import no framework and no transformers. No exceptions (no
``ignore_imports``).
"""

import os
import subprocess
import sys
import tomllib

import pytest
from conftest import REPO_ROOT


def test_import_contracts_hold():
    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = config["contracts"]
    assert {c["type"] for c in contracts} == {"layers", "forbidden"} and len(contracts) == 5
    assert not any("ignore_imports" in c for c in contracts)  # the contract holds with no exceptions
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())", "--no-cache"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Contracts: 5 kept, 0 broken." in proc.stdout
