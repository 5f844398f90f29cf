"""An architecture's name table read and written: Keras variables <-> transformers ``state_dict()`` names, both ways.

A table is a list of rows ``(transformers name, Keras attribute path from the masked LM, layout kind)`` (the kinds
and their array conversions are :mod:`.layouts`'); one table serves export (:func:`table_state_dict`) and import
(:func:`table_assign`), so the two cannot drift apart. Paths may index lists (``encoder_layers.0.attention``).

No Keras/JAX import at module level (the registry is read before the framework starts).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import numpy as np

from hf_tpu_ext.backends.keras.architectures.layouts import (attribute, from_hf, hf_shape, placed_value, take,
                                                            to_hf, variable_numpy)
from hf_tpu_ext.backends.keras.architectures.lazy_state import LazyState
from hf_tpu_ext.errors import CheckpointError

logger = logging.getLogger("hf_tpu_ext")

#: one row: (transformers name, attribute path from the masked LM, layout kind of :mod:`.layouts`)
Row = Tuple[str, str, str]


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


def table_state_dict(model, table: Iterable[Row]) -> LazyState:
    """The model's weights under transformers' names and shapes (float32, C-contiguous), sorted by name; each
    array made from its variable when read (:class:`.lazy_state.LazyState`: an export holds one at a time).

    Raises:
        CheckpointError: see :func:`variables_of` and (on read) :func:`.layouts.variable_numpy`.
    """
    state = LazyState()
    for name, var, kind in variables_of(model, table):
        state.defer(name, hf_shape(kind, tuple(var.shape)),
                    lambda var=var, kind=kind: np.ascontiguousarray(to_hf(kind, variable_numpy(var))))
    return state


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


def renamed_paths(state: Dict[str, Any], legacy_paths: Sequence[Tuple[str, str]]) -> Dict[str, Any]:
    """A checkpoint's ``{Keras variable path: array}`` with older paths renamed to the model's (same order).

    Args:
        state: as read from a checkpoint (``model_state.safetensors``, the best weights).
        legacy_paths: the model's ``legacy_paths``: ``(regular expression matching a whole old path,
            replacement)`` pairs, the first match wins; a path no pattern matches is kept.
    """
    if not legacy_paths:
        return state
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in legacy_paths]
    out = {}
    for path, array in state.items():
        for pattern, replacement in compiled:
            if pattern.fullmatch(path):
                path = pattern.sub(replacement, path)
                break
        out[path] = array
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
        if name not in state and name in head_names:
            missing_head.append(name)
            continue
        placed = placed_value(state.get(name), kind, var)  # --fsdp: read by blocks onto its sharding
        var.assign(placed if placed is not None else
                   from_hf(kind, take(state, name, hf_shape(kind, tuple(var.shape)), what), tuple(var.shape)))
    if missing_head:
        logger.warning("The checkpoint has no prediction head (%s); the %s head starts from its initialization.",
                       ", ".join(missing_head), what)
