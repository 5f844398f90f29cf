"""Which device holds which part of each state variable under ``--fsdp`` (a logical-axis rules table).

Each dimension of a variable gets a logical name from the model's config (``vocab``, ``embed``, ``mlp``,
``heads``, ``position``; ``dim`` otherwise) and :data:`LOGICAL_AXIS_RULES` maps a logical name to a mesh axis
(MaxText's scheme: one table decides, the layers stay unannotated). FSDP shards one dimension per weight: of the
dimensions the table maps to ``"fsdp"``, the largest whose size the ``fsdp`` mesh axis divides (the first of
equals). A weight with fewer elements than ``min_num_params``, a scalar, and the non-trainable variables stay
replicated. Optimizer variables of a weight's shape (Adam's moments) get that weight's spec; with
``shard_grad_op`` the weights themselves stay replicated and only gradients and optimizer state are sharded.

No weight of :data:`REFUSE_REPLICATED_BYTES` or more is left whole on every device without a word: one that no
dimension lets shard is refused (:func:`plan_state`), naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from hf_tpu_ext.errors import BackendError

#: logical axis -> mesh axis (None: never sharded); a tensor-parallel axis would be added here
LOGICAL_AXIS_RULES: Tuple[Tuple[str, object], ...] = (
    ("batch", ("data", "fsdp")),  # the batch rows: split over every device
    ("vocab", "fsdp"),
    ("embed", "fsdp"),
    ("mlp", "fsdp"),
    ("heads", "fsdp"),
    ("position", "fsdp"),
    ("dim", "fsdp"),  # a dimension the config does not name (e.g. a head's width)
)
#: a variable this large (bytes) left replicated under --fsdp is refused
REFUSE_REPLICATED_BYTES = 1 << 20
#: config field -> the logical name of a dimension of that size (the first that matches names it)
_CONFIG_AXES = (("vocab_size", "vocab"), ("intermediate_size", "mlp"), ("hidden_size", "embed"),
                ("num_attention_heads", "heads"), ("max_position_embeddings", "position"))


def mesh_axis(logical: str):
    """The mesh axis (or axes, or None) :data:`LOGICAL_AXIS_RULES` gives ``logical``."""
    return dict(LOGICAL_AXIS_RULES).get(logical)


def logical_axes(shape: Sequence[int], config=None) -> Tuple[str, ...]:
    """Each dimension's logical name: the config field of that size (``vocab``, ``mlp``, ``embed``, ``heads``,
    ``position``), else ``dim``."""
    sizes = [(getattr(config, f, None), name) for f, name in _CONFIG_AXES] if config is not None else []
    return tuple(next((name for size, name in sizes if size == d), "dim") for d in shape)


def shard_dim(shape: Sequence[int], fsdp_size: int, config=None) -> Optional[int]:
    """The dimension FSDP shards: of those the rules map to ``"fsdp"``, the largest ``fsdp_size`` divides (first of
    equals); None when none does (or a scalar)."""
    names = logical_axes(shape, config)
    fits = [i for i, d in enumerate(shape) if mesh_axis(names[i]) == "fsdp" and d % fsdp_size == 0 and d > 0]
    return max(fits, key=lambda i: (shape[i], -i)) if fits else None


@dataclass
class StatePlan:
    """The PartitionSpec tuples of the train state ``(trainable, non_trainable, optimizer)``; ``grads``: the
    gradients' (one per trainable weight); ``replicated_small``: names of the weights kept whole (small);
    ``gather_groups``: the positions (in ``trainable``) of the weights whose gradients are sharded, grouped for one
    collective each (:func:`gather_groups`): ``shard_grad_op`` gathers the updated weights so."""

    trainable: List[tuple]
    non_trainable: List[tuple]
    optimizer: List[tuple]
    grads: List[tuple]
    replicated_small: List[str] = field(default_factory=list)
    gather_groups: List[List[int]] = field(default_factory=list)


def _spec(shape, nbytes: int, name: str, fsdp_size: int, min_num_params: int, config) -> tuple:
    """One variable's spec as a tuple of mesh axes (``()``: replicated).

    Raises:
        BackendError: a variable of :data:`REFUSE_REPLICATED_BYTES` or more that no dimension lets shard.
    """
    if fsdp_size <= 1 or len(shape) == 0 or int(np.prod(shape)) < min_num_params:
        return ()
    dim = shard_dim(shape, fsdp_size, config)
    if dim is None:
        if nbytes >= REFUSE_REPLICATED_BYTES:
            raise BackendError(
                f"--fsdp cannot shard {name} {tuple(shape)} ({nbytes / 2**20:.2f} MiB): the fsdp mesh axis "
                f"({fsdp_size} devices) divides none of its dimensions, so every device would hold it whole; use a "
                f"device count or --fsdp_config mesh whose fsdp size divides one of them, or resize the model.")
        return ()
    return tuple("fsdp" if i == dim else None for i in range(len(shape)))


def plan_state(trainable, non_trainable, optimizer_variables, strategy: str, fsdp_size: int,
               min_num_params: int = 0, config=None) -> StatePlan:
    """Each state variable's spec (:class:`StatePlan`) under ``--fsdp strategy`` over ``fsdp_size`` devices.

    Args:
        trainable, non_trainable, optimizer_variables: Keras variables (``path``, ``shape``, ``dtype``).
        strategy: ``"full_shard"`` or ``"shard_grad_op"``.
        min_num_params: variables with fewer elements stay replicated (``--fsdp_config``).
        config: the model's config (names the dimensions); None: every dimension ``dim``.

    Raises:
        BackendError: a variable of 1 MiB or more left replicated (named, with what to change).
    """
    import jax.numpy as jnp  # its dtypes include bfloat16

    def spec(var):
        nbytes = int(np.prod(var.shape)) * jnp.dtype(var.dtype).itemsize
        return _spec(tuple(var.shape), nbytes, var.path, fsdp_size, min_num_params, config)

    sharded = [spec(v) for v in trainable]
    small = [v.path for v, s in zip(trainable, sharded) if not s]
    return StatePlan(trainable=sharded if strategy == "full_shard" else [()] * len(sharded),
                     non_trainable=[()] * len(non_trainable), optimizer=[spec(v) for v in optimizer_variables],
                     grads=sharded, replicated_small=small, gather_groups=gather_groups(trainable, sharded))


def gather_groups(variables, specs: Sequence[tuple]) -> List[List[int]]:
    """The positions of the sharded ``variables`` (``specs`` not empty) grouped by module: the first component of
    the variable's path (``encoder_layer_3``, ``embeddings``, ``mlm_head``) and its dtype, in order of first
    appearance. One group is gathered by one all-gather (FSDP's flat parameter per wrapped module): one collective
    per layer instead of one per weight."""
    import jax.numpy as jnp

    groups: Dict[tuple, List[int]] = {}
    for i, (var, spec) in enumerate(zip(variables, specs)):
        if spec:
            groups.setdefault((str(var.path).split("/")[0], jnp.dtype(var.dtype).name), []).append(i)
    return list(groups.values())


def gather_whole(weights, dims: Sequence[int], fsdp_size: int, rows, whole) -> list:
    """``weights`` (traced, each sharded on dimension ``dims[i]`` over the fsdp axis, one dtype) made whole on every
    device by ONE all-gather: each weight's sharded dimension moved first and reshaped ``[F, size / F]`` (device
    ``f``'s block is row ``f``: no data moves), the rows concatenated ``[F, total / F]``, constrained ``whole``
    (the all-gather), then cut back into the weights (local copies). For weights no gradient flows through (the
    updated weights of ``shard_grad_op``): fed to the forward's dots instead (``full_shard``) the cut copies cost
    ~12% more CPU per step on XLA:CPU than one all-gather per weight (small preset, 4 devices), so ``full_shard``
    gathers weight by weight.

    Args:
        rows, whole: ``jax.sharding.NamedSharding`` of a ``[F, n]`` array split on ``F``, and replicated.
    """
    import jax
    import jax.numpy as jnp

    parts = [jax.lax.with_sharding_constraint(jnp.moveaxis(w, d, 0).reshape(fsdp_size, -1), rows)
             for w, d in zip(weights, dims)]
    flat = jax.lax.with_sharding_constraint(jnp.concatenate(parts, axis=1), whole)
    out, offset = [], 0
    for w, d, part in zip(weights, dims, parts):
        moved = (w.shape[d],) + tuple(n for i, n in enumerate(w.shape) if i != d)
        out.append(jnp.moveaxis(flat[:, offset:offset + part.shape[1]].reshape(moved), 0, d))
        offset += part.shape[1]
    return out


def held_bytes(arrays) -> int:
    """Bytes of ``arrays`` (jax.Arrays) one device holds: each array's shard shape (from its sharding) times its
    item size, summed (the first device's; FSDP's shards are equal)."""
    total = 0
    for a in arrays:
        total += int(np.prod(a.sharding.shard_shape(a.shape))) * np.dtype(a.dtype).itemsize
    return total


def describe(plan: StatePlan, mesh_shape: Dict[str, int], strategy: str) -> str:
    """The plan in one line (the run's log)."""
    sharded = sum(1 for s in plan.trainable + plan.optimizer if s)
    mesh = " x ".join(f"{k} {v}" for k, v in mesh_shape.items())
    return (f"--fsdp {strategy} over the mesh {mesh}: {sharded} state variables sharded, "
            f"{len(plan.replicated_small)} small weights replicated")
