"""bfloat16 matmuls that XLA:CPU runs natively (AVX512-BF16 / AMX), forward and backward, in the traced step.

Why: Keras' mixed_bfloat16 layers multiply bf16 x bf16 -> bf16 (``jnp.matmul``/``jnp.einsum`` without a
``preferred_element_type``). jaxlib 0.10.2's XLA:CPU rewrites such a dot to ``convert`` f32, an f32 dot,
``convert`` back, so bf16 buys nothing (benchmarks/NOTES.md "Round five"). A dot of bf16 operands with a
**float32 result** (``preferred_element_type=float32``) is kept as is and YNNPACK runs it on the CPU's bf16
instructions: 4096x256 @ 256x1024 at 297 GFLOP/s per CPU-second against 117 in float32 and 101 for the
bf16 -> bf16 dot (2-core Sapphire Rapids VM, NOTES "Round six"). This is also what bf16 accumulation on a TPU/GPU
means (float32 accumulators), so the numbers are those of float32 accumulation rounded to bf16 once.

:func:`native_bf16_dots` routes Keras' JAX backend ``matmul`` and ``einsum`` (what ``Dense``, ``EinsumDense`` and
``MultiHeadAttention`` call) through :func:`bf16_matmul` / :func:`bf16_einsum` while the step is traced on this
thread, for bf16 x bf16 operands without batch dimensions only (the projections and the output head; a batched
bf16 x bf16 -> float32 dot, e.g. attention's, can land on XLA:CPU's Eigen ``DotThunk``, which rejects it:
"Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"), so attention keeps Keras' own path and
float32 runs are untouched. Each has its own backward pass (a
``jax.custom_vjp``) whose dots are again bf16 x bf16 -> float32, rounded to bf16 (autodiff of a float32-result
dot would multiply a float32 cotangent by a bf16 operand, which XLA:CPU computes in float32).

:func:`flat_dots` (float32 and other non-bf16 operands) computes the same non-batched matmuls/einsums as one 2-D
dot of bitcast reshapes (``[B, L, K] @ [K, N]`` as ``[B*L, K] @ [K, N]``). Why: for a dot that contracts two
dims of a 3-D/4-D operand (the gradient of a ``Dense`` kernel contracts batch and sequence), XLA's dot
canonicalization moves the contracting dims last with a physical transpose; the 2-D dot's gradient
(``x^T @ g``) has one contracting dim, which XLA:CPU reads in place -- what TensorFlow's ``MatMul`` on 2-D
reshapes gives (benchmarks/NOTES.md "Round seven": 114 copy/transpose fusions per small-preset step -> fewer).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import ContextManager, Iterator, Optional, Tuple

_active = threading.local()


def _pref_einsum(spec: str, a, b):
    import jax.numpy as jnp

    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _grad_specs(spec: str) -> Optional[Tuple[str, str]]:
    """``(spec of d lhs, spec of d rhs)`` for a two-operand einsum ``"lhs,rhs->out"`` whose every index appears in
    at least two of the three terms (contractions, free and batch dims); None for anything else (traces, sums
    over one operand's own index, repeated indices, ellipses, implicit output)."""
    if "->" not in spec or "." in spec:
        return None
    inputs, out = spec.replace(" ", "").split("->")
    terms = inputs.split(",")
    if len(terms) != 2:
        return None
    lhs, rhs = terms
    for term in (lhs, rhs, out):
        if len(set(term)) != len(term):
            return None
    for index in set(lhs + rhs + out):
        if (index in lhs) + (index in rhs) + (index in out) < 2:
            return None
    return f"{out},{rhs}->{lhs}", f"{out},{lhs}->{rhs}"


@functools.lru_cache(maxsize=None)
def _einsum_with_vjp(spec: str):
    import jax

    d_lhs, d_rhs = _grad_specs(spec)

    @jax.custom_vjp
    def f(a, b):
        return _pref_einsum(spec, a, b)

    def fwd(a, b):
        return _pref_einsum(spec, a, b), (a, b)

    def bwd(residuals, g):
        a, b = residuals
        g = g.astype(a.dtype)
        return _pref_einsum(d_lhs, g, b), _pref_einsum(d_rhs, g, a)

    f.defvjp(fwd, bwd)
    return f


def _has_batch_dims(spec: str) -> bool:
    """Whether an index of ``"lhs,rhs->out"`` appears in all three terms (a batched dot, e.g. attention's)."""
    inputs, _, out = spec.replace(" ", "").partition("->")
    lhs, _, rhs = inputs.partition(",")
    return any(index in rhs and index in out for index in lhs)


def bf16_einsum(spec: str, a, b):
    """``einsum(spec, a, b)`` of bf16 operands -> bf16, every dot (forward and backward) with float32 results.

    Args:
        spec: a two-operand einsum (``"abc,cd->abd"``); one :func:`_grad_specs` cannot differentiate falls back
            to ``jnp.einsum`` with a float32 result (its backward then runs in float32).
        a, b: bfloat16 arrays.

    Returns:
        bfloat16 array of the einsum's shape.
    """
    if _grad_specs(spec) is None:
        return _pref_einsum(spec, a, b)
    return _einsum_with_vjp(spec)(a, b)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _matmul_spec(lhs_rank: int, rhs_rank: int) -> Optional[str]:
    """The einsum of ``matmul`` for ranks >= 2 with equal batch ranks or a 2-D right operand; None otherwise."""
    if lhs_rank < 2 or rhs_rank < 2 or (rhs_rank != 2 and rhs_rank != lhs_rank):
        return None
    batch = _LETTERS[: lhs_rank - 2]
    lhs = batch + "yz"
    rhs = ("zw" if rhs_rank == 2 else batch + "zw")
    return f"{lhs},{rhs}->{batch}yw"


def bf16_matmul(a, b):
    """``a @ b`` of bf16 operands (``[..., M, K] @ [K, N]`` or equal batch dims) as :func:`bf16_einsum`;
    other ranks: ``jnp.matmul`` with a float32 result, rounded to bf16."""
    import jax.numpy as jnp

    spec = _matmul_spec(a.ndim, b.ndim)
    if spec is None or (b.ndim > 2 and a.shape[:-2] != b.shape[:-2]):
        return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
    return bf16_einsum(spec, a, b)


def _flat_plan(spec: str, a, b):
    """``(lhs rows, contraction, rhs cols, output shape)`` when ``"lhs,rhs->out"`` is ``[F.., C..] x [C.., G..] -> [F.., G..]``
    (free dims of ``a`` first, contracted dims last in ``a`` and first in ``b``, output ``F + G``); else None."""
    if "->" not in spec or "." in spec:
        return None
    inputs, out = spec.replace(" ", "").split("->")
    terms = inputs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    lhs, rhs = terms
    contracted = "".join(i for i in lhs if i in rhs)
    free_l, free_r = lhs[: len(lhs) - len(contracted)], rhs[len(contracted):]
    if not contracted or lhs != free_l + contracted or rhs != contracted + free_r or out != free_l + free_r:
        return None
    rows = contraction = cols = 1
    for d in a.shape[: len(free_l)]:
        rows *= int(d)
    for d in a.shape[len(free_l):]:
        contraction *= int(d)
    for d in b.shape[len(contracted):]:
        cols *= int(d)
    return rows, contraction, cols, tuple(a.shape[: len(free_l)]) + tuple(b.shape[len(contracted):])


def flat_einsum(spec: str, a, b):
    """``einsum(spec, a, b)`` as one 2-D dot of reshapes, or None when ``spec`` has another form (see
    :func:`_flat_plan`; batched dots such as attention's are left to the caller).

    Args:
        spec: two-operand einsum, e.g. ``"abc,cde->abde"`` (Keras' query projection).
        a, b: arrays of one float dtype; shapes as ``spec`` says.

    Returns:
        array of the einsum's shape and dtype, or None.
    """
    plan = _flat_plan(spec, a, b)
    if plan is None:
        return None
    rows, contraction, cols, shape = plan
    return (a.reshape(rows, contraction) @ b.reshape(contraction, cols)).reshape(shape)


def _both_bf16(*operands) -> bool:
    import jax.numpy as jnp

    return len(operands) == 2 and all(getattr(x, "dtype", None) == jnp.bfloat16 for x in operands)


def _keras_jax_numpy():
    """``(module, convert_to_tensor)``: Keras' JAX backend ops module (``keras.src.backend.jax.numpy``, whose
    ``matmul``/``einsum`` every ``keras.ops`` call and layer reaches) and its ``convert_to_tensor`` (autocasts a
    variable to the compute dtype).

    The one adapter over this private module. The public alternative: ``keras.ops.matmul``/``keras.ops.einsum``
    called by the model's own layers (the architectures could call :func:`bf16_matmul` themselves); Keras has no
    public hook into the backend op a built-in layer calls.
    """
    from keras.src.backend.jax import numpy as knp
    from keras.src.backend.jax.core import convert_to_tensor

    return knp, convert_to_tensor


def _install() -> None:
    """Wrap Keras' JAX ``matmul``/``einsum`` once per process; the wrappers only switch while active."""
    knp, convert_to_tensor = _keras_jax_numpy()
    if getattr(knp.matmul, "_hf_tpu_bf16_dot", False):
        return
    original_matmul, original_einsum = knp.matmul, knp.einsum

    def matmul(x1, x2):
        if getattr(_active, "on", False) or getattr(_active, "flat", False):
            a, b = convert_to_tensor(x1), convert_to_tensor(x2)
            if b.ndim == 2 and a.ndim >= 2:
                if _both_bf16(a, b):
                    if getattr(_active, "on", False):
                        return bf16_matmul(a, b)
                elif getattr(_active, "flat", False) and a.dtype == b.dtype:
                    spec = _LETTERS[: a.ndim - 1] + "z,zw->" + _LETTERS[: a.ndim - 1] + "w"
                    return flat_einsum(spec, a, b)
        return original_matmul(x1, x2)

    def einsum(subscripts, *operands, **kwargs):
        on, flat = getattr(_active, "on", False), getattr(_active, "flat", False)
        if (on or flat) and not kwargs and isinstance(subscripts, str) and not _has_batch_dims(subscripts):
            arrays = [convert_to_tensor(x) for x in operands]
            if _both_bf16(*arrays):
                if on:
                    return bf16_einsum(subscripts, *arrays)
            elif flat and len(arrays) == 2 and arrays[0].dtype == arrays[1].dtype:
                out = flat_einsum(subscripts, *arrays)
                if out is not None:
                    return out
        return original_einsum(subscripts, *operands, **kwargs)

    matmul._hf_tpu_bf16_dot = einsum._hf_tpu_bf16_dot = True
    knp.matmul, knp.einsum = matmul, einsum


@contextlib.contextmanager
def _switch(name: str, enabled: bool) -> Iterator[None]:
    """Set the thread-local switch ``name`` ("on": bf16 dots, "flat": 2-D dots) for the block; restore it after."""
    if not enabled:
        yield
        return
    _install()
    previous = getattr(_active, name, False)
    setattr(_active, name, True)
    try:
        yield
    finally:
        setattr(_active, name, previous)


def native_bf16_dots(enabled: bool = True) -> ContextManager[None]:
    """While tracing inside this block (this thread), Keras' bf16 x bf16 matmuls/einsums have float32 results
    (module doc); ``enabled=False`` changes nothing."""
    return _switch("on", enabled)


def flat_dots(enabled: bool = True) -> ContextManager[None]:
    """While tracing inside this block (this thread), Keras' non-bf16, non-batched matmuls/einsums of the
    ``[F.., C..] x [C.., G..]`` form are one 2-D dot (module doc, :func:`flat_einsum`); ``enabled=False``
    changes nothing."""
    return _switch("flat", enabled)
