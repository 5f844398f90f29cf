"""The Keras 3 recipes of :mod:`benchmarks.train_throughput`, run in the current-releases environment (JAX).

* ``keras_jax``: ``hf-tpu train --backend keras`` (float32), through :func:`hf_tpu_ext.run.train`;
* ``keras_jax_bf16``: the same with ``--bf16 true`` (bfloat16 compute, float32 weights);
* ``keras_hub_fit``: what a keras-hub user runs instead: ``keras_hub.models.RobertaMaskedLM`` (same
  ``RobertaBackbone`` shape) with its stock ``compile()`` (AdamW, sparse cross-entropy from logits,
  ``jit_compile`` auto = XLA on JAX) and ``model.fit``, fed the same masked batches (same tokenizer, blocks,
  ``max_predictions_per_seq`` positions) through ``tf.data.Dataset.from_generator`` (keras-hub's ``Task.fit``
  converts its input to ``tf.data`` itself).

Steps are timed as everywhere in the benchmark: host wall time from one ``on_train_batch_begin`` to the next
(:class:`KerasStepTimer`, registered as ``bench_step_timer`` for Keras 3), steady state after the preset's warm-up.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import keras

from benchmarks.common import data_file, peak_rss_mb, train_argv
from hf_tpu_ext.callbacks import register_callback

KERAS_RECIPE_FLAGS = {"keras_jax": [], "keras_jax_bf16": ["--bf16", "true"]}
INSTANCES: List["KerasStepTimer"] = []


@register_callback("bench_step_timer", "Benchmarks: host wall time of every training step (begin to next begin).",
                   framework="keras")
class KerasStepTimer(keras.callbacks.Callback):
    """The Keras 3 twin of :class:`benchmarks.step_timer.StepTimer` (begin-to-begin host wall times)."""

    def __init__(self):
        super().__init__()
        self.begins: List[float] = []
        self.cpu_begins: List[float] = []  # time.process_time() at each begin (cpu_ms_per_step)
        self.first_step_end_wall: Optional[float] = None

    @classmethod
    def from_run(cls, run) -> "KerasStepTimer":
        timer = cls()
        INSTANCES.append(timer)
        return timer

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())
        self.cpu_begins.append(time.process_time())

    def on_train_batch_end(self, batch, logs=None):
        if self.first_step_end_wall is None:
            for value in (logs or {}).values():  # JAX dispatches asynchronously: wait for the first step
                float(value)
                break
            self.first_step_end_wall = time.time()

    def first_step_latency(self) -> Optional[float]:
        import psutil

        return None if self.first_step_end_wall is None else self.first_step_end_wall - psutil.Process().create_time()

    def summary(self, warmup_steps: int) -> Dict[str, Any]:
        """:func:`benchmarks.step_timer.summarize_intervals`' figures (that module needs tf_keras, absent here)."""
        import statistics

        intervals = [b - a for a, b in zip(self.begins, self.begins[1:])]
        steady = intervals[max(1, warmup_steps):]
        if not steady:
            raise ValueError(f"only {len(intervals)} timed steps for a warm-up of {warmup_steps}; run more steps")
        median = statistics.median(steady)
        return {"steps_measured": len(steady), "ms_per_step": median * 1e3,
                "ms_per_step_mean": statistics.fmean(steady) * 1e3, "first_step_seconds": intervals[0],
                "compile_seconds": max(intervals[0] - median, 0.0),
                "cpu_ms_per_step": _median_cpu_ms(self.cpu_begins, warmup_steps)}


def _median_cpu_ms(cpu_begins: List[float], warmup_steps: int) -> Optional[float]:
    """:func:`benchmarks.step_timer.median_cpu_ms` (that module imports tf_keras, absent here)."""
    import statistics

    steady = [b - a for a, b in zip(cpu_begins, cpu_begins[1:])][max(1, warmup_steps):]
    return statistics.median(steady) * 1e3 if steady else None


