"""transformers checkpoints -> the Keras backend's masked LMs: reading a transformers folder or Hub repo (config +
PyTorch-named weights), then the architecture of its ``model_type`` (:mod:`.architectures`) builds the model and
assigns the weights through its name table (``arch.assign``). Export, the other direction, is ``export.py``.

No Keras, JAX or torch import at module level: the run imports this only after ``--backend keras`` is checked.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Dict, Optional

import numpy as np

from hf_tpu_ext.backends.keras.architectures import architecture_for
from hf_tpu_ext.backends.keras.architectures.layouts import hf_shape, keras_block
from hf_tpu_ext.backends.model_files import (
    CONFIG_NAME,
    PT_WEIGHTS_INDEX_NAME,
    PT_WEIGHTS_NAME,
    SAFE_WEIGHTS_NAME,
    TF2_WEIGHTS_NAME,
    read_pt_safetensors,
    resolve_model_folder,
)
from hf_tpu_ext.errors import ArgumentError, CheckpointError

logger = logging.getLogger(__name__)


def check_config(config) -> None:
    """Raise ``CheckpointError`` when the Keras backend cannot hold a transformers config: a ``model_type`` with no
    architecture (the message names the supported ones), or the architecture's own ``check_config`` refusal."""
    architecture_for(config, CheckpointError).check_config(config)


def masked_lm_from_state_dict(state: Dict[str, np.ndarray], config, *, dtype=None):
    """A new masked LM of ``config``'s architecture and sizes holding a transformers state dict.

    Args:
        state: ``{transformers name: array}`` as the ``*ForMaskedLM`` class's ``state_dict()`` names them.
        config: the matching transformers config.
        dtype: the model's Keras dtype policy (``None``: Keras' global policy).

    Raises:
        CheckpointError: see :func:`check_config` and the architecture's ``assign`` (a missing weight, a shape).
    """
    arch = architecture_for(config, CheckpointError)
    masked_lm = arch.build(config, dtype)
    arch.assign(masked_lm, state, config)
    return masked_lm


def sharded_weight(slices, kind: str, keras_shape, sharding):
    """One Keras variable's value as a ``jax.Array`` of ``sharding``, read from a transformers tensor by slices: each
    process reads only the blocks its devices hold (``jax.make_array_from_callback``), never the whole tensor.

    Args:
        slices: the tensor's ``safe_open(file, framework="numpy").get_slice(name)`` (its file kept open meanwhile).
        kind: the name table's layout kind (:mod:`.architectures.layouts`: ``SAME``, ``LINEAR``, ``QKV_KERNEL``,
            ``QKV_BIAS``, ``OUT_KERNEL``).
        keras_shape: the variable's shape; sharding: its ``jax.sharding.Sharding`` (e.g. ``--fsdp``'s).

    Returns:
        a float32 ``jax.Array`` (bf16/fp16 checkpoints upcast).

    Raises:
        CheckpointError: the tensor's shape is not the variable's in transformers' layout (named).
    """
    import jax

    keras_shape = tuple(int(d) for d in keras_shape)
    if tuple(slices.get_shape()) != hf_shape(kind, keras_shape):
        raise CheckpointError(f"A checkpoint tensor has shape {tuple(slices.get_shape())}, the model's variable "
                              f"{hf_shape(kind, keras_shape)} (transformers' layout of {keras_shape}).")

    def block(index):
        bounds = [sl.indices(d)[:2] for sl, d in zip(index, keras_shape)]
        return np.ascontiguousarray(keras_block(kind, bounds, keras_shape, slices.__getitem__), dtype=np.float32)

    return jax.make_array_from_callback(keras_shape, sharding, block)


