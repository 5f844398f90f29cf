"""ModernBERT's transformers config as the Keras layers read it, its name table and its FLOP count (no Keras/JAX).

transformers 4.57 and 5 store the same model with different config fields: 4.57 has ``global_attn_every_n_layers``,
``global_rope_theta`` and ``local_rope_theta`` (``None``: the global theta); 5 turns them into ``layer_types``
(``"full_attention"`` / ``"sliding_attention"`` per layer) and ``rope_parameters`` (``{"full_attention":
{"rope_type", "rope_theta"}, "sliding_attention": {...}}``). :func:`layer_types` and :func:`rope_thetas` read
either. The weights (``ModernBertForMaskedLM.state_dict()``) have the same names and shapes in both versions.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Tuple

from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.model_config import SMALL_PRESETS

logger = logging.getLogger(__name__)

FULL, SLIDING = "full_attention", "sliding_attention"
#: transformers ``ACT2FN`` names this module computes -> Keras ``gelu``'s ``approximate`` flag (exact: erf;
#: ``gelu_pytorch_tanh``/``gelu_new``: the tanh formula of Hendrycks & Gimpel 2016, which both sides compute)
ACTIVATIONS = {"gelu": False, "gelu_pytorch_tanh": True, "gelu_new": True}
#: Layout kinds: ``SAME`` (identical arrays) or ``LINEAR`` (Keras ``Dense`` kernel ``[in, out]`` <-> torch
#: ``Linear.weight`` ``[out, in]``)
SAME, LINEAR = "same", "linear"


def default_config() -> Dict[str, Any]:
    """``ModernBertConfig`` keyword arguments of the small preset: 4 layers x 256 wide, 4 heads (the RoBERTa
    preset's 4 x 256 x 4), GeGLU ``intermediate_size`` 512 (``Wi`` is ``[256, 1024]``, so the MLP holds 393k
    parameters against RoBERTa's 524k at 1024), ``local_attention`` 128 with layers 0 and 3 global (ModernBERT's
    ``global_attn_every_n_layers`` 3). Everything else is ``ModernBertConfig``'s default (no biases but the
    decoder's, exact GELU, ``norm_eps`` 1e-5, thetas 160000 global / 10000 local)."""
    return dict(SMALL_PRESETS["modernbert"])  # the presets' one owner: model_config


def layer_types(config) -> List[str]:
    """``"full_attention"`` or ``"sliding_attention"`` per layer: transformers 5's ``layer_types``, else 4.57's rule
    (layer ``i`` is global when ``i % global_attn_every_n_layers == 0``)."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    every = int(getattr(config, "global_attn_every_n_layers", 3))
    return [FULL if i % every == 0 else SLIDING for i in range(int(config.num_hidden_layers))]


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


def half_window(config) -> int:
    """Keys a local layer's query sees on each side: ``local_attention // 2`` (transformers' ``sliding_window``;
    its mask keeps ``|query - key| <= local_attention // 2``, both versions)."""
    return int(config.local_attention) // 2


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


def max_sequence_length(config) -> int:
    """``max_position_embeddings``: RoPE has no table, this is the length the config declares (8192 by default)."""
    return int(config.max_position_embeddings)


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


def flops_per_token(config, seq_length: int, masked_fraction=None) -> float:
    """Training FLOPs (forward + backward) per input token of ``ModernBertForMaskedLM``, PaLM's accounting as
    :func:`hf_tpu_ext.flops.flops_per_token` (``6 N`` for the matmul parameters, ``12 h keys`` per layer for
    ``Q K^T`` and ``A V``, the head ``6 (h^2 + h V)`` times ``masked_fraction``; norms, RoPE, softmax ignored).

    ModernBERT's parameters per layer: ``Wqkv`` ``[h, 3h]``, ``Wo`` ``[h, h]``, GeGLU ``Wi`` ``[h, 2i]``, ``Wo``
    ``[i, h]``: ``N_layer = 4 h^2 + 3 h i``. Keys per query: ``seq_length`` on a global layer; on a local layer
    ``min(2 * (local_attention // 2) + 1, seq_length)``, the window of a query away from the sequence's ends
    (``|q - k| <= local_attention // 2``; queries near an end see fewer, not counted: an upper bound, high by about
    ``local_attention / (4 seq_length)`` of the local layers' attention FLOPs when ``seq_length > local_attention``).
    What the Keras backend computes (``attention.py``): a global layer's chunked or dense kernel scores exactly
    ``seq_length`` keys per query, as counted; a local layer's block-local kernel scores ``3 block`` keys (block:
    ``half_window`` rounded up to 8, 192 for ModernBERT's 129), of which the window's are counted (the useful work,
    as PaLM's MFU leaves recomputation out); before that kernel every local layer scored all ``seq_length``.

    Raises:
        ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1] (as the shared count).
    """
    from hf_tpu_ext.errors import ArgumentError

    if seq_length < 1:
        raise ArgumentError(f"seq_length must be >= 1, got {seq_length}.")
    if masked_fraction is not None and not 0.0 <= masked_fraction <= 1.0:
        raise ArgumentError(f"masked_fraction must be in [0, 1] (or None for every position), got {masked_fraction}.")
    h, inter, vocab = float(config.hidden_size), float(config.intermediate_size), float(config.vocab_size)
    window = min(2 * half_window(config) + 1, int(seq_length))
    keys = [float(seq_length if kind == FULL else window) for kind in layer_types(config)]
    parameters = len(keys) * (4.0 * h * h + 3.0 * h * inter)
    attention = sum(12.0 * h * k for k in keys)
    head = 6.0 * (h * h + h * vocab) * (1.0 if masked_fraction is None else float(masked_fraction))
    return 6.0 * parameters + attention + head
