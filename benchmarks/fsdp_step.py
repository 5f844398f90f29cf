"""Step time and collectives of the Keras backend's compiled train step: replicated vs ``--fsdp full_shard`` vs
``--fsdp shard_grad_op`` on N CPU devices (issue 50's step-overhead figure); ``*_propagated``: the step before
the one-all-gather-per-module constraints (:meth:`~hf_tpu_ext.backends.keras.placement.Placement.gather_for_use`,
``gather_updated``), as GSPMD's propagation alone shards it.

Each mode builds the same RoBERTa model (seed 42), AdamW and the backend's trainer
(:class:`hf_tpu_ext.backends.keras.trainer.JaxTrainer` on a :class:`~hf_tpu_ext.backends.keras.placement.Placement`
of that mode, ``--steps_per_execution 1``), so the step timed is the one a run compiles. For each mode it prints the
optimized HLO's collectives (count and result bytes per kind: all-gather, all-reduce, reduce-scatter, all-to-all,
collective-permute), which do not depend on the machine's load, then times the modes in alternating rounds on one
fixed random batch: wall ms/step, tokens/s and the process's CPU seconds per step (all threads; less sensitive to
other processes than wall time), with the 1-minute load average before each round.

Measured (2-core AVX-512/AMX machine shared with other jobs, load 2-3, 4 CPU devices, fp32): small preset, steady
ms/step replicated 833-840, full_shard 788-790, full_shard_propagated 1318-1336 (CPU s/step 1.42-1.47 / 1.49-1.50
/ 2.40-2.43); ``hf-tpu train --max_steps 40`` steady tokens/s replicated 4,670 / 5,075, full_shard 4,850 / 4,860,
the previous full_shard 3,422 / 3,144. Base preset (per-device batch 2): replicated 7,361-7,683 ms, full_shard
4,880-5,840, full_shard_propagated 4,329-4,492 (its activations, 256 tokens a device, are smaller than the weights
gathered instead).

Usage (from the repository root, the current-releases venv; the device count is set before JAX starts)::

    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.fsdp_step --devices 4 --preset small --rounds 3
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.fsdp_step --preset base --steps 3 --rounds 1
    python -m benchmarks.fsdp_step --hlo-only --dump-dir hlo/   # collectives only, HLO text written per mode
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import time
from typing import Dict, List

#: preset -> (hidden, layers, heads, intermediate, vocab, seq, per-device batch); small = hf-tpu train's defaults
#: with the vocabulary its tokenizer gets from the embedded corpus (6277 of --vocab_size 8000: no device count
#: divides it, so the word embeddings are sharded on the hidden dimension, as in that run),
#: base = BERT-base's shapes (per-device batch 2 to fit 4 replicated copies in host memory), tiny = the tests'
#: (its vocabulary, like small's, divisible by no device count)

PRESETS = {"small": (256, 4, 4, 1024, 6277, 128, 8), "base": (768, 12, 12, 3072, 30522, 128, 2),
           "tiny": (64, 2, 2, 128, 509, 32, 2)}
MODES = ("replicated", "full_shard", "shard_grad_op", "full_shard_propagated", "shard_grad_op_propagated")
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
#: ``%x = f32[2,3]{1,0} all-gather(`` or a tuple result ``(f32[..], f32[..]) all-reduce(``; async ``-start`` too
_OP = re.compile(r"=\s*(\([^()]*\)|[\w]+\[[^\]]*\](?:\{[^}]*\})?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "pred": 1, "f64": 8, "s64": 8}


def collectives(hlo: str) -> Dict[str, Dict[str, object]]:
    """``{kind: {"count": n, "bytes": result bytes summed, "shapes": {"f32[64,256]": n, ...}}}`` of HLO text."""
    out: Dict[str, Dict[str, object]] = {}
    for shape_text, kind in _OP.findall(hlo):
        entry = out.setdefault(kind, {"count": 0, "bytes": 0, "shapes": collections.Counter()})
        entry["count"] += 1
        for dtype, dims in _SHAPE.findall(shape_text):
            n = 1
            for d in filter(None, dims.split(",")):
                n *= int(d)
            entry["bytes"] += n * _BYTES.get(dtype, 4)
            entry["shapes"][f"{dtype}[{dims}]"] += 1
    for entry in out.values():
        entry["shapes"] = dict(entry["shapes"].most_common())
    return out


def build(mode: str, preset: str, devices: int):
    """``(trainer, host batch [1, B, ...], tokens per step)`` of one mode."""
    import jax
    import keras
    import numpy as np
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.placement import Placement
    from hf_tpu_ext.backends.keras.trainer import JaxTrainer
    from hf_tpu_ext.data.masking import default_max_predictions

    hidden, layers, heads, mlp, vocab, seq, per_device = PRESETS[preset]
    config = RobertaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                           intermediate_size=mlp, max_position_embeddings=seq + 2, type_vocab_size=1)
    keras.utils.set_random_seed(42)
    model = build_masked_lm(config, dtype="float32", seed=42)
    optimizer = keras.optimizers.AdamW(learning_rate=5e-4, weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    placement = Placement(jax.devices()[:devices], fsdp=None if mode == "replicated" else mode.split("_prop")[0])
    if mode.endswith("_propagated"):  # the step before the one-collective-per-module gathers: GSPMD alone
        placement.gather_for_use = placement.gather_updated = lambda weights: weights
    trainer = JaxTrainer(model, optimizer, placement, batches=None, schedule=None, evaluate=None,
                         summary_writer=None, checkpoints=None, bf16_dots=jax.default_backend() == "cpu", seed=42,
                         accumulation=1, steps_per_execution=1, config=config)
    batch, p = per_device * devices, default_max_predictions(seq)
    rng = np.random.default_rng(0)
    host = {"input_ids": rng.integers(5, vocab, (1, batch, seq), dtype=np.int32),
            "attention_mask": np.ones((1, batch, seq), np.int32),
            "masked_lm_positions": np.sort(rng.integers(0, seq, (1, batch, p)), axis=-1).astype(np.int32),
            "masked_lm_ids": rng.integers(5, vocab, (1, batch, p), dtype=np.int32),
            "masked_lm_weights": np.ones((1, batch, p), np.float32)}
    return trainer, host, batch * seq


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def time_steps(trainer, host, steps: int) -> Dict[str, float]:
    """Runs ``steps`` steps after one untimed step; wall and CPU seconds per step."""
    import jax
    import numpy as np

    step, batch = trainer._train_step, trainer.placement.put_batch(host, axis=1)
    state, loss, _ = step(trainer._state, batch, np.int32(0))  # compiles at the first call only
    jax.block_until_ready(loss)
    wall, cpu = time.perf_counter(), _cpu_seconds()
    for i in range(steps):
        state, loss, _ = step(state, batch, np.int32(i + 1))
    jax.block_until_ready((state, loss))
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    trainer._state = state
    return {"ms_per_step": 1000 * wall / steps, "cpu_s_per_step": cpu / steps, "loss": float(loss)}


def cpu_flags() -> str:
    """The AVX-512/AMX flags of /proc/cpuinfo (what XLA:CPU's kernels use), or ``?``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return "?"
    return " ".join(sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES[:3]))
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hlo-only", action="store_true", help="collectives only, no timing")
    parser.add_argument("--dump-dir", help="write each mode's optimized HLO text here")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ["JAX_NUM_CPU_DEVICES"] = str(args.devices)  # read when JAX starts (below)
    from benchmarks.step_hlo import strip_debug_info

    print(json.dumps({"cpu_count": os.cpu_count(), "cpu_flags": cpu_flags(), "preset": args.preset,
                      "devices": args.devices}))
    built, report = {}, {"preset": args.preset, "devices": args.devices, "cpu_flags": cpu_flags(), "modes": {}}
    for mode in args.modes:
        trainer, host, tokens = build(mode, args.preset, args.devices)
        hlo = strip_debug_info(trainer.lower_train_step(host).compile().as_text())
        if args.dump_dir:
            os.makedirs(args.dump_dir, exist_ok=True)
            with open(os.path.join(args.dump_dir, f"{args.preset}_{mode}.hlo"), "w", encoding="utf-8") as f:
                f.write(hlo)
        found = collectives(hlo)
        plan = trainer.placement.plan
        report["modes"][mode] = {"collectives": found, "rounds": [],
                                 "sharded_weights": sum(1 for spec in plan.grads if spec) if plan else 0,
                                 "temp_bytes": trainer.placement.memory.get("temporaries")}
        print(json.dumps({"mode": mode, "collectives": {k: (v["count"], v["bytes"]) for k, v in found.items()}}))
        built[mode] = (trainer, host, tokens)
    for r in range(0 if args.hlo_only else args.rounds):
        for mode in args.modes:
            trainer, host, tokens = built[mode]
            load = os.getloadavg()[0]
            figures = time_steps(trainer, host, args.steps)
            figures.update(round=r, load_1min=load, tokens_per_s=tokens / figures["ms_per_step"] * 1000)
            report["modes"][mode]["rounds"].append(figures)
            print(json.dumps({"mode": mode, **{k: round(v, 4) if isinstance(v, float) else v
                                               for k, v in figures.items()}}))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
