"""Best-model tracking of the Keras backend (``--load_best_model_at_end``), on disk in ``checkpoints/best/``.

Each evaluation better than the best so far writes the trainable weights to ``checkpoints/best/``
(:func:`hf_tpu_ext.backends.keras.checkpoint.save_best`), so a killed run's best survives into the resumed one;
``backend._best`` is ``(value, step)`` of the best and ``backend.best_model_checkpoint`` its folder.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Dict

import numpy as np

logger = logging.getLogger("hf_tpu_ext")


def restore_best(backend) -> None:
    """Resume the best-model tracking from ``checkpoints/best/`` when it belongs to the restored history (its
    step at or before the checkpoint's, the same metric); a best of a killed later segment is redone."""
    from hf_tpu_ext.args import BEST_METRICS
    from hf_tpu_ext.backends.keras import checkpoint as ckpt

    if not getattr(backend.args, "load_best_model_at_end", False):
        return
    best = ckpt.read_best(backend.args.output_dir, with_weights=False)
    key = BEST_METRICS[getattr(backend.args, "metric_for_best_model", None) or "loss"]
    if best is not None and best["metric"] == key and 0 < best["global_step"] <= backend._step:
        backend._best = (best["value"], best["global_step"])
        backend.best_model_checkpoint = best["folder"]


def track_best(backend, metrics: Dict[str, float], step: int) -> None:
    """After an evaluation at ``step``: keep its weights on disk when its metric (``--metric_for_best_model``) is
    the best so far (step 0, ``eval_on_start``, is the untrained baseline and never the best)."""
    from hf_tpu_ext.args import BEST_METRICS

    args = backend.args
    if not getattr(args, "load_best_model_at_end", False) or step <= 0:
        return
    key = BEST_METRICS[getattr(args, "metric_for_best_model", None) or "loss"]
    greater = bool(getattr(args, "greater_is_better", None)) and key != "eval_loss"
    value = metrics.get(key)
    if value is None or not math.isfinite(value):
        return
    best = getattr(backend, "_best", None)
    if best is None or (value > best[0] if greater else value < best[0]):
        from hf_tpu_ext.backends.keras import checkpoint as ckpt

        if backend.is_chief:  # on disk, not in memory: a killed run's best survives into the resumed one
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
        backend._best = (float(value), step)
        backend.best_model_checkpoint = os.path.join(backend.args.output_dir, ckpt.BEST_DIRNAME)


def load_best(backend) -> None:
    """At the end of training: the kept best weights into the model's variables (the export then writes them);
    sets ``backend.loaded_best``. A missing or other step's file is warned about and the final weights stay."""
    from hf_tpu_ext.backends.keras import checkpoint as ckpt

    best = getattr(backend, "_best", None)
    if best is None:
        logger.warning("load_best_model_at_end: no evaluation after step 0; the final weights are exported.")
        return
    if not backend.is_chief:  # only the chief exports (and only it wrote the file)
        return
    kept = ckpt.read_best(backend.args.output_dir)
    if kept is None or kept["global_step"] != best[1]:
        logger.warning("load_best_model_at_end: the best weights of step %d are gone from %s; the final weights "
                       "are exported.", best[1], os.path.join(backend.args.output_dir, ckpt.BEST_DIRNAME))
        return
    for var in backend.model.trainable_variables:
        var.assign(kept["weights"][var.path])
    backend.loaded_best = True
    logger.info("loaded the best model of step %d (load_best_model_at_end)", best[1])
