"""Backend-neutral model configuration: the default small RoBERTa, size overrides, position limits.

Both backends build their model from :func:`build_config`, so the same arguments give the same
architecture whichever backend trains it. No TensorFlow or torch import here.
"""

from __future__ import annotations

from hf_tpu_ext.errors import ArgumentError

# The default when neither model_name_or_path nor config_name is given: small enough to train on a laptop
# CPU in minutes, the shape of the "small" preset.
DEFAULT_SMALL_CONFIG = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=1024,
    layer_norm_eps=1e-5,  # RoBERTa's (RobertaConfig's default is BERT's 1e-12)
)

SIZE_OVERRIDES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "hidden_dropout_prob", "attention_probs_dropout_prob")


def max_sequence_length(config) -> int:
    """Longest input the config's position embeddings allow (RoBERTa reserves ``pad_token_id + 1`` slots)."""
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    if config.model_type in ("roberta", "xlm-roberta", "camembert"):
        return positions - (int(config.pad_token_id if config.pad_token_id is not None else 1) + 1)
    return positions


def check_positions(config, max_seq_length: int) -> None:
    """Raise ``ArgumentError`` when ``max_seq_length`` is longer than the model's positions allow."""
    limit = max_sequence_length(config)
    if max_seq_length > limit:
        raise ArgumentError(
            f"--max_seq_length {max_seq_length} is larger than the model allows ({limit} tokens: "
            f"max_position_embeddings={config.max_position_embeddings}). Use --max_seq_length {limit} or less."
        )


def build_config(model_args, tokenizer, max_seq_length: int):
    """The config of a model trained from scratch: ``config_name`` or the default small RoBERTa, with the size
    overrides of ``model_args`` and the tokenizer's vocabulary and special ids. The default RoBERTa gets
    ``max_seq_length + 2`` positions, or ``model_args.checkpoint_max_position_embeddings`` when a resume set it
    (the checkpoint's, which hold a shorter ``--max_seq_length``).

    Raises:
        ArgumentError: hidden size not a multiple of the heads, or too few positions for ``max_seq_length``.
    """
    from transformers import AutoConfig, RobertaConfig

    if model_args.config_name:
        config = AutoConfig.from_pretrained(model_args.config_name, cache_dir=model_args.cache_dir)
    else:
        config = RobertaConfig(**DEFAULT_SMALL_CONFIG)
    for name in SIZE_OVERRIDES:
        value = getattr(model_args, name)
        if value is not None:
            setattr(config, name, value)
    if config.hidden_size % config.num_attention_heads:
        raise ArgumentError(
            f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads {config.num_attention_heads}."
        )
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    if tokenizer.bos_token_id is not None:
        config.bos_token_id = tokenizer.bos_token_id
    if tokenizer.eos_token_id is not None:
        config.eos_token_id = tokenizer.eos_token_id
    if config.model_type == "roberta":
        # RoBERTa positions start at padding_idx + 1
        if model_args.config_name:
            config.max_position_embeddings = max(config.max_position_embeddings or 0, max_seq_length + 2)
        else:  # the default config gets exactly the positions it is trained on (a resumed one: the checkpoint's)
            resumed = getattr(model_args, "checkpoint_max_position_embeddings", None)
            config.max_position_embeddings = int(resumed) if resumed else max_seq_length + 2
        config.type_vocab_size = 1
    check_positions(config, max_seq_length)
    return config


def dropout_overrides(model_args) -> dict:
    """Dropout overrides for a model loaded from ``model_name_or_path`` (size overrides don't apply there)."""
    return {name: getattr(model_args, name) for name in ("hidden_dropout_prob", "attention_probs_dropout_prob")
            if getattr(model_args, name) is not None}


def model_summary_fields(config, num_parameters: int) -> dict:
    """``num_parameters``, ``model_type`` and ``model_config`` sizes, for ``training_summary.json`` and the card."""
    return {
        "num_parameters": int(num_parameters),
        "model_type": config.model_type,
        "model_config": {k: getattr(config, k, None) for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "hidden_dropout_prob", "attention_probs_dropout_prob")},
    }
