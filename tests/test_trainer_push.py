"""The Trainer adapter of the Hub pusher with a plain transformers ``Trainer`` on CPU, against the loopback Hub."""

import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it (test extra)

from hf_tpu_ext.callbacks.torch.push_to_hub import PushToHubCallback, checkpoint_from_hub  # noqa: E402
from hf_tpu_ext.errors import HubAuthError  # noqa: E402


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, n=32, length=16, vocab=100, seed=0):
        rng = np.random.default_rng(seed)
        self.ids = torch.tensor(rng.integers(5, vocab, size=(n, length)), dtype=torch.long)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = torch.full_like(ids, -100)
        labels[::4] = ids[::4]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _trainer(out, callbacks, max_steps=6, save_steps=2, **extra):
    from transformers import RobertaConfig, RobertaForMaskedLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=20, type_vocab_size=1, pad_token_id=1)
    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=8,
                             save_strategy="steps", save_steps=save_steps, logging_steps=2, report_to=[],
                             use_cpu=True, disable_tqdm=True, learning_rate=1e-3, seed=0, **extra)
    return Trainer(model=RobertaForMaskedLM(config), args=args, train_dataset=_Blocks(), callbacks=callbacks)


def test_trainer_checkpoint_strategy_final_push_card_and_resume_from_hub(loopback_hub, tmp_path):
    from safetensors.torch import load_file

    loopback_hub.server.latency(0.2, route="commit")
    cb = PushToHubCallback(hub_model_id="alice/trainer-ck", hub_token=loopback_hub.token, hub_strategy="checkpoint",
                           license="apache-2.0", backoff_seconds=0.01)
    out = tmp_path / "out"
    trainer = _trainer(out, [cb])
    trainer.train()
    report = cb.report
    assert report.final_pushed and report.counts["failed"] == 0 and not report.pending
    assert cb.pushed_steps[-1] == 6 and "optimizer.pt" not in os.listdir(out)
    files = loopback_hub.server.files("alice/trainer-ck")
    last = {p for p in files if p.startswith("last-checkpoint/")}
    assert {"last-checkpoint/optimizer.pt", "last-checkpoint/scheduler.pt", "last-checkpoint/model.safetensors",
            "last-checkpoint/trainer_state.json"} <= last
    state = json.loads(files["last-checkpoint/trainer_state.json"])
    assert (state["global_step"], state["max_steps"]) == (6, 6) and state["epoch"] == pytest.approx(6 / 4)
    assert not [p for p in files if not p.startswith("last-checkpoint/") and (p.endswith(".pt") or "checkpoint-" in p)]
    card = files["README.md"].decode()
    assert "pipeline_tag: fill-mask" in card and "license: apache-2.0" in card and "pytorch" in card
    # the Hub's final weights are the trained model's
    hub_weights = {k: v for k, v in load_file(str(out / "model.safetensors")).items()}
    assert files["model.safetensors"] == (out / "model.safetensors").read_bytes()
    for name, value in trainer.model.state_dict().items():
        if name in hub_weights:
            torch.testing.assert_close(hub_weights[name], value, rtol=0, atol=0)

    folder = checkpoint_from_hub("alice/trainer-ck", str(tmp_path / "dl"), token=loopback_hub.token)
    from transformers import TrainerCallback

    ran = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ran.append(state.global_step)

    resumed = _trainer(tmp_path / "resumed", [Steps()], max_steps=8)
    resumed.train(resume_from_checkpoint=folder)
    assert ran == [7, 8]  # continued from the pushed step 6


def test_trainer_end_strategy_pushes_final_state_without_a_checkpoint(loopback_hub, tmp_path):
    cb = PushToHubCallback(hub_model_id="trainer-end", hub_token=loopback_hub.token, hub_strategy="end",
                           backoff_seconds=0.01)
    _trainer(tmp_path / "out", [cb], max_steps=3, save_steps=100).train()
    assert [c["message"] for c in loopback_hub.server.commits("alice/trainer-end")] == ["initial commit",
                                                                                       "End of training"]
    assert cb.report.final_pushed and "model.safetensors" in loopback_hub.server.files("alice/trainer-end")


def test_trainer_read_only_token_fails_before_the_first_step(loopback_hub, tmp_path):
    from hf_tpu_ext.hub.preflight import preflight

    preflight("alice/exists", loopback_hub.token)
    cb = PushToHubCallback(hub_model_id="alice/exists", hub_token=loopback_hub.read_token)
    trainer = _trainer(tmp_path / "out", [cb])
    with pytest.raises(HubAuthError, match="read-only") as info:
        trainer.train()
    assert trainer.state.global_step == 0 and loopback_hub.read_token not in str(info.value)


def test_trainer_adapter_does_not_import_torch_xla():
    assert "torch_xla" not in sys.modules or os.environ.get("PJRT_DEVICE")
