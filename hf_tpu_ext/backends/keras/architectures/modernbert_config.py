"""ModernBERT's transformers config as the Keras layers read it and its name table (no Keras/JAX); the layer kinds,
the window and the FLOP count are the record's (:mod:`hf_tpu_ext.model_types.modernbert`).

transformers 4.57 and 5 store the same model with different config fields: 4.57 has ``global_attn_every_n_layers``,
``global_rope_theta`` and ``local_rope_theta`` (``None``: the global theta); 5 turns them into ``layer_types``
(``"full_attention"`` / ``"sliding_attention"`` per layer) and ``rope_parameters`` (``{"full_attention":
{"rope_type", "rope_theta"}, "sliding_attention": {...}}``). :func:`layer_types` and :func:`rope_thetas` read
either. The weights (``ModernBertForMaskedLM.state_dict()``) have the same names and shapes in both versions.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Tuple

from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.model_types.modernbert import FULL, SLIDING, half_window, layer_types  # noqa: F401 (the layers')

logger = logging.getLogger(__name__)

#: transformers ``ACT2FN`` names this module computes -> Keras ``gelu``'s ``approximate`` flag (exact: erf;
#: ``gelu_pytorch_tanh``/``gelu_new``: the tanh formula of Hendrycks & Gimpel 2016, which both sides compute)
ACTIVATIONS = {"gelu": False, "gelu_pytorch_tanh": True, "gelu_new": True}
#: Layout kinds: ``SAME`` (identical arrays) or ``LINEAR`` (Keras ``Dense`` kernel ``[in, out]`` <-> torch
#: ``Linear.weight`` ``[out, in]``)
SAME, LINEAR = "same", "linear"


def rope_thetas(config) -> Dict[str, float]:
    """``{"full_attention": theta, "sliding_attention": theta}``: transformers 5's ``rope_parameters``, else
    4.57's ``global_rope_theta`` / ``local_rope_theta`` (a ``None`` local theta is the global one, as 4.57 reads it)."""
    params = getattr(config, "rope_parameters", None) or {}
    global_theta = float(getattr(config, "global_rope_theta", None) or 160000.0)
    local_theta = getattr(config, "local_rope_theta", None)
    thetas = {FULL: global_theta, SLIDING: float(global_theta if local_theta is None else local_theta)}
    for kind in (FULL, SLIDING):
        if isinstance(params.get(kind), dict) and params[kind].get("rope_theta") is not None:
            thetas[kind] = float(params[kind]["rope_theta"])
    return thetas


def check_config(config) -> None:
    """Raise ``CheckpointError`` naming the field when ``config`` is a ModernBERT this module cannot compute."""
    if getattr(config, "model_type", "modernbert") != "modernbert":
        raise CheckpointError(f"model_type {config.model_type!r} is not 'modernbert'.")
    for field in ("hidden_activation", "classifier_activation"):
        value = getattr(config, field, "gelu")
        if value not in ACTIVATIONS:
            raise CheckpointError(f"{field}={value!r} is not supported by --backend keras's ModernBERT "
                                  f"(supported: {', '.join(ACTIVATIONS)}). Use --backend torch_xla for this model.")
    if int(config.hidden_size) % int(config.num_attention_heads):
        raise CheckpointError(f"hidden_size={config.hidden_size} is not a multiple of num_attention_heads="
                              f"{config.num_attention_heads}.")
    types = layer_types(config)
    if len(types) != int(config.num_hidden_layers) or set(types) - {FULL, SLIDING}:
        raise CheckpointError(f"layer_types={types!r} must give {FULL!r} or {SLIDING!r} for each of the "
                              f"{config.num_hidden_layers} layers.")
    for kind, params in (getattr(config, "rope_parameters", None) or {}).items():
        if isinstance(params, dict) and params.get("rope_type", "default") != "default":
            raise CheckpointError(f"rope_parameters[{kind!r}].rope_type={params['rope_type']!r} is not supported "
                                  "by --backend keras's ModernBERT (only 'default' RoPE).")


def name_table(config) -> List[Tuple[str, str, str]]:
    """Every weight of ``ModernBertForMaskedLM.state_dict()`` but the tied ``decoder.weight``: ``(transformers
    name, attribute path in :class:`~.modernbert.ModernBertMaskedLM` (a digit indexes a list), layout kind)``.
    Bias rows appear only when the config's ``norm_bias`` / ``attention_bias`` / ``mlp_bias`` /
    ``classifier_bias`` / ``decoder_bias`` flag is on, and layer 0 has no ``attn_norm`` (transformers' Identity)."""
    def norm(hf: str, own: str) -> List[Tuple[str, str, str]]:
        return [(f"{hf}.weight", f"{own}.gamma", SAME)] + (
            [(f"{hf}.bias", f"{own}.beta", SAME)] if config.norm_bias else [])

    def linear(hf: str, own: str, bias: bool) -> List[Tuple[str, str, str]]:
        return [(f"{hf}.weight", f"{own}.kernel", LINEAR)] + ([(f"{hf}.bias", f"{own}.bias", SAME)] if bias else [])

    rows = [("model.embeddings.tok_embeddings.weight", "backbone.embeddings.tok_embeddings.embeddings", SAME)]
    rows += norm("model.embeddings.norm", "backbone.embeddings.norm")
    for i in range(int(config.num_hidden_layers)):
        hf, own = f"model.layers.{i}", f"backbone.encoder_layers.{i}"
        if i > 0:
            rows += norm(f"{hf}.attn_norm", f"{own}.attn_norm")
        rows += linear(f"{hf}.attn.Wqkv", f"{own}.attn.Wqkv", bool(config.attention_bias))
        rows += linear(f"{hf}.attn.Wo", f"{own}.attn.Wo", bool(config.attention_bias))
        rows += norm(f"{hf}.mlp_norm", f"{own}.mlp_norm")
        rows += linear(f"{hf}.mlp.Wi", f"{own}.mlp.Wi", bool(config.mlp_bias))
        rows += linear(f"{hf}.mlp.Wo", f"{own}.mlp.Wo", bool(config.mlp_bias))
    rows += norm("model.final_norm", "backbone.final_norm")
    rows += linear("head.dense", "head.dense", bool(config.classifier_bias))
    rows += norm("head.norm", "head.norm")
    if config.decoder_bias:
        rows.append(("decoder.bias", "decoder_bias", SAME))
    return rows
