"""`hf-tpu train --push_to_hub` end to end against the loopback Hub: push, load back, card, resume from Hub."""

import json
import logging

import numpy as np
import pytest
import yaml
from conftest import tiny_train_args

REPO = "alice/tiny-mlm"


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(args))


@pytest.fixture
def pushed_run(loopback_hub, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "run"
    results = _train(tiny_train_args(
        out, "--max_steps", "12", "--save_strategy", "steps", "--save_steps", "5", "--eval_strategy", "steps",
        "--eval_steps", "6", "--push_to_hub", "true", "--hub_model_id", REPO, "--hub_strategy", "checkpoint",
        "--hub_token", loopback_hub.token,
    ))
    return loopback_hub, out, results, caplog


def test_push_checkpoint_strategy_end_to_end(pushed_run, tmp_path):
    hub, out, results, caplog = pushed_run
    files = hub.server.files(REPO)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "loss_curve.png",
                 "training_summary.json", "last-checkpoint/ckpt-12.index", "last-checkpoint/checkpoint"):
        assert name in files, f"{name} not on the Hub: {sorted(files)}"
    # the final weights on the Hub are the local final weights
    assert files["model.safetensors"] == (out / "model.safetensors").read_bytes()
    # and their TF copy for the stock TFAutoModelForMaskedLM.from_pretrained(..., use_safetensors=False)
    assert files["tf_model.h5"] == (out / "tf_model.h5").read_bytes()
    # the last commit holds no optimizer state outside last-checkpoint/
    assert not [f for f in files if (f.endswith(".index") or ".data-" in f) and not f.startswith("last-checkpoint/")]

    card = files["README.md"].decode()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "fill-mask"
    assert "base_model" not in meta and "datasets" not in meta
    results_md = meta["model-index"][0]["results"][0]
    assert {m["type"] for m in results_md["metrics"]} >= {"perplexity", "accuracy"}
    assert all(isinstance(v, str) for v in results_md["dataset"].values())
    assert "fine-tuned" not in card.lower()
    perplexity = f"{results['perplexity']:.4f}".rstrip("0").rstrip(".")  # the card drops trailing zeros
    assert f"| Perplexity | {perplexity} |" in card

    # the Hub's own validation accepts the metadata
    from hf_tpu_ext.hub.model_card import validate_model_card
    from huggingface_hub import ModelCard

    validate_model_card(ModelCard(card), token=hub.token, offline_ok=False)

    # transformers loads the repo through HF_ENDPOINT: tokenizer, PyTorch and TF
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(REPO, token=hub.token)
    assert tok.mask_token == "<mask>"
    from hf_tpu_ext.backends.tensorflow.export import load_tf_model

    tf_model = load_tf_model(REPO, token=hub.token)
    ids = np.array([tok("The module <mask> the function.")["input_ids"]])
    tf_logits = tf_model(input_ids=ids).logits.numpy()
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForMaskedLM

    pt = AutoModelForMaskedLM.from_pretrained(REPO, token=hub.token).eval()
    with torch.no_grad():
        pt_logits = pt(input_ids=torch.tensor(ids)).logits.numpy()
    assert np.abs(pt_logits - tf_logits).max() <= 1e-4

    # the token never lands in logs, files or the card
    assert hub.token not in caplog.text
    for path in out.rglob("*"):
        if path.is_file():
            assert hub.token.encode() not in path.read_bytes(), path
    for name, data in files.items():
        assert hub.token.encode() not in data, name


def test_resume_from_hub_last_checkpoint(pushed_run, tmp_path):
    hub, out, results, _ = pushed_run
    resumed = tmp_path / "resumed"
    args = tiny_train_args(resumed, "--max_steps", "16", "--eval_strategy", "no", "--save_strategy", "no",
                           "--resume_from_checkpoint", REPO, "--hub_token", hub.token)
    at = args.index("--max_seq_length")
    del args[at:at + 2]  # left at its default (128): the checkpoint's 32 is used, not refused
    res = _train(args)
    assert res["global_step"] == 16
    assert json.loads((resumed / "training_args.json").read_text())["max_seq_length"] == 32
    state = json.loads((resumed / "trainer_state.json").read_text())
    steps = [e["step"] for e in state["log_history"] if "loss" in e]
    assert steps == [5, 10, 12, 15, 16]  # continued from the pushed step 12, not from 0
    # the history up to step 12 is the pushed checkpoint's (trainer_state.json travels with last-checkpoint/)
    pushed = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [e for e in state["log_history"] if e["step"] <= 12] == pushed
    assert (resumed / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()


def test_bad_token_fails_before_training(loopback_hub, tmp_path):
    from hf_tpu_ext.errors import HubAuthError

    bad = "hf_notAValidTokenAtAll1234567890"
    with pytest.raises(HubAuthError) as err:
        _train(tiny_train_args(tmp_path / "o", "--max_steps", "2", "--push_to_hub", "true", "--hub_model_id", REPO,
                               "--hub_token", bad))
    assert bad not in str(err.value)
    assert not (tmp_path / "o" / "checkpoints").exists()
    with pytest.raises(HubAuthError, match="bob"):
        _train(tiny_train_args(tmp_path / "o2", "--max_steps", "2", "--push_to_hub", "true",
                               "--hub_model_id", "bob/model", "--hub_token", loopback_hub.token))


def test_train_deploys_space_when_training_ends(loopback_hub, tmp_path):
    _train(tiny_train_args(tmp_path / "o", "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no",
                           "--callbacks", "", "--push_to_hub", "true", "--hub_model_id", REPO,
                           "--hub_space_id", "alice/tiny-mlm-demo", "--hub_token", loopback_hub.token))
    space = loopback_hub.server.files("alice/tiny-mlm-demo", repo_type="space")
    assert {"app.py", "requirements.txt", "README.md"} <= set(space)
    meta = yaml.safe_load(space["README.md"].decode().split("---")[1])
    assert meta["sdk"] == "gradio" and meta["models"] == [REPO]
    # the model repo it points at holds the final weights
    assert loopback_hub.server.files(REPO)["model.safetensors"] == (tmp_path / "o" / "model.safetensors").read_bytes()
