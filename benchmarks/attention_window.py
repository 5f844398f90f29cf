"""Figures of issue 51's attention: the window computed, no ``L x L`` (``architectures/attention.py``).

Three parts, printed as JSON lines (``--part``), each with the load average before and after and the CPU's flags:

* ``layer``: one local layer's attention (ModernBERT small preset: 4 heads x 64, window 128 = +-64), forward +
  backward (``jax.grad`` of a sum, jitted), at seq 512 / 2,048 / 8,192 with 8,192 tokens per call (batch 16 / 4 /
  1): the block-local kernel against the dense-masked one (``[L, L]`` scores, the window as a mask: the path
  before); rounds alternate the two, the median of each is kept;
* ``step``: the backend's jitted training step (AdamW, float32, batch 1, 15 % masked positions) of the small preset
  (4 x 256, vocab 8,000) at seq 2,048: ModernBERT's local/global mix against every layer global (both with the new
  kernels), alternating rounds; MFU from ``flops_per_token`` and the CPU's peak (``hf_tpu_ext.flops``);
* ``memory``: the compiled step's temporaries (``memory_analysis().temp_size_in_bytes``, compiled only, never run)
  of ModernBERT-base's config (``ModernBertConfig()``: 22 x 768, 12 heads) at batch 1, seq 1,024 / 4,096 / 8,192:
  "before" forces the dense path on every layer, "after" is the path :func:`attention_path` picks.

Usage (from the repository root, the current-releases venv, the machine otherwise quiet)::

    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.attention_window --part layer --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

#: /proc/cpuinfo flags that decide XLA:CPU's matmul speed
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def machine() -> dict:
    """CPU model, cores, the flags of :data:`SPEED_FLAGS` present, the load average now."""
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    return {"cpu": model, "cores": os.cpu_count(), "flags": [f for f in SPEED_FLAGS if f in flags],
            "load": [round(x, 2) for x in os.getloadavg()]}


def _timed(fn, args, repeats: int) -> float:
    """Fastest of ``repeats`` calls (seconds), after a warm-up (compile)."""
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def layer_part(lengths, rounds: int, tokens: int = 8192, heads: int = 4, dim: int = 64, half_window: int = 64):
    """Block-local vs dense-masked forward + backward per length (module doc)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hf_tpu_ext.backends.keras.architectures.attention_kernels import dense_attention, local_attention

    scale = dim ** -0.5
    for length in lengths:
        batch = max(1, tokens // length)
        rng = np.random.default_rng(0)
        q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads, dim)).astype("float32")) for _ in range(3))
        padding = jnp.ones((batch, length), bool)
        position = np.arange(length)
        window = jnp.asarray(np.abs(position[:, None] - position[None, :]) <= half_window)
        paths = {
            "block_local": lambda q, k, v: local_attention(q, k, v, padding, half_window, scale),
            "dense_masked": lambda q, k, v: dense_attention(q, k, v, jnp.logical_and(
                padding[:, None, None, :], window[None, None]), scale)}
        grads = {name: jax.jit(jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v)), argnums=(0, 1, 2)))
                 for name, f in paths.items()}
        seconds = {name: [] for name in grads}
        load_before = machine()["load"]
        for r in range(rounds):
            for name in (list(grads) if r % 2 == 0 else list(reversed(list(grads)))):
                seconds[name].append(_timed(grads[name], (q, k, v), 2))
        median = {name: statistics.median(s) for name, s in seconds.items()}
        print(json.dumps({"part": "layer", "seq": length, "batch": batch, "window": 2 * half_window,
                          "ms": {n: round(1e3 * m, 2) for n, m in median.items()},
                          "speedup": round(median["dense_masked"] / median["block_local"], 2),
                          "load_before": load_before, "load_after": machine()["load"]}), flush=True)


