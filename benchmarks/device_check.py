"""Accelerator check: the Keras backend's compiled training step at RoBERTa-base shapes (run by hand, or in CI dry).

What it runs is the Keras backend's own program, nothing of its own: the model of
:func:`hf_tpu_ext.backends.keras.model.build_masked_lm` (keras-hub ``RobertaMaskedLM``), the optimizer of
:func:`hf_tpu_ext.backends.keras.optimization.make_optimizer` (``hf-tpu train``'s defaults: AdamW, linear
schedule, clipping at 1.0) and the step of :func:`hf_tpu_ext.backends.keras.step.make_train_step` jitted by
``jit_train_step`` (forward, backward, clipping, AdamW in one XLA program, state donated, data parallel over
every device), fed synthetic batches of the training batch contract (random token ids, 15% masked positions).

Default shapes: RoBERTa-base (hidden 768, 12 layers, 12 heads, FFN 3072, vocabulary 50,265), sequence 512,
global batch 64, bf16 mixed (float32 weights). ``--dry-run``: tiny shapes on whatever device JAX has (the CPU in
CI), a few steps, < 60 s.

It prints, one ``name: value`` line each: the device, the shapes, ``compilations`` (XLA compilations of
``train_step``, must be 1; counted by the backend's ``CompileCounter``), ``step time`` (median ms of the timed
steps, each one synchronised on its loss), ``tokens/s`` (global batch x sequence / step time), ``MFU``
(``tokens/s per device x FLOPs per token / peak``: :func:`hf_tpu_ext.flops.flops_per_token` with the head at the
masked positions, and :func:`hf_tpu_ext.flops.device_peak`: a GPU/TPU datasheet figure, e.g. H200 SXM 989.5
TFLOP/s dense bf16, or the CPU formula), ``device memory`` (the first device's ``peak_bytes_in_use`` from
``memory_stats()``; CPUs report none, then the host's peak RSS is given). The same fields go to a JSON file:
``--json PATH``, else ``$OUT/device_check.json`` when ``OUT`` is set.

Exit status: 0 when the step compiled once and every timed step ran; 1 otherwise (the ``problem:`` lines say
what); 2 for bad arguments or a Python without jax, keras, keras-hub or transformers (one line says which).

Usage (repository root; ``benchmarks/device_check.sh`` installs jax with CUDA first on a fresh GPU machine):
    python -m benchmarks.device_check                  # RoBERTa-base shapes, bf16
    python -m benchmarks.device_check --batch 32 --steps 30
    JAX_PLATFORMS=cpu python -m benchmarks.device_check --dry-run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

#: RoBERTa-base (transformers' ``roberta-base`` config) at sequence 512
BASE_SHAPES = dict(hidden=768, layers=12, heads=12, ffn=3072, vocab=50265, seq=512, batch=64)
#: ``--dry-run``: the same program at sizes a CPU runs in seconds
TINY_SHAPES = dict(hidden=32, layers=2, heads=2, ffn=64, vocab=128, seq=32, batch=4)
#: the fields of the JSON result (tests check them)
RESULT_KEYS = ("date_utc", "device_kind", "platform", "num_devices", "jax_version", "keras_version", "shapes",
               "dtype", "steps_timed", "step_time_ms", "step_time_ms_mean", "tokens_per_second", "flops_per_token",
               "model_flops_per_second", "peak_flops", "peak_source", "mfu", "compilations", "compile_seconds",
               "first_step_seconds", "peak_bytes_in_use", "bytes_limit", "host_max_rss_bytes", "cpu_bf16_flags",
               "load_average", "wall_seconds", "problems", "ok")


def parse_arguments(argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line (sizes default to :data:`BASE_SHAPES`, or :data:`TINY_SHAPES` with ``--dry-run``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, 3 timed steps (CPU, < 60 s)")
    for name in BASE_SHAPES:
        parser.add_argument(f"--{name}", type=int, default=None, help=f"default {BASE_SHAPES[name]} "
                                                                      f"(dry run {TINY_SHAPES[name]})")
    parser.add_argument("--steps", type=int, default=None, help="timed steps after the warm-up (default 50; 3 dry)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after the compiling one (default 2)")
    parser.add_argument("--float32", action="store_true", help="float32 compute instead of bf16 mixed")
    parser.add_argument("--budget-seconds", type=float, default=420.0,
                        help="stop timing steps after this many seconds from the start (default 420: 7 minutes)")
    parser.add_argument("--json", default=None, help="result file (default $OUT/device_check.json when OUT is set)")
    args = parser.parse_args(argv)
    defaults = TINY_SHAPES if args.dry_run else BASE_SHAPES
    args.shapes = {name: int(getattr(args, name) or defaults[name]) for name in BASE_SHAPES}
    args.steps = int(args.steps if args.steps is not None else (3 if args.dry_run else 50))
    bad = [f"--{k} {v}" for k, v in args.shapes.items() if v < 1]
    bad += [f"--steps {args.steps}"] if args.steps < 1 else []
    if args.shapes["hidden"] % args.shapes["heads"]:
        bad.append(f"--hidden {args.shapes['hidden']} is not a multiple of --heads {args.shapes['heads']}")
    if bad:
        parser.error("each size must be >= 1 and hidden a multiple of heads: " + ", ".join(bad))
    return args


def roberta_config(shapes: Dict[str, int]):
    """A transformers ``RobertaConfig`` of ``shapes`` (positions for the sequence, dropout 0.1 as roberta-base)."""
    from transformers import RobertaConfig

    return RobertaConfig(vocab_size=shapes["vocab"], hidden_size=shapes["hidden"], num_hidden_layers=shapes["layers"],
                         num_attention_heads=shapes["heads"], intermediate_size=shapes["ffn"],
                         max_position_embeddings=shapes["seq"] + 2)


def synthetic_batch(shapes: Dict[str, int], predictions: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """One global batch of the training batch contract (ARCHITECTURE.md), ``[1, B, ...]`` (one micro-batch).

    Token ids are uniform in ``[5, vocab)``, ``predictions`` distinct sorted positions per row, all weights 1.
    """
    rng = np.random.default_rng(seed)
    rows, length, vocab = shapes["batch"], shapes["seq"], shapes["vocab"]
    positions = np.sort(np.argsort(rng.random((rows, length)), axis=1)[:, :predictions], axis=1)
    batch = {
        "input_ids": rng.integers(min(5, vocab - 1), vocab, (rows, length)).astype(np.int32),
        "attention_mask": np.ones((rows, length), np.int32),
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": rng.integers(min(5, vocab - 1), vocab, (rows, predictions)).astype(np.int32),
        "masked_lm_weights": np.ones((rows, predictions), np.float32),
    }
    return {k: v[None] for k, v in batch.items()}


def build_step(shapes: Dict[str, int], bf16: bool, total_steps: int):
    """``(step, state, placement, config)``: the Keras backend's jitted train step and its replicated state."""
    import jax

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.optimization import make_optimizer
    from hf_tpu_ext.backends.keras.placement import Placement
    from hf_tpu_ext.backends.keras.step import jit_train_step, make_train_step

    config = roberta_config(shapes)
    _, _, training_args = parse_args(["--output_dir", tempfile.gettempdir(), "--max_steps", str(total_steps)])
    model = build_masked_lm(config, dtype="mixed_bfloat16" if bf16 else "float32", seed=training_args.seed)
    optimizer, _ = make_optimizer(training_args, total_steps)
    optimizer.build(model.trainable_variables)
    placement = Placement()
    state = (placement.put_replicated([v.value for v in model.trainable_variables]),
             placement.put_replicated([v.value for v in model.non_trainable_variables]),
             placement.put_replicated([v.value for v in optimizer.variables]))
    step = jit_train_step(make_train_step(model, optimizer, int(training_args.seed), 1,
                                          bf16_dots=jax.default_backend() == "cpu"), placement)
    return step, state, placement, config


