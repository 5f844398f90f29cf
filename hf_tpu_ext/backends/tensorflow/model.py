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

from hf_tpu_ext.model_config import build_config, check_positions, dropout_overrides


def build_model(model_args, tokenizer, max_seq_length: int, seed: Optional[int] = None):
    """Create the TF masked LM: from ``model_name_or_path``, or from :func:`hf_tpu_ext.model_config.build_config`.

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
    from transformers import TFAutoModelForMaskedLM

    if model_args.model_name_or_path:
        from hf_tpu_ext.backends.tensorflow.export import load_tf_model

        model = load_tf_model(model_args.model_name_or_path, revision=model_args.model_revision,
                              **dropout_overrides(model_args))
        check_positions(model.config, max_seq_length)
        return model

    config = build_config(model_args, tokenizer, max_seq_length)
    if seed is not None:
        import tf_keras

        tf_keras.utils.set_random_seed(seed)
    model = TFAutoModelForMaskedLM.from_config(config)
    model(model.dummy_inputs, training=False)
    return model


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
