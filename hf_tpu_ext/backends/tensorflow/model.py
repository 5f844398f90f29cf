"""The masked language model and its loss, computed only where tokens are masked.

The model object is a stock :class:`transformers.TFRobertaForMaskedLM`, so ``save``/export, the
fill-mask pipeline and the Hub widget work unchanged. Training does not call its ``call`` though: the
vocabulary projection (hidden x vocab per position, the largest matmul of a small model) is applied only
at the ``P = max_predictions_per_seq`` masked positions of each sequence, as BERT's original TPU code
(``get_masked_lm_output``) and keras-hub's ``MaskedLMHead(mask_positions=...)`` do. The loss is the same
mean cross-entropy over masked tokens as the stock model's ``labels=-100`` loss.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import tensorflow as tf

DEFAULT_SMALL_CONFIG = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=1024,
)


def build_model(model_args, tokenizer, max_seq_length: int, seed: Optional[int] = None):
    """Create the TF masked LM: from ``model_name_or_path``, or from a config (default: small RoBERTa).

    Args:
        model_args: :class:`hf_tpu_ext.args.ModelArguments`.
        tokenizer: the tokenizer the model is trained with (its vocab size and special ids fill the config).
        max_seq_length: tokens per block; RoBERTa needs ``max_position_embeddings >= max_seq_length + 2``.
        seed: seeds weight initialization when training from scratch.

    Returns:
        A built ``TFRobertaForMaskedLM`` (or ``TFAutoModelForMaskedLM`` for other architectures).

    Raises:
        ArgumentError: ``max_seq_length`` exceeds what the model's position embeddings allow.
    """
    from transformers import AutoConfig, RobertaConfig, TFAutoModelForMaskedLM

    from hf_tpu_ext.errors import ArgumentError

    if model_args.model_name_or_path:
        from hf_tpu_ext.backends.tensorflow.export import load_tf_model

        overrides = {}
        if model_args.hidden_dropout_prob is not None:
            overrides["hidden_dropout_prob"] = model_args.hidden_dropout_prob
        if model_args.attention_probs_dropout_prob is not None:
            overrides["attention_probs_dropout_prob"] = model_args.attention_probs_dropout_prob
        model = load_tf_model(model_args.model_name_or_path, revision=model_args.model_revision, **overrides)
        check_positions(model.config, max_seq_length)
        return model

    if model_args.config_name:
        config = AutoConfig.from_pretrained(model_args.config_name, cache_dir=model_args.cache_dir)
    else:
        config = RobertaConfig(**DEFAULT_SMALL_CONFIG)
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "hidden_dropout_prob", "attention_probs_dropout_prob"):
        value = getattr(model_args, name)
        if value is not None:
            setattr(config, name, value)
    if config.hidden_size % config.num_attention_heads:
        raise ArgumentError(
            f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads {config.num_attention_heads}."
        )
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    if config.model_type == "roberta":
        # RoBERTa positions start at padding_idx + 1
        if model_args.config_name:
            config.max_position_embeddings = max(config.max_position_embeddings or 0, max_seq_length + 2)
        else:  # the default config gets exactly the positions it is trained on
            config.max_position_embeddings = max_seq_length + 2
        config.type_vocab_size = 1
    check_positions(config, max_seq_length)
    if seed is not None:
        tf.keras.utils.set_random_seed(seed)
        import tf_keras

        tf_keras.utils.set_random_seed(seed)
    model = TFAutoModelForMaskedLM.from_config(config)
    model(model.dummy_inputs, training=False)
    return model


def max_sequence_length(config) -> int:
    """Longest input the config's position embeddings allow (RoBERTa reserves ``pad_token_id + 1`` slots)."""
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    if config.model_type in ("roberta", "xlm-roberta", "camembert"):
        return positions - (int(config.pad_token_id or 1) + 1)
    return positions


def check_positions(config, max_seq_length: int) -> None:
    """Raise ``ArgumentError`` when ``max_seq_length`` is longer than the model's positions allow."""
    from hf_tpu_ext.errors import ArgumentError

    limit = max_sequence_length(config)
    if max_seq_length > limit:
        raise ArgumentError(
            f"--max_seq_length {max_seq_length} is larger than the model allows ({limit} tokens: "
            f"max_position_embeddings={config.max_position_embeddings}). Use --max_seq_length {limit} or less."
        )


def masked_lm_logits(model, batch: Dict[str, tf.Tensor], training: bool = False) -> tf.Tensor:
    """Vocabulary logits at the masked positions only.

    Args:
        model: a ``TFRobertaForMaskedLM`` (anything with ``.roberta`` and ``.lm_head`` like it).
        batch: the training batch dict (see ARCHITECTURE.md): ``input_ids``/``attention_mask`` int32 [B, L],
            ``masked_lm_positions`` int32 [B, P].
        training: dropout on/off.

    Returns:
        float logits [B, P, vocab_size] (float32, or the compute dtype under mixed precision).
    """
    encoder = getattr(model, model.base_model_prefix)
    hidden = encoder(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training
    )[0]  # [B, L, H]
    gathered = tf.gather(hidden, batch["masked_lm_positions"], batch_dims=1)  # [B, P, H]
    return model.lm_head(gathered, training=training)


def masked_lm_sums(model, batch: Dict[str, tf.Tensor], training: bool = False) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Sums for the masked-LM loss and accuracy of one (per-replica) batch.

    Returns:
        ``(loss_sum, num_correct, num_tokens)``, float32 scalars: the summed cross-entropy (nats) over the
        masked tokens, how many of them the argmax predicts right, and how many there are
        (``sum(masked_lm_weights)``). Mean loss = ``loss_sum / num_tokens``; perplexity = ``exp`` of it.
    """
    logits = tf.cast(masked_lm_logits(model, batch, training=training), tf.float32)
    labels = batch["masked_lm_ids"]
    weights = tf.cast(batch["masked_lm_weights"], tf.float32)
    token_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)  # [B, P]
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
    return tf.reduce_sum(token_loss * weights), tf.reduce_sum(correct * weights), tf.reduce_sum(weights)


def count_parameters(model) -> int:
    """Number of trainable parameters (tied embeddings counted once)."""
    seen, total = set(), 0
    for w in model.trainable_weights:
        if id(w) in seen:
            continue
        seen.add(id(w))
        total += int(w.shape.num_elements())
    return total
