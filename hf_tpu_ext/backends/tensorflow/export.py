"""Model folders that both TensorFlow and PyTorch transformers load: PyTorch-named safetensors from a TF model.

Stock ``TFPreTrainedModel.save_pretrained(safe_serialization=True)`` writes TF variable names (safetensors
metadata ``format: tf``), which PyTorch ``from_pretrained``, the Hub widget and most tools cannot read. This
module writes what ``RobertaForMaskedLM.save_pretrained`` would write instead -- ``config.json`` and a
``model.safetensors`` with PyTorch state-dict names, ``[out, in]`` Linear weights and metadata
``format: pt`` -- using transformers' own TF->PT name conversion, and reads such folders back into TF through
transformers' PT->TF helper with a plain dict of numpy arrays (no torch needed on either side).

Beside it, a TF-format ``tf_model.h5`` (what ``TFPreTrainedModel.save_pretrained(safe_serialization=False)``
writes) lets a plain TensorFlow script load the folder or its Hub repo with the stock
``TFAutoModelForMaskedLM.from_pretrained(path_or_repo_id, use_safetensors=False)``. ``use_safetensors=False``
is needed because transformers 4.57's TF ``from_pretrained`` always picks ``model.safetensors`` first (local
folder: ``model.safetensors``, its index, then ``tf_model.h5``; Hub: the same) and its PyTorch-safetensors
reader iterates over a ``safe_open`` handle, which no safetensors release supports
(``TypeError: 'builtins.safe_open' object is not iterable``). PyTorch ``from_pretrained`` (4.x and 5) reads
``model.safetensors`` and ignores ``tf_model.h5``.

Example:
    >>> from hf_tpu_ext.backends.tensorflow.export import save_model_folder, load_tf_model
    >>> save_model_folder(model, "out", tokenizer=tokenizer)  # doctest: +SKIP
    ['config.json', 'model.safetensors', 'tokenizer.json', ...]
    >>> model = load_tf_model("out")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from typing import Optional

# The framework-free pieces (file names, PyTorch-format safetensors, Hub snapshot of one weight format) live
# in backends/model_files.py, shared with the Keras backend; the old private names stay importable here.
from hf_tpu_ext.backends.model_files import (  # noqa: F401
    BASE_PATTERNS as _BASE_PATTERNS,
    CONFIG_NAME,
    PT_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    TF2_WEIGHTS_INDEX_NAME,
    TF2_WEIGHTS_NAME,
    read_pt_safetensors as _read_pt_safetensors,
    resolve_model_folder as _resolve_folder,
    safetensors_format as _safetensors_format,
    weight_patterns as _weight_patterns,
)
from hf_tpu_ext.errors import ArgumentError, CheckpointError
# The TF model -> PyTorch-named folder writer is neutral ground (the tf_keras push callback writes the same
# folder and may not import a backend); the names stay importable here.
from hf_tpu_ext.tf_model_folder import pytorch_config, pytorch_state_dict, save_model_folder  # noqa: F401

logger = logging.getLogger(__name__)


def load_tf_model(
    path_or_repo_id: str,
    revision: Optional[str] = None,
    *,
    cache_dir: Optional[str] = None,
    token=None,
    **config_overrides,
):
    """Load a masked-LM model folder (ours, PyTorch's, or a stock TF one) or Hub repo into TensorFlow.

    Order of preference in the folder:

    1. PyTorch-format ``model.safetensors`` (or its shards): read as a dict of numpy arrays and loaded with
       ``transformers.modeling_tf_pytorch_utils.load_pytorch_state_dict_in_tf2_model`` (no torch needed).
    2. TF-format weights (``tf_model.h5``, TF-named safetensors from ``save_pretrained``):
       ``TFAutoModelForMaskedLM.from_pretrained``.
    3. ``pytorch_model.bin``: ``TFAutoModelForMaskedLM.from_pretrained(from_pt=True)`` (needs torch).

    Args:
        path_or_repo_id: a local folder, or a Hub repo id downloaded with ``huggingface_hub.snapshot_download``
            from ``HF_ENDPOINT`` (default: the public Hub).
        revision: branch, tag or commit of a Hub repo (ignored for a local folder).
        cache_dir: Hub download cache (default: the huggingface_hub cache).
        token: Hub token (default: ``HF_TOKEN`` or the cached login). Never logged.
        **config_overrides: config attributes to change before the model is built, e.g.
            ``hidden_dropout_prob=0.0``.

    Returns:
        A built ``TFAutoModelForMaskedLM`` instance (``TFRobertaForMaskedLM`` for RoBERTa configs) holding the
        folder's weights. Weights PyTorch transformers ties (``lm_head.decoder.*``) come from the shared
        variables.

    Raises:
        ArgumentError: the local folder does not exist, or an override is not a config attribute.
        HubRepoError / HubAuthError: the repo or revision cannot be downloaded.
        CheckpointError: the folder has no config or no weights this function can read, or a weight's shape
            differs from the config's.
    """
    from transformers import TFAutoModelForMaskedLM

    folder = _resolve_folder(str(path_or_repo_id), revision, cache_dir, token)
    config = _load_config(folder, path_or_repo_id, config_overrides)
    state = _read_pt_safetensors(folder)
    if state is not None:
        return _model_from_pt_state(config, state, path_or_repo_id)

    has_tf = any(
        os.path.isfile(os.path.join(folder, n)) for n in (TF2_WEIGHTS_NAME, TF2_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME)
    )
    if has_tf:
        return TFAutoModelForMaskedLM.from_pretrained(folder, config=config)
    if os.path.isfile(os.path.join(folder, PT_WEIGHTS_NAME)):
        try:
            import torch  # noqa: F401
        except ImportError:
            raise CheckpointError(
                f"{path_or_repo_id} only has {PT_WEIGHTS_NAME}, which needs torch to read; install torch or convert it "
                "to model.safetensors."
            ) from None
        return TFAutoModelForMaskedLM.from_pretrained(folder, config=config, from_pt=True)
    raise CheckpointError(
        f"{path_or_repo_id} has no weights: expected {SAFE_WEIGHTS_NAME}, {TF2_WEIGHTS_NAME} or {PT_WEIGHTS_NAME}."
    )


def _load_config(folder: str, path_or_repo_id, config_overrides: dict):
    """The folder's ``config.json`` with ``config_overrides`` set, named by ``path_or_repo_id`` (part of
    :func:`load_tf_model`).

    Raises:
        CheckpointError: no ``config.json``. ArgumentError: an override that is not a config attribute.
    """
    from transformers import AutoConfig

    if not os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        raise CheckpointError(f"{path_or_repo_id} has no {CONFIG_NAME}; it is not a transformers model folder.")
    config = AutoConfig.from_pretrained(folder)
    config._name_or_path = str(path_or_repo_id)  # the repo id, not the cache snapshot (model cards use it)
    unknown = sorted(k for k in config_overrides if not hasattr(config, k))
    if unknown:
        raise ArgumentError(f"Unknown config attributes to override: {', '.join(unknown)} (not in {type(config).__name__}).")
    for key, value in config_overrides.items():
        setattr(config, key, value)
    return config


def _model_from_pt_state(config, state: dict, path_or_repo_id):
    """A ``TFAutoModelForMaskedLM`` built from ``config`` holding ``state`` (PyTorch names -> numpy arrays), through
    transformers' PT->TF helper (part of :func:`load_tf_model`).

    Raises:
        CheckpointError: a weight's shape differs from the config's.
    """
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM
    from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model

    model = TFAutoModelForMaskedLM.from_config(config)
    try:
        model, info = load_pytorch_state_dict_in_tf2_model(
            model, state, allow_missing_keys=True, output_loading_info=True, skip_logger_warnings=True
        )
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        raise CheckpointError(
            f"The weights in {path_or_repo_id} do not fit its config.json ({type(e).__name__}: {str(e).splitlines()[0]})."
        ) from None
    if info["missing_keys"]:
        logger.warning(
            "Weights not found in %s, newly initialized: %s", path_or_repo_id, ", ".join(sorted(info["missing_keys"]))
        )
    if info["unexpected_keys"]:
        logger.info("Weights in %s not used by %s: %s", path_or_repo_id, type(model).__name__, sorted(info["unexpected_keys"]))
    return model
