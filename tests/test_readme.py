"""The README's argument reference and set-up commands stay true to the code."""

import subprocess
import sys

from conftest import REPO_ROOT


def test_argument_reference_is_current():
    out = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "argument_reference.py")],
                         capture_output=True, text=True, check=True).stdout
    readme = (REPO_ROOT / "README.md").read_text()
    assert out.strip() in readme, "README argument reference is stale: run scripts/argument_reference.py"
    # pasted once: each of its section titles appears exactly once in the README
    titles = [line for line in out.splitlines() if line.startswith("#### ")]
    assert titles == ["#### Model (`ModelArguments`)", "#### Data (`DataTrainingArguments`)",
                      "#### Training (`TrainingArguments`)", "#### Defaults that differ from transformers"]
    assert {title: readme.count(title) for title in titles} == {title: 1 for title in titles}
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


def test_packaging_layers_match_the_readme_and_the_extras_module():
    import re
    import tomllib

    from hf_tpu_ext.extras import EXTRA_MODULES

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower(): dep for dep in project["dependencies"]}
    # the core is framework-free and has no upper pin on the Hub libraries
    assert not {"tensorflow", "tf-keras", "torch", "keras", "jax", "gradio"} & set(core)
    assert core["transformers"] == "transformers>=4.57" and core["huggingface_hub"] == "huggingface_hub>=0.36"
    extras = project["optional-dependencies"]
    assert set(EXTRA_MODULES) <= set(extras)  # every extra an error message names exists
    assert "transformers>=4.57,<5" in extras["tensorflow"] and "gradio>=6.17.3" in extras["demo"]
    # the demo beside [tensorflow]: the gradio that allows huggingface_hub<1.0 and [tensorflow]'s own pins, so pip
    # need not backtrack (tests/test_packaging.py)
    assert extras["tensorflow-demo"] == ["transformers>=4.57,<5", "huggingface_hub>=0.36,<1.0", "hf-tpu-ext[tensorflow]",
                                         "gradio>=6.17.3,<6.18", "gradio_client"]

    readme = (REPO_ROOT / "README.md").read_text()
    first = re.search(r"```bash\n# 1\.[^\n]*\n([^\n]+)", readme).group(1)
    assert 'pip install ".[jax,demo]" && hf-tpu train --output_dir my-fill-mask-model' in first  # the current stack
    assert 'pip install ".[tensorflow-demo]"' in readme  # the TensorFlow option
    for named in re.findall(r'pip install "\.\[([a-z,-]+)\]"', readme):
        assert set(named.split(",")) <= set(extras), named
    test_sh = (REPO_ROOT / "scripts" / "test.sh").read_text()
    assert 'pip install -q -e ".[tensorflow-demo,test]"' in test_sh and "scripts/test_env_*.sh" in test_sh
    assert {"test_env_current.sh", "test_env_torch_xla.sh"} <= {p.name for p in (REPO_ROOT / "scripts").glob("test_env_*.sh")}


def test_cli_version():
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        out = subprocess.run([sys.executable, "-m", "hf_tpu_ext", flag], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"hf-tpu-ext {version('hf-tpu-ext')}\n"
        assert out.stderr == ""
    usage = subprocess.run([sys.executable, "-m", "hf_tpu_ext", "--help"], capture_output=True, text=True,
                           check=True).stdout
    assert usage.splitlines()[:2] == ["usage: hf-tpu <command> [<args>]", "       hf-tpu --version"]


def test_the_tpu_vm_examples_parse_as_written():
    """The README's "on a TPU VM" commands run on the backend they name (the default one: Keras on JAX, which
    refuses --tpu_name: JAX finds a TPU VM's chips itself)."""
    import shlex

    from hf_tpu_ext.args import parse_args

    text = (REPO_ROOT / "README.md").read_text()
    block = text.split("# on a TPU VM", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line)[2:] for line in block.splitlines() if line.startswith("hf-tpu train ")]
    assert len(commands) == 2
    # the first on the default backend of this environment and on Keras (the default where JAX is installed)
    parsed = [parse_args(argv)[2] for argv in (commands[0], commands[0] + ["--backend", "keras"], commands[1])]
    assert [(a.backend, a.tpu_name, a.steps_per_execution) for a in parsed[1:]] == [("keras", None, 100),
                                                                                     ("tensorflow", "local", 1)]
    assert parsed[0].steps_per_execution == 100
