"""Exact GELU through ``erf`` in the compiled training step (what transformers' RoBERTa computes, cheaper on XLA:CPU).

Why: Keras 3's JAX backend computes the exact GELU as ``jax.nn.gelu(x, approximate=False) = 0.5 x erfc(-x / sqrt 2)``.
XLA lowers ``erfc`` to two rational approximations joined by selects plus an ``exp``, and its derivative again;
``0.5 x (1 + erf(x / sqrt 2))`` is the same function (Hendrycks & Gimpel 2016, eq. 1; transformers'
``GELUActivation``) with one polynomial ratio. Small preset on 2 CPU cores: 643 -> 621 ms per step (alternating
in-process rounds, benchmarks/NOTES.md "Round four"). In float32 the two differ by at most 1e-6 absolute over
[-12, 12] (erf cancels for ``x < -5``, where GELU's magnitude is below 1e-6 anyway; bfloat16: one ulp).

:func:`erf_gelu` routes Keras' backend ``gelu`` (what the ``"gelu"`` activation of keras-hub's layers calls) through
:func:`gelu_erf` while the step is traced on this thread; the model, its config and exported presets are unchanged
(they still name ``"gelu"``), and outside the block the original runs.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_active = threading.local()
_SQRT_HALF = 0.7071067811865476


def gelu_erf(x):
    """``0.5 x (1 + erf(x / sqrt 2))``, element-wise, in ``x``'s dtype (any float shape)."""
    import jax
    import jax.numpy as jnp

    return x * (jnp.asarray(0.5, x.dtype) + jnp.asarray(0.5, x.dtype) * jax.lax.erf(x * jnp.asarray(_SQRT_HALF, x.dtype)))


def _keras_jax_nn():
    """Keras' JAX backend ``nn`` module (``keras.src.backend.jax.nn``: the ``gelu`` that ``keras.ops.gelu`` and the
    ``"gelu"`` activation reach).

    The one adapter over this private module. The public alternative: ``keras.ops.gelu(x, approximate=False)``
    or a model's own activation calling :func:`gelu_erf`; Keras has no public hook into the backend op.
    """
    from keras.src.backend.jax import nn

    return nn


def _install() -> None:
    """Wrap Keras' JAX ``nn.gelu`` once per process; the wrapper only switches while :func:`erf_gelu` is active."""
    nn = _keras_jax_nn()
    original = nn.gelu
    if getattr(original, "_hf_tpu_erf_gelu", False):
        return

    def dispatching_gelu(x, approximate=True):
        if getattr(_active, "on", False) and not approximate:
            import jax.numpy as jnp

            x = jnp.asarray(x)
            if jnp.issubdtype(x.dtype, jnp.floating):
                return gelu_erf(x)
        return original(x, approximate)

    dispatching_gelu._hf_tpu_erf_gelu = True
    nn.gelu = dispatching_gelu


@contextlib.contextmanager
def erf_gelu() -> Iterator[None]:
    """While tracing inside this block (this thread), Keras' exact ``gelu`` is :func:`gelu_erf`."""
    _install()
    previous = getattr(_active, "on", False)
    _active.on = True
    try:
        yield
    finally:
        _active.on = previous
