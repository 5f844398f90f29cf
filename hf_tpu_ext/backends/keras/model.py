"""RoBERTa masked LM of the Keras backend: :class:`~hf_tpu_ext.backends.keras.roberta.RobertaMaskedLM` (Keras 3
layers, no keras-hub, no TensorFlow), built from a transformers config.

CONTRACT (with ``export.py`` -> transformers safetensors / optional keras-hub preset, and ``hf_convert.py`` <-
transformers):

* The training model is ``roberta.RobertaMaskedLM``: ``backbone`` (token + position embeddings, LayerNorm,
  ``num_layers`` post-LN encoder layers with exact GELU) and ``masked_lm_head`` whose output projection is the
  backbone's ``token_embedding`` (one variable). Its weights map to transformers and to keras-hub's
  ``RobertaMaskedLM`` through ``hf_convert.py``'s one table: :func:`to_keras_hub_masked_lm` builds the keras-hub
  model of the same weights (keras-hub needed), :func:`load_from_keras_hub_masked_lm` copies one back.
* Inputs: ``{"token_ids": int32 [B, L], "padding_mask": int32 [B, L], "mask_positions": int32 [B, P]}``;
  output: logits ``[B, P, vocab]`` (compute dtype: bfloat16 under ``--bf16``, variables always float32). The
  head runs only at ``mask_positions`` (the training batch's ``masked_lm_positions``).
* Shape mapping from the transformers ``RobertaConfig`` (:func:`backbone_kwargs`): ``vocabulary_size =
  vocab_size``, ``num_layers = num_hidden_layers``, ``num_heads = num_attention_heads``, ``hidden_dim =
  hidden_size``, ``intermediate_dim = intermediate_size``, ``dropout = hidden_dropout_prob``,
  ``attention_dropout = attention_probs_dropout_prob``, ``max_sequence_length = max_position_embeddings - 2``
  (positions start at 0 here, transformers' RoBERTa at ``padding_idx + 1 = 2``; the converters shift the position
  table by 2 rows). No token-type embedding (transformers' ``type_vocab_size`` 1: the export writes zeros) and
  LayerNorm epsilon 1e-5 (the default config's; a config with another ``layer_norm_eps`` trains with 1e-5).
* The transformers config the run records (``config.json``, the card, the FLOPs count) is the one
  :func:`hf_tpu_ext.model_config.build_config` makes, kept beside the model as ``model.config``.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

logger = logging.getLogger("hf_tpu_ext")


def backbone_kwargs(config) -> Dict[str, Any]:
    """``roberta.RobertaMaskedLM`` size arguments of a transformers ``RobertaConfig`` (see the module doc)."""
    return dict(vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
                num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
                intermediate_dim=int(config.intermediate_size), dropout=float(config.hidden_dropout_prob),
                attention_dropout=float(getattr(config, "attention_probs_dropout_prob", config.hidden_dropout_prob)),
                max_sequence_length=int(config.max_position_embeddings) - 2)


def seed_keras(seed: int) -> None:
    """``keras.utils.set_random_seed`` without seeding TensorFlow: that function imports TensorFlow wherever it is
    installed (``[keras]``'s keras-hub brings it), and the Keras backend's process imports none."""
    import random

    import numpy as np

    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED
    except ImportError:  # another Keras layout: its public function (may import TensorFlow)
        import keras

        keras.utils.set_random_seed(seed)
        return
    global_state.set_global_attribute(GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)  # recreated from the seed
    random.seed(seed)
    np.random.seed(seed)


def build_masked_lm(config, dtype: str = "float32", seed: Optional[int] = None):
    """A new ``roberta.RobertaMaskedLM`` of ``config``'s shape (truncated-normal 0.02 weights, LayerNorm 1/0).

    Args:
        config: a transformers ``RobertaConfig`` (:func:`hf_tpu_ext.model_config.build_config`).
        dtype: Keras dtype policy: ``"float32"``, or ``"mixed_bfloat16"`` (bfloat16 compute, float32 variables).
        seed: seeds the initializers (Keras' global seed, :func:`seed_keras`).

    Returns:
        the masked LM; ``model.config`` is ``config``.

    Raises:
        ArgumentError: ``config.model_type`` is not ``roberta``.
    """
    from hf_tpu_ext.backends.keras.roberta import RobertaMaskedLM
    from hf_tpu_ext.errors import ArgumentError

    if getattr(config, "model_type", "roberta") != "roberta":
        raise ArgumentError(f"--backend keras trains RoBERTa models; the config is a {config.model_type!r} model. "
                            "Use --backend tensorflow for other encoders.")
    if seed is not None:
        seed_keras(int(seed))
    model = RobertaMaskedLM(**backbone_kwargs(config), dtype=dtype)
    model.config = config
    return model


def to_keras_hub_masked_lm(model, pad_token_id: Optional[int] = None):
    """A float32 ``keras_hub.models.RobertaMaskedLM`` holding the training model's weights (needs keras-hub).

    Raises:
        CheckpointError: see ``hf_convert.parameter_table``.
    """
    from hf_tpu_ext.backends.keras.hf_convert import masked_lm_from_state_dict, masked_lm_state_dict

    config = model.config
    pad = config.pad_token_id if pad_token_id is None else pad_token_id
    return masked_lm_from_state_dict(masked_lm_state_dict(model, pad), config, dtype="float32", keras_hub=True)


def load_from_keras_hub_masked_lm(model, masked_lm) -> None:
    """Copy every weight of a ``keras_hub.models.RobertaMaskedLM`` into the training ``model`` (same shapes).

    Raises:
        CheckpointError: the two models differ in their variables' shapes (named).
    """
    from hf_tpu_ext.backends.keras.hf_convert import assign_state_dict, masked_lm_state_dict

    assign_state_dict(model, masked_lm_state_dict(masked_lm, model.config.pad_token_id), model.config)


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
