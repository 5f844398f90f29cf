"""Best-model tracking of the Keras backend (``--load_best_model_at_end``), on disk in ``checkpoints/best/``.

Which evaluation is the best is decided by the shared loop (:class:`hf_tpu_ext.best_metric.BestTracker`,
``backend.best``); each new best's trainable weights go to ``checkpoints/best/``
(:func:`save_best_weights`, called by the trainer's ``keep_best``), so a killed run's best survives into the resumed
one; ``backend.best_model_checkpoint`` is that folder once a best is kept.
"""

from __future__ import annotations

import logging
import os
from typing import Dict

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


def best_folder(output_dir: str) -> str:
    """``output_dir/checkpoints/best/``: where the best evaluation's weights are kept."""
    return os.path.join(output_dir, ckpt.BEST_DIRNAME)


def save_best_weights(output_dir: str, step: int, key: str, value: float, weights: Dict[str, np.ndarray]) -> None:
    """The new best evaluation's trainable weights (variable path -> array) on disk, not in memory: a killed run's
    best survives into the resumed one (the caller is the process that writes files)."""
    ckpt.save_best(output_dir, step, key, float(value), weights)
    logger.info("new best %s=%.4g at step %d: weights kept in %s", key, value, step, best_folder(output_dir))


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
                       "are exported.", best_step, best_folder(backend.args.output_dir))
        return
    weights = renamed_paths(kept["weights"], getattr(backend.model, "legacy_paths", ()))  # an older run's paths
    for var in backend.model.trainable_variables:
        var.assign(weights[var.path])
    backend.loaded_best = True
    logger.info("loaded the best model of step %d (load_best_model_at_end)", best_step)
