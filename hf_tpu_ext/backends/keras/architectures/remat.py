"""``--gradient_checkpointing`` on the Keras backend: each encoder layer's call under ``jax.checkpoint`` (remat).

Why here and not ``keras.RematScope``: Keras 3.15's remat (``keras.RematScope`` / ``keras.remat``) is decided when
a layer is *built* (the scope in force at construction) and wraps the call in a plain ``jax.checkpoint`` with no
policy, so every matmul would be computed again in the backward pass. Gradient checkpointing is a training choice
(the same model is exported, evaluated and probed without it), so the step turns it on while it traces
(:func:`layer_checkpointing`, as it does counter-based dropout and erf GELU) and every architecture's layer loop
calls its layers through :func:`call_layer`: one place for the five families (``encoder.py``'s BERT, DistilBERT,
RoBERTa; ``modernbert.py``; ``eurobert.py``).

Policy (:data:`POLICY`, ``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``): the backward pass keeps the
outputs of the projections (``x @ W``: a ``dot_general`` with no batch dimension; query/key/value, attention
output, both feed-forward matmuls) and recomputes everything between them: the attention (its scores and
probabilities are batched dots, ``[B, heads, L, L]`` the largest temporaries at long lengths), LayerNorms,
GELU/GeGLU/SwiGLU, dropout masks. The recomputation costs element-wise work and the attention, not the
projections' FLOPs (figures: benchmarks/compiled_memory.py, benchmarks/NOTES.md).

Dropout under remat: the counter-based masks (:mod:`hf_tpu_ext.backends.keras.dropout`) are a function of the
step's key, the call counter (taken once, while the layer is traced; the backward pass replays that trace, it does
not trace again) and the element index, so the recomputed masks are the forward's: losses equal those without.
Keras' own dropout (a ``SeedGenerator`` variable updated inside the layer) cannot run under remat: the step uses
the counter-based dropout whenever it checkpoints.

Imported only on the Keras backend (JAX), after the framework starts.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Optional

_active = threading.local()


def policy(name: str = "dots_with_no_batch_dims_saveable") -> Callable[..., bool]:
    """The ``jax.checkpoint_policies`` entry called ``name`` (what :func:`layer_checkpointing` takes)."""
    import jax

    return getattr(jax.checkpoint_policies, name)


#: the policy ``--gradient_checkpointing`` uses (module doc): projections kept, the rest recomputed
POLICY = "dots_with_no_batch_dims_saveable"


@contextlib.contextmanager
def layer_checkpointing(name: Optional[str] = POLICY) -> Iterator[None]:
    """While a model is traced inside this block (this thread), :func:`call_layer` wraps each encoder layer in
    ``jax.checkpoint`` with the policy ``jax.checkpoint_policies.<name>``; ``name=None`` changes nothing."""
    previous = getattr(_active, "policy", None)
    _active.policy = policy(name) if name else None
    try:
        yield
    finally:
        _active.policy = previous


def call_layer(layer: Callable[..., Any], x, *args, **kwargs):
    """``layer(x, *args, **kwargs)``, under ``jax.checkpoint`` while :func:`layer_checkpointing` is active.

    Args:
        layer: an encoder layer (a Keras layer; its weights are read from the step's ``stateless_call`` scope, so
            they enter the checkpointed function as closed-over values and their gradients flow as without remat).
        x: the hidden states ``[B, L, H]``; ``args``/``kwargs``: the layer's other inputs (masks, RoPE tables,
            window, ``training``), closed over as they are.

    Returns:
        the layer's output (``[B, L, H]``, ``x``'s dtype), the same values with or without remat.
    """
    chosen = getattr(_active, "policy", None)
    if chosen is None:
        return layer(x, *args, **kwargs)
    import jax

    return jax.checkpoint(lambda hidden: layer(hidden, *args, **kwargs), policy=chosen)(x)
