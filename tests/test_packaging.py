"""The framework-free core installs beside the main environment's pins (transformers 4.57, huggingface_hub 0.36).

tests/current/test_core_install.py checks the same beside transformers 5 and huggingface_hub 2.x.
"""

import json
import subprocess
import sys
import tomllib
from importlib.metadata import version

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
