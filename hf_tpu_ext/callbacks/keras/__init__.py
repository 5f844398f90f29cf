"""Keras 3 callbacks (``keras.callbacks.Callback``) under the built-in names, for ``model.fit`` on the JAX and
TensorFlow backends and keras-hub task models: ``push_to_hub``, ``throughput``, ``xla_recompile_guard``,
``masked_lm_metrics``. Get them by name with ``get_callback(name, framework="keras")`` (or ``model=``).

Notes common to all of them: on JAX, Keras keeps the training state outside the model's variables during an
epoch and syncs it when a callback reads ``self.model``; the per-batch hooks here read ``self._model`` (no
sync) and take step counts from the batch indices Keras passes, so they cost no device read per step.
"""

from __future__ import annotations


def backend_name() -> str:
    """``keras.backend.backend()``: ``"jax"``, ``"tensorflow"``, ``"torch"`` or ``"numpy"``."""
    import keras

    return keras.backend.backend()


def process_index() -> int:
    """This process's index among the training processes (0 on the chief / a single host).

    JAX: ``keras.distribution`` (``jax.process_index()`` under a multi-host ``keras.distribution``
    setup); TensorFlow: the ``TF_CONFIG`` task index of a worker (0 without one); other backends: 0.
    """
    name = backend_name()
    if name == "jax":
        import jax

        return int(jax.process_index())
    if name == "tensorflow":
        import json
        import os

        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        task, cluster = config.get("task") or {}, config.get("cluster") or {}
        if not task or task.get("type") == "chief":
            return 0
        # without a "chief" task, worker 0 is the chief (tf.distribute's convention)
        return int(task.get("index", 0)) + (1 if "chief" in cluster else 0)
    return 0