def _step_setup(config, seq: int, batch: int = 1):
    """(jitted step, state, batch arrays) of the backend's float32 training step for ``config``."""
    import jax
    import keras
    import numpy as np

    from hf_tpu_ext.backends.keras.architectures import get_architecture
    from hf_tpu_ext.backends.keras.step import make_train_step, split_micro_batches

    model = get_architecture("modernbert").build(config, "float32")
    optimizer = keras.optimizers.AdamW(1e-4)
    optimizer.build(model.trainable_variables)
    state = tuple([v.value for v in vs] for vs in
                  (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
    rng = np.random.default_rng(0)
    masked = -(-int(0.15 * seq) // 8) * 8
    ids = rng.integers(5, int(config.vocab_size), size=(batch, seq)).astype(np.int32)
    positions = np.sort(np.stack([rng.choice(seq, masked, replace=False) for _ in range(batch)]), 1).astype(np.int32)
    arrays = split_micro_batches({"input_ids": ids, "attention_mask": np.ones_like(ids),
                                  "masked_lm_positions": positions,
                                  "masked_lm_ids": np.take_along_axis(ids, positions, 1),
                                  "masked_lm_weights": np.ones(positions.shape, np.float32)}, 1)
    step = jax.jit(make_train_step(model, optimizer, seed=0, accumulation=1, bf16_dots=False))
    return step, state, arrays, masked / seq


def step_part(seq: int, rounds: int):
    """Small preset at ``seq``: local/global mix vs all-global (module doc), with MFU."""
    import numpy as np
    from transformers import ModernBertConfig

    from hf_tpu_ext.flops import device_peak
    from hf_tpu_ext.model_types import flops_per_token, record_for

    base = dict(record_for("modernbert").small_preset, vocab_size=8000, max_position_embeddings=max(seq, 8192), pad_token_id=0,
                bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    configs = {"mix": ModernBertConfig(**base),
               "all_global": ModernBertConfig(**dict(base, global_attn_every_n_layers=1))}
    setups = {name: _step_setup(c, seq) for name, c in configs.items()}
    seconds = {name: [] for name in setups}
    load_before = machine()["load"]
    for r in range(rounds):
        for name in (list(setups) if r % 2 == 0 else list(reversed(list(setups)))):
            step, state, arrays, _ = setups[name]
            seconds[name].append(_timed(lambda s=step, st=state, a=arrays: s(st, a, np.int32(0)), (), 2))
    peak = device_peak("CPU", "float32")
    out = {"part": "step", "seq": seq, "batch": 1, "peak_flops": peak.flops, "peak_source": peak.source}
    for name, config in configs.items():
        median = statistics.median(seconds[name])
        fpt = flops_per_token(config, seq, setups[name][3])
        out[name] = {"s_per_step": round(median, 3), "tokens_per_s": round(seq / median, 1),
                     "flops_per_token": fpt, "mfu": round(seq / median * fpt / peak.flops, 4) if peak.flops else None}
    out["speedup"] = round(out["all_global"]["s_per_step"] / out["mix"]["s_per_step"], 2)
    out.update(load_before=load_before, load_after=machine()["load"])
    print(json.dumps(out), flush=True)


def temp_bytes(config, seq: int) -> int:
    """``temp_size_in_bytes`` of the compiled (not run) float32 step at batch 1, ``seq`` tokens."""
    import jax

    step, state, arrays, _ = _step_setup(config, seq)
    abstract = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (state, arrays))
    compiled = step.lower(*abstract, jax.ShapeDtypeStruct((), "int32")).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def memory_part(lengths):
    """ModernBERT-base step temporaries before (dense everywhere) and after (module doc)."""
    from unittest import mock

    from transformers import ModernBertConfig

    from hf_tpu_ext.backends.keras.architectures import attention

    for seq in lengths:
        config = ModernBertConfig(max_position_embeddings=8192)
        with mock.patch.object(attention, "attention_path", lambda *a, **k: ("dense", "forced: the path before")):
            before = temp_bytes(config, seq)
        after = temp_bytes(config, seq)
        print(json.dumps({"part": "memory", "model": "ModernBERT-base config", "seq": seq, "batch": 1,
                          "temp_gb_before": round(before / 1e9, 2), "temp_gb_after": round(after / 1e9, 2),
                          "load": machine()["load"]}), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--part", choices=("layer", "step", "memory", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lengths", default="", help="comma-separated (default: the module doc's)")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    given = [int(x) for x in args.lengths.split(",") if x]
    print(json.dumps({"machine": machine()}), flush=True)
    if args.part in ("layer", "all"):
        layer_part(given or [512, 2048, 8192], args.rounds)
    if args.part in ("step", "all"):
        step_part((given or [2048])[0], args.rounds)
    if args.part in ("memory", "all"):
        memory_part(given or [1024, 4096, 8192])


if __name__ == "__main__":
    main()
