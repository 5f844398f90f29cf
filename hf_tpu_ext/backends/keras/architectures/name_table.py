"""An architecture's name table: Keras variables <-> transformers ``state_dict()`` names and layouts, both ways.

A table is a list of rows ``(transformers name, Keras attribute path from the masked LM, layout kind)``; one
table serves export (:func:`table_state_dict`) and import (:func:`table_assign`), so the two cannot drift apart.
Layout kinds (how a Keras array becomes the PyTorch one):

- :data:`SAME`: identical (embeddings, LayerNorm gamma/beta, biases of ``Dense``).
- :data:`LINEAR`: a ``Dense`` kernel ``[in, out]`` is a ``Linear.weight`` ``[out, in]`` (transposed).
- :data:`QKV_KERNEL`: an ``EinsumDense`` query/key/value kernel ``[hidden, heads, head_dim]`` is a ``Linear.weight``
  ``[heads * head_dim, hidden]`` whose output features are head-major (reshape, then transpose).
- :data:`QKV_BIAS`: ``[heads, head_dim]`` is ``[heads * head_dim]``.
- :data:`OUT_KERNEL`: the attention output kernel ``[heads, head_dim, hidden]`` is ``[hidden, heads * head_dim]``.

No Keras/JAX import at module level (the registry is read before the framework starts).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import numpy as np

from hf_tpu_ext.errors import CheckpointError

logger = logging.getLogger("hf_tpu_ext")

SAME, LINEAR, QKV_KERNEL, QKV_BIAS, OUT_KERNEL = "same", "linear", "qkv_kernel", "qkv_bias", "out_kernel"

#: one row: (transformers name, attribute path from the masked LM, layout kind)
Row = Tuple[str, str, str]


def to_transformers(kind: str, array: np.ndarray) -> np.ndarray:
    """A Keras array in the transformers layout of ``kind`` (module doc)."""
    if kind == SAME:
        return array
    if kind == LINEAR:
        return array.T
    if kind == QKV_KERNEL:  # [hidden, heads, head_dim] -> [heads*head_dim, hidden]
        return array.reshape(array.shape[0], -1).T
    if kind == QKV_BIAS:
        return array.reshape(-1)
    if kind == OUT_KERNEL:  # [heads, head_dim, hidden] -> [hidden, heads*head_dim]
        return array.reshape(-1, array.shape[-1]).T
    raise ValueError(f"unknown layout kind {kind!r}")


def from_transformers(kind: str, array: np.ndarray, keras_shape: Sequence[int]) -> np.ndarray:
    """The inverse of :func:`to_transformers` for a Keras variable of ``keras_shape``."""
    if kind in (SAME, QKV_BIAS):
        return array.reshape(tuple(keras_shape))
    if kind in (LINEAR, QKV_KERNEL, OUT_KERNEL):  # every one is "reshape, then transpose"
        return array.T.reshape(tuple(keras_shape))
    raise ValueError(f"unknown layout kind {kind!r}")


def transformers_shape(kind: str, keras_shape: Sequence[int]) -> Tuple[int, ...]:
    """The transformers shape of a Keras variable of ``keras_shape`` and layout ``kind``."""
    return tuple(to_transformers(kind, np.zeros(tuple(keras_shape), dtype=np.float32)).shape)


def attribute(obj, path: str):
    """``obj.a.b[2].c`` for ``path`` ``"a.b.2.c"`` (integers index lists)."""
    for name in path.split("."):
        obj = obj[int(name)] if name.isdigit() else getattr(obj, name)
    return obj


def variables_of(model, table: Iterable[Row]) -> List[Tuple[str, Any, str]]:
    """``(transformers name, Keras variable, kind)`` for every row of ``table``.

    Raises:
        CheckpointError: the model has a variable no row names (the table would export it incompletely).
    """
    rows = [(name, attribute(model, path), kind) for name, path, kind in table]
    known = {id(var) for _, var, _ in rows}
    unknown = [w.path for w in model.weights if id(w) not in known]
    if unknown:
        raise CheckpointError(f"{type(model).__name__} has variables with no transformers name: "
                              f"{', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}.")
    return rows


def numpy_value(variable) -> np.ndarray:
    """A variable's value as float32 numpy (bf16 upcast; a replicated multi-process ``jax.Array`` read locally).

    Raises:
        CheckpointError: the value is sharded across processes (gather it first).
    """
    from keras import ops

    value = variable.value if hasattr(variable, "value") else variable
    if getattr(value, "is_fully_addressable", True) is False:
        if not getattr(value, "is_fully_replicated", False):
            raise CheckpointError(f"{getattr(variable, 'path', 'A variable')} is sharded across processes; gather it "
                                  "(jax.experimental.multihost_utils.process_allgather) before exporting.")
        value = value.addressable_data(0)
    array = np.asarray(ops.convert_to_numpy(value))
    return array.astype(np.float32) if array.dtype != np.float32 else array


def table_state_dict(model, table: Iterable[Row]) -> Dict[str, np.ndarray]:
    """The model's weights under transformers' names and shapes (float32, C-contiguous), sorted by name.

    Raises:
        CheckpointError: see :func:`variables_of` and :func:`numpy_value`.
    """
    state = {name: np.ascontiguousarray(to_transformers(kind, numpy_value(var)))
             for name, var, kind in variables_of(model, table)}
    return dict(sorted(state.items()))


def normalized_names(state: Dict[str, Any], prefix: str, bare_prefixes: Sequence[str]) -> Dict[str, Any]:
    """A state dict's names in the ``prefix``-ed masked-LM form.

    A bare base model's names (``embeddings.*``, ``encoder.*``: ``bare_prefixes``) get ``prefix``
    (``"bert."``); old checkpoints' LayerNorm ``gamma``/``beta`` become ``weight``/``bias``, as transformers
    renames them on load.
    """
    out = {}
    for name, array in state.items():
        if name.endswith(".gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith(".beta"):
            name = name[: -len("beta")] + "bias"
        if name.startswith(tuple(bare_prefixes)):
            name = prefix + name
        out[name] = array
    return out


def table_assign(model, state: Dict[str, Any], table: Iterable[Row], head_names: Sequence[str],
                 aliases: Dict[str, str], what: str) -> None:
    """Copy a transformers state dict into ``model``'s variables (in place), through ``table``.

    Args:
        model: the Keras masked LM the table's attribute paths start from.
        state: ``{transformers name: array}`` (numpy or anything ``np.asarray`` reads), already normalized.
        table: the architecture's rows.
        head_names: names of the prediction head: when one is absent (a base-model checkpoint) the head keeps its
            initialization and one warning names what is missing.
        aliases: ``{name: other name holding the same weight}`` tried when ``name`` is absent (e.g. BERT's
            ``cls.predictions.bias`` also saved as ``cls.predictions.decoder.bias``).
        what: the architecture, for messages (``"BERT"``).

    Raises:
        CheckpointError: a weight outside the head is missing, or a weight's shape differs from the model's.
    """
    missing_head = []
    for name, var, kind in variables_of(model, table):
        if name not in state and aliases.get(name) in state:
            name = aliases[name]
        if name not in state:
            if name in head_names:
                missing_head.append(name)
                continue
            raise CheckpointError(f"The checkpoint has no {name!r}; it is not a {what} model of this config.")
        array = np.asarray(state[name], dtype=np.float32)
        needed = transformers_shape(kind, var.shape)
        if tuple(array.shape) != needed:
            raise CheckpointError(f"{name} has shape {tuple(array.shape)}, the model needs {needed} "
                                  "(config.json and the weights do not match).")
        var.assign(from_transformers(kind, array, var.shape))
    if missing_head:
        logger.warning("The checkpoint has no prediction head (%s); the %s head starts from its initialization.",
                       ", ".join(missing_head), what)
