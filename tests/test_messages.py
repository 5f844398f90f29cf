"""One-line messages that fit where they are printed (issue 30): missing-extra hints right for the environment,
packages of later phases found before training, a dataset config the Hub does not have, a resume repo that does
not exist (with the owner's nearest repo).

The environment hints are unit tests on fake installed-version lookups (``extras._version``/``extras._installed``):
the exact line for the TensorFlow venv, the current-releases venv and a torch_xla venv, whatever this one holds.
"""

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from conftest import REPO_ROOT
from hf_tpu_ext import extras
from hf_tpu_ext.errors import CheckpointError, DataError, HubRepoError, MissingExtraError

TF_VENV = {"transformers": "4.57.6", "huggingface_hub": "0.36.2", "torch": "2.13.0+cpu", "tensorflow": "2.21.0"}
CURRENT_VENV = {"transformers": "5.24.0", "huggingface_hub": "2.4.0", "torch": "2.13.0+cpu", "keras": "3.15.1"}
XLA_VENV = {"transformers": "4.57.6", "huggingface_hub": "0.36.2", "torch": "2.9.1"}


@pytest.fixture
def fake_env(monkeypatch):
    """``fake_env(versions, missing=())``: installed distributions and the import names that are not installed."""
    def install(versions, missing=()):
        monkeypatch.setattr(extras, "_version", lambda dist: versions.get(dist))
        monkeypatch.setattr(extras, "_installed", lambda module: module not in missing)
    return install


def test_jax_hint_in_the_tensorflow_venv_is_a_venv_of_its_own(fake_env):
    fake_env(TF_VENV, missing=("jax",))
    with pytest.raises(MissingExtraError) as err:
        extras.require_extra("jax", "--backend keras")
    assert str(err.value) == (
        "--backend keras needs [jax] in a venv of its own (missing here: jax; installing it here would "
        "replace transformers 4.57.6, huggingface_hub 0.36.2, which [jax] pins to transformers>=5, "
        "huggingface_hub>=1.0): python -m venv .venv-jax && .venv-jax/bin/pip install 'hf-tpu-ext[jax]'.")
    assert extras.install_hint("jax") == (
        "python -m venv .venv-jax && .venv-jax/bin/pip install 'hf-tpu-ext[jax]' (a venv of its own: installing [jax] "
        "here would replace transformers 4.57.6, huggingface_hub 0.36.2)")
    assert extras.install_hint("keras") == "pip install 'hf-tpu-ext[keras]'"  # no pins: fits any venv


def test_hints_where_the_extra_fits_are_plain_pip_installs(fake_env):
    fake_env(CURRENT_VENV, missing=("jax",))
    with pytest.raises(MissingExtraError) as err:
        extras.require_extra("jax", "--backend keras")
    assert str(err.value) == "--backend keras needs: pip install 'hf-tpu-ext[jax]' (missing: jax)."
    fake_env(XLA_VENV, missing=("torch_xla",))
    with pytest.raises(MissingExtraError) as err:
        extras.require_extra("torch-xla", "--backend torch_xla")
    assert str(err.value) == "--backend torch_xla needs: pip install 'hf-tpu-ext[torch-xla]' (missing: torch_xla)."


def test_torch_xla_hint_never_replaces_another_torch(fake_env):
    fake_env(TF_VENV, missing=("torch_xla",))
    with pytest.raises(MissingExtraError) as err:
        extras.require_extra("torch-xla", "--backend torch_xla")
    assert str(err.value) == (
        "--backend torch_xla needs [torch-xla] in a venv of its own (missing here: torch_xla; installing it here would "
        "replace torch 2.13.0+cpu, which [torch-xla] pins to torch==2.9.1, transformers>=4.57,<5, "
        "huggingface_hub>=0.36,<1.0): python -m venv .venv-xla && .venv-xla/bin/pip install 'hf-tpu-ext[torch-xla]'.")


def test_tensorflow_hint_in_the_current_venv_is_a_venv_of_its_own(fake_env):
    fake_env(CURRENT_VENV, missing=("tf_keras",))
    with pytest.raises(MissingExtraError) as err:
        extras.require_extra("tensorflow", "the TensorFlow backend")
    assert str(err.value) == (
        "the TensorFlow backend needs [tensorflow] in a venv of its own (missing here: tf_keras, transformers 4.x "
        "(found 5.24.0); installing it here would replace transformers 5.24.0, huggingface_hub 2.4.0, which "
        "[tensorflow] pins to transformers>=4.57,<5, huggingface_hub>=0.36,<1.0): "
        "python -m venv .venv-tf && .venv-tf/bin/pip install 'hf-tpu-ext[tensorflow]'.")


