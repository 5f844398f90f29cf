"""Training throughput, MFU and overheads of ``hf-tpu train`` against the recipes users would otherwise run.

One invocation runs, one after the other, on the same model config, data, sequence length and global batch:

1. ``hf_tpu``: ``hf-tpu train`` through its library entry point (:func:`hf_tpu_ext.run.train`), default
   callbacks (``throughput,xla_recompile_guard``) on;
2. ``plain``: the recipe of transformers' docs/``run_mlm``: ``datasets.map`` tokenization, ``group_texts``,
   ``DataCollatorForLanguageModeling`` + ``model.prepare_tf_dataset``, ``TFAutoModelForMaskedLM.from_config``,
   ``compile(optimizer=create_optimizer(...))``, ``model.fit``;
3. ``plain_xla``: the same with ``compile(..., jit_compile=True)``;

plus the ``tf.data`` input pipeline alone, ``hf-tpu prepare-data`` and the step-time overhead of the callbacks
(all defaults + an async Hub push every 20 steps to a loopback Hub answering each request after 200 ms, against
no callbacks; the loopback Hub's request threads run at nice 19, see :func:`_loopback_hub`). Every part runs in
its own Python process (``--job``), so each gets a fresh TensorFlow and its own peak RSS.

Step times are host wall times from one ``on_train_batch_begin`` to the next
(:class:`benchmarks.step_timer.StepTimer`); steady state = the steps after ``warmup`` steps. Each recipe and
callback run is repeated ``--repeats`` times (default 3), round-robin, and the fastest run counts (median
step for the recipes, mean step for the callback runs, whose save points are periodic costs); every run's
figure is kept in the JSON (``runs_ms_per_step``). The callback runs both write the trainer's checkpoint every
20 steps, so their difference is the callbacks' cost alone.

MFU = tokens/s x FLOPs per token / peak FLOP/s. FLOPs per token: :func:`hf_tpu_ext.flops.flops_per_token`
(Kaplan et al. 2020, Sec. 2.1: ``6 N`` per token for ``N`` non-embedding parameters, plus PaLM's
``12 n_layer d n_ctx`` attention term, Chowdhery et al. 2022, App. B), with the LM head counted at the
``max_predictions_per_seq`` masked positions the loss needs, for every recipe (so MFU compares useful work;
``mfu_executed`` counts the plain recipes' head at every position, as they run it). The peak is the hardware's,
the same one ``hf-tpu train`` logs (:func:`hf_tpu_ext.flops.device_peak`: a TPU/GPU datasheet value times the
accelerators, or the CPU formula cores x clock x FLOP/cycle); the XLA matmul rate the ``probe`` job measures is
recorded beside it (``achievable_matmul_flops``) but never divides MFU: it moves with the machine's load.

Quiet rounds: every child process (a round of one recipe) records the 1- and 5-minute load average at its start
and end and the CPU time other processes used meanwhile (``/proc/stat`` busy time minus this benchmark's own
children: the load average also counts the benchmark's previous round). A round is quiet when those others used
at most :data:`QUIET_FOREIGN_CPU_SHARE` of the cores; a result is a headline (``"headline": true``, README and
RESULTS.md figures) only when the 1-minute load was at most :data:`QUIET_START_LOAD` x cores before the first
round and every timed round was quiet. Run it alone on the machine.

Usage (from the repository root; results go to ``benchmarks/results/`` and ``benchmarks/RESULTS.md``):
    python -m benchmarks.train_throughput --preset small     # CPU, a few minutes on 2 cores
    python -m benchmarks.train_throughput --preset multi     # the CPU as 4 logical devices
    python -m benchmarks.train_throughput --preset base      # roberta-base shapes, seq 512, bf16 (GPU/TPU)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
RESULTS_MD = REPO_ROOT / "benchmarks" / "RESULTS.md"
RECIPES = ("hf_tpu", "plain", "plain_xla")
# hf-tpu train with --jit_compile false: what the XLA step (and its counter-based dropout) buys; bf16 mixed
# precision on both compiler paths (--bf16 true alone picks the path per device: hf_tpu_ext/precision.py)
EXTRA_RECIPES = ("hf_tpu_no_xla", "hf_tpu_bf16", "hf_tpu_bf16_no_xla")
RECIPE_FLAGS = {
    "hf_tpu": [],
    "hf_tpu_no_xla": ["--jit_compile", "false"],
    "hf_tpu_bf16": ["--bf16", "true", "--jit_compile", "true"],
    "hf_tpu_bf16_no_xla": ["--bf16", "true", "--jit_compile", "false"],
}
#: prepare-data tokenizing processes compared (1 and N)
PREPARE_PROCS = (1, 2)
#: `hf-tpu train --backend keras` (Keras 3 on JAX) fp32/bf16 and keras-hub's stock RobertaMaskedLM.fit
#: (benchmarks/keras_recipes.py), each run by the current-releases venv's Python (--keras_python)
KERAS_RECIPES = ("keras_jax", "keras_jax_bf16", "keras_hub_fit")
ALL_RECIPES = RECIPES + EXTRA_RECIPES + KERAS_RECIPES
HUB_LATENCY_SECONDS = 0.2
PUSH_EVERY_STEPS = 20
#: a round is quiet when other processes used at most this share of the machine's cores during it (on average)
QUIET_FOREIGN_CPU_SHARE = 0.1
#: a headline result needs the 1-minute load average at most this x cores before its first round
QUIET_START_LOAD = 0.3
BENCH_USER_TOKEN = "hf_bench_loopback_token_0123456789"


@dataclasses.dataclass(frozen=True)
class Preset:
    """Model, data and run sizes of one benchmark preset.

    Attributes:
        name: preset name.
        num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, vocab_size: RoBERTa shapes
            (``vocab_size`` is what the BPE tokenizer is trained to; a small corpus may give fewer tokens).
        seq_length: tokens per sequence.
        global_batch_size: sequences per optimizer step over all replicas.
        cpu_devices: logical CPU devices to split the CPU into (1: no split).
        bf16: mixed bfloat16 compute.
        steps: optimizer steps per recipe run; warmup: leading steps not in the steady state.
        overhead_steps: steps of each callback-overhead run (pushes at every ``PUSH_EVERY_STEPS``).
        pipeline_batches: batches timed for the input pipeline alone.
    """

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    seq_length: int
    global_batch_size: int
    cpu_devices: int = 1
    bf16: bool = False
    steps: int = 30
    warmup: int = 5
    overhead_steps: int = 41
    pipeline_batches: int = 200

    @property
    def max_predictions(self) -> int:
        from hf_tpu_ext.data.masking import default_max_predictions

        return default_max_predictions(self.seq_length, 0.15)


PRESETS = {
    "small": Preset("small", 4, 256, 4, 1024, 8000, 128, 16),
    "multi": Preset("multi", 4, 256, 4, 1024, 8000, 128, 16, cpu_devices=4),
    "base": Preset("base", 12, 768, 12, 3072, 50265, 512, 32, bf16=True, steps=60, warmup=10, overhead_steps=81,
                   pipeline_batches=100),
}


#: copies of the shared texts in the prepare-data processes comparison (WikiText-2 valid + test, tiny-shakespeare,
#: Jargon File: 5.2 MB, ~1.8 M tokens once): a corpus big enough that --num_proc matters
PREPARE_CORPUS_COPIES = 4


def prepare_corpus_file(workdir: Path) -> Optional[Path]:
    """The text of the prepare-data processes comparison (``workdir/prepare-corpus.txt``), or None without data.

    Every ``*.txt`` under ``../shared/data``, concatenated ``PREPARE_CORPUS_COPIES`` times (~20 MB).
    """
    files = sorted(SHARED_DATA.glob("*/*.txt"))
    if not files:
        return None
    path = workdir / "prepare-corpus.txt"
    if not path.is_file():
        text = "".join(f.read_text(encoding="utf-8") for f in files)
        path.write_text(text * PREPARE_CORPUS_COPIES, encoding="utf-8")
    return path


def data_file() -> Optional[Path]:
    """WikiText-2 ``valid.txt`` next to the repository (``../shared/data``), or None: the embedded corpus."""
    path = SHARED_DATA / "wikitext-2" / "valid.txt"
    return path if path.is_file() else None


# ======================================================================================= jobs (child side)
def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _setup_devices(preset: Preset) -> None:
    if preset.cpu_devices > 1:
        from hf_tpu_ext.backends.tensorflow.strategy import split_cpu

        split_cpu(preset.cpu_devices)


def _train_argv(preset: Preset, workdir: Path, out: Path, steps: int, callbacks: str, extra=()) -> List[str]:
    data = data_file()
    argv = [
        "--output_dir", str(out), "--overwrite_output_dir", "true",
        "--tokenizer_name", str(workdir / "prepared" / "tokenizer"),
        "--num_hidden_layers", str(preset.num_hidden_layers), "--hidden_size", str(preset.hidden_size),
        "--num_attention_heads", str(preset.num_attention_heads), "--intermediate_size", str(preset.intermediate_size),
        "--max_seq_length", str(preset.seq_length),
        "--per_device_train_batch_size", str(preset.global_batch_size // preset.cpu_devices),
        "--max_steps", str(steps), "--logging_steps", "10", "--eval_strategy", "no", "--save_strategy", "no",
        "--disable_tqdm", "true", "--callbacks", callbacks,
    ]
    if data is not None:
        argv += ["--train_file", str(data)]
    if preset.bf16:
        argv += ["--bf16", "true"]
    return argv + list(extra)


def job_hf_tpu(preset: Preset, workdir: Path, callbacks: str = "throughput,xla_recompile_guard,bench_step_timer",
               steps: Optional[int] = None, extra=(), evaluate: bool = False) -> Dict[str, Any]:
    """``hf-tpu train`` through :func:`hf_tpu_ext.run.train`; returns step timings, traces and RSS."""
    _setup_devices(preset)
    from benchmarks import step_timer
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    steps = steps or preset.steps
    out = workdir / f"out-{os.getpid()}"
    argv = _train_argv(preset, workdir, out, steps, callbacks, extra)
    if evaluate:  # one evaluation after the last step (not inside any timed step interval)
        argv += ["--eval_strategy", "steps", "--eval_steps", str(steps)]
    results = train(*parse_args(argv))
    timer = step_timer.last_instance()
    summary = timer.summary(preset.warmup)
    summary.update(
        train_step_compilations=int(results["train_function_traces"]),
        xla_step_compilations=int(results["xla_step_traces"]),
        final_loss=float(results["train_loss"]),
        peak_rss_mb=_peak_rss_mb(),
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
    _setup_devices(preset)
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
        peak_rss_mb=_peak_rss_mb(),
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


# ======================================================================================= parent side
def machine_description() -> Dict[str, Any]:
    """What the numbers were measured on: CPU model, cores, memory, OS, versions, load at the start."""
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    versions = {}
    for pkg in ("tensorflow", "tf-keras", "transformers", "datasets"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:
            pass
    return {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2 ** 30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def keras_python() -> str:
    """The Python of the Keras recipes: ``$HF_TPU_KERAS_PYTHON``, else the current-releases venv of
    ``scripts/test_env_current.sh`` (``.venv-current``) when it exists, else this Python."""
    given = os.environ.get("HF_TPU_KERAS_PYTHON")
    if given:
        return given
    venv = REPO_ROOT / ".venv-current" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _cpu_busy_seconds() -> Optional[float]:
    """CPU seconds all processes of the machine used so far (``/proc/stat``: user, nice, system, irq, softirq and
    steal, the last being time the hypervisor gave to other guests); None where unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]] + [0] * 8
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    """CPU seconds this process's finished children (and theirs) used: the benchmark's own work."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class RoundLoad:
    """The load around one round: 1- and 5-minute load averages at start and end, and the cores other processes
    kept busy meanwhile (machine CPU time minus this benchmark's children's, per wall second)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.loadavg_start = [round(x, 2) for x in os.getloadavg()[:2]]
        self.busy_start, self.own_start = _cpu_busy_seconds(), _children_cpu_seconds()

    def finish(self) -> Dict[str, Any]:
        wall = max(time.perf_counter() - self.start, 1e-9)
        busy, own = _cpu_busy_seconds(), _children_cpu_seconds()
        foreign = None
        if busy is not None and self.busy_start is not None:
            foreign = max(0.0, (busy - self.busy_start) - (own - self.own_start)) / wall
        return round_load_fields(self.loadavg_start, [round(x, 2) for x in os.getloadavg()[:2]], foreign)


