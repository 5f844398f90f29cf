"""The child side of :mod:`benchmarks.train_throughput`: each part of a preset (``--job NAME``) run in this process.

Every job returns a JSON-able dict (step timings from :mod:`benchmarks.step_timer`, peak RSS, compilations, ...)
that the parent (:func:`benchmarks.rounds.child`) reads back; frameworks are imported inside the jobs.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Dict, Optional

from benchmarks.common import (KERAS_RECIPES, PUSH_EVERY_STEPS, RECIPE_FLAGS, Preset, data_file, peak_rss_mb,
                               prepare_corpus_file, setup_devices, train_argv)


def job_hf_tpu(preset: Preset, workdir: Path, callbacks: str = "throughput,xla_recompile_guard,bench_step_timer",
               steps: Optional[int] = None, extra=(), evaluate: bool = False) -> Dict[str, Any]:
    """``hf-tpu train`` through :func:`hf_tpu_ext.run.train`; returns step timings, traces and RSS."""
    setup_devices(preset)
    from benchmarks import step_timer
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    steps = steps or preset.steps
    out = workdir / f"out-{os.getpid()}"
    argv = train_argv(preset, workdir, out, steps, callbacks, extra)
    if evaluate:  # one evaluation after the last step (not inside any timed step interval)
        argv += ["--eval_strategy", "steps", "--eval_steps", str(steps)]
    results = train(*parse_args(argv))
    timer = step_timer.last_instance()
    summary = timer.summary(preset.warmup)
    summary.update(
        train_step_compilations=int(results["train_function_traces"]),
        xla_step_compilations=int(results["xla_step_traces"]),
        final_loss=float(results["train_loss"]),
        peak_rss_mb=peak_rss_mb(),
        first_step_latency_seconds=timer.first_step_latency(),
        eval_loss=results.get("eval_loss"),
        perplexity=results.get("perplexity"),
    )
    summary_json = out / "training_summary.json"
    if summary_json.is_file():
        info = json.loads(summary_json.read_text())
        summary.update(precision=info.get("precision"), compiler=info.get("compiler"))
    shutil.rmtree(out, ignore_errors=True)
    return summary


def _plain_datasets(preset: Preset, tokenizer):
    """The docs recipe's data: ``datasets.map`` tokenization, then ``group_texts`` into blocks."""
    from datasets import Dataset, load_dataset

    data = data_file()
    if data is not None:
        raw = load_dataset("text", data_files={"train": str(data)})["train"]
    else:
        from hf_tpu_ext.data.corpus import default_corpus_texts

        raw = Dataset.from_dict({"text": default_corpus_texts()})
    raw = raw.filter(lambda x: len(x["text"].strip()) > 0)
    tokenized = raw.map(lambda b: tokenizer(b["text"], return_special_tokens_mask=True), batched=True,
                        remove_columns=["text"])
    L = preset.seq_length

    def group_texts(examples):  # as in transformers' run_mlm example
        concatenated = {k: sum(examples[k], []) for k in examples.keys()}
        total = (len(concatenated["input_ids"]) // L) * L
        return {k: [t[i: i + L] for i in range(0, total, L)] for k, t in concatenated.items()}

    return tokenized.map(group_texts, batched=True)


def job_plain(preset: Preset, workdir: Path, jit_compile: bool) -> Dict[str, Any]:
    """The plain transformers recipe with ``model.fit`` (``jit_compile`` on or off)."""
    setup_devices(preset)
    import tensorflow as tf
    import tf_keras
    from transformers import (AutoTokenizer, DataCollatorForLanguageModeling, RobertaConfig,
                              TFAutoModelForMaskedLM, create_optimizer)

    from benchmarks.step_timer import StepTimer
    from hf_tpu_ext.backends.tensorflow.strategy import resolve_strategy

    tokenizer = AutoTokenizer.from_pretrained(str(workdir / "prepared" / "tokenizer"))
    lm_data = _plain_datasets(preset, tokenizer)
    if preset.bf16:
        tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    strategy = resolve_strategy().strategy
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=preset.hidden_size, num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads, intermediate_size=preset.intermediate_size,
        max_position_embeddings=preset.seq_length + 2, type_vocab_size=1, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    tf_keras.utils.set_random_seed(42)
    with strategy.scope():
        model = TFAutoModelForMaskedLM.from_config(config)
        optimizer, _ = create_optimizer(init_lr=5e-4, num_train_steps=preset.steps, num_warmup_steps=0,
                                        weight_decay_rate=0.01)
        model.compile(optimizer=optimizer, jit_compile=jit_compile)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="np")
    dataset = model.prepare_tf_dataset(lm_data, shuffle=True, batch_size=preset.global_batch_size,
                                       collate_fn=collator).repeat()
    timer = StepTimer()
    history = model.fit(dataset, steps_per_epoch=preset.steps, epochs=1, callbacks=[timer], verbose=0)
    summary = timer.summary(preset.warmup)
    summary.update(
        train_step_compilations=int(model.train_function.experimental_get_tracing_count()),
        final_loss=float(history.history["loss"][-1]),
        peak_rss_mb=peak_rss_mb(),
        first_step_latency_seconds=timer.first_step_latency(),
    )
    return summary


