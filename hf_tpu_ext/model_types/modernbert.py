"""ModernBERT (and Ettin, mmBERT: the same ``model_type``): a cased byte-level BPE with ``[CLS]``-style specials,
rotary positions (no table: the limit is the declared ``max_position_embeddings``), alternating global and local
attention, GeGLU. Layer kinds and the window are read here because the FLOP count needs them (no framework).
"""

from __future__ import annotations

from typing import List, Optional

from hf_tpu_ext.model_types.record import ModelTypeRecord, check_count_arguments, head_flops

FULL, SLIDING = "full_attention", "sliding_attention"


def layer_types(config) -> List[str]:
    """``"full_attention"`` or ``"sliding_attention"`` per layer: transformers 5's ``layer_types``, else 4.57's rule
    (layer ``i`` is global when ``i % global_attn_every_n_layers == 0``)."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    every = int(getattr(config, "global_attn_every_n_layers", 3))
    return [FULL if i % every == 0 else SLIDING for i in range(int(config.num_hidden_layers))]


def half_window(config) -> int:
    """Keys a local layer's query sees on each side: ``local_attention // 2`` (transformers' ``sliding_window``;
    its mask keeps ``|query - key| <= local_attention // 2``, both versions)."""
    return int(config.local_attention) // 2


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs (forward + backward) per input token of ``ModernBertForMaskedLM``, PaLM's accounting as
    :func:`.record.encoder_flops_per_token` (``6 N`` for the matmul parameters, ``12 h keys`` per layer for
    ``Q K^T`` and ``A V``, the head ``6 (h^2 + h V)`` times ``masked_fraction``; norms, RoPE, softmax ignored).

    ModernBERT's parameters per layer: ``Wqkv`` ``[h, 3h]``, ``Wo`` ``[h, h]``, GeGLU ``Wi`` ``[h, 2i]``, ``Wo``
    ``[i, h]``: ``N_layer = 4 h^2 + 3 h i``. Keys per query: ``seq_length`` on a global layer; on a local layer
    ``min(2 * (local_attention // 2) + 1, seq_length)``, the window of a query away from the sequence's ends
    (``|q - k| <= local_attention // 2``; queries near an end see fewer, not counted: an upper bound, high by about
    ``local_attention / (4 seq_length)`` of the local layers' attention FLOPs when ``seq_length > local_attention``).
    What the Keras backend computes (``backends/keras/architectures/attention.py``): a global layer's chunked or
    dense kernel scores exactly ``seq_length`` keys per query, as counted; a local layer's block-local kernel scores
    ``3 block`` keys (block: ``half_window`` rounded up to 8, 192 for ModernBERT's 129), of which the window's are
    counted (the useful work, as PaLM's MFU leaves recomputation out); before that kernel every local layer scored
    all ``seq_length``.

    Raises:
        ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1] (as the shared count).
    """
    check_count_arguments(seq_length, masked_fraction)
    h, inter = float(config.hidden_size), float(config.intermediate_size)
    window = min(2 * half_window(config) + 1, int(seq_length))
    keys = [float(seq_length if kind == FULL else window) for kind in layer_types(config)]
    parameters = len(keys) * (4.0 * h * h + 3.0 * h * inter)
    attention = sum(12.0 * h * k for k in keys)
    return 6.0 * parameters + attention + head_flops(config, masked_fraction)


RECORD = ModelTypeRecord(
    name="modernbert",
    masked_lm_classes={"modernbert": "ModernBertForMaskedLM"},
    # 4 x 256 x 4 as RoBERTa's; GeGLU intermediate 512 (Wi [256, 1024]: 393k MLP parameters against RoBERTa's
    # 524k); a 128-token local window with every third layer global; positions: the class default 8192 (rotary)
    small_preset=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
                      local_attention=128, global_attn_every_n_layers=3),
    tokenizer_kind="bracket_bpe",
    backends=("torch_xla", "keras"),  # transformers 4.57 has no TF ModernBERT
    flag_fields={"hidden_dropout_prob": ("embedding_dropout", "mlp_dropout"),
                 "attention_probs_dropout_prob": ("attention_dropout",)},
    flops_per_token=flops_per_token,
)
