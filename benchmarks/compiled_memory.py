"""Compiled memory per device of the Keras backend's training step: replicated, ``--fsdp``, ``--fsdp`` +
``--gradient_checkpointing`` (issue 50's figures; compiled, never run, nothing allocated).

The step is the backend's own (:func:`hf_tpu_ext.backends.keras.step.make_train_step`: forward, backward, AdamW
with clipping, mixed bfloat16 by default as on a TPU), jitted with the state donated, lowered from
``jax.ShapeDtypeStruct`` arguments and compiled by XLA for a mesh of ``N`` devices (8 CPU devices by default:
``--xla_force_host_platform_device_count``, set here before JAX starts). The model and the AdamW variables are
built inside ``keras.StatelessScope``, where Keras defers every initializer, so a 1.5 B-parameter model costs no
memory. ``compiled.memory_analysis()`` gives the figures of ONE device's program (GSPMD partitions the step):

* ``state``: the bytes a device holds of the trainable weights, the non-trainable ones and the optimizer state
  (its shards, from the shardings below), the batch shard besides;
* ``temp``: XLA's temporaries (activations kept for the backward pass, gradients, gathered weights, ...);
* ``peak`` = arguments + outputs - donated aliases + temporaries.

Modes: the trainer's own placement (:class:`~hf_tpu_ext.backends.keras.placement.Placement`, the batch split by
rows over every device in every mode) and its step's arguments (``grad_sharding``, ``weight_use``,
``weight_update``, as ``backends/keras/trainer.py`` hands them to ``make_train_step``), jitted by its
:func:`~hf_tpu_ext.backends.keras.step.jit_train_step`. ``replicated``: no ``--fsdp`` (a ``"data"`` mesh, every
device the whole state); ``fsdp``: ``--fsdp full_shard`` (a ``("data", "fsdp")`` mesh of ``1 x N``, each variable
with the spec of the backend's rules table, :func:`hf_tpu_ext.backends.keras.sharding.plan_state`, default
``--fsdp_config``: every trainable weight with a dimension the fsdp axis divides sharded, its AdamW moments
alike; each sharded weight gathered whole where the forward reads it, ``Placement.gather_for_use``; its gradient
reduced to the shard, ``Placement.grad_sharding``); ``fsdp+gc``: that, and ``--gradient_checkpointing`` (each
encoder layer under ``jax.checkpoint``: :mod:`hf_tpu_ext.backends.keras.architectures.remat`).

CPU compilation is an estimate of a TPU's: XLA:TPU fuses and schedules differently, and XLA:CPU computes bfloat16
element-wise work in float32 (more temporaries than a TPU). The README table is labelled so.

Usage (repository root, the current-releases venv; minutes per model on 2 cores)::

    python -m benchmarks.compiled_memory                       # the three models x three modes, a table
    python -m benchmarks.compiled_memory --models bert-base --modes replicated fsdp+gc --json out.json
    python -m benchmarks.compiled_memory --policy nothing_saveable   # another jax.checkpoint policy
    python -m benchmarks.compiled_memory --accelerator --models bert-base   # this machine's GPU/TPU chips
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Dict, List, Optional

MIB, GIB = 2**20, 2**30
MODES = ("replicated", "fsdp", "fsdp+gc")
#: name -> (transformers model_type, config fields): public architectures' shapes (random weights: shapes only)
MODELS: Dict[str, tuple] = {
    "bert-base": ("bert", dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                               intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)),
    "modernbert-large": ("modernbert", dict(
        vocab_size=50368, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, intermediate_size=2624,
        max_position_embeddings=8192, local_attention=128, global_attn_every_n_layers=3, pad_token_id=50283,
        bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282)),
    # XLM-R XL's layout (post-LN encoder) at 2048 x 28 layers, RoBERTa's vocabulary: 1.51 B parameters
    "encoder-1.5b": ("roberta", dict(vocab_size=50265, hidden_size=2048, num_hidden_layers=28,
                                     num_attention_heads=16, intermediate_size=8192, max_position_embeddings=514,
                                     type_vocab_size=1, pad_token_id=1)),
}


#: XLA:CPU's default scheduler orders for thread concurrency and hoists the recomputation of ``jax.checkpoint``
#: next to the forward pass (the temporaries of remat equal those without: measured, benchmarks/NOTES.md); the
#: memory-minimizing scheduler orders as TPU/GPU compilers do for memory. XLA reads it once, when it starts.
MEMORY_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def set_cpu_devices(count: int) -> None:
    """Split the host CPU into ``count`` XLA devices and schedule for memory (:data:`MEMORY_SCHEDULER`), before JAX
    starts (an earlier count or scheduler flag in ``XLA_FLAGS`` is replaced)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f and MEMORY_SCHEDULER.split("=")[0] not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={int(count)}",
                                                MEMORY_SCHEDULER])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("KERAS_BACKEND", "jax")


