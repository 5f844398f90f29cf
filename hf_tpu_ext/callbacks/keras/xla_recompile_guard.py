"""Catch XLA recompilations of a Keras 3 train step, counted from the compiler's own events."""

from __future__ import annotations

import logging
import re
import threading
from typing import Dict, List

import keras

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.keras import backend_name
from hf_tpu_ext.callbacks.recompile_guard import FunctionCompilations, RecompileGuardCore, check_guard_arguments
from hf_tpu_ext.callbacks.xla_compile_log import compile_log

logger = logging.getLogger("hf_tpu_ext")

# jax._src.dispatch.BACKEND_COMPILE_EVENT: recorded (with ``fun_name=``) after each XLA compilation that
# was not served from JAX's compilation cache (jax 0.4.x to 0.10)
JAX_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class _JaxCompileEvents:
    """Collects ``(fun_name, seconds)`` of JAX's backend compilations while registered."""

    def __init__(self):
        import jax.monitoring

        self._monitoring = jax.monitoring
        self._lock = threading.Lock()
        self._pending: List[Dict] = []
        self._registered = False

    def _listener(self, event: str, duration: float, **kwargs) -> None:
        if event == JAX_BACKEND_COMPILE_EVENT:
            with self._lock:
                self._pending.append({"fun_name": str(kwargs.get("fun_name", "?")), "seconds": float(duration)})

    def start(self) -> None:
        if not self._registered:
            self._monitoring.register_event_duration_secs_listener(self._listener)
            self._registered = True

    def stop(self) -> None:
        if self._registered:
            unregister = getattr(self._monitoring, "unregister_event_duration_listener", None)
            if unregister is not None:
                unregister(self._listener)
            self._registered = False

    def poll(self) -> List[Dict]:
        with self._lock:
            out, self._pending = self._pending, []
        return out


class _XlaDumpEvents:
    """TensorFlow backend: XLA's compilations from its dump folder (see ``callbacks.xla_compile_log``)."""

    def __init__(self):
        self._log = compile_log()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def poll(self) -> List[Dict]:
        # module "a_inference_one_step_on_data_123__" is the tf.function one_step_on_data
        return [{"fun_name": re.sub(r"^a_inference_|_\d+__$", "", name), "module_id": module_id}
                for module_id, name in self._log.poll().items()]


@register_callback("xla_recompile_guard", framework="keras")
class XLARecompileGuard(RecompileGuardCore, keras.callbacks.Callback):
    """Warn or fail when the train step is XLA-compiled again after warm-up (Keras 3, JAX or TensorFlow).

    Counts the compiler's real compilations, not Python traces:

    * JAX: a ``jax.monitoring`` listener for ``/jax/core/compile/backend_compile_duration``, the event JAX
      records after every XLA compilation (what ``JAX_LOG_COMPILES=1`` logs as "Finished XLA compilation");
      a compilation served from JAX's persistent compilation cache costs no compile and is not counted.
    * TensorFlow: XLA's dump folder, one module id per compilation
      (:mod:`hf_tpu_ext.callbacks.xla_compile_log`; ``jit_compile`` is Keras 3's default on TensorFlow).
      Construct the guard before the process's first XLA compilation (XLA reads ``XLA_FLAGS`` once).

    A compilation counts when it happens between ``on_train_batch_begin`` and ``on_train_batch_end``
    (evaluation and ``predict`` in other callbacks are not the train step), per train function: a
    ``compile()`` that makes Keras build a new one starts a new warm-up. Each new input shape (a short last
    batch, another sequence length) or dtype is a compilation: seconds on a GPU, minutes on a TPU pod.

    Writes ``xla_compilations`` (compilations of the current train function, int) into batch and epoch
    logs; ``events`` holds the messages, ``compiled`` the compilations seen (``fun_name``, and seconds on JAX).

    Args:
        warmup_compilations: compilations allowed per train function before the guard acts (>= 1).
        action: ``"warn"`` (``logging`` + ``warnings.warn(RuntimeWarning)``) or ``"raise"``
            (:class:`hf_tpu_ext.errors.RecompilationError`, which stops ``fit``).

    Raises:
        ArgumentError: an unknown ``action`` or ``warmup_compilations < 1``.
    """

    def __init__(self, warmup_compilations: int = 1, action: str = "warn"):
        super().__init__()
        self.warmup_compilations = check_guard_arguments(action, warmup_compilations)
        self.init_guard(action)
        self._functions = FunctionCompilations()
        self._checked_jit = False
        name = backend_name()
        if name == "jax":
            self._source = _JaxCompileEvents()
        elif name == "tensorflow":
            self._source = _XlaDumpEvents()
        else:
            self._source = None
            logger.warning("XLARecompileGuard: the %s backend does not compile with XLA here; nothing to guard.", name)

    @property
    def compiled(self) -> List[Dict]:
        """The compilations of the current train function (``fun_name``, and seconds on JAX)."""
        return self._functions.compiled

    @property
    def compilations(self) -> int:
        """XLA compilations of the current train function during train steps."""
        return len(self.compiled)

    def on_train_begin(self, logs=None):
        if self._source is not None:
            self._source.start()
            self._source.poll()  # compiled before training (building the model, the optimizer)

    def on_train_end(self, logs=None):
        if self._source is not None:
            self._source.stop()

    def on_train_batch_begin(self, batch, logs=None):
        if self._source is not None:
            self._source.poll()  # compiled between steps (evaluation, other callbacks): not the train step

    def on_train_batch_end(self, batch, logs=None):
        if self._source is None:
            return
        new = self._source.poll()
        if not self._checked_jit:
            self._checked_jit = True
            if backend_name() == "tensorflow" and not getattr(self._model, "jit_compile", True):
                logger.warning("XLARecompileGuard: the model does not compile with XLA (jit_compile=False); "
                               "nothing to guard. Use model.compile(..., jit_compile=True) as on a TPU.")
        for n, event in self._functions.add(getattr(self._model, "train_function", None), new):
            if n > self.warmup_compilations:
                self._report(n, event, batch)
        if logs is not None:
            logs["xla_compilations"] = self.compilations

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._source is not None:
            logs["xla_compilations"] = self.compilations

    def _report(self, n: int, event: Dict, batch: int) -> None:
        message = (
            f"The train step ({event['fun_name']}) was XLA-compiled again at batch {batch} of the epoch "
            f"(compilation {n}, {self.warmup_compilations} expected). Each new input shape or dtype costs a "
            "full XLA compilation; keep batches static (drop_remainder=True, one sequence_length, fixed dtypes)."
        )
        if self.action == "raise":
            self._source.stop()  # fit stops without on_train_end
        self.act(message)
