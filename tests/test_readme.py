"""The README's argument reference and set-up commands stay true to the code."""

import subprocess
import sys

from conftest import REPO_ROOT


def test_argument_reference_is_current():
    out = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "argument_reference.py")],
                         capture_output=True, text=True, check=True).stdout
    readme = (REPO_ROOT / "README.md").read_text()
    assert out.strip() in readme, "README argument reference is stale: run scripts/argument_reference.py"
    assert out.count("| `--") >= 60


def test_ci_runs_the_readme_test_command():
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in readme and "bash scripts/test.sh" in ci
    assert "python -m pytest" in (REPO_ROOT / "scripts" / "test.sh").read_text()


def test_cli_help_lists_every_command():
    from hf_tpu_ext.cli import COMMANDS

    out = subprocess.run([sys.executable, "-m", "hf_tpu_ext", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for name in ("train", "prepare-data", "push", "callbacks", "demo", "deploy-space"):
        assert name in COMMANDS and f"  {name}" in out
