"""Our TrainerCallbacks in a transformers 5 ``Trainer`` (PyTorch, CPU) with the loopback Hub (.venv-current).

A tiny RobertaForMaskedLM built from a config (2 layers, hidden 64, 32-token blocks) and a byte-level BPE
tokenizer trained here; the script is a stock ``Trainer`` + ``DataCollatorForLanguageModeling`` plus our
callbacks from ``get_callback``.
"""

import json
import math
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tpu_ext.callbacks import get_callback  # noqa: E402

SEQ, BATCH = 32, 8


@pytest.fixture(scope="module")
def tiny_mlm():
    """(tokenizer, train blocks, eval blocks, config) built locally: no download."""
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    texts = default_corpus_texts()[:400]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=500, model_max_length=SEQ)
    ids = [i for t in texts for i in tokenizer(t, add_special_tokens=False)["input_ids"]]
    blocks = [{"input_ids": ids[k:k + SEQ]} for k in range(0, len(ids) - SEQ, SEQ)]
    assert len(blocks) >= 120
    config = transformers.RobertaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=128, max_position_embeddings=SEQ + 2,
                                        pad_token_id=tokenizer.pad_token_id, bos_token_id=0, eos_token_id=2,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return tokenizer, blocks[:96], blocks[96:120], config


def _trainer(tiny_mlm, out, callbacks, max_steps=8, **overrides):
    from transformers import (DataCollatorForLanguageModeling, RobertaForMaskedLM, Trainer, TrainingArguments,
                              set_seed)

    tokenizer, train, evaluation, config = tiny_mlm
    set_seed(0)
    options = dict(per_device_train_batch_size=BATCH, max_steps=max_steps, learning_rate=1e-3, logging_steps=2,
                   save_strategy="steps", save_steps=4, report_to=[], use_cpu=True, dataloader_drop_last=True,
                   disable_tqdm=True)
    args = TrainingArguments(output_dir=str(out), **dict(options, **overrides))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    return Trainer(model=RobertaForMaskedLM(config), args=args, train_dataset=train, data_collator=collator,
                   processing_class=tokenizer, callbacks=callbacks)


def test_push_to_hub_final_state_resume_and_card(tiny_mlm, loopback_hub, tmp_path):
    from huggingface_hub import ModelCard

    from hf_tpu_ext.callbacks.torch.push_to_hub import checkpoint_from_hub
    from hf_tpu_ext.hub.model_card import check_card_metadata

    push = get_callback("push_to_hub", framework="torch", hub_model_id="alice/tiny-t5", hub_token=loopback_hub.token,
                        hub_strategy="checkpoint", backoff_seconds=0.01, license="apache-2.0")
    trainer = _trainer(tiny_mlm, tmp_path / "out", [push])
    assert type(push).__module__ == "hf_tpu_ext.callbacks.torch.push_to_hub"
    trainer.train()

    files = loopback_hub.server.files("alice/tiny-t5")
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(files)
    assert "last-checkpoint/trainer_state.json" in files and "last-checkpoint/optimizer.pt" in files
    state = json.loads(files["last-checkpoint/trainer_state.json"])
    assert state["global_step"] == 8  # the final checkpoint landed
    assert push.pushed_steps[-1] == 8 and push.report.final_pushed
    # the final weights on the Hub are the trained model's
    from safetensors.torch import load

    hub_weights = load(files["model.safetensors"])
    local = trainer.model.state_dict()
    name = "roberta.encoder.layer.1.output.dense.weight"
    assert torch.equal(hub_weights[name], local[name].cpu())

    card = ModelCard(files["README.md"].decode())
    assert check_card_metadata(card.data.to_dict()) == []
    assert card.data.pipeline_tag == "fill-mask" and card.data.license == "apache-2.0"

    # resume from the repo id: last-checkpoint/ comes back and the Trainer continues at step 8
    local_ckpt = checkpoint_from_hub("alice/tiny-t5", str(tmp_path / "from-hub"), token=loopback_hub.token)
    assert os.path.isfile(os.path.join(local_ckpt, "optimizer.pt"))
    resumed = _trainer(tiny_mlm, tmp_path / "resumed", [], max_steps=10)
    resumed.train(resume_from_checkpoint=local_ckpt)
    assert resumed.state.global_step == 10
    assert [e["step"] for e in resumed.state.log_history if "loss" in e] == [2, 4, 6, 8, 10]


