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


def test_trainer_masked_lm_metrics_with_padding_collator_reach_state_and_card(loopback_hub, tmp_path):
    # a stock DataCollatorForLanguageModeling script: lines of different lengths, padded per batch; the metrics
    # callback is given no collator and uses the Trainer's; the Trainer evaluates too (its own eval_loss)
    from huggingface_hub import ModelCard
    from transformers import DataCollatorForLanguageModeling, RobertaConfig, RobertaForMaskedLM, Trainer, TrainingArguments

    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    texts = [" ".join(["the cat sat on the mat", "a dog ran far away", "birds sing"][i % 3] for _ in range(1 + i % 4))
             for i in range(40)]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=300, model_max_length=32)
    lines = [{"input_ids": tokenizer(t, truncation=True)["input_ids"]} for t in texts]
    assert len({len(x["input_ids"]) for x in lines}) > 2  # really ragged
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=40, pad_token_id=tokenizer.pad_token_id)
    metrics = get_callback("masked_lm_metrics", framework="torch", eval_dataset=lines[:16], batch_size=8)
    push = PushToHubCallback(hub_model_id="alice/trainer-eval", hub_token=loopback_hub.token, hub_strategy="end",
                             backoff_seconds=0.01)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=8,
                             save_strategy="steps", save_steps=4, logging_steps=2, report_to=[], use_cpu=True,
                             disable_tqdm=True, seed=0, num_train_epochs=1, eval_strategy="steps", eval_steps=4,
                             per_device_eval_batch_size=8)
    meter = get_callback("throughput", framework="torch", seq_length=32, warmup_steps=1, peak_flops=1e12)
    model = RobertaForMaskedLM(config)
    real = []  # the real (non-pad) tokens of every training forward, counted beside the meter
    model.register_forward_pre_hook(lambda m, a, kw: real.append(int(kw["attention_mask"].sum())) if m.training
                                    else None, with_kwargs=True)
    trainer = Trainer(model=model, args=args, train_dataset=lines, eval_dataset=lines[16:32],
                      callbacks=[metrics, push, meter],
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3))
    trainer.train()  # 40 lines / 8 = 5 steps per epoch: evaluated at the last step (4)

    history = trainer.state.log_history
    evals = [e for e in history if "eval_perplexity" in e]
    assert [e["step"] for e in evals] == [4] and evals[0] == dict(metrics.results, epoch=0.8, step=4)
    assert sorted(evals[0]) == ["epoch", "eval_masked_accuracy", "eval_masked_loss", "eval_masked_tokens",
                                "eval_perplexity", "step"]
    assert evals[0]["eval_perplexity"] == pytest.approx(np.exp(evals[0]["eval_masked_loss"]), rel=1e-6)
    # one value per key: the Trainer's eval_loss is its own evaluation's, ours are apart from it
    trainer_evals = [e for e in history if "eval_loss" in e]
    assert [e["step"] for e in trainer_evals] == [4] and "eval_perplexity" not in trainer_evals[0]
    # the evaluation is in the last checkpoint's trainer_state.json (made before the Trainer saved step 4)
    saved = json.loads((tmp_path / "out" / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e for e in saved["log_history"] if "eval_perplexity" in e] == evals

    files = loopback_hub.server.files("alice/trainer-eval")
    card = ModelCard(files["README.md"].decode())
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert results == {"perplexity": round(evals[0]["eval_perplexity"], 6),
                       "accuracy": round(evals[0]["eval_masked_accuracy"], 6),
                       "loss": round(evals[0]["eval_masked_loss"], 6)}
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in card.text.splitlines()]
    rows = {c[0]: c[1] for c in cells if len(c) == 2}
    assert float(rows["Masked-token accuracy"]) == round(evals[0]["eval_masked_accuracy"], 4)
    assert float(rows["Perplexity"]) == round(evals[0]["eval_perplexity"], 4)
    assert "PyTorch (transformers Trainer) on CPU" in card.text
    assert f"\n- torch {torch.__version__}\n" in card.text
    assert "tensorflow" not in card.text.split("Framework versions")[-1]
    # tokens seen: the real tokens of the 4 training batches (pads left out), not 4 x 8 x 32
    assert len(real) == 4 and sum(real) < 4 * 8 * 32
    assert rows["Tokens seen"] == f"{sum(real):,}", rows
    whole = [line for line in card.text.splitlines() if line.startswith("| Throughput, whole run")]
    assert len(whole) == 1 and "n/a" not in whole[0]
    # the throughput callback's figures (listed after the push callback), read at the final push
    steady = [line for line in card.text.splitlines() if line.startswith("| Throughput, steady")]
    assert len(steady) == 1 and "n/a" not in steady[0]
    assert "| MFU (steady rate x FLOPs per token / peak FLOP/s) | " in card.text
    assert "(peak 1e+12 FLOP/s per replica; given (peak_flops))" in card.text
    # the loss curve of hf-tpu train's plot, from the Trainer's log history, pushed beside the card
    assert "![Training and evaluation loss](loss_curve.png)" in card.text
    assert files["loss_curve.png"][:8] == b"\x89PNG\r\n\x1a\n"
