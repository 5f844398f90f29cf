"""The masked language model and its loss, computed only where tokens are masked.

The model object is a stock :class:`transformers.TFRobertaForMaskedLM`, so ``save``/export, the
fill-mask pipeline and the Hub widget work unchanged. Training does not call its ``call`` though: the
vocabulary projection (hidden x vocab per position, the largest matmul of a small model) is applied only
at the ``P = max_predictions_per_seq`` masked positions of each sequence, as BERT's original TPU code
(``get_masked_lm_output``) and keras-hub's ``MaskedLMHead(mask_positions=...)`` do. The loss is the same
mean cross-entropy over masked tokens as the stock model's ``labels=-100`` loss.
"""

from __future__ import annotations

from typing import Optional


# the masked-position loss lives with the evaluation code (callbacks use it without importing a backend)
from hf_tpu_ext.metrics.masked_lm_tf import masked_lm_logits, masked_lm_sums  # noqa: F401
from hf_tpu_ext.model_config import build_config, check_positions, dropout_overrides


def build_model(model_args, tokenizer, max_seq_length: int, seed: Optional[int] = None):
    """Create the TF masked LM: from ``model_name_or_path``, or from :func:`hf_tpu_ext.model_config.build_config`.

    Args:
        model_args: :class:`hf_tpu_ext.args.ModelArguments`.
        tokenizer: the tokenizer the model is trained with (its vocab size and special ids fill the config).
        max_seq_length: tokens per block; RoBERTa needs ``max_position_embeddings >= max_seq_length + 2``.
        seed: seeds weight initialization when training from scratch.

    Returns:
        A built ``TFRobertaForMaskedLM``, ``TFBertForMaskedLM`` or ``TFDistilBertForMaskedLM`` (``TFAutoModelForMaskedLM``).

    Raises:
        ArgumentError: ``max_seq_length`` exceeds what the model's position embeddings allow.
    """
    from transformers import TFAutoModelForMaskedLM

    if model_args.model_name_or_path:
        from hf_tpu_ext.backends.tensorflow.export import load_tf_model  # transformers' TF classes: only here

        model = load_tf_model(model_args.model_name_or_path, revision=model_args.model_revision,
                              **dropout_overrides(model_args, _model_type(model_args)))
        check_positions(model.config, max_seq_length)
        return model

    config = build_config(model_args, tokenizer, max_seq_length)
    if seed is not None:
        import tf_keras

        tf_keras.utils.set_random_seed(seed)
    model = TFAutoModelForMaskedLM.from_config(config)
    model(model.dummy_inputs, training=False)
    return model


def _model_type(model_args):
    """``model_type`` of ``--model_name_or_path``'s config (``None`` when it cannot be read here: the loader says
    why), so the dropout flags reach DistilBERT's ``dropout``/``attention_dropout``."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                          cache_dir=model_args.cache_dir).model_type
    except (OSError, ValueError):
        return None


def count_parameters(model) -> int:
    """Number of trainable parameters (tied embeddings counted once)."""
    seen, total = set(), 0
    for w in model.trainable_weights:
        if id(w) in seen:
            continue
        seen.add(id(w))
        total += int(w.shape.num_elements())
    return total