def model_config(name: str, **overrides):
    """The transformers config of :data:`MODELS` ``name`` (``overrides``: more fields, e.g. a tiny test's sizes)."""
    from transformers import AutoConfig

    model_type, fields = MODELS[name] if name in MODELS else (name, {})
    return AutoConfig.for_model(model_type, **{**fields, **overrides})


def _abstract_model(config, dtype: str):
    """``(model, optimizer)`` with every variable deferred (``keras.StatelessScope``: shapes only, no memory)."""
    import keras
    from keras.src.backend.common import global_state

    from hf_tpu_ext.backends.keras.model import build_masked_lm

    # its step counter and learning rate are scalars with a value: made outside the scope
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01, global_clipnorm=1.0)
    with keras.StatelessScope(initialize_variables=False):
        model = build_masked_lm(config, dtype=dtype, seed=0)
        optimizer.build(model.trainable_variables)
    # Keras initializes deferred variables when a later scope (the step's stateless_call) ends: these never are
    global_state.set_global_attribute("uninitialized_variables", [])
    return model, optimizer


def step_state(config, mode: str, dtype: str = "mixed_bfloat16", devices=None):
    """``(model, optimizer, placement, state)`` of ``mode`` (:data:`MODES`, ``replicated+gc``): the deferred model
    and AdamW (:func:`_abstract_model`), the trainer's :class:`~hf_tpu_ext.backends.keras.placement.Placement`
    (``--fsdp full_shard`` for the ``fsdp`` modes, its ``plan`` made from ``config``) and the train state
    ``(trainable, non_trainable, optimizer)`` as lists of ``jax.ShapeDtypeStruct`` with the shardings
    ``Placement.put_state`` gives the trainer's arrays (shapes only, nothing allocated).

    Raises:
        BackendError: under ``fsdp``, a weight of 1 MiB or more no dimension of which the device count divides.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from hf_tpu_ext.backends.keras.placement import Placement

    placement = Placement(devices, fsdp="full_shard" if mode.startswith("fsdp") else None)
    model, optimizer = _abstract_model(config, dtype)
    groups = (model.trainable_variables, model.non_trainable_variables, optimizer.variables)
    if placement.strategy is None:
        specs = tuple([()] * len(variables) for variables in groups)
    else:
        plan = placement.plan_for(*groups, config=config)
        specs = (plan.trainable, plan.non_trainable, plan.optimizer)
    state = tuple([jax.ShapeDtypeStruct(tuple(int(d) for d in v.shape), jax.numpy.dtype(v.dtype),
                                        sharding=NamedSharding(placement.mesh, PartitionSpec(*spec)))
                   for v, spec in zip(variables, part)] for variables, part in zip(groups, specs))
    return model, optimizer, placement, state


def _batch_structs(placement, rows: int, seq: int, predictions: int, packed: bool = False):
    """The training batch (``[1, rows, ...]``, one micro-batch) as ``ShapeDtypeStruct``s split by rows over every
    device (``placement.batch_sharding(1)``, as the trainer puts it)."""
    import jax
    import jax.numpy as jnp

    rows_split = placement.batch_sharding(1)
    shapes = {"input_ids": (seq, jnp.int32), "attention_mask": (seq, jnp.int32),
              "masked_lm_positions": (predictions, jnp.int32), "masked_lm_ids": (predictions, jnp.int32),
              "masked_lm_weights": (predictions, jnp.float32)}
    if packed:
        shapes.update(segment_ids=(seq, jnp.int32), position_ids=(seq, jnp.int32))
    return {k: jax.ShapeDtypeStruct((1, rows, length), dtype, sharding=rows_split)
            for k, (length, dtype) in shapes.items()}


def _state_bytes(structs) -> int:
    """Bytes one device holds of the state (each array's shard)."""
    total = 0
    for part in structs:
        for s in part:
            shard = s.sharding.shard_shape(s.shape)
            n = s.dtype.itemsize
            for d in shard:
                n *= int(d)
            total += n
    return total


def compiled_memory(config, mode: str, per_device_batch: int = 8, seq: int = 512, predictions: Optional[int] = None,
                    dtype: str = "mixed_bfloat16", devices=None, policy: Optional[str] = None) -> Dict[str, Any]:
    """Compile the train step of ``config`` in ``mode`` (:data:`MODES`) and return one device's figures.

    Args:
        config: a transformers config the Keras backend trains.
        mode: ``replicated``, ``fsdp`` or ``fsdp+gc`` (module doc); ``replicated+gc``: replicated with remat.
        per_device_batch: sequences per device; seq: tokens per sequence; predictions: masked positions per
            sequence (default: 15% of ``seq``).
        dtype: Keras dtype policy of the model (``mixed_bfloat16``: float32 weights, bfloat16 compute).
        devices: the mesh's devices (default: every JAX device).
        policy: the ``jax.checkpoint_policies`` name for the ``+gc`` modes (default: the backend's).

    Returns:
        ``{"parameters", "devices", "state_bytes", "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
        "peak_bytes", "compile_seconds"}`` (bytes of one device).
    """
    import jax
    import numpy as np

    from hf_tpu_ext.backends.keras.architectures import remat
    from hf_tpu_ext.backends.keras.step import jit_train_step, make_train_step

    model, optimizer, placement, state = step_state(config, mode, dtype, devices)
    predictions = predictions or max(1, int(round(0.15 * seq)))
    batch = _batch_structs(placement, per_device_batch * placement.num_devices, seq, predictions)
    chosen = remat.POLICY
    try:
        remat.POLICY = policy or chosen  # make_train_step reads the module's policy when it builds the step
        # the trainer's step (backends/keras/trainer.py): the placement's gradient, gather and update constraints
        step = make_train_step(model, optimizer, 0, 1, bf16_dots=False, gradient_checkpointing=mode.endswith("+gc"),
                               grad_sharding=placement.grad_sharding, weight_use=placement.gather_for_use,
                               weight_update=placement.gather_updated)
    finally:
        remat.POLICY = chosen
    start = time.perf_counter()
    compiled = jit_train_step(step, placement).lower(state, batch, jax.ShapeDtypeStruct((), jax.numpy.int32)).compile()
    seconds = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    arguments, outputs = int(analysis.argument_size_in_bytes), int(analysis.output_size_in_bytes)
    alias, temp = int(analysis.alias_size_in_bytes), int(analysis.temp_size_in_bytes)
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return {"parameters": parameters, "devices": placement.num_devices, "state_bytes": _state_bytes(state),
            "argument_bytes": arguments, "output_bytes": outputs, "alias_bytes": alias, "temp_bytes": temp,
            "peak_bytes": arguments + outputs - alias + temp, "compile_seconds": round(seconds, 1)}


#: the figures a depth fit extrapolates (each linear in the number of encoder layers)
LINEAR_KEYS = ("parameters", "state_bytes", "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes")


def depth_fit(name: str, mode: str, depths=(3, 6), **kwargs) -> Dict[str, Any]:
    """The figures of :data:`MODELS` ``name`` at its own depth, from compiles at two smaller ``depths``.

    Every figure is ``a + b * layers``: parameters and state exactly (a layer's weights and moments), temporaries as
    measured (one layer's saved activations and gradients per layer, the embeddings, head and gathered weights
    once). Depths of multiples of 3 hold whole ModernBERT global/local patterns (a global layer every 3). A
    28-layer compile takes ~10x a 3-layer one; the fit is checked against BERT-base's full compile (NOTES.md).
    ``kwargs`` go to :func:`compiled_memory`. Returns its keys, ``compile_seconds`` summed, ``"fit": depths``.
    """
    full = int(model_config(name).num_hidden_layers)
    low, high = (compiled_memory(model_config(name, num_hidden_layers=d), mode, **kwargs) for d in depths)
    out: Dict[str, Any] = {"devices": low["devices"], "fit": list(depths),
                           "compile_seconds": round(low["compile_seconds"] + high["compile_seconds"], 1)}
    for key in LINEAR_KEYS:
        per_layer = (high[key] - low[key]) / (depths[1] - depths[0])
        out[key] = int(round(low[key] + per_layer * (full - depths[0])))
    return out


def largest_fitting(rows: List[Dict[str, Any]], chip_gib: float, mode: str) -> Optional[float]:
    """The largest parameter count (billions) that fits ``chip_gib`` in ``mode``, extrapolated from the largest
    measured model of that mode (its peak bytes per parameter at the same batch and length); None if no row."""
    measured = [r for r in rows if r["mode"] == mode]
    if not measured:
        return None
    largest = max(measured, key=lambda r: r["parameters"])
    per_parameter = largest["peak_bytes"] / largest["parameters"]
    return chip_gib * GIB / per_parameter / 1e9


def _table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| model | parameters | mode | state / device | temporaries / device | peak / device | compile s |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['parameters'] / 1e6:,.0f} M | {r['mode']} | {r['state_bytes'] / GIB:.2f} GiB"
                     f" | {r['temp_bytes'] / GIB:.2f} GiB | {r['peak_bytes'] / GIB:.2f} GiB | {r['compile_seconds']} |")
    return "\n".join(lines)


