"""What the compiled training step needs per device, said before the first step (and refused where it cannot fit).

XLA's ``Compiled.memory_analysis()`` gives the bytes one device holds for the step's arguments (the state and the
batch), outputs (the new state, aliased to the donated arguments), and temporaries (activations, gradients,
collectives' buffers). The state's bytes per device come from the arrays' shardings
(:func:`hf_tpu_ext.backends.keras.sharding.held_bytes`). Where JAX knows the device's limit
(``device.memory_stats()["bytes_limit"]``: TPU, GPU; none on CPU), a step that needs more is refused in one line
naming what would help, instead of an XLA out-of-memory error mid-run.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from hf_tpu_ext.backends.keras.sharding import held_bytes
from hf_tpu_ext.errors import BackendError

logger = logging.getLogger("hf_tpu_ext")

MIB = float(1 << 20)


def step_memory(compiled, state) -> Dict[str, int]:
    """Bytes per device of a compiled step: ``state_bytes``, ``argument_bytes``, ``output_bytes``,
    ``alias_bytes`` (outputs written into donated arguments), ``temp_bytes`` and ``total_bytes`` (arguments +
    outputs - aliased + temporaries); only ``state_bytes`` where XLA gives no analysis."""
    figures = {"state_bytes": held_bytes([a for part in state for a in part])}
    analysis = compiled.memory_analysis()
    if analysis is None:
        return figures
    for key, attr in (("argument_bytes", "argument_size_in_bytes"), ("output_bytes", "output_size_in_bytes"),
                      ("alias_bytes", "alias_size_in_bytes"), ("temp_bytes", "temp_size_in_bytes")):
        figures[key] = int(getattr(analysis, attr, 0) or 0)
    figures["total_bytes"] = (figures["argument_bytes"] + figures["output_bytes"] - figures["alias_bytes"]
                              + figures["temp_bytes"])
    return figures


def live_bytes_per_device() -> int:
    """The most bytes any of this process's devices holds in live arrays now (``jax.live_arrays()``, each array's
    shards on that device): what the run really keeps there, state, batch and any copy left in the Keras
    variables included (a device's own figure on CPU, where ``memory_stats`` gives none)."""
    import jax

    held: Dict[Any, int] = {device: 0 for device in jax.local_devices()}
    for array in jax.live_arrays():
        for shard in array.addressable_shards:
            if shard.device in held:
                held[shard.device] += int(shard.data.nbytes)
    return max(held.values())


def device_limit(device) -> Optional[int]:
    """``device``'s memory in bytes as JAX knows it (``memory_stats()["bytes_limit"]``), None where unknown (CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # a platform without the call: no limit known
        return None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else None


def memory_line(figures: Dict[str, int], limit: Optional[int], strategy: Optional[str], devices: int) -> str:
    """The run's line: the step's memory per device and the device's limit (``devices``: those one weight is
    split over under ``--fsdp``, else those each holding the whole state)."""
    how = f"--fsdp {strategy} over {devices} devices" if strategy else f"replicated on each of {devices} devices"
    line = f"Memory per device of the compiled training step: state {figures['state_bytes'] / MIB:.2f} MiB ({how})"
    if "total_bytes" in figures:
        line += (f", arguments {figures['argument_bytes'] / MIB:.2f} MiB, outputs {figures['output_bytes'] / MIB:.2f}"
                 f" MiB ({figures['alias_bytes'] / MIB:.2f} MiB of them in place), temporaries "
                 f"{figures['temp_bytes'] / MIB:.2f} MiB: {figures['total_bytes'] / MIB:.2f} MiB in all")
    return line + (f"; the device has {limit / MIB:.0f} MiB." if limit else "; the device's limit is not known "
                                                                             "(none on a CPU).")


def check_fits(figures: Dict[str, int], limit: Optional[int], strategy: Optional[str], device_kind: str) -> None:
    """Refuse a step that needs more than the device's ``limit`` (bytes; None: nothing to check).

    Raises:
        BackendError: one line with the need, the limit and what would help.
    """
    need = figures.get("total_bytes")
    if not limit or need is None or need <= limit:
        return
    helps = (["--fsdp full_shard (weights, gradients and optimizer state split over the devices)"]
             if strategy != "full_shard" else [])
    helps += ["--gradient_checkpointing (activations recomputed in the backward pass)",
              "a smaller --per_device_train_batch_size (with --gradient_accumulation_steps to keep the batch)"]
    raise BackendError(f"The training step needs {need / MIB:.0f} MiB per device (state "
                       f"{figures['state_bytes'] / MIB:.0f} MiB, temporaries {figures['temp_bytes'] / MIB:.0f} MiB), "
                       f"more than the {limit / MIB:.0f} MiB of a {device_kind}: try {', or '.join(helps)}.")


def report(compiled, state, placement) -> Dict[str, Any]:
    """Measure ``compiled`` (the step, before its first run), log the line, refuse what cannot fit; the figures
    are kept in ``placement.memory`` (None: only returned).

    Raises:
        BackendError: the step needs more than the device's limit (:func:`check_fits`).
    """
    import jax

    figures = step_memory(compiled, state)
    figures["live_bytes"] = live_bytes_per_device()
    device = jax.local_devices()[0]
    limit = device_limit(device)
    strategy = getattr(placement, "strategy", None)
    devices = getattr(placement, "num_devices", jax.device_count())
    if strategy:  # the devices one weight is split over (a hybrid mesh replicates it across "data")
        devices = placement.mesh_shape["fsdp"]
    if limit:
        figures["device_limit_bytes"] = limit
    if placement is not None:
        placement.memory = figures
    logger.info("%s", memory_line(figures, limit, strategy, devices))
    check_fits(figures, limit, strategy, device.device_kind)
    return figures
