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

import json
import logging
import os
from typing import Dict, List, Optional

import numpy as np

from hf_tpu_ext.data.tokenizer import save_tokenizer_files
from hf_tpu_ext.errors import ArgumentError, CheckpointError, HubAuthError, HubRepoError
from hf_tpu_ext.fileio import atomic_write, atomic_write_text

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TF2_WEIGHTS_NAME = "tf_model.h5"
TF2_WEIGHTS_INDEX_NAME = "tf_model.h5.index.json"
PT_WEIGHTS_NAME = "pytorch_model.bin"

# Config and tokenizer files of a model repo; one weight format is added (see _weight_patterns).
_BASE_PATTERNS = ["*.json", "*.txt", "*.model"]


def _weight_patterns(repo_files: List[str]) -> List[str]:
    """The one weight format to download, in load_tf_model's order: safetensors, tf_model.h5, pytorch_model.bin."""
    top = set(repo_files)
    if SAFE_WEIGHTS_NAME in top or SAFE_WEIGHTS_INDEX_NAME in top:
        return ["model*.safetensors"]
    if TF2_WEIGHTS_NAME in top or TF2_WEIGHTS_INDEX_NAME in top:
        return ["tf_model*.h5"]
    return ["pytorch_model*.bin"]


def pytorch_state_dict(model) -> Dict[str, np.ndarray]:
    """The weights of a TF transformers model as a PyTorch-named state dict of numpy arrays.

    Names and transposes come from ``transformers.modeling_tf_pytorch_utils``
    (``convert_tf_weight_name_to_pt_weight_name`` + ``apply_transpose``), so
    ``tf_roberta_for_masked_lm/roberta/encoder/layer_._0/attention/self/query/kernel:0`` [in, out] becomes
    ``roberta.encoder.layer.0.attention.self.query.weight`` [out, in]. A variable shared by two layers (the
    word embeddings that the TF LM head reuses as its decoder) is written once, under its first name; PyTorch
    transformers ties ``lm_head.decoder.weight``/``lm_head.decoder.bias`` itself on load, exactly as for a
    folder written by ``RobertaForMaskedLM.save_pretrained``.

    Args:
        model: a built ``TFPreTrainedModel`` (e.g. ``TFRobertaForMaskedLM``); variables may be distributed.

    Returns:
        ``{pytorch_name: array}``; arrays are C-contiguous, float weights float32 (bfloat16/float16 upcast).

    Raises:
        CheckpointError: the model has no variables yet (not built), or two variables map to one name.
    """
    from transformers.modeling_tf_pytorch_utils import apply_transpose, convert_tf_weight_name_to_pt_weight_name

    weights = list(model.trainable_weights) + list(model.non_trainable_weights)
    if not weights:
        raise CheckpointError("The model has no weights yet: call it once (model(model.dummy_inputs)) before saving.")
    # Same rule as transformers' PT<->TF loaders: a derived model keeps the base-model prefix ("roberta.").
    start_prefix_to_remove = ""
    names = []
    for w in weights:
        names.append(convert_tf_weight_name_to_pt_weight_name(w.name, tf_weight_shape=w.shape))
    if not any(n.startswith(model.base_model_prefix) for n, _ in names):
        start_prefix_to_remove = model.base_model_prefix + "."
    state: Dict[str, np.ndarray] = {}
    seen = set()
    for w, (name, transpose) in zip(weights, names):
        key = id(getattr(w, "_primary", w))  # one entry per underlying variable (tied weights)
        if key in seen:
            continue
        seen.add(key)
        if start_prefix_to_remove:
            name = name.replace(start_prefix_to_remove, "", 1)
        if name in state:
            raise CheckpointError(
                f"Two variables of {type(model).__name__} map to the PyTorch name {name!r}; this architecture cannot "
                "be exported with PyTorch names. Use model.save_pretrained() instead."
            )
        array = np.asarray(w.numpy())
        if array.dtype.kind == "V" or str(array.dtype) in ("bfloat16", "float16"):
            array = array.astype(np.float32)
        state[name] = np.ascontiguousarray(apply_transpose(transpose, array, pt_to_tf=False))
    return state


def _pytorch_config(model):
    """A copy of the model's config with PyTorch ``architectures`` (``TFRobertaForMaskedLM`` -> ``RobertaForMaskedLM``)."""
    import copy

    config = copy.deepcopy(model.config)
    cls_name = type(model).__name__
    config.architectures = [cls_name[2:] if cls_name.startswith("TF") else cls_name]
    return config