def round_load_fields(loadavg_start: List[float], loadavg_end: List[float], foreign_cores: Optional[float],
                      cores: Optional[int] = None) -> Dict[str, Any]:
    """``load``: ``loadavg_start``/``loadavg_end`` ([1 min, 5 min]), ``foreign_cpu_cores`` (cores other processes
    kept busy on average) and ``quiet`` (``foreign_cpu_cores <= QUIET_FOREIGN_CPU_SHARE x cores``; False when it
    could not be measured)."""
    cores = cores or os.cpu_count() or 1
    quiet = foreign_cores is not None and foreign_cores <= QUIET_FOREIGN_CPU_SHARE * cores
    return {"loadavg_start": loadavg_start, "loadavg_end": loadavg_end,
            "foreign_cpu_cores": None if foreign_cores is None else round(foreign_cores, 3), "quiet": quiet}


def _child(name: str, preset: Preset, workdir: Path, env_extra: Optional[Dict[str, str]] = None,
           timeout: float = 1800) -> Dict[str, Any]:
    env = dict(os.environ)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_DATASETS_CACHE": str(workdir / "datasets-cache"), "HF_HOME": str(workdir / "hf-home"),
                "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)})
    env.update(env_extra or {})
    result_path = workdir / f"{name}.json"
    python = sys.executable
    if name in KERAS_RECIPES:  # Keras 3 + JAX + transformers 5 live in another environment than TensorFlow's
        python = keras_python()
        env.setdefault("KERAS_BACKEND", "jax")
        if preset.cpu_devices > 1:
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={preset.cpu_devices}"
    cmd = [python, "-m", "benchmarks.train_throughput", "--preset", preset.name, "--job", name,
           "--workdir", str(workdir), "--steps", str(preset.steps)]
    print(f"[bench] {name} ...", flush=True)
    start = time.perf_counter()
    round_load = RoundLoad()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    load = round_load.finish()
    (workdir / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not result_path.is_file():
        tail = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()][-1:] or ["no output"]
        print(f"[bench] {name} failed after {seconds:.0f}s: {tail[0][:300]}", flush=True)
        return {"error": tail[0][:500], "wall_seconds": seconds, "load": load}
    result = json.loads(result_path.read_text())
    result["wall_seconds"] = seconds
    result["load"] = load
    print(f"[bench] {name} done in {seconds:.0f}s (load {load['loadavg_start'][0]:.2f} -> {load['loadavg_end'][0]:.2f}, "
          f"others {load['foreign_cpu_cores'] if load['foreign_cpu_cores'] is not None else '?'} cores"
          f"{'' if load['quiet'] else ': NOT QUIET'})", flush=True)
    return result


