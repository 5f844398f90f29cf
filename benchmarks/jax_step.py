"""The Keras backend's jitted training step alone, wall and process CPU time per step, variants in alternating rounds.

Each variant is one child process (an XLA flag set or a CPU device count is fixed when JAX starts), so rounds
alternate processes: variant A round 1, B round 1, A round 2, ... Every child builds the backend's own model
(:func:`hf_tpu_ext.backends.keras.model.build_masked_lm`), AdamW and step
(:func:`hf_tpu_ext.backends.keras.step.make_train_step`, jitted as the backend does, state donated, batch
sharded over every device of a ``Placement``) at the small preset's shapes, then times ``steps`` steps after 3 of
warm-up: median wall ms/step and process CPU ms/step (``time.process_time``: under contention the steadier one).

Usage (from the repository root, the current-releases venv):
    python -m benchmarks.jax_step --rounds 3 --steps 8 \
        --variant 'base=' --variant 'dev2=JAX_NUM_CPU_DEVICES=2' \
        --variant 'noeigen=XLA_FLAGS=--xla_cpu_multi_thread_eigen=false'

A variant is ``name=VAR=value;VAR=value`` (environment of that child; empty: the parent's). ``--bf16`` (or a
variant's ``BENCH_BF16=1``) runs the step with bfloat16 compute (``mixed_bfloat16``); ``BENCH_NATIVE_BF16_DOTS=1`` / ``0``
passes ``bf16_dots`` True / False to ``make_train_step`` (unset: on a CPU, as the run's ``PrecisionPlan``);
``BENCH_MODEL_TYPE=bert|distilbert|modernbert|eurobert`` times that architecture's small preset (the record's
``small_preset``, vocabulary 8000; ``BENCH_CONFIG="local_attention=1024"`` overrides config fields, e.g. ModernBERT all-global), and each
child reports tokens/s, MFU and its peak RSS (the architecture's ``flops_per_token``, the CPU's formula peak); ``BENCH_TREE=<checkout>`` runs that
variant's child from another checkout of the repository (a before/after of a code change in one run). Prints one JSON line per child and a summary with the per-round
ratios against the first variant, the load and the CPU's bf16 flags.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(batch: int, seq: int, steps: int, bf16: bool) -> dict:
    """One variant: build, compile, time ``steps`` steps (this process's environment is the variant's)."""
    from hf_tpu_ext.host_memory import keep_step_memory

    keep_step_memory(single_arena=True)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    import numpy as np
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.placement import Placement
    from hf_tpu_ext.backends.keras.step import jit_train_step, make_train_step
    from hf_tpu_ext.data.masking import default_max_predictions

    model_type = os.environ.get("BENCH_MODEL_TYPE", "roberta")
    if model_type == "roberta":
        config = RobertaConfig(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                               intermediate_size=1024, max_position_embeddings=seq + 2, type_vocab_size=1)
    else:  # the architecture's small preset (the record's small_preset), 8000 tokens, BENCH_CONFIG overrides
        from transformers import AutoConfig

        from hf_tpu_ext.model_types import record_for

        config = AutoConfig.for_model(model_type, **{**record_for(model_type).small_preset, "vocab_size": 8000,
                                                     "max_position_embeddings": max(512, seq), "pad_token_id": 0})
        if os.environ.get("BENCH_CONFIG"):
            config.update_from_string(os.environ["BENCH_CONFIG"])
    bf16 = bf16 or os.environ.get("BENCH_BF16") == "1"
    model = build_masked_lm(config, dtype="mixed_bfloat16" if bf16 else "float32", seed=42)
    optimizer = keras.optimizers.AdamW(learning_rate=5e-4, weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    placement = Placement()
    dots = os.environ.get("BENCH_NATIVE_BF16_DOTS")  # unset: the step's default (bf16_dot.py on a CPU)
    step = make_train_step(model, optimizer, 42, 1, bf16_dots=jax.default_backend() == "cpu" if dots is None else dots == "1")
    step = jit_train_step(step, placement)
    state = (placement.put_replicated([v.value for v in model.trainable_variables]),
             placement.put_replicated([v.value for v in model.non_trainable_variables]),
             placement.put_replicated([v.value for v in optimizer.variables]))
    rng = np.random.default_rng(0)
    p = default_max_predictions(seq)
    host = {"input_ids": rng.integers(5, 8000, (1, batch, seq), dtype=np.int32),
            "attention_mask": np.ones((1, batch, seq), np.int32),
            "masked_lm_positions": np.sort(rng.integers(1, seq, (1, batch, p), dtype=np.int32), axis=-1),
            "masked_lm_ids": rng.integers(5, 8000, (1, batch, p), dtype=np.int32),
            "masked_lm_weights": np.ones((1, batch, p), np.float32)}
    batch_arrays = placement.put_batch(host, axis=1)
    walls, cpus = [], []
    for i in range(3 + steps):
        w0, c0 = time.perf_counter(), time.process_time()
        state, loss, _ = step(state, batch_arrays, np.int32(i))
        float(loss)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    ms = statistics.median(walls[3:]) * 1e3
    figures = {"model_type": model_type, "seq": seq, "tokens_per_s": round(batch * seq / ms * 1e3, 1)}
    try:  # MFU from the model type's own FLOP count (its record's) and the CPU's formula peak (hf_tpu_ext.flops)
        from hf_tpu_ext.flops import device_peak, flops_per_token

        per_token = flops_per_token(config, seq, p / seq)
        peak = device_peak("CPU", "bfloat16" if bf16 else "float32").flops
        figures.update(flops_per_token=per_token, mfu=round(figures["tokens_per_s"] * per_token / peak, 4))
    except ImportError:  # a checkout from before the architecture registry
        pass
    import resource  # peak resident memory of this child (Linux: KiB): the model, optimizer state, compiled step

    figures["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return {**figures, "devices": placement.num_devices, "bf16": bf16, "ms_per_step": ms,
            "cpu_ms_per_step": statistics.median(cpus[3:]) * 1e3, "first_step_s": walls[0],
            "loss": float(loss), "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__}


def parse_variant(text: str):
    name, _, env_text = text.partition("=")
    env = {}
    for part in filter(None, env_text.split(";")):
        key, _, value = part.partition("=")
        env[key] = value
    return name, env


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=[], help="name=VAR=value;VAR=value (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--bf16", action="store_true", help="every variant in mixed_bfloat16")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.batch, args.seq, args.steps, args.bf16)), flush=True)
        return
    from hf_tpu_ext.precision import cpu_flags

    variants = [parse_variant(v) for v in (args.variant or ["base="])]
    results = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        for name, env in variants:
            cmd = [sys.executable, "-m", "benchmarks.jax_step", "--child", "--steps", str(args.steps),
                   "--batch", str(args.batch), "--seq", str(args.seq)] + (["--bf16"] if args.bf16 else [])
            load = os.getloadavg()[0]
            # BENCH_TREE: run this variant from another checkout (cwd comes first on sys.path under -m)
            out = subprocess.run(cmd, env={**os.environ, "JAX_PLATFORMS": "cpu", **env}, capture_output=True,
                                 text=True, cwd=env.get("BENCH_TREE"))
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                sys.stderr.write(out.stderr[-3000:])
                raise SystemExit(f"variant {name} failed")
            res = json.loads(line[0][7:])
            res.update(round=r + 1, variant=name, load_start=round(load, 2))
            results[name].append(res)
            print(json.dumps(res), flush=True)
    first = variants[0][0]
    summary = {"cpu_bf16_flags": sorted(cpu_flags() & {"avx512_bf16", "amx_bf16", "amx_tile"}),
               "load_end": [round(x, 2) for x in os.getloadavg()]}
    for name, rows in results.items():
        summary[name] = {
            "ms_per_step": [round(x["ms_per_step"], 1) for x in rows],
            "cpu_ms_per_step": [round(x["cpu_ms_per_step"], 1) for x in rows],
            "wall_speedup_vs_" + first: [round(a["ms_per_step"] / b["ms_per_step"], 3)
                                         for a, b in zip(results[first], rows)],
            "cpu_ratio_vs_" + first: [round(a["cpu_ms_per_step"] / b["cpu_ms_per_step"], 3)
                                      for a, b in zip(results[first], rows)]}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