def save_model_folder(model, output_dir: str, tokenizer=None, *, tf_weights: bool = True) -> List[str]:
    """Write a model folder that PyTorch and TensorFlow transformers both load.

    Writes ``config.json`` (``architectures`` named without the ``TF`` prefix) and ``model.safetensors``
    (PyTorch parameter names, ``[out, in]`` Linear weights, float32, metadata ``{"format": "pt"}``, written
    with ``safetensors.numpy`` so torch is not needed), ``tf_model.h5`` (the same weights in TF's layout,
    written by the model's own ``save_weights``, for the stock
    ``TFAutoModelForMaskedLM.from_pretrained(folder, use_safetensors=False)``; see the module doc), plus the
    tokenizer files when a tokenizer is given. Each file is written to a temporary name in ``output_dir`` and
    moved into place with ``os.replace``, so a reader (or a background Hub upload) never sees a half-written
    file. Stale shard indexes (``tf_model.h5.index.json``, ``model.safetensors.index.json``) are removed so
    loaders do not pick them over the new weights.

    Args:
        model: a built TF transformers model (``TFRobertaForMaskedLM``).
        output_dir: folder to write into (created if missing; existing files of the same names replaced).
        tokenizer: optional ``PreTrainedTokenizer(Fast)``, saved with ``save_pretrained``.
        tf_weights: also write ``tf_model.h5`` (doubles the weight bytes on disk and in pushes); when False a
            stale ``tf_model.h5`` is removed instead.

    Returns:
        The names (relative to ``output_dir``) of the files written, e.g.
        ``["model.safetensors", "tf_model.h5", "config.json", "tokenizer.json", ...]``.

    Raises:
        CheckpointError: the model is not built or cannot be expressed with PyTorch names.
    """
    from safetensors.numpy import save_file

    os.makedirs(output_dir, exist_ok=True)
    state = pytorch_state_dict(model)
    config = _pytorch_config(model)
    written = []

    atomic_write(os.path.join(output_dir, SAFE_WEIGHTS_NAME), lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    written.append(SAFE_WEIGHTS_NAME)
    if tf_weights:
        # HDF5 by layer name, as TFPreTrainedModel.save_pretrained(safe_serialization=False) writes it
        atomic_write(os.path.join(output_dir, TF2_WEIGHTS_NAME), lambda tmp: model.save_weights(tmp, save_format="h5"))
        written.append(TF2_WEIGHTS_NAME)

    atomic_write_text(os.path.join(output_dir, CONFIG_NAME), config.to_json_string(use_diff=True))
    written.append(CONFIG_NAME)
    stale_names = (TF2_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_INDEX_NAME) + (() if tf_weights else (TF2_WEIGHTS_NAME,))
    for stale in stale_names:
        if os.path.isfile(os.path.join(output_dir, stale)):
            os.remove(os.path.join(output_dir, stale))

    if tokenizer is not None:
        written += save_tokenizer_files(tokenizer, output_dir, exclude=written)
    return written


def _safetensors_format(path: str) -> Optional[str]:
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as f:
        return (f.metadata() or {}).get("format")


def _read_pt_safetensors(folder: str) -> Optional[Dict[str, np.ndarray]]:
    """PyTorch-format safetensors weights of ``folder`` as one dict (shards merged); ``None`` if there are none."""
    from safetensors.numpy import load_file

    single = os.path.join(folder, SAFE_WEIGHTS_NAME)
    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        files = [os.path.join(folder, s) for s in shards]
    else:
        return None
    if _safetensors_format(files[0]) != "pt":
        return None
    state: Dict[str, np.ndarray] = {}
    for path in files:
        for name, array in load_file(path).items():
            if str(array.dtype) in ("bfloat16", "float16"):
                array = array.astype(np.float32)
            state[name] = array
    return state


def _resolve_folder(path_or_repo_id: str, revision: Optional[str], cache_dir: Optional[str], token) -> str:
    """A local folder for ``path_or_repo_id``: the folder itself, or a Hub snapshot download."""
    if os.path.isdir(path_or_repo_id):
        return path_or_repo_id
    looks_local = path_or_repo_id.startswith((".", os.sep, "~")) or path_or_repo_id.count("/") > 1 or (
        os.sep != "/" and os.sep in path_or_repo_id
    )
    if looks_local:
        raise ArgumentError(f"Model folder {path_or_repo_id!r} does not exist; give an existing folder or a Hub repo id 'user/name'.")

    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    # The endpoint is read at call time so HF_ENDPOINT set after import (a private or test Hub) is honoured.
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    endpoint = endpoint.rstrip("/")
    try:
        # List first so only one weight format is fetched (repos often hold .bin, .h5 and .safetensors copies).
        repo_files = HfApi(endpoint=endpoint).list_repo_files(path_or_repo_id, revision=revision, token=token)
        return snapshot_download(
            path_or_repo_id,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            endpoint=endpoint,
            allow_patterns=_BASE_PATTERNS + _weight_patterns(repo_files),
        )
    except HFValidationError:
        raise HubRepoError(
            f"{path_or_repo_id!r} is neither an existing folder nor a valid Hub repo id ('user/name')."
        ) from None
    except GatedRepoError:
        raise HubAuthError(
            f"The Hub repo {path_or_repo_id} is gated: accept its conditions on the Hub and log in (HF_TOKEN)."
        ) from None
    except RevisionNotFoundError:
        raise HubRepoError(f"Revision {revision!r} of Hub repo {path_or_repo_id} does not exist; check --model_revision.") from None
    except RepositoryNotFoundError:
        raise HubRepoError(
            f"Hub repo {path_or_repo_id} was not found at {endpoint} (or it is private and no valid token was given); "
            "check the repo id, HF_ENDPOINT and HF_TOKEN."
        ) from None
    except LocalEntryNotFoundError:
        raise HubRepoError(
            f"Cannot download {path_or_repo_id} from {endpoint} and it is not in the local cache; check the network/HF_ENDPOINT."
        ) from None


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
    import tensorflow as tf
    from transformers import AutoConfig, TFAutoModelForMaskedLM
    from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model

    folder = _resolve_folder(str(path_or_repo_id), revision, cache_dir, token)
    if not os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        raise CheckpointError(f"{path_or_repo_id} has no {CONFIG_NAME}; it is not a transformers model folder.")
    config = AutoConfig.from_pretrained(folder)
    config._name_or_path = str(path_or_repo_id)  # the repo id, not the cache snapshot (model cards use it)
    unknown = sorted(k for k in config_overrides if not hasattr(config, k))
    if unknown:
        raise ArgumentError(f"Unknown config attributes to override: {', '.join(unknown)} (not in {type(config).__name__}).")
    for key, value in config_overrides.items():
        setattr(config, key, value)

    state = _read_pt_safetensors(folder)
    if state is not None:
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
