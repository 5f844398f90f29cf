"""The Keras backend's model folder: transformers weights of the model's architecture plus, for RoBERTa, BERT and
DistilBERT, an optional keras-hub preset of the masked LM (keras-hub has no ModernBERT).

:func:`export_masked_lm` writes, from the Keras backend's masked LM (any architecture of
:mod:`~hf_tpu_ext.backends.keras.architectures`, looked up by ``config.model_type``) or a keras-hub
``RobertaMaskedLM``:

- ``model.safetensors``: the architecture's ``state_dict`` (its ``*ForMaskedLM`` parameter names and layouts, e.g.
  ``roberta.embeddings.*``, ``roberta.encoder.layer.N.*``, ``lm_head.*``), float32, metadata ``{"format": "pt"}``
  -- what ``save_pretrained`` writes, so ``AutoModelForMaskedLM.from_pretrained`` (transformers 4 and 5, PyTorch),
  the ``fill-mask`` pipeline and the Hub widget load it;
- ``config.json``: the architecture's ``export_config`` (RoBERTa: ``max_position_embeddings = positions +
  pad_token_id + 1``, ``type_vocab_size=1``) with ``architectures = [masked_lm_class(model_type)]`` (the record's);
- the tokenizer files (``tokenizer.save_pretrained``);
- ``keras_hub/`` (only where keras-hub is installed: ``[keras]``; it brings TensorFlow, and only for the
  architectures with a ``keras_hub`` preset, :func:`preset_tasks`): a keras-hub preset (``config.json``, ``task.json``,
  ``model.weights.h5``, ``task.weights.h5``, ``metadata.json``, ``preprocessor.json``, ``tokenizer.json``,
  ``assets/tokenizer/``) of the same weights, head included, float32: ``RobertaMaskedLM``, ``BertMaskedLM``
  (keras-hub's BERT layers use the tanh approximation of GELU: see :mod:`.architectures.keras_hub_bert`) or
  ``DistilBertMaskedLM``.

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
    masked_lm = keras_hub.models.RobertaMaskedLM.from_preset(f"{folder}/keras_hub")  # BertMaskedLM, ...

The preset is built from the exported transformers state dict (:func:`keras_hub_masked_lm`),
not copied from the training model, so both halves of the folder hold the same numbers by construction.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from typing import List, Set

from hf_tpu_ext.backends.keras.architectures import architecture_for, get_architecture, supported_model_types
from hf_tpu_ext.backends.keras.model import keras_global_state
from hf_tpu_ext.backends.keras.tensor_files import write_pt_safetensors
from hf_tpu_ext.backends.model_files import CONFIG_NAME
from hf_tpu_ext.data.tokenizer import save_tokenizer_files
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.fileio import atomic_write_text
from hf_tpu_ext.model_types import masked_lm_class, max_sequence_length

logger = logging.getLogger(__name__)

#: The keras-hub preset's folder inside a model folder / Hub repo (beside the transformers files).
KERAS_PRESET_DIR = "keras_hub"
#: keys of a preset's ``metadata.json`` that change with every save whatever was saved
PRESET_VOLATILE_KEYS = ("date_saved",)
#: model types already told they get no preset (one log line per process, not one per save)
_NO_PRESET_LOGGED: Set[str] = set()


def preset_tasks() -> List[str]:
    """keras-hub's masked-LM tasks the registry's architectures write presets of, registry order, once each."""
    tasks = [get_architecture(t).keras_hub for t in supported_model_types()]
    return list(dict.fromkeys(preset.task for preset in tasks if preset is not None))


def preset_architecture(masked_lm):
    """The architecture whose keras-hub task ``masked_lm`` is (a keras-hub model given without a config).

    Raises:
        CheckpointError: no architecture writes that task.
    """
    for model_type in supported_model_types():
        arch = get_architecture(model_type)
        if arch.keras_hub is not None and arch.keras_hub.task == type(masked_lm).__name__:
            return arch
    raise CheckpointError(f"A {type(masked_lm).__name__} without a config: no architecture here writes it; pass "
                          "config=.")


def keras_hub_available() -> bool:
    """Whether keras-hub can be imported (``find_spec``: nothing imported, so no TensorFlow either)."""
    try:
        return importlib.util.find_spec("keras_hub") is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def fresh_layer_names():
    """Keras' automatic layer names counted from zero inside the block, the process's counters restored after.

    keras-hub leaves weightless layers unnamed (``dropout``, ``softmax``, ...), so Keras numbers them per process
    and the preset's ``config.json`` and ``*.weights.h5`` group names would depend on how many models the process
    built before (a resume's export would change bytes). The counters live in Keras' global state (no public API;
    without it the names stay Keras' own).
    """
    try:
        global_state = keras_global_state()
    except ImportError:  # another Keras layout: names as Keras gives them
        yield
        return
    saved = global_state.get_global_attribute("object_name_uids")
    global_state.set_global_attribute("object_name_uids", collections.defaultdict(int))
    try:
        yield
    finally:
        global_state.set_global_attribute("object_name_uids", saved)


def _same_bytes(a: str, b: str) -> bool:
    if not (os.path.isfile(a) and os.path.isfile(b)) or os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def same_preset(new_dir: str, old_dir: str) -> bool:
    """Whether two keras-hub preset folders hold the same files with the same bytes, ``metadata.json`` compared
    without :data:`PRESET_VOLATILE_KEYS` (its save date)."""

    def names(folder):
        return sorted(os.path.relpath(os.path.join(r, n), folder) for r, _, ns in os.walk(folder) for n in ns)

    if not os.path.isdir(old_dir) or names(new_dir) != names(old_dir):
        return False
    for name in names(new_dir):
        a, b = os.path.join(new_dir, name), os.path.join(old_dir, name)
        if name == "metadata.json":
            try:
                with open(a, encoding="utf-8") as fa, open(b, encoding="utf-8") as fb:
                    ma, mb = json.load(fa), json.load(fb)
            except (OSError, ValueError):
                return False
            if {k: v for k, v in ma.items() if k not in PRESET_VOLATILE_KEYS} != {
                    k: v for k, v in mb.items() if k not in PRESET_VOLATILE_KEYS}:
                return False
        elif not _same_bytes(a, b):
            return False
    return True


def _unchanged_source(tokenizer, fresh: str, names: List[str]):
    """The local folder ``tokenizer`` was loaded from when it is unchanged since (a fresh load of that folder saves
    the same bytes as ``tokenizer`` did into ``fresh``), else None."""
    source = str(getattr(tokenizer, "name_or_path", "") or "")
    if not source or not os.path.isdir(source):
        return None
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix=".tokenizer.", dir=fresh) as again:
        try:
            AutoTokenizer.from_pretrained(source).save_pretrained(again)
        except Exception:  # noqa: BLE001 (not loadable on its own: no source to keep bytes of)
            return None
        if all(_same_bytes(os.path.join(fresh, n), os.path.join(again, n)) for n in names):
            return source
    return None


def save_tokenizer(tokenizer, folder: str, exclude=()) -> List[str]:
    """The tokenizer's files in ``folder`` (``save_pretrained``'s), each moved into place atomically; a file
    whose bytes would not change is left alone.

    A tokenizer unchanged since it was loaded from a folder (a resumed run's: ``output_dir`` or the Hub's
    download) gets that folder's own bytes: a load/save round trip of transformers rewrites fields
    (``is_local``, ``null`` -> ``""``) although nothing changed, and the Hub's files would change with it.

    Returns:
        the names relative to ``folder`` (minus ``exclude``).
    """
    os.makedirs(folder, exist_ok=True)
    fresh = tempfile.mkdtemp(prefix="hf-tpu-tokenizer-")  # not in folder: a kill leaves nothing there
    try:
        names = save_tokenizer_files(tokenizer, fresh, exclude=exclude)
        source = _unchanged_source(tokenizer, fresh, names)
        for name in names:
            src = os.path.join(fresh, name)
            if source is not None and os.path.isfile(os.path.join(source, name)):
                src = os.path.join(source, name)
            dst = os.path.join(folder, name)
            if not _same_bytes(src, dst):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst + ".tmp")
                os.replace(dst + ".tmp", dst)
        return names
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def keras_hub_masked_lm(state, config, preprocessor=None):
    """A float32 keras-hub masked LM of ``config``'s sizes holding the architecture's transformers state dict (its
    :class:`~.architectures.base.KerasHubPreset`'s ``masked_lm``).

    Raises:
        CheckpointError: no keras-hub preset for the architecture; as the architecture's ``assign``; a weight
            missing from ``state``.
    """
    arch = architecture_for(config, CheckpointError)
    if arch.keras_hub is None:
        raise CheckpointError(f"keras-hub has no masked LM of model_type {config.model_type!r}.")
    return arch.keras_hub.masked_lm(state, config, preprocessor)

def save_keras_preset(state, config, preset_dir: str, preprocessor=None) -> List[str]:
    """Write a keras-hub preset of the whole masked LM (:func:`keras_hub_masked_lm`; head included) built from
    transformers weights.

    The preset is written into a hidden temp folder beside ``preset_dir`` and swapped into place, so a reader
    or a background upload never sees half a preset (pushes ignore hidden paths).

    Args:
        state: the ``*ForMaskedLM`` state dict (numpy), as the architecture's ``state_dict`` returns.
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
        preset_model = keras_hub_masked_lm(state, config, preprocessor)
        preset_model.save_to_preset(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only
        if same_preset(tmp, preset_dir):  # a re-export of the same weights: the files (and Hub) stay byte-equal
            shutil.rmtree(tmp, ignore_errors=True)
            tmp = None
        old = None
        if tmp is not None and os.path.exists(preset_dir):
            old = tempfile.mkdtemp(prefix=f".{name}.", suffix=".old", dir=parent)
            os.replace(preset_dir, os.path.join(old, name))
        if tmp is not None:
            os.replace(tmp, preset_dir)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = []
    for root, _, names in os.walk(preset_dir):
        files += [os.path.relpath(os.path.join(root, n), parent) for n in names]
    return sorted(files)


def export_config(masked_lm, config=None, tokenizer=None):
    """The transformers config ``config.json`` gets: the architecture's ``export_config`` (or a copy of ``config``),
    ``architectures`` = the model type's record's masked-LM class (``[masked_lm_class(model_type)]``).

    Args:
        masked_lm: the Keras backend's masked LM, or a keras-hub ``RobertaMaskedLM``.
        config: the run's transformers config (``None``: ``masked_lm.config``; a keras-hub model has none: RoBERTa's
            config is derived from the model and the tokenizer).

    Raises:
        CheckpointError: no architecture for the config's ``model_type``, or a size that differs from the model's.
    """
    if config is None:  # the Keras backend's model keeps the run's transformers config beside it
        config = getattr(masked_lm, "config", None)
    arch = preset_architecture(masked_lm) if config is None else architecture_for(config, CheckpointError)
    hf_config = (arch.export_config(masked_lm, config, tokenizer) if arch.export_config is not None
                 else copy.deepcopy(config))
    hf_config.architectures = [masked_lm_class(hf_config.model_type)]
    return hf_config


def export_masked_lm(masked_lm, folder: str, tokenizer=None, config=None, *, keras_preset: bool = True) -> List[str]:
    """Write a model folder that transformers (PyTorch) loads (and keras-hub, for RoBERTa) from a Keras masked LM.

    This is what the Keras backend's ``Backend.export(folder, tokenizer)`` calls. Every file is written to a
    temporary name and moved into place (``os.replace``), so a reader or a background Hub upload never sees a
    half-written file.

    Args:
        masked_lm: the Keras backend's masked LM of any registered architecture (``model.config`` names it), or a
            keras-hub ``RobertaMaskedLM``; float32 weights under any dtype policy (bf16 mixed precision included).
        folder: the output folder (created if missing; files of the same names replaced).
        tokenizer: a transformers tokenizer (``PreTrainedTokenizerBase``) or a folder/repo id of tokenizer files
            (``AutoTokenizer.from_pretrained``); ``None``: no tokenizer files and no keras-hub preprocessor.
        config: the run's transformers config (sizes must equal the model's; see :func:`export_config`);
            ``None``: ``masked_lm.config`` when the model carries one (``backends/keras/model.py``), else one
            derived from the model and the tokenizer.
        keras_preset: also write the keras-hub preset into ``folder/keras_hub/`` (module doc) when keras-hub is
            installed (``[keras]``) and keras-hub has the architecture (:func:`preset_tasks`; ModernBERT: one
            info line per process).

    Returns:
        Names relative to ``folder`` of the files written, e.g. ``["model.safetensors", "config.json",
        "tokenizer.json", "tokenizer_config.json", ..., "keras_hub/config.json", "keras_hub/task.json", ...]``.

    Raises:
        CheckpointError: no architecture for the config's ``model_type``, a model its name table does not know,
            or a config that disagrees with the model.
    """
    if tokenizer is not None and isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer  # slow to import: only for a tokenizer given by name

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    hf_config = export_config(masked_lm, config, tokenizer)
    arch = architecture_for(hf_config, CheckpointError)
    state = arch.state_dict(masked_lm, hf_config)
    if tokenizer is not None and len(tokenizer) > hf_config.vocab_size:
        raise CheckpointError(f"The tokenizer has {len(tokenizer)} tokens but the model only {hf_config.vocab_size} "
                              "embeddings; export the tokenizer the model was trained with.")

    os.makedirs(folder, exist_ok=True)
    written = [write_pt_safetensors(folder, state)]  # one tensor made and written at a time
    atomic_write_text(os.path.join(folder, CONFIG_NAME), hf_config.to_json_string(use_diff=True))
    written.append(CONFIG_NAME)
    if tokenizer is not None:
        written += save_tokenizer(tokenizer, folder, exclude=written)
    if keras_preset and arch.keras_hub is None:
        if hf_config.model_type not in _NO_PRESET_LOGGED:
            _NO_PRESET_LOGGED.add(hf_config.model_type)
            logger.info("No keras_hub/ preset for model_type %r: keras-hub has no such masked LM (it has %s); the "
                        "transformers files are complete.", hf_config.model_type, ", ".join(preset_tasks()))
    elif keras_preset and not keras_hub_available():
        logger.debug("keras-hub is not installed: no %s/ preset in %s (pip install \"hf-tpu-ext[keras]\" adds it; "
                     "keras-hub brings TensorFlow).", KERAS_PRESET_DIR, folder)
    elif keras_preset:
        with fresh_layer_names():  # the same names in every export (see there)
            preprocessor = None
            if tokenizer is not None:
                preprocessor = arch.keras_hub.preprocessor(folder, hf_config, max_sequence_length(hf_config))
            written += save_keras_preset(state, hf_config, os.path.join(folder, KERAS_PRESET_DIR), preprocessor)
    return written
