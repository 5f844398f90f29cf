"""``--fsdp`` and ``--fsdp_config`` (transformers' names): read and checked before any framework starts.

``--fsdp`` takes TrainingArguments' options, space-separated: one sharding strategy (``full_shard``: weights,
gradients and optimizer state sharded; ``shard_grad_op``: gradients and optimizer state sharded, weights
replicated), optionally ``auto_wrap`` (transformers' wrapping policy; the Keras backend shards weight by weight
anyway, so it changes nothing there). ``--fsdp_config`` is a JSON object or a JSON file with ``min_num_params``
(weights with fewer elements stay replicated; transformers' ``fsdp_`` prefix is accepted) and, on
``--backend keras``, ``mesh``: ``{"data": D, "fsdp": F}`` (data parallel over ``D`` groups, e.g. hosts or
slices, FSDP within each group of ``F`` devices; default all devices on ``"fsdp"``). torch_xla's own keys
(``xla``, ``xla_fsdp_v2``, ``xla_fsdp_grad_ckpt``) are handed to its Trainer as they are.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from hf_tpu_ext.errors import ArgumentError

#: the sharding strategies implemented (TrainingArguments' FSDPOption values)
FSDP_STRATEGIES = ("full_shard", "shard_grad_op")
#: options refused, with what to do instead
_REFUSED = {
    "no_shard": "drop --fsdp (every device then holds the whole state)",
    "hybrid_shard": "on --backend keras pass --fsdp full_shard with --fsdp_config '{\"mesh\": {\"data\": D, \"fsdp\": F}}'",
    "hybrid_shard_zero2": "on --backend keras pass --fsdp shard_grad_op with --fsdp_config '{\"mesh\": {\"data\": D, "
                          "\"fsdp\": F}}'",
    "offload": "there is no host offload of the XLA step; use --fsdp full_shard alone",
}
#: --fsdp_config keys read on --backend keras; the rest of KNOWN_KEYS is torch_xla's
KERAS_KEYS = ("min_num_params", "mesh")
TORCH_XLA_KEYS = ("min_num_params", "xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "transformer_layer_cls_to_wrap")
MESH_AXES = ("data", "fsdp")


def parse_fsdp(value) -> Optional[str]:
    """``--fsdp`` as a normalized space-separated string (``"full_shard"``, ``"full_shard auto_wrap"``), or None.

    Accepts a string (words separated by spaces or commas), a list of words, or a boolean (true: ``full_shard``,
    transformers' meaning; false or ``""``: off).

    Raises:
        ArgumentError: an option not implemented (named, with what to pass instead), none or two strategies.
    """
    if value is None or value is False:
        return None
    if value is True:
        return "full_shard"
    words = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
    words = [str(w).strip().lower() for w in words if str(w).strip()]
    if not words or words in (["false"], ["none"]):
        return None
    if words == ["true"]:
        return "full_shard"
    for word in words:
        if word in _REFUSED:
            raise ArgumentError(f"--fsdp {word} is not supported: {_REFUSED[word]}.")
        if word not in FSDP_STRATEGIES + ("auto_wrap",):
            raise ArgumentError(f"--fsdp {word!r} is not an FSDP option; choose full_shard or shard_grad_op "
                                "(optionally with auto_wrap).")
    strategies = [w for w in dict.fromkeys(words) if w in FSDP_STRATEGIES]
    if len(strategies) != 1:
        raise ArgumentError(f"--fsdp {' '.join(words)!r} needs exactly one of full_shard or shard_grad_op.")
    return " ".join(dict.fromkeys(words))


def fsdp_strategy(fsdp: Optional[str]) -> Optional[str]:
    """``"full_shard"``, ``"shard_grad_op"`` or None (no ``--fsdp``) of a :func:`parse_fsdp` value."""
    if not fsdp:
        return None
    return next(w for w in fsdp.split() if w in FSDP_STRATEGIES)


def parse_fsdp_config(value) -> Optional[Dict[str, Any]]:
    """``--fsdp_config`` as a dict: a JSON object, a path to a JSON file, or a dict already; None when unset.

    ``fsdp_``-prefixed keys lose the prefix (transformers' rule). ``min_num_params``: an int >= 0; ``mesh``: an
    object of ``data`` and ``fsdp`` sizes, ints >= 1 (a missing one is computed from the device count).

    Raises:
        ArgumentError: an unreadable file, not JSON, not an object, a bad ``min_num_params`` or ``mesh``.
    """
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        data = value
    else:
        text = str(value)
        if not text.lstrip().startswith("{"):
            if not os.path.isfile(text):
                raise ArgumentError(f"--fsdp_config {text!r} is neither a JSON object nor a file; pass e.g. "
                                    "--fsdp_config '{\"min_num_params\": 1000000}' or a JSON file.")
            with open(text, encoding="utf-8") as f:
                text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ArgumentError(f"--fsdp_config is not valid JSON ({err.msg}, line {err.lineno} column {err.colno}).")
        if not isinstance(data, dict):
            raise ArgumentError("--fsdp_config must be a JSON object, e.g. {\"min_num_params\": 1000000}.")
    config = {(k[5:] if k.startswith("fsdp_") else k): v for k, v in data.items()}
    known = dict.fromkeys(KERAS_KEYS + TORCH_XLA_KEYS)
    unknown = [k for k in config if k not in known]
    if unknown:
        raise ArgumentError(f"--fsdp_config key {unknown[0]!r} is not read here; known keys: {', '.join(known)}.")
    minimum = config.get("min_num_params", 0)
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise ArgumentError(f"--fsdp_config min_num_params must be a whole number >= 0, got {minimum!r}.")
    if "mesh" in config:
        _check_mesh(config["mesh"])
    return config


def _check_mesh(mesh) -> None:
    if not isinstance(mesh, dict) or not mesh or any(k not in MESH_AXES for k in mesh):
        raise ArgumentError(f"--fsdp_config mesh must be an object of the axes {' and '.join(MESH_AXES)}, e.g. "
                            f"{{\"data\": 2, \"fsdp\": 4}}; got {json.dumps(mesh)}.")
    for axis, size in mesh.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ArgumentError(f"--fsdp_config mesh {axis} must be a whole number >= 1, got {size!r}.")


def check_fsdp(args) -> None:
    """Normalize ``args.fsdp`` / ``args.fsdp_config`` in place and refuse what the backend cannot do.

    Raises:
        ArgumentError: ``--backend tensorflow`` with ``--fsdp``; ``--fsdp_config`` without ``--fsdp``; keys of
            the other backend; ``shard_grad_op`` or ``mesh`` on torch_xla (FSDPv2 shards everything over every
            device); and what :func:`parse_fsdp` / :func:`parse_fsdp_config` refuse.
    """
    args.fsdp = parse_fsdp(args.fsdp)
    args.fsdp_config = parse_fsdp_config(args.fsdp_config)
    if args.fsdp is None:
        if args.fsdp_config is not None:
            raise ArgumentError("--fsdp_config configures --fsdp: add --fsdp full_shard (or shard_grad_op), or drop "
                                "--fsdp_config.")
        return
    if args.backend == "tensorflow":
        raise ArgumentError("--fsdp is not implemented by --backend tensorflow (its strategies replicate the "
                            "weights); pass --backend keras (or torch_xla), or drop --fsdp.")
    config = args.fsdp_config or {}
    if args.backend == "keras":
        foreign = [k for k in config if k not in KERAS_KEYS]
        if foreign:
            raise ArgumentError(f"--fsdp_config {foreign[0]} is read by --backend torch_xla only; --backend keras "
                                f"reads {', '.join(KERAS_KEYS)}.")
    elif args.backend == "torch_xla":
        if "mesh" in config:
            raise ArgumentError("--fsdp_config mesh is read by --backend keras only (torch_xla's FSDPv2 shards over "
                                "every device); drop it.")
        if fsdp_strategy(args.fsdp) != "full_shard":
            raise ArgumentError("--fsdp shard_grad_op is not available with --backend torch_xla: its FSDPv2 shards "
                                "weights, gradients and optimizer state; pass --fsdp full_shard.")
