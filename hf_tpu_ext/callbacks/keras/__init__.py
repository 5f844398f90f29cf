"""Keras 3 callbacks (``keras.callbacks.Callback``) under the built-in names, for ``model.fit`` on the JAX and
TensorFlow backends and keras-hub task models: ``push_to_hub``, ``throughput``, ``xla_recompile_guard``,
``masked_lm_metrics``. Get them by name with ``get_callback(name, framework="keras")`` (or ``model=``).

Notes common to all of them: on JAX, Keras keeps the training state outside the model's variables during an
epoch and syncs it when a callback reads ``self.model``; the per-batch hooks here read ``self._model`` (no
sync) and take step counts from the batch indices Keras passes, so they cost no device read per step.
"""

from __future__ import annotations

from hf_tpu_ext.distributed import process_index as _process_index


def backend_name() -> str:
    """``keras.backend.backend()``: ``"jax"``, ``"tensorflow"``, ``"torch"`` or ``"numpy"``."""
    import keras

    return keras.backend.backend()


def process_index() -> int:
    """This process's index among the training processes (0 on the chief / a single host): the one answer of
    :func:`hf_tpu_ext.distributed.process_index` (a multi-host ``keras.distribution`` on JAX, ``TF_CONFIG`` on
    TensorFlow)."""
    return _process_index()