def job_keras_train(preset, workdir: Path, extra=()) -> Dict[str, Any]:
    """``hf-tpu train --backend keras`` with the preset's shapes (same arguments as the ``hf_tpu`` recipe)."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = workdir / f"out-{os.getpid()}"
    argv = train_argv(preset, workdir, out, preset.steps, "throughput,xla_recompile_guard,bench_step_timer",
                       ["--backend", "keras", "--report_to", "none", *extra])
    argv += ["--eval_strategy", "steps", "--eval_steps", str(preset.steps)]
    results = train(*parse_args(argv))
    timer = INSTANCES[-1]
    summary = timer.summary(preset.warmup)
    summary.update(xla_step_compilations=int(results["xla_step_compilations"]),
                   train_step_compilations=int(results["xla_step_compilations"]),
                   final_loss=float(results["train_loss"]), peak_rss_mb=peak_rss_mb(),
                   first_step_latency_seconds=timer.first_step_latency(), eval_loss=results.get("eval_loss"),
                   perplexity=results.get("perplexity"), load_average=[round(x, 2) for x in os.getloadavg()])
    info_path = out / "training_summary.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        summary.update(precision=info.get("precision"), compiler=info.get("compiler"))
    shutil.rmtree(out, ignore_errors=True)
    return summary


def job_keras_hub_fit(preset, workdir: Path) -> Dict[str, Any]:
    """keras-hub's stock ``RobertaMaskedLM.compile()`` + ``fit`` on the same masked batches (float32)."""
    import keras_hub
    import numpy as np
    from transformers import AutoTokenizer

    from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches

    tokenizer = AutoTokenizer.from_pretrained(str(workdir / "prepared" / "tokenizer"))
    data = data_file()
    if data is not None:
        texts = [t for t in Path(data).read_text(encoding="utf-8").splitlines() if t.strip()]
    else:
        from hf_tpu_ext.data.corpus import default_corpus_texts

        texts = default_corpus_texts()
    ids = [i for text in texts for i in tokenizer(text)["input_ids"]]
    L = preset.seq_length
    blocks = np.array(ids[: (len(ids) // L) * L], np.int32).reshape(-1, L)
    batches = TrainBatches(blocks, preset.global_batch_size, 42,
                           NumpyMasker.for_tokenizer(tokenizer, preset.max_predictions))

    def generator():
        step = 0
        while True:
            b = batches(step)
            step += 1
            yield ({"token_ids": b["input_ids"], "padding_mask": b["attention_mask"],
                    "mask_positions": b["masked_lm_positions"]}, b["masked_lm_ids"], b["masked_lm_weights"])

    import tensorflow as tf  # keras-hub's Task.fit turns anything but a tf.data.Dataset into one itself

    spec = {"token_ids": tf.TensorSpec([preset.global_batch_size, L], tf.int32),
            "padding_mask": tf.TensorSpec([preset.global_batch_size, L], tf.int32),
            "mask_positions": tf.TensorSpec([preset.global_batch_size, preset.max_predictions], tf.int32)}
    labels = tf.TensorSpec([preset.global_batch_size, preset.max_predictions], tf.int32)
    weights = tf.TensorSpec([preset.global_batch_size, preset.max_predictions], tf.float32)
    dataset = tf.data.Dataset.from_generator(generator, output_signature=(spec, labels, weights)).prefetch(2)
    keras.utils.set_random_seed(42)
    backbone = keras_hub.models.RobertaBackbone(
        vocabulary_size=len(tokenizer), num_layers=preset.num_hidden_layers, num_heads=preset.num_attention_heads,
        hidden_dim=preset.hidden_size, intermediate_dim=preset.intermediate_size, max_sequence_length=L)
    model = keras_hub.models.RobertaMaskedLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.AdamW(5e-4, weight_decay=0.01))  # the stock loss and metrics
    timer = KerasStepTimer()
    history = model.fit(dataset, steps_per_epoch=preset.steps, epochs=1, callbacks=[timer], verbose=0)
    summary = timer.summary(preset.warmup)
    summary.update(final_loss=float(history.history["loss"][-1]), peak_rss_mb=peak_rss_mb(), train_step_compilations=None,
                   first_step_latency_seconds=timer.first_step_latency(), precision="float32",
                   compiler="XLA (JAX), keras-hub Task.fit", load_average=[round(x, 2) for x in os.getloadavg()])
    return summary


def run_keras_job(name: str, preset, workdir: Path) -> Dict[str, Any]:
    """One Keras recipe by name (``keras_jax``, ``keras_jax_bf16``, ``keras_hub_fit``)."""
    if name in KERAS_RECIPE_FLAGS:
        return job_keras_train(preset, workdir, KERAS_RECIPE_FLAGS[name])
    if name == "keras_hub_fit":
        return job_keras_hub_fit(preset, workdir)
    raise ValueError(f"unknown Keras job {name!r}")
