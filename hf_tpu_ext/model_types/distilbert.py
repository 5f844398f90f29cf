"""DistilBERT: BERT's WordPiece, its own config names (``dim``, ``n_layers``, ``n_heads``, ``hidden_dim``,
``dropout``, ``attention_dropout``)."""

from hf_tpu_ext.model_types.record import ModelTypeRecord

RECORD = ModelTypeRecord(
    name="distilbert",
    masked_lm_classes={"distilbert": "DistilBertForMaskedLM"},
    small_preset=dict(dim=256, n_layers=4, n_heads=4, hidden_dim=1024, max_position_embeddings=512),
    tokenizer_kind="wordpiece",
    backends=("tensorflow", "torch_xla", "keras"),
    flag_fields={"hidden_size": ("dim",), "num_hidden_layers": ("n_layers",), "num_attention_heads": ("n_heads",),
                 "intermediate_size": ("hidden_dim",), "hidden_dropout_prob": ("dropout",),
                 "attention_probs_dropout_prob": ("attention_dropout",)},
)