def test_demo_and_probe_without_a_framework_suggest_what_fits_this_venv(fake_env):
    from hf_tpu_ext.commands.demo import load_demo
    from hf_tpu_ext.commands.probe import _check_frameworks

    fake_env(CURRENT_VENV, missing=("torch", "tensorflow"))  # transformers 5: [tensorflow] would replace it
    with pytest.raises(MissingExtraError) as err:
        load_demo("out")
    assert str(err.value) == (
        "hf-tpu demo runs the model with PyTorch or TensorFlow, and neither is installed: pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu (PyTorch's CPU build; [tensorflow] needs transformers 4, "
        "a venv of its own).")
    with pytest.raises(MissingExtraError) as err:
        _check_frameworks("auto")
    assert str(err.value).startswith("hf-tpu probe runs the model with PyTorch or TensorFlow, and neither is "
                                     "installed: pip install torch --index-url https://download.pytorch.org/whl/cpu (")
    fake_env(TF_VENV, missing=("torch", "tensorflow"))  # transformers 4: both extras fit
    with pytest.raises(MissingExtraError) as err:
        load_demo("out")
    assert str(err.value) == ("hf-tpu demo runs the model with PyTorch or TensorFlow, and neither is installed: "
                              "pip install 'hf-tpu-ext[demo,torch]' (or '[demo,tensorflow]').")
    with pytest.raises(MissingExtraError) as err:
        _check_frameworks(None)
    assert str(err.value) == ("hf-tpu probe runs the model with PyTorch or TensorFlow, and neither is installed: "
                              "pip install 'hf-tpu-ext[torch]' (or '[tensorflow]').")


def _entry(name):
    from hf_tpu_ext.backends import backend_entry

    return backend_entry(name)


def test_packages_of_later_phases_are_named_before_training(fake_env):
    fake_env(CURRENT_VENV, missing=("jinja2",))
    with pytest.raises(MissingExtraError) as err:
        extras.require_run_packages(_entry("keras"))
    assert str(err.value) == ("--backend keras needs: pip install 'hf-tpu-ext[jax]' (missing: jinja2 for the model "
                              "card).")
    fake_env(TF_VENV, missing=("matplotlib", "evaluate"))
    with pytest.raises(MissingExtraError) as err:
        extras.require_run_packages(_entry("tensorflow"))
    assert str(err.value) == ("the TensorFlow backend needs: pip install 'hf-tpu-ext[tensorflow]' (missing: "
                              "matplotlib for loss_curve.png, evaluate for the evaluation's masked_lm metric).")
    fake_env(CURRENT_VENV, missing=("evaluate",))  # the Keras backend evaluates without the evaluate package
    extras.require_run_packages(_entry("keras"))


