"""[torch-xla] is met by what .venv-xla holds (torch 2.9.1, torch_xla 2.9.0, transformers 4), and ``pip check``
is clean (run by scripts/test_env_torch_xla.sh; skipped where torch_xla is not installed)."""

from importlib.metadata import version

import pytest

pytest.importorskip("torch_xla")

from extras_resolution import pip_check, unmet_requirements  # noqa: E402


def test_torch_xla_extra_is_met_by_this_environment():
    assert (version("torch"), version("torch_xla"), version("transformers").split(".")[0]) == ("2.9.1", "2.9.0", "4")
    assert unmet_requirements("torch-xla") == []
    assert pip_check() == "No broken requirements found."
