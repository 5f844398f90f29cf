"""RoBERTa (and checkpoints of the same weights: XLM-RoBERTa, CamemBERT): byte-level BPE, positions numbered from
``pad_token_id + 1``, one token type."""

from hf_tpu_ext.model_types.record import ModelTypeRecord


def reserved_positions(config) -> int:
    """RoBERTa's position ids start at ``padding_idx + 1`` (``pad_token_id``, 1 when unset)."""
    pad = getattr(config, "pad_token_id", None)
    return int(1 if pad is None else pad) + 1


RECORD = ModelTypeRecord(
    name="roberta",
    masked_lm_classes={"roberta": "RobertaForMaskedLM", "xlm-roberta": "XLMRobertaForMaskedLM",
                       "camembert": "CamembertForMaskedLM"},
    # 4 layers x 256 x 4 heads, FFN 1024; RobertaConfig's default eps is BERT's 1e-12, RoBERTa's own is 1e-5.
    # No max_position_embeddings: the run sets it (max_seq_length + 2, positions_fit_run).
    small_preset=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                      layer_norm_eps=1e-5),
    tokenizer_kind="byte_level_bpe",
    backends=("tensorflow", "torch_xla", "keras"),
    reserved_positions=reserved_positions,
    positions_fit_run=True,
    scratch_fields={"type_vocab_size": 1},
    same_positions=("roberta-prelayernorm",),
)
