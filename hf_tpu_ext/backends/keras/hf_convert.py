"""RoBERTa masked LM (the Keras backend's ``roberta.RobertaMaskedLM`` or keras-hub's) <-> transformers RoBERTa
weights (PyTorch parameter names), both ways.

One table (:data:`EMBEDDING_TABLE`, :data:`BLOCK_TABLE`, :data:`HEAD_TABLE`, read by :func:`parameter_table`)
pairs every variable of the training model (``roberta.py``: Keras 3 layers, no keras-hub) and of a keras-hub
``RobertaMaskedLM`` (``RobertaBackbone`` + ``MaskedLMHead`` with the token embedding tied as its decoder, the
optional preset's model) with the ``RobertaForMaskedLM`` state-dict name it corresponds to and the layout
change between them, so export (:func:`masked_lm_state_dict`, used by
``export.py``) and import (:func:`masked_lm_from_state_dict`, :func:`load_masked_lm`: ``--model_name_or_path``
and resume from a model folder) cannot drift apart. Layouts:

- Dense kernels are ``[in, out]`` in Keras and ``Linear.weight`` ``[out, in]`` in PyTorch (transposed).
- Attention projections are ``EinsumDense`` kernels ``[hidden, heads, head_dim]`` (query/key/value) and
  ``[heads, head_dim, hidden]`` (output) in Keras; transformers has ``[hidden, hidden]`` Linear weights whose
  input/output features are ``heads * head_dim`` in head-major order (a reshape, then the transpose).
- Positions: transformers' RoBERTa numbers real tokens from ``padding_idx + 1`` (``pad_token_id + 1``: 2 for
  RoBERTa's ``<pad>``=1, ``create_position_ids_from_input_ids``) and gives pad tokens position ``padding_idx``;
  keras-hub's ``PositionEmbedding`` numbers every token from 0. Keras row ``i`` is transformers row
  ``i + pad_token_id + 1``; the first ``pad_token_id + 1`` rows are written as zeros (only pad tokens, whose
  outputs are masked, read them) and ``max_position_embeddings = max_sequence_length + pad_token_id + 1``.
- Token types: keras-hub has none. transformers adds ``token_type_embeddings[0]`` to every token (ids default
  to 0), so on import that row is folded into every position row (the sum is the same), and on export a
  single zero row is written (``type_vocab_size=1``).

Both directions give equal logits at every non-pad position of right-padded batches (the fill-mask pipeline's
and the trainer's layout) up to float32 rounding: ``tests/current/test_keras_export.py`` checks 1e-4.

No Keras, JAX or torch import at module level: the run imports this only after ``--backend keras`` is checked.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

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

#: transformers model types whose ``*ForMaskedLM`` is RoBERTa's architecture under the ``roberta.`` prefix.
ROBERTA_MODEL_TYPES = {"roberta": "RobertaForMaskedLM", "xlm-roberta": "XLMRobertaForMaskedLM",
                       "camembert": "CamembertForMaskedLM"}
#: keras-hub's RobertaBackbone/MaskedLMHead use LayerNormalization(epsilon=1e-5) and exact (erf) GELU.
KERAS_HUB_LAYER_NORM_EPS = 1e-5
BASE_PREFIX = "roberta."

# Layout kinds of the table: how a Keras array becomes the transformers array (and back).
SAME, LINEAR, QKV_KERNEL, QKV_BIAS, OUT_KERNEL = "same", "linear", "qkv_kernel", "qkv_bias", "out_kernel"


def position_offset(pad_token_id: Optional[int]) -> int:
    """Rows transformers' RoBERTa position table reserves before the first real position: ``pad_token_id + 1``
    (2 for RoBERTa; ``None`` is taken as RoBERTa's 1)."""
    return int(1 if pad_token_id is None else pad_token_id) + 1


def _to_hf(kind: str, array: np.ndarray) -> np.ndarray:
    if kind == SAME:
        return array
    if kind == LINEAR:  # [in, out] -> [out, in]
        return array.T
    if kind == QKV_KERNEL:  # [hidden, heads, head_dim] -> [heads*head_dim, hidden]
        return array.reshape(array.shape[0], -1).T
    if kind == QKV_BIAS:  # [heads, head_dim] -> [heads*head_dim]
        return array.reshape(-1)
    if kind == OUT_KERNEL:  # [heads, head_dim, hidden] -> [hidden, heads*head_dim]
        return array.reshape(-1, array.shape[-1]).T
    raise ValueError(kind)


def _from_hf(kind: str, array: np.ndarray, keras_shape: Tuple[int, ...]) -> np.ndarray:
    if kind in (SAME, QKV_BIAS):
        return array.reshape(keras_shape)
    if kind == LINEAR:
        return array.T.reshape(keras_shape)
    if kind in (QKV_KERNEL, OUT_KERNEL):  # inverse of the reshape-then-transpose above
        return array.T.reshape(keras_shape)
    raise ValueError(kind)


def _hf_shape(kind: str, keras_shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(_to_hf(kind, np.zeros(keras_shape, dtype=np.float32)).shape)


# The one name table: (transformers name, keras-hub ``RobertaMaskedLM`` attribute path, this package's
# ``roberta.RobertaMaskedLM`` attribute path, layout kind). ``{i}`` is the encoder layer; block rows are
# relative to ``backbone.transformer_layers[i]``, the others to the masked LM.
EMBEDDING_TABLE = (
    ("roberta.embeddings.word_embeddings.weight", "backbone.token_embedding.embeddings",
     "backbone.token_embedding.embeddings", SAME),
    ("roberta.embeddings.LayerNorm.weight", "backbone.embeddings_layer_norm.gamma",
     "backbone.embeddings_layer_norm.gamma", SAME),
    ("roberta.embeddings.LayerNorm.bias", "backbone.embeddings_layer_norm.beta",
     "backbone.embeddings_layer_norm.beta", SAME),
)
BLOCK_TABLE = tuple(
    [(f"roberta.encoder.layer.{{i}}.attention.self.{n}.{w}", f"_self_attention_layer.{n}_dense.{k}",
      f"self_attention.{n}_dense.{k}", kind)
     for n in ("query", "key", "value") for w, k, kind in (("weight", "kernel", QKV_KERNEL), ("bias", "bias", QKV_BIAS))]
    + [(f"roberta.encoder.layer.{{i}}.{hf}", hub, own, kind) for hf, hub, own, kind in (
        ("attention.output.dense.weight", "_self_attention_layer.output_dense.kernel",
         "self_attention.output_dense.kernel", OUT_KERNEL),
        ("attention.output.dense.bias", "_self_attention_layer.output_dense.bias",
         "self_attention.output_dense.bias", SAME),
        ("attention.output.LayerNorm.weight", "_self_attention_layer_norm.gamma", "self_attention_layer_norm.gamma", SAME),
        ("attention.output.LayerNorm.bias", "_self_attention_layer_norm.beta", "self_attention_layer_norm.beta", SAME),
        ("intermediate.dense.weight", "_feedforward_intermediate_dense.kernel", "intermediate_dense.kernel", LINEAR),
        ("intermediate.dense.bias", "_feedforward_intermediate_dense.bias", "intermediate_dense.bias", SAME),
        ("output.dense.weight", "_feedforward_output_dense.kernel", "output_dense.kernel", LINEAR),
        ("output.dense.bias", "_feedforward_output_dense.bias", "output_dense.bias", SAME),
        ("output.LayerNorm.weight", "_feedforward_layer_norm.gamma", "output_layer_norm.gamma", SAME),
        ("output.LayerNorm.bias", "_feedforward_layer_norm.beta", "output_layer_norm.beta", SAME))])
HEAD_TABLE = (
    ("lm_head.dense.weight", "masked_lm_head._intermediate_dense.kernel", "masked_lm_head.dense.kernel", LINEAR),
    ("lm_head.dense.bias", "masked_lm_head._intermediate_dense.bias", "masked_lm_head.dense.bias", SAME),
    ("lm_head.layer_norm.weight", "masked_lm_head._intermediate_layer_norm.gamma", "masked_lm_head.layer_norm.gamma", SAME),
    ("lm_head.layer_norm.bias", "masked_lm_head._intermediate_layer_norm.beta", "masked_lm_head.layer_norm.beta", SAME),
    ("lm_head.bias", "masked_lm_head._bias", "masked_lm_head.bias", SAME),
)
#: the position table (shifted by :func:`position_offset` rows; no row of the table above)
POSITION_PATHS = ("backbone.embeddings.position_embedding.position_embeddings", "backbone.position_embeddings")


def _is_own_model(masked_lm) -> bool:
    """True for :class:`hf_tpu_ext.backends.keras.roberta.RobertaMaskedLM`, False for keras-hub's."""
    from hf_tpu_ext.backends.keras.roberta import RobertaMaskedLM

    return isinstance(masked_lm, RobertaMaskedLM)


def _attribute(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def parameter_table(masked_lm) -> List[Tuple[str, Any, str]]:
    """``(transformers name, Keras variable, layout kind)`` for every variable except the position table.

    Args:
        masked_lm: this package's ``roberta.RobertaMaskedLM`` or a keras-hub ``RobertaMaskedLM`` (built:
            constructing either builds it).

    Returns:
        Names as in ``RobertaForMaskedLM.state_dict()`` (``roberta.embeddings.word_embeddings.weight``, ...,
        ``lm_head.bias``); ``lm_head.decoder.*`` are left out, as ``save_pretrained`` leaves them out (tied
        to the word embeddings and to ``lm_head.bias`` on load).

    Raises:
        CheckpointError: the model is neither, or has variables this table does not know (a changed
            architecture would otherwise be exported incompletely).
    """
    backbone = getattr(masked_lm, "backbone", None)
    head = getattr(masked_lm, "masked_lm_head", None)
    if backbone is None or head is None or not hasattr(backbone, "transformer_layers"):
        raise CheckpointError(
            f"Expected a RoBERTa masked LM (backbone + masked_lm_head), got {type(masked_lm).__name__}."
        )
    own = _is_own_model(masked_lm)
    if not own and getattr(head, "token_embedding", None) is not backbone.token_embedding:
        raise CheckpointError("The masked-LM head's decoder is not tied to the backbone's token embedding; "
                              "transformers' RobertaForMaskedLM ties them, so this head cannot be exported.")
    column = 2 if own else 1
    table: List[Tuple[str, Any, str]] = [(row[0], _attribute(masked_lm, row[column]), row[3]) for row in EMBEDDING_TABLE]
    for i, block in enumerate(backbone.transformer_layers):
        table += [(row[0].format(i=i), _attribute(block, row[column]), row[3]) for row in BLOCK_TABLE]
    table += [(row[0], _attribute(masked_lm, row[column]), row[3]) for row in HEAD_TABLE]
    known = {id(v) for _, v, _ in table} | {id(_position_variable(masked_lm))}
    unknown = [w.path for w in masked_lm.weights if id(w) not in known]
    if unknown:
        raise CheckpointError(
            f"{type(masked_lm).__name__} has variables with no transformers RoBERTa counterpart: {', '.join(unknown[:8])}"
            f"{' ...' if len(unknown) > 8 else ''}. Only RoBERTa masked LMs (roberta.py's or keras-hub's) can be exported."
        )
    return table


def _position_variable(masked_lm):
    return _attribute(masked_lm, POSITION_PATHS[1 if _is_own_model(masked_lm) else 0])


def _numpy(variable) -> np.ndarray:
    """A variable's value as a float32 numpy array (bf16/fp16 upcast; mixed precision keeps float32 anyway)."""
    from keras import ops

    value = variable.value if hasattr(variable, "value") else variable
    if getattr(value, "is_fully_addressable", True) is False:
        # a jax.Array of a multi-process run: every process holds a full copy when replicated (data parallel)
        if not getattr(value, "is_fully_replicated", False):
            raise CheckpointError(f"{getattr(variable, 'path', 'A variable')} is sharded across processes; gather it "
                                  "(jax.experimental.multihost_utils.process_allgather) before exporting.")
        value = value.addressable_data(0)
    array = np.asarray(ops.convert_to_numpy(value))
    if array.dtype != np.float32 and array.dtype.kind in ("f", "V"):
        array = array.astype(np.float32)
    return array


def masked_lm_state_dict(masked_lm, pad_token_id: Optional[int] = 1) -> Dict[str, np.ndarray]:
    """The weights of a RoBERTa masked LM as a ``RobertaForMaskedLM`` state dict of numpy arrays.

    Args:
        masked_lm: ``roberta.RobertaMaskedLM`` or keras-hub ``RobertaMaskedLM`` (float32 weights; any dtype
            policy).
        pad_token_id: the tokenizer's pad id (transformers' ``padding_idx``); positions are shifted by
            ``pad_token_id + 1`` rows (see the module doc).

    Returns:
        ``{name: float32 C-contiguous array}`` with transformers' shapes: word embeddings ``[V, H]``, position
        embeddings ``[L + pad_token_id + 1, H]`` (first rows zero), token type embeddings ``[1, H]`` (zeros),
        Linear weights ``[out, in]``, ``lm_head.bias`` ``[V]``; no ``lm_head.decoder.*`` (tied on load).

    Raises:
        CheckpointError: see :func:`parameter_table`.
    """
    table = parameter_table(masked_lm)
    state = {name: np.ascontiguousarray(_to_hf(kind, _numpy(var))) for name, var, kind in table}
    positions = _numpy(_position_variable(masked_lm))
    offset = position_offset(pad_token_id)
    hidden = positions.shape[1]
    state["roberta.embeddings.position_embeddings.weight"] = np.concatenate(
        [np.zeros((offset, hidden), np.float32), positions], axis=0)
    state["roberta.embeddings.token_type_embeddings.weight"] = np.zeros((1, hidden), np.float32)
    return dict(sorted(state.items()))


def _normalized_names(state: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Names of a ``RobertaForMaskedLM``/``RobertaModel`` state dict in the ``roberta.``-prefixed form.

    A bare ``RobertaModel`` (``embeddings.*``, ``encoder.*``, maybe ``pooler.*``) gets the prefix; old
    checkpoints' LayerNorm ``gamma``/``beta`` become ``weight``/``bias`` (transformers renames them on load too).
    """
    out = {}
    for name, array in state.items():
        if name.endswith(".gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith(".beta"):
            name = name[: -len("beta")] + "bias"
        if name.startswith(("embeddings.", "encoder.", "pooler.")):
            name = BASE_PREFIX + name
        out[name] = array
    return out


def check_config(config) -> None:
    """Raise ``CheckpointError`` when a transformers config is not an architecture keras-hub's RoBERTa can hold.

    Accepted: ``model_type`` roberta / xlm-roberta / camembert, ``hidden_act`` "gelu" (exact), absolute
    positions, an encoder (not ``is_decoder``), ``hidden_size`` a multiple of ``num_attention_heads``.
    A ``layer_norm_eps`` other than keras-hub's fixed 1e-5 is only logged (logits then differ by ~1e-6).
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in ROBERTA_MODEL_TYPES:
        raise CheckpointError(f"The Keras backend trains RoBERTa masked LMs; this model's model_type is {model_type!r} "
                              f"(supported: {', '.join(ROBERTA_MODEL_TYPES)}). Use --backend tensorflow for other models.")
    act = getattr(config, "hidden_act", "gelu")
    if act != "gelu":
        raise CheckpointError(f"hidden_act {act!r} is not supported by keras-hub's RobertaBackbone (exact 'gelu' only).")
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        raise CheckpointError(f"position_embedding_type {config.position_embedding_type!r} is not supported "
                              "(keras-hub's RobertaBackbone has absolute positions only).")
    if getattr(config, "is_decoder", False):
        raise CheckpointError("A decoder RoBERTa (is_decoder=True) cannot be loaded as a masked LM.")
    if config.hidden_size % config.num_attention_heads:
        raise CheckpointError(f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                              f"{config.num_attention_heads}.")
    eps = float(getattr(config, "layer_norm_eps", KERAS_HUB_LAYER_NORM_EPS))
    if eps != KERAS_HUB_LAYER_NORM_EPS:
        logger.warning("layer_norm_eps is %g in the config; keras-hub's RoBERTa uses %g (outputs differ slightly).",
                       eps, KERAS_HUB_LAYER_NORM_EPS)


def assign_state_dict(masked_lm, state: Dict[str, np.ndarray], config) -> None:
    """Copy a transformers RoBERTa state dict into an existing RoBERTa masked LM (in place).

    Args:
        masked_lm: ``roberta.RobertaMaskedLM`` or keras-hub ``RobertaMaskedLM`` of ``config``'s sizes; its position
            table may be shorter than the checkpoint's (the first ``max_sequence_length`` real positions are taken).
        state: ``RobertaForMaskedLM`` (or bare ``RobertaModel``) weights as numpy arrays, transformers' names and
            shapes (see :func:`masked_lm_state_dict`); legacy LayerNorm ``gamma``/``beta`` names are accepted.
        config: the matching transformers config (``pad_token_id`` gives the position offset).

    Without ``lm_head.*`` weights (a ``RobertaModel`` checkpoint) the head keeps its initialization and a warning
    names the missing weights; ``lm_head.decoder.weight`` is not read (keras-hub ties it to the embeddings).

    Raises:
        CheckpointError: unsupported config (:func:`check_config`), a backbone weight missing, or a shape that
            differs from the model's.
    """
    check_config(config)
    state = _normalized_names(state)
    offset = position_offset(config.pad_token_id)

    def take(name: str, shape) -> np.ndarray:
        if name not in state:
            raise CheckpointError(f"The checkpoint has no {name!r}; it is not a RoBERTa model of this config.")
        array = np.asarray(state[name], dtype=np.float32)
        if tuple(array.shape) != tuple(shape):
            raise CheckpointError(f"{name} has shape {tuple(array.shape)}, the model needs {tuple(shape)} "
                                  "(config.json and the weights do not match).")
        return array

    missing_head = []
    for name, var, kind in parameter_table(masked_lm):
        shape = tuple(var.shape)
        if name.startswith("lm_head.") and name not in state:
            alias = {"lm_head.bias": "lm_head.decoder.bias"}.get(name)
            if alias in state:
                name = alias
            else:
                missing_head.append(name)
                continue
        var.assign(_from_hf(kind, take(name, _hf_shape(kind, shape)), shape))
    position_var = _position_variable(masked_lm)
    length, hidden = (int(d) for d in position_var.shape)
    name = "roberta.embeddings.position_embeddings.weight"
    positions = np.asarray(state.get(name, np.zeros((0, hidden))), np.float32)
    if name not in state or positions.shape[1:] != (hidden,) or positions.shape[0] < offset + length:
        raise CheckpointError(f"{name} has shape {tuple(positions.shape) if name in state else 'none'}; the model needs "
                              f"at least ({offset + length}, {hidden}) ({length} positions after {offset} reserved rows).")
    rows = positions[offset: offset + length]
    type_name = "roberta.embeddings.token_type_embeddings.weight"
    if type_name in state:  # every token gets row 0 (token_type_ids default to zeros): fold it in
        rows = rows + take(type_name, (state[type_name].shape[0], hidden))[0]
    position_var.assign(rows)
    decoder = state.get("lm_head.decoder.weight")
    if decoder is not None and not np.array_equal(decoder, state["roberta.embeddings.word_embeddings.weight"]):
        logger.warning("lm_head.decoder.weight differs from the word embeddings; keras-hub's head is tied to them, "
                       "so the decoder weights are not used.")
    if missing_head:
        logger.warning("The checkpoint has no masked-LM head (%s): the head is newly initialized.", ", ".join(missing_head))


def masked_lm_from_state_dict(state: Dict[str, np.ndarray], config, *, preprocessor=None, dtype=None,
                              keras_hub: bool = False):
    """Build a RoBERTa masked LM of ``config``'s sizes holding a transformers RoBERTa state dict.

    Args:
        state: see :func:`assign_state_dict`.
        config: the matching transformers config (``RobertaConfig``): sizes, ``pad_token_id``,
            ``max_position_embeddings``, ``hidden_dropout_prob`` (keras-hub has one dropout rate for both).
        preprocessor: optional keras-hub preprocessor to attach (``keras_hub`` only).
        dtype: keras dtype policy for the model (``None``: Keras' global policy).
        keras_hub: build a ``keras_hub.models.RobertaMaskedLM`` (the preset's model; needs keras-hub, which
            imports TensorFlow) instead of :class:`hf_tpu_ext.backends.keras.roberta.RobertaMaskedLM`.

    Returns:
        the masked LM, ``max_sequence_length = max_position_embeddings - (pad_token_id + 1)``.

    Raises:
        CheckpointError: see :func:`assign_state_dict`; also no position left after the reserved rows.
    """
    check_config(config)
    max_len = int(config.max_position_embeddings) - position_offset(config.pad_token_id)
    if max_len < 1:
        raise CheckpointError(f"max_position_embeddings {config.max_position_embeddings} leaves no position after the "
                              f"{position_offset(config.pad_token_id)} rows RoBERTa reserves.")
    sizes = dict(vocabulary_size=int(config.vocab_size), num_layers=int(config.num_hidden_layers),
                 num_heads=int(config.num_attention_heads), hidden_dim=int(config.hidden_size),
                 intermediate_dim=int(config.intermediate_size), dropout=float(config.hidden_dropout_prob),
                 max_sequence_length=max_len, dtype=dtype)
    if keras_hub:
        import keras_hub as hub

        # fixed names, not Keras' per-process numbering: an export's config.json is the same each time
        backbone = hub.models.RobertaBackbone(**sizes, name="roberta_backbone")
        masked_lm = hub.models.RobertaMaskedLM(backbone=backbone, preprocessor=preprocessor, name="roberta_masked_lm")
    else:
        from hf_tpu_ext.backends.keras.roberta import RobertaMaskedLM

        attention = float(getattr(config, "attention_probs_dropout_prob", config.hidden_dropout_prob))
        masked_lm = RobertaMaskedLM(**sizes, attention_dropout=attention)
    assign_state_dict(masked_lm, state, config)
    return masked_lm


def _read_state(folder: str, path_or_repo_id: str) -> Dict[str, np.ndarray]:
    import os

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
            import json

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
    """The config and PyTorch-named weights of a transformers RoBERTa folder or Hub repo (no model built).

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
    import os

    from transformers import AutoConfig

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
    return config, _read_state(folder, str(path_or_repo_id))


def load_masked_lm(path_or_repo_id: str, revision: Optional[str] = None, *, cache_dir: Optional[str] = None,
                   token=None, dtype=None, **config_overrides):
    """Load a transformers RoBERTa masked-LM folder or Hub repo as a new ``roberta.RobertaMaskedLM``.

    Arguments and errors as :func:`read_transformers_checkpoint`; ``dtype`` is the model's Keras dtype policy
    (``None``: the global policy).

    Returns:
        ``(masked_lm, config)``.
    """
    config, state = read_transformers_checkpoint(path_or_repo_id, revision, cache_dir=cache_dir, token=token,
                                                 **config_overrides)
    return masked_lm_from_state_dict(state, config, dtype=dtype), config


def load_transformers_weights(masked_lm, path_or_repo_id: str, revision: Optional[str] = None, *,
                              cache_dir: Optional[str] = None, token=None):
    """Copy a transformers RoBERTa checkpoint's weights into an existing RoBERTa masked LM (in place).

    For a training model already built with the checkpoint's config (the Keras backend's
    ``--model_name_or_path``): sizes must match; the position table may be shorter than the checkpoint's.

    Returns:
        The checkpoint's transformers config.

    Raises:
        as :func:`read_transformers_checkpoint` and :func:`assign_state_dict`.
    """
    config, state = read_transformers_checkpoint(path_or_repo_id, revision, cache_dir=cache_dir, token=token)
    assign_state_dict(masked_lm, state, config)
    return config
