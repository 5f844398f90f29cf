"""BERT: WordPiece, 512 learned positions from 0, two token types."""

from hf_tpu_ext.model_types.record import ModelTypeRecord

RECORD = ModelTypeRecord(
    name="bert",
    masked_lm_classes={"bert": "BertForMaskedLM"},
    small_preset=dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                      max_position_embeddings=512),
    tokenizer_kind="wordpiece",
    backends=("tensorflow", "torch_xla", "keras"),
)
