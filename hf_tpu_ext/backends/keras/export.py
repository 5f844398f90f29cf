"""The Keras backend's model folder: transformers RoBERTa weights plus a keras-hub preset of the whole masked LM.

:func:`export_masked_lm` writes, from a keras-hub ``RobertaMaskedLM``:

- ``model.safetensors``: ``RobertaForMaskedLM`` parameter names and layouts (``roberta.embeddings.*``,
  ``roberta.encoder.layer.N.*``, ``lm_head.*``), float32, metadata ``{"format": "pt"}`` -- what
  ``RobertaForMaskedLM.save_pretrained`` writes, so ``AutoModelForMaskedLM.from_pretrained`` (transformers 4
  and 5, PyTorch), the ``fill-mask`` pipeline and the Hub widget load it (name mapping: ``hf_convert.py``);
- ``config.json``: a ``RobertaConfig`` of the model's sizes with ``max_position_embeddings = positions +
  pad_token_id + 1`` and ``type_vocab_size=1``;
- the tokenizer files (``tokenizer.save_pretrained``);
- ``keras_hub/``: a keras-hub preset (``config.json``, ``task.json``, ``model.weights.h5``,
  ``task.weights.h5``, ``metadata.json``, ``preprocessor.json``, ``tokenizer.json``, ``assets/tokenizer/``)
  of the same weights, head included, float32.

Why a preset in a subfolder: keras-hub's ``from_preset("hf://user/model")`` reads the repo root. There it finds
transformers' ``config.json`` (``model_type``) and converts the RoBERTa backbone only
(``keras_hub/src/utils/transformers/convert_roberta.py`` has no masked-LM head), so the head would be random.
A keras-hub preset at the root would replace transformers' ``config.json``/``tokenizer.json``, and ``hf://``
handles take no subfolder (keras-hub passes the whole handle to ``hf_hub_download`` as ``repo_id``; a third
path part fails huggingface_hub's repo-id validation). So the preset lives in ``keras_hub/`` and a keras-hub
user loads the whole masked LM from the downloaded folder::

    from huggingface_hub import snapshot_download
    import keras_hub
    folder = snapshot_download("user/model", allow_patterns=["keras_hub/*"])
    masked_lm = keras_hub.models.RobertaMaskedLM.from_preset(f"{folder}/keras_hub")

The preset is built from the exported transformers state dict (:func:`hf_convert.masked_lm_from_state_dict`),
not copied from the training model, so both halves of the folder hold the same numbers by construction.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
from typing import List

from hf_tpu_ext.backends.keras.hf_convert import (
    KERAS_HUB_LAYER_NORM_EPS,
    ROBERTA_MODEL_TYPES,
    check_config,
    masked_lm_from_state_dict,
    masked_lm_state_dict,
    position_offset,
)
from hf_tpu_ext.backends.model_files import CONFIG_NAME, write_pt_safetensors
from hf_tpu_ext.data.tokenizer import save_tokenizer_files
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.fileio import atomic_write_text

logger = logging.getLogger(__name__)

#: The keras-hub preset's folder inside a model folder / Hub repo (beside the transformers files).
KERAS_PRESET_DIR = "keras_hub"


def transformers_config(masked_lm, config=None, tokenizer=None):
    """The ``RobertaConfig`` (or the given config's class) describing a keras-hub ``RobertaMaskedLM``.

    Args:
        masked_lm: keras-hub ``RobertaMaskedLM``.
        config: the run's transformers config (``model_config.build_config`` or the ``--model_name_or_path``
            one), copied, not changed; ``None``: a fresh ``RobertaConfig`` with the tokenizer's special ids.
        tokenizer: used for ``pad/bos/eos_token_id`` when ``config`` is ``None``.

    Returns:
        A config with the model's sizes, ``max_position_embeddings = max_sequence_length + pad_token_id + 1``,
        ``type_vocab_size=1``, ``layer_norm_eps=1e-5``, ``hidden_act="gelu"``, ``architectures`` =
        ``["RobertaForMaskedLM"]`` (or the XLM-R/CamemBERT class for those model types).

    Raises:
        CheckpointError: the config's sizes differ from the model's, or it is not a RoBERTa config.
    """
    from transformers import RobertaConfig

    backbone = masked_lm.backbone
    sizes = dict(vocab_size=int(backbone.vocabulary_size), hidden_size=int(backbone.hidden_dim),
                 num_hidden_layers=int(backbone.num_layers), num_attention_heads=int(backbone.num_heads),
                 intermediate_size=int(backbone.intermediate_dim))
    if config is None:
        ids = {}
        for field in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(tokenizer, field, None) if tokenizer is not None else None
            if value is not None:
                ids[field] = int(value)
        dropout = float(backbone.dropout)
        config = RobertaConfig(**sizes, **ids, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    else:
        config = copy.deepcopy(config)
        wrong = [f"{k}={getattr(config, k, None)} (model: {v})" for k, v in sizes.items() if getattr(config, k, None) != v]
        if wrong:
            raise CheckpointError("The config does not describe the Keras model: " + ", ".join(wrong) + ".")
    if config.pad_token_id is None:
        config.pad_token_id = 1
    positions = int(backbone.max_sequence_length) + position_offset(config.pad_token_id)
    if getattr(config, "max_position_embeddings", None) != positions:
        logger.info("max_position_embeddings %s -> %d (the Keras model's %d positions + %d reserved rows)",
                    getattr(config, "max_position_embeddings", None), positions, backbone.max_sequence_length,
                    position_offset(config.pad_token_id))
    config.max_position_embeddings = positions
    config.type_vocab_size = 1
    config.layer_norm_eps = KERAS_HUB_LAYER_NORM_EPS
    config.hidden_act = "gelu"
    config.tie_word_embeddings = True
    config.architectures = [ROBERTA_MODEL_TYPES.get(config.model_type, "RobertaForMaskedLM")]
    check_config(config)
    return config


def keras_hub_preprocessor(tokenizer_folder: str, sequence_length: int):
    """A keras-hub ``RobertaMaskedLMPreprocessor`` with the same byte-level BPE as a saved transformers tokenizer.

    The vocabulary and merges are read from the folder's ``tokenizer.json`` (``model.type == "BPE"``), so no
    ``vocab.json``/``merges.txt`` are needed. keras-hub's ``RobertaTokenizer`` requires RoBERTa's special tokens
    ``<s>``, ``</s>``, ``<pad>``, ``<mask>`` in the vocabulary.

    Args:
        tokenizer_folder: a folder written by ``tokenizer.save_pretrained``.
        sequence_length: the preprocessor's padded length (the model's ``max_sequence_length``).

    Returns:
        The preprocessor, or ``None`` (logged) when the tokenizer is not a RoBERTa-style byte-level BPE.
    """
    import json

    path = os.path.join(tokenizer_folder, "tokenizer.json")
    if not os.path.isfile(path):
        logger.info("No tokenizer.json: the keras-hub preset gets no preprocessor.")
        return None
    with open(path, encoding="utf-8") as f:
        model = json.load(f).get("model") or {}
    if model.get("type") != "BPE":
        logger.info("The tokenizer is %s, not a byte-level BPE: the keras-hub preset gets no preprocessor.", model.get("type"))
        return None
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]  # tokenizers >= 0.20: pairs
    import keras_hub

    try:
        tokenizer = keras_hub.models.RobertaTokenizer(vocabulary=dict(model["vocab"]), merges=merges)
    except ValueError as e:  # a special token RoBERTa needs is missing
        logger.info("keras-hub's RobertaTokenizer cannot use this vocabulary (%s): no preprocessor in the preset.", e)
        return None
    return keras_hub.models.RobertaMaskedLMPreprocessor(tokenizer=tokenizer, sequence_length=int(sequence_length))


def save_keras_preset(state, config, preset_dir: str, preprocessor=None) -> List[str]:
    """Write a keras-hub preset of the whole ``RobertaMaskedLM`` (head included) built from transformers weights.

    The preset is written into a hidden temp folder beside ``preset_dir`` and swapped into place, so a reader
    or a background upload never sees half a preset (pushes ignore hidden paths).

    Args:
        state: ``RobertaForMaskedLM`` state dict (numpy), as :func:`hf_convert.masked_lm_state_dict` returns.
        config: the matching transformers config.
        preset_dir: the preset folder to (re)create.
        preprocessor: optional keras-hub preprocessor saved with the task (tokenizer assets included).

    Returns:
        The preset's file names relative to ``preset_dir``'s parent (``keras_hub/task.json``, ...).
    """
    preset_dir = os.path.abspath(preset_dir)
    parent, name = os.path.split(preset_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    try:
        # float32 whatever the training policy was: a keras-hub user gets the exported numbers exactly
        preset_model = masked_lm_from_state_dict(state, config, preprocessor=preprocessor, dtype="float32")
        preset_model.save_to_preset(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only
        old = None
        if os.path.exists(preset_dir):
            old = tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=parent)
            os.replace(preset_dir, os.path.join(old, name))
        os.replace(tmp, preset_dir)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = []
    for root, _, names in os.walk(preset_dir):
        files += [os.path.relpath(os.path.join(root, n), parent) for n in names]
    return sorted(files)


def export_masked_lm(masked_lm, folder: str, tokenizer=None, config=None, *, keras_preset: bool = True) -> List[str]:
    """Write a model folder that transformers (PyTorch) and keras-hub both load, from a keras-hub masked LM.

    This is what the Keras backend's ``Backend.export(folder, tokenizer)`` calls. Every file is written to a
    temporary name and moved into place (``os.replace``), so a reader or a background Hub upload never sees a
    half-written file.

    Args:
        masked_lm: keras-hub ``RobertaMaskedLM`` (``RobertaBackbone`` + ``MaskedLMHead`` tied to the token
            embedding); float32 weights under any dtype policy (bf16 mixed precision included).
        folder: the output folder (created if missing; files of the same names replaced).
        tokenizer: a transformers tokenizer (``PreTrainedTokenizerBase``) or a folder/repo id of tokenizer files
            (``AutoTokenizer.from_pretrained``); ``None``: no tokenizer files and no keras-hub preprocessor.
        config: the run's transformers config (sizes must equal the model's; see :func:`transformers_config`);
            ``None``: ``masked_lm.config`` when the model carries one (``backends/keras/model.py``), else one
            derived from the model and the tokenizer.
        keras_preset: also write the keras-hub preset into ``folder/keras_hub/`` (module doc).

    Returns:
        Names relative to ``folder`` of the files written, e.g. ``["model.safetensors", "config.json",
        "tokenizer.json", "tokenizer_config.json", ..., "keras_hub/config.json", "keras_hub/task.json", ...]``.

    Raises:
        CheckpointError: the model is not an exportable keras-hub RoBERTa masked LM or the config disagrees
            with it.
    """
    if tokenizer is not None and isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    if config is None:  # the Keras backend's model keeps the run's transformers config beside it
        config = getattr(masked_lm, "config", None)
    hf_config = transformers_config(masked_lm, config, tokenizer)
    state = masked_lm_state_dict(masked_lm, hf_config.pad_token_id)
    if state["roberta.embeddings.word_embeddings.weight"].shape[0] != hf_config.vocab_size:
        raise CheckpointError("The token embedding and the config's vocab_size differ.")
    if tokenizer is not None and len(tokenizer) > hf_config.vocab_size:
        raise CheckpointError(f"The tokenizer has {len(tokenizer)} tokens but the model only {hf_config.vocab_size} "
                              "embeddings; export the tokenizer the model was trained with.")

    os.makedirs(folder, exist_ok=True)
    written = [write_pt_safetensors(folder, state)]
    atomic_write_text(os.path.join(folder, CONFIG_NAME), hf_config.to_json_string(use_diff=True))
    written.append(CONFIG_NAME)
    if tokenizer is not None:
        written += save_tokenizer_files(tokenizer, folder, exclude=written)
    if keras_preset:
        preprocessor = None
        if tokenizer is not None:
            preprocessor = keras_hub_preprocessor(folder, masked_lm.backbone.max_sequence_length)
        written += save_keras_preset(state, hf_config, os.path.join(folder, KERAS_PRESET_DIR), preprocessor)
    return written
