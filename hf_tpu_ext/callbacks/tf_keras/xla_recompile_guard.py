"""Catch recompilations of the train function: on a TPU each one stalls training for seconds to minutes."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

import tf_keras

from hf_tpu_ext.callbacks import read_global_step, register_callback
from hf_tpu_ext.callbacks.recompile_guard import (RecompileGuardCore, Signature, check_guard_arguments,
                                                  describe_change, recompiled_message)
from hf_tpu_ext.callbacks.xla_compile_log import compile_log

logger = logging.getLogger("hf_tpu_ext")
__all__ = ["XLARecompileGuard", "signature_of", "describe_change", "Signature"]


def _spec_entries(obj: Any, path: str, out: List[Tuple[str, str]]) -> None:
    """Flatten a traced input signature into ``(path, description)`` pairs (shape and dtype per tensor)."""
    import tensorflow as tf

    if isinstance(obj, tf.TensorSpec):
        shape = tuple(obj.shape.as_list()) if obj.shape.rank is not None else None
        out.append((path, f"shape {shape} {obj.dtype.name}"))
        return
    if isinstance(obj, dict):
        for key in sorted(obj, key=str):
            _spec_entries(obj[key], f"{path}[{key!r}]", out)
        return
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _spec_entries(item, f"{path}[{i}]", out)
        return
    # iterators (IteratorSpec, DistributedIteratorSpec) carry the element structure
    element = getattr(obj, "_element_spec", None)
    if element is not None:
        _spec_entries(element, path, out)
        return
    values = getattr(obj, "_value_specs", None)  # PerReplicaSpec: one spec per replica
    if values:
        _spec_entries(values[0], path, out)
        return
    out.append((path, repr(obj)))


def signature_of(concrete_function) -> Signature:
    """``((path, "shape (8, 128) int32"), ...)`` for the inputs of a concrete function, iterators unpacked.

    Args:
        concrete_function: a ``tf.types.experimental.ConcreteFunction`` (one trace of a ``tf.function``).

    Returns:
        A hashable tuple describing every input tensor (shape with None for unknown dims, dtype) or
        Python value, by its path (``args[0][0]['input_ids']``: first argument, element 0, key).
    """
    args, kwargs = concrete_function.structured_input_signature
    out: List[Tuple[str, str]] = []
    _spec_entries(tuple(args), "args", out)
    _spec_entries(dict(kwargs), "kwargs", out)
    return tuple(out)


class _Tracked:
    """Traces seen of one train function object."""

    def __init__(self, fn):
        self.fn = fn  # keep it alive so its id stays unique
        self.tracing_count = 0
        self.signatures: List[Signature] = []
        self.xla_modules: List[int] = []  # XLA compilations seen during its train steps
        self.compilations = 0  # max(distinct signatures, XLA compilations)


@register_callback("xla_recompile_guard")
class XLARecompileGuard(RecompileGuardCore, tf_keras.callbacks.Callback):
    """Warn or fail when the train function is traced/compiled again after warm-up.

    A ``tf.function`` is traced (and, with XLA, compiled) once per distinct input signature, and with
    ``jit_compile=True`` XLA compiles once more per new concrete input shape under one trace. A second
    compilation mid-run -- a batch of another shape (a partial last batch, a different sequence length), or
    another dtype -- costs seconds on a GPU, minutes on a TPU pod, every time it happens.

    Two signals are counted per train function, and the larger count is the number of compilations:

    * XLA's own compilations (:mod:`hf_tpu_ext.callbacks.xla_compile_log`: XLA's dump folder, one module id
      per compilation), counted when they happen between ``on_train_batch_begin`` and
      ``on_train_batch_end`` (evaluation and ``predict`` inside ``fit`` are not the train step). This sees
      the short-last-batch recompilation: ``fit(x, batch_size=8, jit_compile=True)`` on 20 samples is one
      trace with a ``None`` batch dimension but two XLA compilations (shapes 8 and 4).
    * distinct traced input signatures of ``model.<function_attr>`` (``experimental_get_tracing_count()``,
      then the concrete functions' inputs; a function that creates variables is traced twice for one
      signature: that counts once) -- the only signal without XLA, and the one that names the input that
      changed.

    Functions are tracked per object, so a ``fit`` that builds a new train function (after ``compile``)
    starts its own warm-up. XLA's dump is switched on when the guard is constructed; construct it before
    the process's first XLA compilation (XLA reads ``XLA_FLAGS`` once). With ``jit_compile`` on and no XLA
    compilation seen after the first step, the guard logs that it counts traces only.

    Writes ``xla_compilations`` (compilations of the current train function, int) into batch and epoch logs.

    Args:
        warmup_compilations: compilations allowed per train function before the guard acts (>= 1).
        action: ``"warn"`` (``logging`` + ``warnings.warn(RuntimeWarning)``) or ``"raise"``
            (:class:`hf_tpu_ext.errors.RecompilationError`, which stops ``fit``).
        function_attr: the model attribute holding the train ``tf.function``.
        count_xla_compilations: read XLA's compilations (True) or only the traces (False: XLA_FLAGS untouched).

    Raises:
        ArgumentError: an unknown ``action`` or ``warmup_compilations < 1``.
    """

    def __init__(self, warmup_compilations: int = 1, action: str = "warn", function_attr: str = "train_function",
                 count_xla_compilations: bool = True):
        super().__init__()
        self.warmup_compilations = check_guard_arguments(action, warmup_compilations)
        self.init_guard(action)
        self.function_attr = function_attr
        self._tracked: Dict[int, _Tracked] = {}
        self._current: Optional[_Tracked] = None
        self._warned_untraceable = False
        self._xla_log = compile_log() if count_xla_compilations else None
        self._warned_no_xla = False
        self._supports_tf_logs = True

    @classmethod
    def from_run(cls, run) -> "XLARecompileGuard":
        """Configure for hf-tpu-ext's trainer: warn, counting traces only.

        The trainer's XLA functions are traced with ``reduce_retracing=False`` on static shapes, so each XLA
        compilation is a new trace there; XLA_FLAGS is left as the user set it.
        """
        return cls(count_xla_compilations=False)

    @property
    def compilations(self) -> int:
        """Compilations of the current train function (0 before the first call): the larger of its XLA
        compilations during train steps and its distinct traced input signatures."""
        return self._current.compilations if self._current else 0

    def _check(self, xla_modules: Optional[List[int]] = None) -> None:
        fn = getattr(self.model, self.function_attr, None) if self.model is not None else None
        get_count = getattr(fn, "experimental_get_tracing_count", None)
        if get_count is None:
            if fn is not None and not self._warned_untraceable:
                self._warned_untraceable = True
                logger.warning("XLARecompileGuard: model.%s is not a tf.function (run_eagerly?); nothing to guard.",
                               self.function_attr)
            return
        tracked = self._tracked.get(id(fn))
        if tracked is None or tracked.fn is not fn:
            tracked = self._tracked[id(fn)] = _Tracked(fn)
        self._current = tracked
        count = get_count()
        new_signatures: List[Signature] = []
        if count != tracked.tracing_count:
            tracked.tracing_count = count
            try:
                concrete = fn._list_all_concrete_functions()  # private, but the only way to see the traces' inputs
                signatures = [signature_of(cf) for cf in concrete]
            except Exception:  # pragma: no cover - TF internals moved: fall back to counting traces
                signatures = [(("trace", str(i)),) for i in range(count)]
            new_signatures = [s for s in dict.fromkeys(signatures) if s not in tracked.signatures]
        previous = tracked.signatures[-1] if tracked.signatures else None
        tracked.signatures.extend(new_signatures)
        tracked.xla_modules.extend(xla_modules or ())
        self._warn_if_xla_unseen(tracked)
        total = max(len(tracked.signatures), len(tracked.xla_modules))
        first_new, tracked.compilations = tracked.compilations + 1, max(total, tracked.compilations)
        for n in range(first_new, tracked.compilations + 1):
            signature = new_signatures.pop(0) if new_signatures else None
            if n <= self.warmup_compilations:
                previous = signature if signature is not None else previous
                continue
            if signature is not None:
                cause = describe_change(previous, signature) if previous is not None else "a new input signature"
                previous = signature
            else:
                cause = ("XLA compiled the step for a new concrete input shape under the same trace (a relaxed "
                         "None dimension, e.g. a short last batch)")
            step = read_global_step(self.model)
            where = f" at global step {step}" if step is not None else ""
            self.act(recompiled_message(self.function_attr, where, n, self.warmup_compilations, cause))

    def _warn_if_xla_unseen(self, tracked: _Tracked) -> None:
        """Log once when the model compiles with XLA but XLA's dump shows nothing (XLA_FLAGS read earlier)."""
        if (self._xla_log is None or self._warned_no_xla or tracked.xla_modules or not tracked.signatures
                or not getattr(self.model, "_jit_compile", False)):
            return
        self._warned_no_xla = True
        logger.warning(
            "XLARecompileGuard: the model compiles with XLA, but XLA's compilations cannot be seen in this "
            "process (XLA read XLA_FLAGS before the guard was created); counting traces only, which misses a "
            "new batch size under one trace. Create the guard before the first XLA compilation."
        )

    def _poll_xla(self) -> List[int]:
        return list(self._xla_log.poll()) if self._xla_log is not None else []

    def on_train_batch_begin(self, batch, logs=None):
        self._poll_xla()  # compiled outside a train step (evaluation, predict in a callback): not counted

    def on_train_batch_end(self, batch, logs=None):
        self._check(self._poll_xla())
        if logs is not None and self._current is not None:
            logs["xla_compilations"] = self.compilations

    def on_epoch_end(self, epoch, logs=None):
        self._check()
        if logs is not None and self._current is not None:
            logs["xla_compilations"] = self.compilations
