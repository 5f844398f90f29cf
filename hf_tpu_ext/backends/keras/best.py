"""Best-model tracking of the Keras backend (``--load_best_model_at_end``), on disk in ``checkpoints/best/``.

Which evaluation is the best is decided by the shared loop (:class:`hf_tpu_ext.best_metric.BestTracker`,
``backend.best``); each new best's trainable weights go to ``checkpoints/best/``
(:func:`hf_tpu_ext.backends.keras.checkpoint.save_best`), so a killed run's best survives into the resumed one;
``backend.best_model_checkpoint`` is its folder.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from hf_tpu_ext.backends.keras import checkpoint as ckpt
from hf_tpu_ext.backends.keras.architectures.name_table import renamed_paths

logger = logging.getLogger("hf_tpu_ext")


def restore_best(backend) -> None:
    """Resume the best-model tracking (``backend.best``, a :class:`~hf_tpu_ext.best_metric.BestTracker`) from
    ``checkpoints/best/`` when it belongs to the restored history (its step at or before the checkpoint's, the
    same metric); a best of a killed later segment is redone."""
    if not getattr(backend.args, "load_best_model_at_end", False):
        return
    best = ckpt.read_best(backend.args.output_dir, with_weights=False)
    if best is not None and best["metric"] == backend.best.key and 0 < best["global_step"] <= backend.current_step():
        backend.best.value, backend.best.step = best["value"], best["global_step"]
        backend.best_model_checkpoint = best["folder"]


def keep_best(backend, step: int, key: str, value: float) -> None:
    """The new best evaluation's trainable weights on disk (process 0 writes), not in memory: a killed run's best
    survives into the resumed one."""
    if backend.is_chief:
        if backend.on_tensorflow:
            from keras import ops

            weights = [ops.convert_to_numpy(v.value) for v in backend.model.trainable_variables]
        else:
            import jax

            weights = [np.asarray(x) for x in jax.device_get(backend.state[0])]
        ckpt.save_best(backend.args.output_dir, step, key, float(value),
                       {var.path: w for var, w in zip(backend.model.trainable_variables, weights)})
        logger.info("new best %s=%.4g at step %d: weights kept in %s", key, value, step,
                    os.path.join(backend.args.output_dir, ckpt.BEST_DIRNAME))
    backend.best_model_checkpoint = os.path.join(backend.args.output_dir, ckpt.BEST_DIRNAME)


def load_best(backend) -> None:
    """At the end of training: the kept best weights into the model's variables (the export then writes them);
    sets ``backend.loaded_best``. A missing or other step's file is warned about and the final weights stay."""
    best_step = backend.best.step
    if best_step is None:
        logger.warning("load_best_model_at_end: no evaluation after step 0; the final weights are exported.")
        return
    if not backend.is_chief:  # only the chief exports (and only it wrote the file)
        return
    kept = ckpt.read_best(backend.args.output_dir)
    if kept is None or kept["global_step"] != best_step:
        logger.warning("load_best_model_at_end: the best weights of step %d are gone from %s; the final weights "
                       "are exported.", best_step, os.path.join(backend.args.output_dir, ckpt.BEST_DIRNAME))
        return
    weights = renamed_paths(kept["weights"], getattr(backend.model, "legacy_paths", ()))  # an older run's paths
    for var in backend.model.trainable_variables:
        var.assign(weights[var.path])
    backend.loaded_best = True
    logger.info("loaded the best model of step %d (load_best_model_at_end)", best_step)