def run_steps(step, state, batch, warmup: int, steps: int, deadline: float) -> Dict[str, Any]:
    """Run the compiling step, ``warmup`` more, then up to ``steps`` timed ones (until ``deadline``, perf_counter).

    Every step waits for its loss (``block_until_ready``), so a step's time is the device's. Returns
    ``first_step_seconds``, ``intervals`` (seconds per timed step), ``compilations``, ``compile_seconds``.
    """
    import jax
    import jax.numpy as jnp

    from hf_tpu_ext.backends.keras.step import CompileCounter

    intervals: List[float] = []
    with CompileCounter("train_step") as compiles:
        start = time.perf_counter()
        state, loss, _ = step(state, batch, jnp.int32(0))
        jax.block_until_ready(loss)
        first = time.perf_counter() - start
        for i in range(1, warmup + 1):
            state, loss, _ = step(state, batch, jnp.int32(i))
            jax.block_until_ready(loss)
        for i in range(warmup + 1, warmup + 1 + steps):
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            state, loss, _ = step(state, batch, jnp.int32(i))
            jax.block_until_ready(loss)
            intervals.append(time.perf_counter() - start)
    return {"first_step_seconds": first, "intervals": intervals, "compilations": compiles.count,
            "compile_seconds": compiles.seconds, "loss_sum": float(loss)}