def test_throughput_and_masked_lm_metrics_give_real_numbers_on_cpu(tiny_mlm, tmp_path):
    from transformers import DataCollatorForLanguageModeling

    tokenizer, _, evaluation, _ = tiny_mlm
    throughput = get_callback("throughput", framework="torch", seq_length=SEQ, warmup_steps=2)
    metrics = get_callback("masked_lm_metrics", framework="torch", eval_dataset=evaluation, batch_size=8,
                           data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
                           every_n_steps=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guard = get_callback("xla_recompile_guard", framework="torch", action="raise")
        trainer = _trainer(tiny_mlm, tmp_path / "out", [throughput, metrics, guard], save_strategy="no")
        trainer.train()

    s = throughput.summary
    assert (s["global_batch_size"], s["seq_length"], s["num_replicas"]) == (8, 32, 1)
    assert s["steps_measured"] == 6  # 8 steps, the first 2 not timed
    assert s["tokens_per_second"] == pytest.approx(s["samples_per_second"] * 32)
    assert s["samples_per_second"] > 1 and s["step_time_ms_median"] > 0
    from hf_tpu_ext.flops import flops_per_token

    assert s["flops_per_token"] == flops_per_token(trainer.model.config, SEQ) > 0  # from the model's config
    assert s["model_flops_per_second"] == pytest.approx(s["tokens_per_second"] * s["flops_per_token"])
    from hf_tpu_ext.flops import device_peak

    # on a CPU the peak is the CPU formula's (the same as hf-tpu train's), MFU in [0, 1]
    assert s["peak_flops"] == device_peak("CPU", "float32").flops
    assert s["mfu"] == pytest.approx(s["model_flops_per_second"] / s["peak_flops"]) and 0 < s["mfu"] <= 1
    logged = [e for e in trainer.state.log_history if "tokens_per_second" in e]
    assert [e["step"] for e in logged] == [4, 6, 8]  # one throughput line per logging step (step 2: warm-up)
    assert s["tokens_seen"] == 8 * BATCH * SEQ  # full 32-token blocks: every position is a real token

    assert [h["step"] for h in metrics.history] == [4, 8]
    final = metrics.results
    assert 0 < final["eval_masked_loss"] < math.log(len(tokenizer)) + 1
    assert final["eval_perplexity"] == pytest.approx(math.exp(final["eval_masked_loss"]), rel=1e-6)
    assert 0 <= final["eval_masked_accuracy"] <= 1 and final["eval_masked_tokens"] > 0
    # the Trainer's log history has them as their own entries, and no eval_loss of ours beside the Trainer's
    entries = [e for e in trainer.state.log_history if "eval_perplexity" in e]
    assert [e["step"] for e in entries] == [4, 8] and entries[-1] == dict(final, epoch=entries[-1]["epoch"], step=8)
    assert not [e for e in trainer.state.log_history if "eval_loss" in e]

    # eager PyTorch on CPU: the guard says it has nothing to guard (once), never a silent no-op
    assert guard.mode is None
    notes = [str(w.message) for w in caught if "XLARecompileGuard" in str(w.message)]
    assert len(notes) == 1 and notes[0].startswith("XLARecompileGuard: nothing to guard: the model runs eagerly on cpu")


def test_recompile_guard_counts_torch_compile_graphs(tiny_mlm, tmp_path):
    from torch.utils.data import IterableDataset
    from transformers import DataCollatorForLanguageModeling

    from hf_tpu_ext.errors import RecompilationError

    tokenizer, train, _, _ = tiny_mlm

    class Ordered(IterableDataset):
        """Six batches of 32 tokens, then 16-token sequences: the 7th step has a new shape."""

        def __iter__(self):
            for k, ex in enumerate(train):
                yield {"input_ids": ex["input_ids"] if k < 6 * BATCH else ex["input_ids"][:16]}

    guard = get_callback("xla_recompile_guard", framework="torch", action="raise", warmup_steps=2)
    trainer = _trainer(tiny_mlm, tmp_path / "out", [guard], max_steps=10, save_strategy="no", logging_steps=100,
                       torch_compile=True, torch_compile_backend="eager")
    trainer.train_dataset = Ordered()
    with pytest.raises(RecompilationError) as err:
        trainer.train()
    assert guard.mode == "torch_compile"
    assert str(err.value).startswith("torch.compile compiled ")
    assert "at global step 7 (window: a plain train step)" in str(err.value)
    assert guard.compilations_after_warmup >= 1


def test_readme_trainer_snippet_runs_as_written(tiny_mlm, loopback_hub, tmp_path):
    # the block a user copies: run in a fresh process in a folder with train.txt; the one change is a local
    # tokenizer in place of the Hub's roberta-base (no download here)
    from huggingface_hub import ModelCard

    from readme_snippets import card_rows, run_readme_block

    tokenizer = tiny_mlm[0]
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    hub_name = 'AutoTokenizer.from_pretrained("FacebookAI/roberta-base")'
    proc = run_readme_block("### Callbacks in a transformers Trainer script", tmp_path,
                            {hub_name: f'AutoTokenizer.from_pretrained({str(tmp_path / "tok")!r})'},
                            {"HF_TOKEN": loopback_hub.token})
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = [line for line in proc.stdout.splitlines() if line.startswith("{'loss'")]
    assert len(printed) == 1 and "'tokens_per_second'" in printed[0]  # 8 steps, logging_steps 5: one log line

    files = loopback_hub.server.files("alice/my-fill-mask-model")
    card = ModelCard(files["README.md"].decode())
    assert {r.metric_type for r in card.data.eval_results} == {"perplexity", "accuracy", "loss"}
    rows = card_rows(card.text)
    for label in ("Tokens seen", "Masked-token accuracy", "Perplexity"):
        assert rows[label] != "n/a", label
    assert "loss_curve.png" in files and f"\n- transformers {transformers.__version__}\n" in card.text