def job_probe(preset: Preset, workdir: Path) -> Dict[str, Any]:
    """The machine's peak FLOP/s for MFU (all CPU cores by formula, or one accelerator's datasheet value x their
    number) and, beside it, the matmul rate XLA reaches now (recorded only: it moves with the load)."""
    import tensorflow as tf

    from hf_tpu_ext.flops import default_device_kind, device_peak, measure_peak_flops

    dtype = "bfloat16" if preset.bf16 else "float32"
    kind = default_device_kind()
    accelerators = len(tf.config.list_logical_devices("GPU")) or len(tf.config.list_logical_devices("TPU"))
    count = max(accelerators if kind != "CPU" else 1, 1)
    peak = device_peak(kind, dtype)
    measured = measure_peak_flops(dtype, target_seconds=2.0)
    return {"device_kind": kind, "dtype": dtype, "devices": count, "peak_flops_per_device": peak.flops,
            "peak_flops": peak.flops * count if peak.flops else None, "peak_source": peak.source,
            "achievable_matmul_flops": measured * count, "load_average": [round(x, 2) for x in os.getloadavg()]}


def job_pipeline(preset: Preset, workdir: Path) -> Dict[str, Any]:
    """Tokens/s the ``tf.data`` training pipeline (stateless masking included) delivers on its own."""
    from hf_tpu_ext.args import DataTrainingArguments
    from hf_tpu_ext.data.blocks import group_into_blocks
    from hf_tpu_ext.data.loading import load_text_datasets
    from hf_tpu_ext.data.masking import make_mask_fn
    from hf_tpu_ext.data.pipeline import input_pipeline_tokens_per_second, make_train_dataset
    from hf_tpu_ext.data.tokenizer import load_tokenizer

    data = data_file()
    data_args = DataTrainingArguments(train_file=str(data) if data else None, max_seq_length=preset.seq_length)
    tok = load_tokenizer(str(workdir / "prepared" / "tokenizer"))
    blocks = group_into_blocks(load_text_datasets(data_args, seed=42), tok, preset.seq_length)
    dataset = make_train_dataset(blocks["train"], global_batch_size=preset.global_batch_size, seed=42,
                                 mask_fn=make_mask_fn(tok, data_args.max_predictions_per_seq))
    rate = input_pipeline_tokens_per_second(dataset, preset.pipeline_batches)
    return {"tokens_per_second": rate, "batches": preset.pipeline_batches}


def job_prepare_data(preset: Preset, workdir: Path, num_proc: Optional[int] = None) -> Dict[str, Any]:
    """``hf-tpu prepare-data`` on the benchmark text.

    Without ``num_proc`` it trains the BPE tokenizer every recipe then uses (``workdir/prepared``) on the training
    text; with it, it tokenizes :func:`prepare_corpus_file` with that tokenizer in ``num_proc`` processes
    (``workdir/prepared-np<N>``).
    """
    from hf_tpu_ext.commands.prepare_data import main as prepare_main

    data = data_file() if num_proc is None else (prepare_corpus_file(workdir) or data_file())
    if num_proc is None:
        out = workdir / "prepared"
        argv = ["--vocab_size", str(preset.vocab_size)]
    else:
        out = workdir / f"prepared-np{num_proc}"
        argv = ["--tokenizer_name", str(workdir / "prepared" / "tokenizer"), "--num_proc", str(num_proc),
                "--overwrite_output_path", "true"]
    argv += ["--output_path", str(out), "--max_seq_length", str(preset.seq_length), "--num_shards", "2"]
    if data is not None:
        argv += ["--train_file", str(data)]
    buffer = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(buffer):
        prepare_main(argv)
    total = time.perf_counter() - start
    text = buffer.getvalue()
    m = re.search(r"Tokenized (\d+) tokens in ([0-9.]+) s", text)
    if not m:
        raise RuntimeError(f"Unexpected prepare-data output:\n{text}")
    tokens, seconds = int(m.group(1)), float(m.group(2))
    manifest = json.loads((out / "manifest.json").read_text())
    return {"tokens": tokens, "tokenize_seconds": seconds, "tokens_per_second": tokens / max(seconds, 1e-9),
            "num_proc": num_proc or 1,
            "total_seconds": total, "end_to_end_tokens_per_second": tokens / max(total, 1e-9),
            "vocab_size": int(manifest.get("vocab_size") or manifest.get("metadata", {}).get("vocab_size") or 0)}


def run_job(name: str, preset: Preset, workdir: Path) -> Dict[str, Any]:
    """Run one benchmark part in this process (called in a child process by :func:`main`)."""
    if name == "prepare_data":
        return job_prepare_data(preset, workdir)
    if name.startswith("prepare_data_np"):
        return job_prepare_data(preset, workdir, num_proc=int(name[len("prepare_data_np"):]))
    if name == "probe":
        return job_probe(preset, workdir)
    if name == "pipeline":
        return job_pipeline(preset, workdir)
    if name in KERAS_RECIPES:
        from benchmarks.keras_recipes import run_keras_job

        return run_keras_job(name, preset, workdir)
    if name in RECIPE_FLAGS:
        return job_hf_tpu(preset, workdir, extra=RECIPE_FLAGS[name], evaluate=True)
    if name == "plain":
        return job_plain(preset, workdir, jit_compile=False)
    if name == "plain_xla":
        return job_plain(preset, workdir, jit_compile=True)
    # both runs write the trainer's checkpoint every PUSH_EVERY_STEPS: the difference is the callbacks' cost
    saves = ["--save_strategy", "steps", "--save_steps", str(PUSH_EVERY_STEPS)]
    if name == "callbacks_none":
        return job_hf_tpu(preset, workdir, callbacks="bench_step_timer", steps=preset.overhead_steps, extra=saves)
    if name == "callbacks_push":
        return job_hf_tpu(
            preset, workdir, callbacks="throughput,xla_recompile_guard,bench_step_timer", steps=preset.overhead_steps,
            extra=["--push_to_hub", "true", "--hub_model_id", f"bench/hf-tpu-{preset.name}", *saves,
                   "--hub_strategy", "every_save"],
        )
    raise ValueError(f"unknown job {name!r}")