def read_weights(folder: str, path_or_repo_id: str) -> Dict[str, np.ndarray]:
    """``{transformers name: float32 array}`` of a local model folder, read whole (``CheckpointError`` when it has
    no readable weights, naming ``path_or_repo_id``)."""
    state = read_pt_safetensors(folder)
    if state is not None:
        return state
    bins = [n for n in (PT_WEIGHTS_NAME, PT_WEIGHTS_INDEX_NAME) if os.path.isfile(os.path.join(folder, n))]
    if bins:
        try:
            import torch
        except ImportError:
            raise CheckpointError(f"{path_or_repo_id} only has {PT_WEIGHTS_NAME}, which needs torch to read; install "
                                  "torch (pip install 'torch==2.13.*') or convert it to model.safetensors.") from None
        files = [PT_WEIGHTS_NAME]
        if bins[0] == PT_WEIGHTS_INDEX_NAME:
            with open(os.path.join(folder, PT_WEIGHTS_INDEX_NAME), encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for name in files:
            # weights_only: a pickle from the Hub must not run code
            loaded = torch.load(os.path.join(folder, name), map_location="cpu", weights_only=True)
            state.update({k: v.float().numpy() for k, v in loaded.items()})
        return state
    if os.path.isfile(os.path.join(folder, TF2_WEIGHTS_NAME)) or os.path.isfile(os.path.join(folder, SAFE_WEIGHTS_NAME)):
        raise CheckpointError(f"{path_or_repo_id} has TensorFlow-format weights only; the Keras backend reads PyTorch "
                              "names (model.safetensors with format 'pt', or pytorch_model.bin). Convert it with "
                              "transformers (from_pretrained(..., from_tf=True).save_pretrained(folder)).")
    raise CheckpointError(f"{path_or_repo_id} has no weights: expected {SAFE_WEIGHTS_NAME} or {PT_WEIGHTS_NAME}.")


def read_transformers_checkpoint(path_or_repo_id: str, revision: Optional[str] = None, *,
                                 cache_dir: Optional[str] = None, token=None, **config_overrides):
    """The config and PyTorch-named weights of a transformers masked-LM folder or Hub repo (no model built).

    Reads ``config.json`` and ``model.safetensors`` (or its shards; no torch needed) or ``pytorch_model.bin``
    (torch, ``weights_only=True``). The config is checked (:func:`check_config`) before any weight is read.

    Args:
        path_or_repo_id: a local folder, or a Hub repo id downloaded from ``HF_ENDPOINT`` (config, tokenizer and
            one weight format only).
        revision: branch, tag or commit of a Hub repo (ignored for a folder).
        cache_dir: Hub download cache (default: huggingface_hub's).
        token: Hub token (default: ``HF_TOKEN`` or the cached login); never logged.
        **config_overrides: config attributes to change, e.g. ``hidden_dropout_prob=0.0``.

    Returns:
        ``(config, state)``: the transformers config (``_name_or_path`` = ``path_or_repo_id``, for the card's
        ``base_model``) and ``{name: float32 numpy array}``.

    Raises:
        ArgumentError: a missing local folder, or an override that is not a config attribute.
        HubRepoError / HubAuthError: the repo cannot be downloaded.
        CheckpointError: no config, an unsupported architecture, or no readable weights.
    """
    config, folder = read_transformers_config(path_or_repo_id, revision, cache_dir=cache_dir, token=token,
                                              **config_overrides)
    return config, read_weights(folder, str(path_or_repo_id))


def read_transformers_config(path_or_repo_id: str, revision: Optional[str] = None, *,
                             cache_dir: Optional[str] = None, token=None, **config_overrides):
    """``(config, local folder)`` of a transformers masked-LM folder or Hub repo, the config checked and no weight
    read (:func:`read_transformers_checkpoint`'s first half; the same arguments and errors but the weights')."""
    from transformers import AutoConfig  # slow to import: only when a checkpoint is read

    folder = resolve_model_folder(str(path_or_repo_id), revision, cache_dir, token)
    if not os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        raise CheckpointError(f"{path_or_repo_id} has no {CONFIG_NAME}; it is not a transformers model folder.")
    config = AutoConfig.from_pretrained(folder)
    config._name_or_path = str(path_or_repo_id)
    unknown = sorted(k for k in config_overrides if not hasattr(config, k))
    if unknown:
        raise ArgumentError(f"Unknown config attributes to override: {', '.join(unknown)} (not in {type(config).__name__}).")
    for key, value in config_overrides.items():
        setattr(config, key, value)
    check_config(config)  # before the weights are read: a wrong model fails fast
    return config, folder


def load_masked_lm(path_or_repo_id: str, revision: Optional[str] = None, *, cache_dir: Optional[str] = None,
                   token=None, dtype=None, **config_overrides):
    """Load a transformers masked-LM folder or Hub repo as a new Keras masked LM of its architecture.

    Every architecture of the Keras backend (:func:`~hf_tpu_ext.backends.keras.architectures.
    supported_model_types`): ``roberta``/``xlm-roberta``/``camembert`` (``RobertaForMaskedLM``, ...), ``bert``
    (``BertForMaskedLM``), ``distilbert`` (``DistilBertForMaskedLM``), ``modernbert``
    (``ModernBertForMaskedLM``); the model's logits equal transformers' within 1e-4 (float32).

    Arguments and errors as :func:`read_transformers_checkpoint` (another ``model_type``: ``CheckpointError``
    naming the supported ones); ``dtype`` is the model's Keras dtype policy (``None``: the global policy).

    Returns:
        ``(masked_lm, config)``: the Keras model (the contract of ``architectures/base.py``: inputs
        ``token_ids``/``padding_mask``/``mask_positions``, logits ``[B, P, vocab_size]``) and its transformers
        config.
    """
    config, state = read_transformers_checkpoint(path_or_repo_id, revision, cache_dir=cache_dir, token=token,
                                                 **config_overrides)
    return masked_lm_from_state_dict(state, config, dtype=dtype), config


def load_transformers_weights(masked_lm, path_or_repo_id: str, revision: Optional[str] = None, *,
                              cache_dir: Optional[str] = None, token=None):
    """Copy a transformers checkpoint's weights into an existing masked LM of its architecture (in place).

    For a training model already built with the checkpoint's config (the Keras backend's
    ``--model_name_or_path``): sizes must match; the position table may be shorter than the checkpoint's.

    Returns:
        The checkpoint's transformers config.

    Raises:
        as :func:`read_transformers_checkpoint` and the architecture's ``assign``.
    """
    config, state = read_transformers_checkpoint(path_or_repo_id, revision, cache_dir=cache_dir, token=token)
    architecture_for(config, CheckpointError).assign(masked_lm, state, config)
    return config
