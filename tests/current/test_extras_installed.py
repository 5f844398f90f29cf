"""Each extra .venv-current is built from ([jax], [keras], [torch], [demo]) is met on its own by what it holds,
with the pinned stack, and ``pip check`` is clean (see tests/extras_resolution.py)."""

from importlib.metadata import version

import pytest

from extras_resolution import pip_check, unmet_requirements  # tests/ (on the path through tests/conftest.py)


@pytest.mark.parametrize("extra", ["jax", "keras", "torch", "demo"])
def test_extra_is_met_by_this_environment(extra):
    assert unmet_requirements(extra) == []


def test_current_stack_and_pip_check():
    # [jax]: transformers 5, huggingface_hub >= 1, keras >= 3.15; [demo]: a gradio that allows huggingface_hub >= 1
    assert (int(version("transformers").split(".")[0]), int(version("huggingface_hub").split(".")[0]) >= 1) == (5, True)
    assert tuple(int(x) for x in version("keras").split(".")[:2]) >= (3, 15)
    assert pip_check() == "No broken requirements found."