def median_run(runs: List[Dict[str, Any]], key: str = "ms_per_step") -> Dict[str, Any]:
    """The successful run with the median ``key`` (a job's error when all failed), with the spread of all runs.

    The rounds run round-robin, so a slow spell of the shared machine hits every recipe; the median keeps
    one slow (or lucky) round from deciding a ratio. The result holds ``key`` = the median of the runs,
    ``runs_<key>`` (every run, in order), ``fastest_<key>``, ``spread_<key>`` = ``max / median - 1`` (how
    much the slowest round lost) and the median ``first_step_latency_seconds``.
    """
    import statistics

    ok = [r for r in runs if "error" not in r and r.get(key) is not None]
    if not ok:
        return runs[-1]
    values = [r[key] for r in ok]
    median = statistics.median(values)
    chosen = dict(min(ok, key=lambda r: (abs(r[key] - median), r[key])))
    chosen[key] = median
    chosen[f"runs_{key}"] = [round(v, 2) for v in values]
    chosen[f"fastest_{key}"] = round(min(values), 2)
    chosen[f"spread_{key}"] = round(max(values) / median - 1.0, 4)
    loads = [r.get("load") or {} for r in ok]
    chosen["runs_load"] = loads
    chosen["quiet_rounds"] = sum(1 for load in loads if load.get("quiet"))
    chosen["rounds"] = len(ok)
    latencies = [r["first_step_latency_seconds"] for r in ok if r.get("first_step_latency_seconds") is not None]
    if latencies:
        chosen["first_step_latency_seconds"] = statistics.median(latencies)
        chosen["runs_first_step_latency_seconds"] = [round(v, 2) for v in latencies]
    return chosen


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def assemble(preset: Preset, parts: Dict[str, Dict[str, Any]], machine: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON result: per-recipe tokens/s, ms/step, compile time, compilations, peak RSS, MFU, and the extras.

    Args:
        preset: the preset run.
        parts: job name -> what the job returned (or ``{"error": ...}``).
        machine: :func:`machine_description`.

    Returns:
        dict with ``preset``, ``machine``, ``model``, ``flops``, ``recipes`` (``hf_tpu``, ``plain``,
        ``plain_xla``), ``input_pipeline``, ``prepare_data``, ``callback_overhead`` and ``ratios``.
    """
    from types import SimpleNamespace

    from hf_tpu_ext.flops import flops_per_token

    vocab = (parts.get("prepare_data") or {}).get("vocab_size") or preset.vocab_size
    config = SimpleNamespace(hidden_size=preset.hidden_size, num_hidden_layers=preset.num_hidden_layers,
                             intermediate_size=preset.intermediate_size, vocab_size=vocab)
    fpt = flops_per_token(config, preset.seq_length, masked_fraction=preset.max_predictions / preset.seq_length)
    fpt_full = flops_per_token(config, preset.seq_length, masked_fraction=None)
    peak = (parts.get("probe") or {}).get("peak_flops")
    tokens_per_step = preset.global_batch_size * preset.seq_length
    recipes = {}
    for name in ALL_RECIPES:
        part = parts.get(name) or {"error": "not run"}
        if "error" in part:
            recipes[name] = {"error": part["error"], "tokens_per_second": None, "ms_per_step": None,
                             "compile_seconds": None, "train_step_compilations": None, "peak_rss_mb": None, "mfu": None}
            continue
        tps = tokens_per_step / (part["ms_per_step"] / 1e3)
        entry = {
            "tokens_per_second": round(tps, 1),
            "ms_per_step": round(part["ms_per_step"], 2),
            "ms_per_step_mean": round(part["ms_per_step_mean"], 2),
            "compile_seconds": round(part["compile_seconds"], 2),
            "train_step_compilations": part["train_step_compilations"],
            "peak_rss_mb": round(part["peak_rss_mb"], 1),
            "mfu": round(tps * fpt / peak, 4) if peak else None,
            "steps_measured": part["steps_measured"],
            "final_loss": round(part["final_loss"], 4),
        }
        if name != "hf_tpu" and peak:
            entry["mfu_executed"] = round(tps * fpt_full / peak, 4)
        for key in ("xla_step_compilations", "runs_ms_per_step", "fastest_ms_per_step", "spread_ms_per_step",
                    "runs_first_step_latency_seconds", "precision", "compiler", "runs_load", "quiet_rounds",
                    "rounds", "load"):
            if key in part:
                entry[key] = part[key]
        for key in ("first_step_latency_seconds", "eval_loss", "perplexity"):
            if part.get(key) is not None:
                entry[key] = round(float(part[key]), 4)
        recipes[name] = entry

    pipeline = parts.get("pipeline") or {}
    none, push = parts.get("callbacks_none") or {}, parts.get("callbacks_push") or {}
    overhead = {"push_every_steps": PUSH_EVERY_STEPS, "hub_latency_ms": HUB_LATENCY_SECONDS * 1e3,
                "steps": preset.overhead_steps}
    if "error" not in none and "error" not in push and none and push:
        overhead.update(
            no_callbacks_ms_per_step=round(none["ms_per_step"], 2),
            no_callbacks_ms_per_step_mean=round(none["ms_per_step_mean"], 2),
            callbacks_push_ms_per_step=round(push["ms_per_step"], 2),
            callbacks_push_ms_per_step_mean=round(push["ms_per_step_mean"], 2),
            overhead_median=round(push["ms_per_step"] / none["ms_per_step"] - 1.0, 4),
            overhead_mean=round(push["ms_per_step_mean"] / none["ms_per_step_mean"] - 1.0, 4),
            hub_commits=push.get("hub_commits"),
            runs_no_callbacks_ms_per_step_mean=none.get("runs_ms_per_step_mean"),
            runs_callbacks_push_ms_per_step_mean=push.get("runs_ms_per_step_mean"),
        )
    else:
        overhead["error"] = (none.get("error") or push.get("error") or "not run")
    hf_tps = recipes["hf_tpu"]["tokens_per_second"]
    plain_tps = recipes["plain"]["tokens_per_second"]
    # the path `hf-tpu train --bf16 true` takes on this machine (hf_tpu_ext/precision.py)
    from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags, resolve_precision

    native = bool(cpu_flags() & NATIVE_BF16_CPU_FLAGS) if machine.get("accelerator", "CPU") == "CPU" else True
    bf16_plan = resolve_precision(True, None, machine.get("accelerator", "CPU"), native)
    bf16_default = "hf_tpu_bf16" if bf16_plan.jit_compile else "hf_tpu_bf16_no_xla"
    prep1, prepn = parts.get(f"prepare_data_np{PREPARE_PROCS[0]}") or {}, parts.get(f"prepare_data_np{PREPARE_PROCS[-1]}") or {}

    def ppl_change(name):
        a, b = recipes[name].get("perplexity"), recipes["hf_tpu"].get("perplexity")
        return a / b - 1.0 if a and b else None

    ratios = {
        "hf_tpu_bf16_default_vs_plain": _ratio(recipes[bf16_default]["tokens_per_second"], plain_tps),
        "hf_tpu_bf16_vs_plain": _ratio(recipes["hf_tpu_bf16"]["tokens_per_second"], plain_tps),
        "hf_tpu_bf16_no_xla_vs_plain": _ratio(recipes["hf_tpu_bf16_no_xla"]["tokens_per_second"], plain_tps),
        "bf16_default_perplexity_change": ppl_change(bf16_default),
        "hf_tpu_slowest_round_vs_median": recipes["hf_tpu"].get("spread_ms_per_step"),
        "prepare_data_np_vs_1": _ratio(prepn.get("tokens_per_second"), prep1.get("tokens_per_second")),
        "first_step_latency_hf_tpu_vs_plain": _ratio(recipes["hf_tpu"].get("first_step_latency_seconds"),
                                                     recipes["plain"].get("first_step_latency_seconds")),
        "hf_tpu_vs_plain": _ratio(hf_tps, recipes["plain"]["tokens_per_second"]),
        "hf_tpu_vs_plain_xla": _ratio(hf_tps, recipes["plain_xla"]["tokens_per_second"]),
        "hf_tpu_no_xla_vs_plain": _ratio(recipes["hf_tpu_no_xla"]["tokens_per_second"],
                                         recipes["plain"]["tokens_per_second"]),
        "hf_tpu_vs_hf_tpu_no_xla": _ratio(hf_tps, recipes["hf_tpu_no_xla"]["tokens_per_second"]),
        # issue 19's targets: keras/JAX fp32 >= 0.9x the TensorFlow backend, >= 1.8x keras-hub's stock fit
        "keras_jax_vs_hf_tpu": _ratio(recipes["keras_jax"]["tokens_per_second"], hf_tps),
        "keras_jax_vs_keras_hub_fit": _ratio(recipes["keras_jax"]["tokens_per_second"],
                                             recipes["keras_hub_fit"]["tokens_per_second"]),
        "keras_jax_bf16_vs_keras_jax": _ratio(recipes["keras_jax_bf16"]["tokens_per_second"],
                                              recipes["keras_jax"]["tokens_per_second"]),
        "input_pipeline_vs_training": _ratio(pipeline.get("tokens_per_second"), hf_tps),
        "callback_overhead_mean": overhead.get("overhead_mean"),
    }
    ratios = {k: (round(v, 4) if v is not None else None) for k, v in ratios.items()}
    machine = dict(machine, load_average_end=[round(x, 2) for x in os.getloadavg()])
    return {
        "preset": preset.name,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "model": {"num_hidden_layers": preset.num_hidden_layers, "hidden_size": preset.hidden_size,
                  "num_attention_heads": preset.num_attention_heads, "intermediate_size": preset.intermediate_size,
                  "vocab_size": vocab, "seq_length": preset.seq_length, "global_batch_size": preset.global_batch_size,
                  "max_predictions_per_seq": preset.max_predictions, "cpu_devices": preset.cpu_devices,
                  "precision": "bf16 mixed" if preset.bf16 else "float32",
                  "data": f"wikitext-2 {data_file().name}" if data_file() else "embedded corpus",
                  "steps": preset.steps, "warmup_steps": preset.warmup},
        "flops": {"flops_per_token": fpt, "flops_per_token_full_head": fpt_full,
                  "formula": "hf_tpu_ext.flops.flops_per_token: 6*N_nonembedding + 12*n_layer*d*n_ctx + "
                             "6*(d^2 + d*V)*P/L (Kaplan et al. 2020 Sec. 2.1; PaLM App. B)",
                  "probe": parts.get("probe")},
        "recipes": recipes,
        "input_pipeline": pipeline,
        "prepare_data": parts.get("prepare_data"),
        "prepare_data_num_proc": {str(n): parts.get(f"prepare_data_np{n}") for n in PREPARE_PROCS},
        "bf16_default_recipe": bf16_default,
        "bf16_default_path": {"precision": bf16_plan.precision, "compiler": bf16_plan.compiler,
                              "native_bf16": bf16_plan.native_bf16, "reason": bf16_plan.reason},
        "callback_overhead": overhead,
        "ratios": ratios,
        **quietness(machine, {**recipes, "callbacks_none": none, "callbacks_push": push}),
        "targets": {"hf_tpu_vs_plain": 1.6, "hf_tpu_vs_plain_xla": 1.0, "input_pipeline_vs_training": 5.0,
                    "callback_overhead_mean_max": 0.03, "train_step_compilations": 1,
                    "hf_tpu_bf16_default_vs_plain": 2.2, "bf16_default_perplexity_change_abs_max": 0.02,
                    "hf_tpu_slowest_round_vs_median_max": 0.05, "prepare_data_np_vs_1": 1.8,
                    "first_step_latency_hf_tpu_vs_plain_max": 1.0},
    }


def quietness(machine: Dict[str, Any], timed: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Whether a result may be a headline: ``quiet`` (the criteria, the start load and the rounds that were not
    quiet, ``{name: "k of n"}``) and ``headline`` (start load <= ``QUIET_START_LOAD`` x cores and every timed
    round quiet)."""
    cores = machine.get("cpu_cores") or os.cpu_count() or 1
    start = (machine.get("load_average_start") or [None])[0]
    start_ok = start is not None and start <= QUIET_START_LOAD * cores
    loaded = {}
    for name, part in timed.items():
        if not part or part.get("error"):
            continue
        if "rounds" in part:
            rounds, quiet = part["rounds"], part.get("quiet_rounds", 0)
        else:  # one run (no median over rounds)
            rounds, quiet = 1, int(bool((part.get("load") or {}).get("quiet")))
        if quiet < rounds:
            loaded[name] = f"{rounds - quiet} of {rounds}"
    return {"quiet": {"criteria": f"1-minute load <= {QUIET_START_LOAD} x {cores} cores before the first round; in "
                                  f"every round other processes used <= {QUIET_FOREIGN_CPU_SHARE:.0%} of the cores",
                      "start_load": start, "start_load_ok": start_ok, "loaded_rounds": loaded},
            "headline": bool(start_ok and not loaded)}


def _fmt(value, spec: str = ",.0f", missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown_table(result: Dict[str, Any]) -> str:
    """A Markdown table of the recipes of one result (for the README section)."""
    lines = ["| recipe | precision, compiler | tokens/s | ms/step (median of rounds) | rounds ms/step | slowest round "
             "| first step s | eval perplexity | train-step compilations | peak RSS MB | MFU |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for name in ALL_RECIPES:
        r = result["recipes"].get(name)
        if r is None:
            continue
        if r.get("error"):
            lines.append(f"| `{name}` | failed: {r['error'][:80]} | | | | | | | | | |")
            continue
        path = f"{r['precision']}, {r.get('compiler')}" if r.get("precision") else "n/a"
        rounds = ", ".join(f"{v:.0f}" for v in r.get("runs_ms_per_step") or [])
        lines.append(f"| `{name}` | {path} | {_fmt(r['tokens_per_second'])} | {_fmt(r['ms_per_step'], '.1f')} | "
                     f"{rounds} | {_fmt(r.get('spread_ms_per_step'), '+.1%')} | "
                     f"{_fmt(r.get('first_step_latency_seconds'), '.1f')} | {_fmt(r.get('perplexity'), ',.1f')} | "
                     f"{r['train_step_compilations']} | {_fmt(r['peak_rss_mb'], '.0f')} | {_fmt(r['mfu'], '.1%')} |")
    return "\n".join(lines)


RESULTS_HEADER = (
    "# Benchmark results\n\n"
    "One row per run of `python -m benchmarks.train_throughput --preset NAME` (newest last). tokens/s: median "
    "step time after warm-up; ratios are hf-tpu train over the plain transformers recipe; pipeline: `tf.data` "
    "tokens/s over hf-tpu training tokens/s; callbacks: mean step-time overhead of the default callbacks + async "
    "Hub push every 20 steps (200 ms per request) over no callbacks. Full numbers: `benchmarks/results/<preset>.json`.\n\n"
    "| date | preset | machine | hf_tpu tok/s | plain tok/s | plain_xla tok/s | hf/plain | hf/plain_xla | "
    "compilations | MFU hf_tpu | hf_tpu no-XLA tok/s (/plain) | pipeline x | prepare-data tok/s | callbacks overhead |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
)
RESULTS_HEADER_V2 = (
    "\n## With bf16, rounds' spread, first-step latency and prepare-data processes (from 2026-12-01)\n\n"
    "tokens/s: the median of the rounds' median step times (rounds alternate recipes); slowest round: how much "
    "the slowest round of `hf_tpu` lost against that median; bf16 default: the path `--bf16 true` takes on this "
    "machine (hf_tpu_ext/precision.py); ppl change: its eval perplexity after the same steps against fp32 "
    "`hf_tpu`; first step: process start to the first finished step, hf_tpu / plain; prepare-data: tokenization "
    "tokens/s with 1 and N processes; load: the 1-minute load average at the start and the end.\n\n"
    "| date | preset | machine; load | hf_tpu tok/s | plain tok/s | hf/plain | slowest round | bf16 XLA tok/s | "
    "bf16 TF-kernels tok/s | bf16 default /plain | bf16 ppl change | first step s (hf / plain) | prepare-data tok/s "
    "1 proc / N (x) | callbacks overhead |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|\n"
)


def results_row(result: Dict[str, Any]) -> str:
    """One ``RESULTS.md`` row of a result (the table under :data:`RESULTS_HEADER_V2`)."""
    m, r, q = result["machine"], result["recipes"], result["ratios"]
    load_end = (m.get("load_average_end") or [None])[0]
    machine = (f"{m['cpu']}, {m['cpu_cores']} cores, {m['memory_gb']} GB; load {m['load_average_start'][0]:.1f}"
               + (f"-{load_end:.1f}" if load_end is not None else "")
               + (f"; {result['flops']['probe']['device_kind']}" if (result["flops"].get("probe") or {}).get(
                   "device_kind", "CPU") != "CPU" else "")
               + ("; quiet" if result.get("headline") else "; **not quiet: not a headline** ("
                  + (", ".join(f"{k} {v} rounds loaded" for k, v in (result.get("quiet") or {}).get("loaded_rounds", {}).items())
                     or "busy at the start") + ")"))
    procs = result.get("prepare_data_num_proc") or {}
    p1, pn = (procs.get(str(PREPARE_PROCS[0])) or {}), (procs.get(str(PREPARE_PROCS[-1])) or {})
    hf, plain = r["hf_tpu"], r["plain"]
    return (f"| {result['date']} | {result['preset']} | {machine} | {_fmt(hf['tokens_per_second'])} | "
            f"{_fmt(plain['tokens_per_second'])} | {_x(q['hf_tpu_vs_plain'])} | "
            f"{_fmt(q.get('hf_tpu_slowest_round_vs_median'), '+.1%')} | "
            f"{_fmt((r.get('hf_tpu_bf16') or {}).get('tokens_per_second'))} | "
            f"{_fmt((r.get('hf_tpu_bf16_no_xla') or {}).get('tokens_per_second'))} | "
            f"{_x(q.get('hf_tpu_bf16_default_vs_plain'))} | {_fmt(q.get('bf16_default_perplexity_change'), '+.2%')} | "
            f"{_fmt(hf.get('first_step_latency_seconds'), '.1f')} / {_fmt(plain.get('first_step_latency_seconds'), '.1f')} | "
            f"{_fmt(p1.get('tokens_per_second'))} / {_fmt(pn.get('tokens_per_second'))} "
            f"({_x(q.get('prepare_data_np_vs_1'))}) | {_fmt(q['callback_overhead_mean'], '+.1%')} |\n")


def append_results_row(result: Dict[str, Any], path: Path = RESULTS_MD) -> None:
    """Append :func:`results_row` to ``RESULTS.md`` (created with its headers when missing)."""
    if not path.is_file():
        path.write_text(RESULTS_HEADER)
    text = path.read_text()
    with path.open("a") as f:
        if RESULTS_HEADER_V2.strip().splitlines()[0] not in text:
            f.write(RESULTS_HEADER_V2)
        f.write(results_row(result))


def draw_chart(result: Dict[str, Any], path: Path) -> None:
    """A bar chart PNG of tokens/s per recipe (and what the input pipeline alone delivers, as a line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ALL_RECIPES if (result["recipes"].get(n) or {}).get("tokens_per_second")]
    values = [result["recipes"][n]["tokens_per_second"] for n in names]
    labels = {"hf_tpu": "hf-tpu train", "plain": "plain recipe", "plain_xla": "plain + jit_compile",
              "hf_tpu_no_xla": "hf-tpu train\n--jit_compile false", "hf_tpu_bf16": "hf-tpu train\n--bf16 (XLA)",
              "hf_tpu_bf16_no_xla": "hf-tpu train\n--bf16 (TF kernels)", "keras_jax": "--backend keras\n(JAX)",
              "keras_jax_bf16": "--backend keras\n(JAX) --bf16", "keras_hub_fit": "keras-hub\nRobertaMaskedLM.fit"}
    fig, ax = plt.subplots(figsize=(9.6, 4.4), dpi=120)
    colors = {"hf_tpu": "#ff9d00", "plain": "#7f7f7f", "plain_xla": "#4c72b0", "hf_tpu_no_xla": "#ffc266",
              "hf_tpu_bf16": "#d62728", "hf_tpu_bf16_no_xla": "#ff9896", "keras_jax": "#2ca02c",
              "keras_jax_bf16": "#98df8a", "keras_hub_fit": "#9467bd"}
    bars = ax.bar([labels[n] for n in names], values, color=[colors[n] for n in names])
    for bar, value, name in zip(bars, values, names):
        mfu = result["recipes"][name].get("mfu")
        text = f"{value:,.0f}" + (f"\nMFU {mfu:.1%}" if mfu is not None else "")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("tokens / s (median step, after warm-up)")
    model = result["model"]
    ax.set_title(f"preset {result['preset']}: {model['num_hidden_layers']}x{model['hidden_size']}, seq "
                 f"{model['seq_length']}, batch {model['global_batch_size']}, {model['precision']}", fontsize=10)
    ax.set_ylim(0, max(values or [1]) * 1.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _loopback_hub():
    """Start the loopback Hub of the test suite (``tests/loopback_hub.py``) with 200 ms per request.

    It stands in for a remote server, so its request threads run at nice 19: its own work (receiving and
    hashing each upload) then uses CPU the training process leaves idle instead of being counted as the
    callbacks' cost. The client side of every push (hashing, reading, sending) runs in the training process
    and is counted.
    """
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from loopback_hub import LoopbackHubServer

    server = LoopbackHubServer({BENCH_USER_TOKEN: {"name": "bench", "orgs": []}}, niceness=19)
    server.latency(HUB_LATENCY_SECONDS)
    return server


def main(argv: Optional[List[str]] = None) -> int:
    """Run a preset (or, with ``--job``, one part of it in this process). Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--skip", default="", help="comma-separated parts not to run (e.g. callbacks_push,plain_xla)")
    parser.add_argument("--results_dir", default=str(RESULTS_DIR), help="where <preset>.json and the chart go")
    parser.add_argument("--no_results_md", action="store_true", help="do not append a row to benchmarks/RESULTS.md")
    parser.add_argument("--steps", type=int, help="optimizer steps per recipe run (default: the preset's)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each recipe and callback run, round-robin; the median counts (default 3)")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    if args.steps:
        preset = dataclasses.replace(preset, steps=args.steps)

    if args.job:  # child: one part, result as JSON in the workdir
        workdir = Path(args.workdir)
        result = run_job(args.job, preset, workdir)
        (workdir / f"{args.job}.json").write_text(json.dumps(result, indent=1))
        return 0

    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    machine = machine_description()
    start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix=f"hf-tpu-bench-{preset.name}-"))
    parts: Dict[str, Dict[str, Any]] = {}
    try:
        parts["prepare_data"] = _child("prepare_data", preset, workdir)
        if "error" in parts["prepare_data"]:
            print("[bench] prepare-data failed; nothing else can run (the recipes use its tokenizer).")
            return 1
        prep_runs: Dict[str, List[Dict[str, Any]]] = {}
        for _ in range(max(1, args.repeats)):  # tokenizing processes 1 and N, alternating
            for n in PREPARE_PROCS:
                if "prepare_data_np" not in skip:
                    prep_runs.setdefault(f"prepare_data_np{n}", []).append(_child(f"prepare_data_np{n}", preset, workdir))
        for name, name_runs in prep_runs.items():
            parts[name] = median_run(name_runs, "tokenize_seconds")
        for name in ("probe", "pipeline"):
            if name not in skip:
                parts[name] = _child(name, preset, workdir)
        runs: Dict[str, List[Dict[str, Any]]] = {}
        for _ in range(max(1, args.repeats)):  # round-robin, so a slow spell of the machine hits every recipe
            for name in ALL_RECIPES:
                if name not in skip:
                    runs.setdefault(name, []).append(_child(name, preset, workdir))
            if "callbacks_none" not in skip:
                runs.setdefault("callbacks_none", []).append(_child("callbacks_none", preset, workdir))
            if "callbacks_push" not in skip:
                server = _loopback_hub()
                try:
                    run = _child("callbacks_push", preset, workdir, env_extra={
                        "HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0",
                        "HF_TOKEN": BENCH_USER_TOKEN})
                    run["hub_commits"] = len([r for r in server.requests if r.get("route") == "commit"])
                    runs.setdefault("callbacks_push", []).append(run)
                finally:
                    server.close()
        for name, name_runs in runs.items():
            parts[name] = median_run(name_runs, "ms_per_step_mean" if name.startswith("callbacks_") else "ms_per_step")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    result = assemble(preset, parts, machine)
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    json_path = results_dir / f"{preset.name}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    draw_chart(result, results_dir / f"{preset.name}_tokens_per_second.png")
    if not args.no_results_md:
        append_results_row(result)
    print(markdown_table(result))
    if not result["headline"]:
        print(f"[bench] NOT a headline result: the machine was not quiet ({json.dumps(result['quiet'])}); "
              "README.md and RESULTS.md quote quiet runs only", flush=True)
    print("ratios:", json.dumps(result["ratios"]))
    print(f"[bench] wrote {json_path} in {result['wall_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