def memory_fields() -> Dict[str, Optional[int]]:
    """The first device's allocator peak (``peak_bytes_in_use``, ``bytes_limit``; None where the device has no
    stats, e.g. a CPU) and the host's peak resident set (bytes)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
            "host_max_rss_bytes": int(rss)}


def measure(args: argparse.Namespace, started: float) -> Dict[str, Any]:
    """Build and time the step; the result dict of :data:`RESULT_KEYS`."""
    import jax
    import keras

    from hf_tpu_ext.flops import compute_mfu, device_peak, flops_per_token
    from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags

    shapes, bf16 = args.shapes, not args.float32
    predictions = max(1, round(shapes["seq"] * 0.15))  # hf-tpu train's default max_predictions_per_seq
    step, state, placement, config = build_step(shapes, bf16, args.warmup + 1 + args.steps)
    batch = placement.put_batch(synthetic_batch(shapes, predictions), axis=1)
    timing = run_steps(step, state, batch, args.warmup, args.steps, started + args.budget_seconds)
    device = jax.devices()[0]
    intervals = timing["intervals"]
    step_seconds = statistics.median(intervals) if intervals else None
    tokens_per_second = shapes["batch"] * shapes["seq"] / step_seconds if step_seconds else None
    per_token = flops_per_token(config, shapes["seq"], predictions / shapes["seq"])
    dtype = "bfloat16" if bf16 else "float32"
    peak = device_peak("CPU" if device.platform == "cpu" else device.device_kind, dtype)
    per_device = tokens_per_second / placement.num_devices if tokens_per_second else None
    problems = []
    if timing["compilations"] != 1:
        problems.append(f"the step compiled {timing['compilations']} times, not once")
    if len(intervals) < args.steps:
        problems.append(f"only {len(intervals)} of {args.steps} timed steps ran within --budget-seconds "
                        f"{args.budget_seconds:g}")
    if not np.isfinite(timing["loss_sum"]):
        problems.append(f"the loss is not finite ({timing['loss_sum']})")
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "device_kind": device.device_kind,
        "platform": device.platform, "num_devices": placement.num_devices, "jax_version": jax.__version__,
        "keras_version": keras.__version__, "shapes": shapes, "dtype": "bf16 mixed" if bf16 else "float32",
        "steps_timed": len(intervals), "step_time_ms": step_seconds * 1e3 if step_seconds else None,
        "step_time_ms_mean": statistics.fmean(intervals) * 1e3 if intervals else None,
        "tokens_per_second": tokens_per_second, "flops_per_token": per_token,
        "model_flops_per_second": tokens_per_second * per_token if tokens_per_second else None,
        "peak_flops": peak.flops, "peak_source": peak.source, "mfu": compute_mfu(per_device, per_token, peak.flops),
        "compilations": timing["compilations"], "compile_seconds": timing["compile_seconds"],
        "first_step_seconds": timing["first_step_seconds"], **memory_fields(),
        "cpu_bf16_flags": sorted(cpu_flags() & NATIVE_BF16_CPU_FLAGS),
        "load_average": [round(v, 2) for v in os.getloadavg()], "wall_seconds": time.perf_counter() - started,
        "problems": problems, "ok": not problems,
    }


def _gib(value: Optional[int]) -> str:
    return "n/a" if value is None else f"{value / 2 ** 30:.2f} GiB"


def report_lines(result: Dict[str, Any]) -> List[str]:
    """The printed summary, one ``name: value`` line per figure."""
    s = result["shapes"]
    mfu = "n/a" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
    peak = "no peak" if result["peak_flops"] is None else f"{result['peak_flops'] / 1e12:.4g} TFLOP/s"
    memory = (f"peak {_gib(result['peak_bytes_in_use'])} in use of {_gib(result['bytes_limit'])}"
              if result["peak_bytes_in_use"] is not None
              else f"n/a on {result['platform']} (host peak RSS {_gib(result['host_max_rss_bytes'])})")
    step = "n/a" if result["step_time_ms"] is None else f"{result['step_time_ms']:.2f} ms"
    tokens = "n/a" if result["tokens_per_second"] is None else f"{result['tokens_per_second']:,.0f}"
    lines = [
        f"device: {result['device_kind']} ({result['platform']}), {result['num_devices']} device(s), "
        f"jax {result['jax_version']}, keras {result['keras_version']}",
        f"shapes: hidden {s['hidden']}, layers {s['layers']}, heads {s['heads']}, ffn {s['ffn']}, seq {s['seq']}, "
        f"batch {s['batch']}, vocab {s['vocab']}, {result['dtype']}",
        f"compilations: {result['compilations']} (first step {result['first_step_seconds']:.1f} s, "
        f"compiling {result['compile_seconds']:.1f} s)",
        f"step time: {step} (median of {result['steps_timed']} steps)",
        f"tokens/s: {tokens}",
        f"MFU: {mfu} of {peak} ({result['peak_source']})",
        f"device memory: {memory}",
    ]
    return lines + [f"problem: {p}" for p in result["problems"]]


def result_path(args: argparse.Namespace) -> Optional[str]:
    if args.json:
        return args.json
    out = os.environ.get("OUT")
    return os.path.join(out, "device_check.json") if out else None


def main(argv: Optional[List[str]] = None) -> int:
    started = time.perf_counter()
    args = parse_arguments(argv)
    if args.dry_run:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # read when jax is first imported
    os.environ.setdefault("KERAS_BACKEND", "jax")
    missing = [name for name in ("jax", "keras", "keras_hub", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"device_check: {', '.join(missing)} not installed in {sys.executable}: run bash "
              "benchmarks/device_check.sh (it installs them), or pip install '.[jax]'", file=sys.stderr)
        return 2
    result = measure(args, started)
    for line in report_lines(result):
        print(line, flush=True)
    path = result_path(args)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
        print(f"result: {path}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