def test_hf_tpu_train_without_jinja2_stops_in_the_checks(tmp_path):
    """The card's jinja2 missing: refused before any data or model work, nothing written (it used to end a
    trained run at the card)."""
    code = ("import sys\nsys.modules['jinja2'] = None\nfrom hf_tpu_ext.cli import main\n"
            "sys.exit(main(['train', '--output_dir', sys.argv[1], '--report_to', 'none', '--callbacks', '']))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                         "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == (
        "hf-tpu train: error: the TensorFlow backend needs: pip install 'hf-tpu-ext[tensorflow]' "
        "(missing: jinja2 for the model card).")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- --dataset_name / --dataset_config_name


def test_a_config_the_dataset_does_not_have_gets_no_offline_hint(tmp_path, monkeypatch):
    import datasets

    from hf_tpu_ext.data.loading import _load_hub_dataset

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # a local folder: nothing to fetch
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.txt").write_text("some text\n" * 10)
    args = SimpleNamespace(dataset_name=str(folder), dataset_config_name="nope")
    with pytest.raises(DataError) as err:
        _load_hub_dataset(args, cache_dir=str(tmp_path / "cache"))
    assert str(err.value) == (f"--dataset_config_name 'nope' is not a config of the dataset {str(folder)!r} "
                              "(available: ['default']); pass one of them, or leave --dataset_config_name out.")


def test_dataset_errors_say_offline_only_when_the_hub_was_not_reached():
    from datasets.exceptions import DatasetNotFoundError

    from hf_tpu_ext.data.loading import hub_dataset_error

    unreachable = ConnectionError("Couldn't reach 'alice/ds' on the Hub (LocalEntryNotFoundError)")
    assert str(hub_dataset_error("alice/ds", "nope", unreachable)) == (
        "Could not load the dataset 'alice/ds' (config 'nope'): ConnectionError: Couldn't reach 'alice/ds' on the Hub "
        "(LocalEntryNotFoundError). Without network access a Hub dataset only loads from the local cache (download it "
        "once where the Hub is reachable, then set HF_DATASETS_OFFLINE=1), or pass --train_file.")
    missing = DatasetNotFoundError("Dataset 'alice/nods' doesn't exist on the Hub or cannot be accessed.")
    assert str(hub_dataset_error("alice/nods", None, missing)) == (
        "--dataset_name 'alice/nods': Dataset 'alice/nods' doesn't exist on the Hub or cannot be accessed. Check the "
        "name (and HF_TOKEN for a private or gated dataset), or pass --train_file.")
    assert str(hub_dataset_error("alice/ds", None, KeyError("text"))) == (
        "Could not load the dataset 'alice/ds': KeyError: 'text'. Check --dataset_name and --dataset_config_name, or "
        "pass --train_file.")


# ---------------------------------------------------------------- --resume_from_checkpoint user/name


def _fake_listing(monkeypatch, ids, wait=None):
    from huggingface_hub import HfApi

    def list_models(self, author=None, limit=None, **kwargs):
        if wait is not None:
            wait.wait(10)
        return iter([SimpleNamespace(id=i) for i in ids if i.split("/")[0] == author])

    monkeypatch.setattr(HfApi, "list_models", list_models)


def test_resume_from_a_repo_that_does_not_exist_names_it_and_the_near_name(loopback_hub, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    from hf_tpu_ext.hub.resume import download_last_checkpoint

    HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token).create_repo("alice/jargon-tf")
    # the loopback Hub has no listing route: the line names the repo, without a suggestion
    with pytest.raises(HubRepoError) as err:
        download_last_checkpoint("alice/jargon-tff", loopback_hub.token, str(tmp_path / "a"))
    assert str(err.value) == (
        f"Could not download last-checkpoint/ of alice/jargon-tff: the model repo 'alice/jargon-tff' does not exist "
        f"at {loopback_hub.endpoint} (or it is private and the token cannot read it); check the repo id and HF_TOKEN.")
    _fake_listing(monkeypatch, ["alice/jargon-tf", "alice/other-model", "bob/jargon-tff"])
    with pytest.raises(HubRepoError) as err:
        download_last_checkpoint("alice/jargon-tff", loopback_hub.token, str(tmp_path / "b"))
    assert str(err.value) == (
        f"Could not download last-checkpoint/ of alice/jargon-tff: the model repo 'alice/jargon-tff' does not exist "
        f"at {loopback_hub.endpoint} (or it is private and the token cannot read it); did you mean 'alice/jargon-tf'?")
    assert loopback_hub.token not in str(err.value)
    # the repo exists, its checkpoint does not: the other half of "which is missing"
    with pytest.raises(CheckpointError) as err:
        download_last_checkpoint("alice/jargon-tf", loopback_hub.token, str(tmp_path / "c"))
    assert str(err.value) == ("alice/jargon-tf has no last-checkpoint/ folder with a checkpoint; it is written by runs "
                              "with --push_to_hub --hub_strategy checkpoint.")


def test_model_ref_suggests_the_near_name_and_never_waits_on_the_listing(loopback_hub, monkeypatch):
    from hf_tpu_ext.hub.model_ref import check_model_ref, similar_repo_ids

    _fake_listing(monkeypatch, ["alice/roberta-small", "alice/roberta-smal-v2", "alice/unrelated"])
    with pytest.raises(HubRepoError) as err:
        check_model_ref("alice/roberta-smal", token=loopback_hub.token)
    assert str(err.value) == (
        f"--model_name_or_path 'alice/roberta-smal' is neither an existing local folder nor a model repo on "
        f"{loopback_hub.endpoint} (or the repo is private and no valid token was given). Check the path or repo id, "
        "HF_ENDPOINT and HF_TOKEN. Did you mean 'alice/roberta-small' or 'alice/roberta-smal-v2'?")
    assert similar_repo_ids("roberta-smal") == []  # no owner to list
    stalled = threading.Event()
    _fake_listing(monkeypatch, ["alice/roberta-small"], wait=stalled)
    try:
        assert similar_repo_ids("alice/roberta-smal", timeout=0.2) == []
    finally:
        stalled.set()