def _fits_table(rows: List[Dict[str, Any]], chips=(8, 16, 32, 95)) -> str:
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    lines = ["| chip memory | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    for gib in chips:
        cells = [f"{largest_fitting(rows, gib, m):.2f} B" for m in modes]
        lines.append(f"| {gib} GiB | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _machine() -> Dict[str, Any]:
    """CPU model, flags the figures may depend on, and the load average (compile time only)."""
    flags, model = set(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                elif line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return {"cpu": model, "flags": [f for f in wanted if f in flags], "load_average": list(os.getloadavg())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES) + ["replicated+gc"])
    parser.add_argument("--devices", type=int, default=8, help="CPU devices of the mesh (default 8)")
    parser.add_argument("--accelerator", action="store_true",
                        help="compile for JAX's default devices (a GPU/TPU machine: every chip) instead of CPUs")
    parser.add_argument("--per_device_batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--dtype", default="mixed_bfloat16", choices=["mixed_bfloat16", "float32"])
    parser.add_argument("--policy", default=None, help="jax.checkpoint_policies name for the +gc modes")
    parser.add_argument("--json", default=None, help="also write the rows and the machine here")
    parser.add_argument("--fit", type=int, nargs=2, default=None, metavar=("L1", "L2"),
                        help="compile at these two depths and extrapolate to the model's (depth_fit); default: "
                             "compile the whole model")
    args = parser.parse_args(argv)
    if not args.accelerator:
        set_cpu_devices(args.devices)
    import jax

    machine = dict(_machine(), platform=jax.devices()[0].platform, device_kind=jax.devices()[0].device_kind)
    args.devices = len(jax.devices())
    print(json.dumps(machine))
    rows = []
    for name in args.models:
        for mode in args.modes:
            kwargs = dict(per_device_batch=args.per_device_batch, seq=args.seq, dtype=args.dtype, policy=args.policy)
            figures = (depth_fit(name, mode, tuple(args.fit), **kwargs) if args.fit else
                       compiled_memory(model_config(name), mode, **kwargs))
            rows.append({"model": name, "mode": mode, **figures})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.devices} devices, {args.per_device_batch} x {args.seq} tokens per device, {args.dtype}\n")
    print(_table(rows))
    print("\nLargest encoder per chip (estimated from CPU compilation):\n")
    print(_fits_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            kept = {k: v for k, v in vars(args).items() if k != "json"}  # no path of this machine in the file
            json.dump({"machine": machine, "args": kept, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
