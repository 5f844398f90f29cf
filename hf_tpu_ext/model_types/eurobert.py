"""EuroBERT: a Llama-style encoder (RMSNorm, SwiGLU, RoPE from 0, grouped-query attention where the config has
fewer key/value heads), Llama 3's tokenizer kind, an untied output head (``tie_word_embeddings: false``), no
position table (the limit is the declared ``max_position_embeddings``, 8192 by default). The head sizes are read
here because the FLOP count needs them (no framework)."""

from __future__ import annotations

from typing import Optional

from hf_tpu_ext.model_types.record import ModelTypeRecord, check_count_arguments


def head_dim(config) -> int:
    """``config.head_dim`` (transformers 5 sets it), else ``hidden_size // num_attention_heads``."""
    return int(getattr(config, "head_dim", None) or int(config.hidden_size) // int(config.num_attention_heads))


def kv_heads(config) -> int:
    """``num_key_value_heads`` (``None``: one per query head)."""
    return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
    """Training FLOPs (forward + backward) per input token of ``EuroBertForMaskedLM``, PaLM's accounting as
    :func:`.record.encoder_flops_per_token`: ``6 N`` for the layers' matmul parameters, ``12 heads head_dim
    seq_length`` per layer for ``Q K^T`` and ``A V`` (grouped-query attention still scores every query head), the
    head ``6 h V`` (``lm_head`` alone: no dense transform) times ``masked_fraction``; norms, RoPE, softmax ignored.

    Parameters per layer: ``q_proj``/``o_proj`` ``h heads d`` each, ``k_proj``/``v_proj`` ``h kv_heads d`` each,
    SwiGLU ``gate_proj``/``up_proj``/``down_proj`` ``3 h i``.

    Raises:
        ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1].
    """
    check_count_arguments(seq_length, masked_fraction)
    h, inter, vocab = float(config.hidden_size), float(config.intermediate_size), float(config.vocab_size)
    query_width = float(int(config.num_attention_heads) * head_dim(config))
    kv_width = float(kv_heads(config) * head_dim(config))
    layers = float(config.num_hidden_layers)
    per_layer = 2.0 * h * query_width + 2.0 * h * kv_width + 3.0 * h * inter
    head = 6.0 * h * vocab * (1.0 if masked_fraction is None else float(masked_fraction))
    return 6.0 * layers * per_layer + 12.0 * layers * query_width * float(seq_length) + head


RECORD = ModelTypeRecord(
    name="eurobert",
    masked_lm_classes={"eurobert": "EuroBertForMaskedLM"},
    # RoBERTa's 4 x 256 x 4 with EuroBERT's own ratios: SwiGLU 4x wide, one key/value head per query head (as the
    # released 210m/610m), RoPE theta 250000, the head untied
    small_preset=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                      intermediate_size=1024, rope_theta=250000.0, tie_word_embeddings=False),
    tokenizer_kind="llama_bpe",
    backends=("torch_xla", "keras"),  # transformers 4.57 has no EuroBERT (5 has it), and no TF class
    # EuroBertConfig has no hidden dropout: --hidden_dropout_prob sets no field
    flag_fields={"hidden_dropout_prob": (), "attention_probs_dropout_prob": ("attention_dropout",)},
    flops_per_token=flops_per_token,
)
