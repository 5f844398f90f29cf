"""A model folder that PyTorch and TensorFlow transformers both load, written from a TF transformers model.

Stock ``TFPreTrainedModel.save_pretrained(safe_serialization=True)`` writes TF variable names (safetensors
metadata ``format: tf``), which PyTorch ``from_pretrained``, the Hub widget and most tools cannot read.
:func:`save_model_folder` writes what ``RobertaForMaskedLM.save_pretrained`` would write instead --
``config.json`` and a ``model.safetensors`` with PyTorch state-dict names, ``[out, in]`` Linear weights and
metadata ``format: pt`` -- using transformers' own TF->PT name conversion (no torch needed), beside a
TF-format ``tf_model.h5`` for the stock ``TFAutoModelForMaskedLM.from_pretrained(..., use_safetensors=False)``
(see :mod:`hf_tpu_ext.backends.tensorflow.export` for why ``use_safetensors=False``).

Neutral ground below the backends and the callbacks: ``hf-tpu train``'s TensorFlow backend exports with it,
and the tf_keras ``push_to_hub`` callback of a plain ``model.fit`` script writes the same folder (the
callbacks may not import a backend). TensorFlow itself is only touched through the model's own methods.
"""

from __future__ import annotations

import os
from typing import Dict, List

import numpy as np

from hf_tpu_ext.data.tokenizer import save_tokenizer_files
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.fileio import atomic_write, atomic_write_text

# transformers' own file names (what its loaders look for)
from transformers.utils import (CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME,  # isort: skip
                                TF2_WEIGHTS_INDEX_NAME, TF2_WEIGHTS_NAME)


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


def pytorch_config(model):
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
    config = pytorch_config(model)
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


class ModelCheckpointer:
    """A ``tf.train.CheckpointManager`` of a tf_keras model and its optimizer, for a plain ``model.fit`` script.

    The object graph is the TensorFlow backend's (``model``, ``optimizer``, ``global_step``, ``epoch``), so
    ``hf-tpu train --resume_from_checkpoint`` and the backend's checkpointer restore these checkpoints.

    Args:
        model: the compiled tf_keras model.
        directory: the checkpoint folder (``ckpt-<step>.index``/``.data-*``); the newest 2 are kept.
    """

    def __init__(self, model, directory: str):
        import tensorflow as tf

        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, global_step=self._step,
                                         epoch=self._epoch)
        self._manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2, checkpoint_name="ckpt")

    @property
    def latest(self):
        """The newest checkpoint's prefix (``.../ckpt-N``), or None."""
        return self._manager.latest_checkpoint

    def save(self, step: int, epoch: float = 0.0) -> str:
        """Write the checkpoint of global ``step``; returns its prefix ``.../ckpt-<step>``."""
        self._step.assign(int(step))
        self._epoch.assign(int(epoch))
        return self._manager.save(checkpoint_number=int(step))


def copy_checkpoint(prefix: str, folder: str) -> str:
    """Copy the TensorFlow checkpoint ``prefix`` (``.../ckpt-N``: its ``.index``, ``.data-*`` and sidecar files)
    alone into ``folder`` (emptied first), with the ``checkpoint`` state file ``tf.train`` reads; returns ``folder``."""
    import glob
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for path in glob.glob(prefix + ".*"):
        shutil.copy2(path, folder)
    name = os.path.basename(prefix)
    atomic_write_text(os.path.join(folder, "checkpoint"),
                      f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    return folder


def model_facts(model) -> dict:
    """What TensorFlow knows about a run of ``model`` for its card: ``backend``, ``accelerator`` (``"TPU"``,
    ``"GPU"`` or ``"CPU"``), ``num_devices``/``num_replicas`` (the current ``tf.distribute`` strategy's replicas),
    ``strategy`` (its class name), ``precision`` (the tf_keras policy, e.g. ``"mixed_bfloat16"``),
    ``jit_compile`` and ``name_or_path`` (what the weights were loaded from)."""
    import tensorflow as tf
    import tf_keras

    strategy = tf.distribute.get_strategy()
    kind = next((k for k in ("TPU", "GPU") if tf.config.list_logical_devices(k)), "CPU")
    return dict(backend="tensorflow", accelerator=kind, num_replicas=strategy.num_replicas_in_sync,
                num_devices=strategy.num_replicas_in_sync, strategy=type(strategy).__name__,
                precision=tf_keras.mixed_precision.global_policy().name,
                jit_compile=getattr(model, "_jit_compile", None), name_or_path=getattr(model, "name_or_path", None))
