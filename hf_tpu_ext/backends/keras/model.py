"""RoBERTa masked LM of the Keras backend: keras-hub's ``RobertaMaskedLM`` itself, built from a transformers config.

CONTRACT (with ``export.py`` -> transformers safetensors / keras-hub preset, and ``hf_convert.py`` <- transformers):

* The training model IS a ``keras_hub.models.RobertaMaskedLM`` (``preprocessor=None``): a
  ``keras_hub.models.RobertaBackbone`` (``backbone``) and keras-hub's ``MaskedLMHead`` (``masked_lm_head``, layer
  name ``"mlm_head"``) whose output projection is tied to ``backbone.token_embedding`` (the head has its own
  ``_intermediate_dense``, ``_intermediate_layer_norm`` and ``_bias``). Its weight layout is keras-hub's, so
  :func:`to_keras_hub_masked_lm` returns the model itself and :func:`load_from_keras_hub_masked_lm` copies the
  weights of any ``RobertaMaskedLM`` of the same shape into it.
* Inputs: ``{"token_ids": int32 [B, L], "padding_mask": int32 [B, L], "mask_positions": int32 [B, P]}``;
  output: logits ``[B, P, vocab]`` (compute dtype: bfloat16 under ``--bf16``, variables always float32). The
  head runs only at ``mask_positions`` (the training batch's ``masked_lm_positions``).
* Shape mapping from the transformers ``RobertaConfig`` (:func:`backbone_kwargs`): ``vocabulary_size =
  vocab_size``, ``num_layers = num_hidden_layers``, ``num_heads = num_attention_heads``, ``hidden_dim =
  hidden_size``, ``intermediate_dim = intermediate_size``, ``dropout = hidden_dropout_prob``,
  ``max_sequence_length = max_position_embeddings - 2`` (keras-hub positions start at 0, transformers' RoBERTa
  at ``padding_idx + 1 = 2``; the converters shift the position table by 2 rows). keras-hub's RoBERTa has no
  token-type embedding (transformers' ``type_vocab_size`` 1: the export writes zeros) and LayerNorm epsilon
  1e-5 (the default config's; a config with another ``layer_norm_eps`` trains with 1e-5).
  ``attention_probs_dropout_prob`` is set on each attention layer's dropout after the build.
* The transformers config the run records (``config.json``, the card, the FLOPs count) is the one
  :func:`hf_tpu_ext.model_config.build_config` makes, kept beside the model as :attr:`KerasMaskedLM.config`.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

logger = logging.getLogger("hf_tpu_ext")


def backbone_kwargs(config) -> Dict[str, Any]:
    """``keras_hub.models.RobertaBackbone`` arguments of a transformers ``RobertaConfig`` (see the module doc)."""
    return dict(vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
                num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
                intermediate_dim=int(config.intermediate_size), dropout=float(config.hidden_dropout_prob),
                max_sequence_length=int(config.max_position_embeddings) - 2)


def build_masked_lm(config, dtype: str = "float32", seed: Optional[int] = None):
    """A new ``keras_hub.models.RobertaMaskedLM`` of ``config``'s shape (weights from keras-hub's initializers).

    Args:
        config: a transformers ``RobertaConfig`` (:func:`hf_tpu_ext.model_config.build_config`).
        dtype: Keras dtype policy: ``"float32"``, or ``"mixed_bfloat16"`` (bfloat16 compute, float32 variables).
        seed: seeds the initializers (``keras.utils.set_random_seed``).

    Returns:
        the masked LM; ``model.config`` is ``config``.

    Raises:
        ArgumentError: ``config.model_type`` is not ``roberta``.
    """
    import keras
    import keras_hub

    from hf_tpu_ext.errors import ArgumentError

    if getattr(config, "model_type", "roberta") != "roberta":
        raise ArgumentError(f"--backend keras trains RoBERTa models; the config is a {config.model_type!r} model. "
                            "Use --backend tensorflow for other encoders.")
    if seed is not None:
        keras.utils.set_random_seed(int(seed))
    backbone = keras_hub.models.RobertaBackbone(**backbone_kwargs(config), dtype=dtype)
    attention_dropout = float(getattr(config, "attention_probs_dropout_prob", config.hidden_dropout_prob))
    for layer in backbone.transformer_layers:
        # keras-hub uses one rate for both; transformers' attention-probability dropout is its own
        inner = getattr(getattr(layer, "_self_attention_layer", None), "_dropout_layer", None)
        if inner is not None:
            inner.rate = attention_dropout
    model = keras_hub.models.RobertaMaskedLM(backbone=backbone, preprocessor=None)
    model.config = config
    return model


def to_keras_hub_masked_lm(model):
    """The ``keras_hub.models.RobertaMaskedLM`` of a training model: the model itself (see the module doc)."""
    return model


def load_from_keras_hub_masked_lm(model, masked_lm) -> None:
    """Copy every weight of a ``keras_hub.models.RobertaMaskedLM`` into the training ``model`` (same shapes).

    Raises:
        ValueError: the two models differ in their variables' count or shapes.
    """
    source, target = masked_lm.weights, model.weights
    if len(source) != len(target) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(source, target)):
        raise ValueError("the keras-hub RobertaMaskedLM does not have the training model's shape: "
                         f"{len(source)} vs {len(target)} variables.")
    for src, dst in zip(source, target):
        dst.assign(src.value)


def load_pretrained(model_name_or_path: str, dtype: str, revision: Optional[str] = None,
                    overrides: Optional[Dict[str, Any]] = None):
    """The masked LM of a transformers RoBERTa checkpoint (a folder or Hub repo), through ``hf_convert``.

    Returns:
        ``(model, config)``.

    Raises:
        ArgumentError: the checkpoint is not a RoBERTa model.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_name_or_path, revision=revision)
    for name, value in (overrides or {}).items():
        setattr(config, name, value)
    model = build_masked_lm(config, dtype=dtype)
    # H2's converter (transformers weights -> this model's keras-hub layout)
    from hf_tpu_ext.backends.keras.hf_convert import load_transformers_weights

    load_transformers_weights(model, model_name_or_path, revision=revision)
    return model, config


def count_parameters(model) -> int:
    """Trainable parameters (the tied embedding counted once: it is one variable)."""
    return int(sum(int(_size(v.shape)) for v in model.trainable_variables))


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
