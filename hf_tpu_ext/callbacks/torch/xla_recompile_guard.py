"""Catch recompilations during a ``Trainer`` run: XLA graphs on torch_xla, torch.compile graphs elsewhere.

Twin of the Keras ``xla_recompile_guard``. On an XLA device it counts XLA compilations; on any other device
(CPU, CUDA) it counts the graphs ``torch.compile`` (TorchDynamo) builds when the run uses it
(``TrainingArguments(torch_compile=True)`` or a ``torch.compile``-d model); with neither there is nothing
that compiles, and the guard says so once (a warning, ``self.mode is None``) instead of silently passing.
"""

from __future__ import annotations

import logging
import warnings
from typing import Optional

from transformers import TrainerCallback

from hf_tpu_ext.callbacks import register_callback
from hf_tpu_ext.callbacks.recompile_guard import RecompileGuardCore, StepWindows, check_guard_arguments

logger = logging.getLogger("hf_tpu_ext")


def _xla_compile_count() -> Optional[int]:
    """XLA graphs compiled by this process (``UncachedCompile``), None without torch_xla."""
    try:
        import torch_xla.debug.metrics as met
    except Exception:  # torch_xla not installed or not importable
        return None
    return int(met.counter_value("UncachedCompile") or 0)


def _dynamo_compile_count() -> int:
    """Graphs TorchDynamo (``torch.compile``) compiled in this process: the first ones and every recompilation.

    The one adapter over a private module (``torch._dynamo.utils.counters``): torch (2.4 ... 2.9) has no public
    counter of compiled graphs; the public alternative, ``TORCH_LOGS=recompiles`` (``torch._logging.set_logs
    (recompiles=True)``), logs each recompilation instead of counting it.
    """
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _model_device_type(model) -> Optional[str]:
    try:
        return next(model.parameters()).device.type
    except Exception:  # no model, or no parameters
        return None


def _uses_torch_compile(args, model) -> bool:
    if getattr(args, "torch_compile", False):
        return True
    return type(model).__name__ == "OptimizedModule" or hasattr(model, "_orig_mod")


@register_callback("xla_recompile_guard", framework="torch")
class XLARecompileGuard(RecompileGuardCore, TrainerCallback):
    """Warn or fail when XLA (or torch.compile) compiles new graphs after warm-up.

    What is counted (``self.mode``, set at ``on_train_begin`` from the model's device and the arguments):

    - ``"xla"``: the model is on an XLA device; ``torch_xla.debug.metrics``' ``UncachedCompile`` counter
      (graphs compiled, not found in the compilation cache).
    - ``"torch_compile"``: another device, and the run uses ``torch.compile`` (``args.torch_compile`` or a
      compiled model); TorchDynamo's ``unique_graphs`` counter (one per graph compiled, recompilations
      after a guard failure included).
    - ``None``: nothing compiles (eager PyTorch); a warning says the guard has nothing to guard.

    The run is cut into step windows (from one
    ``on_step_begin`` to the next); each window has a kind, the set of Trainer events inside it (``log``,
    ``evaluate``, ``save``, ``epoch_end``), because logging, evaluation and saving cut the lazy graph at
    other places and legitimately compile their own graphs once. Compilations during the first
    ``warmup_steps`` windows, or the first window of each kind, are warm-up; any compilation in a later
    window of a kind already seen is a recompilation -- typically a batch of another shape (a partial last
    batch, another sequence length), a dtype change, or a Python value baked into the graph.

    Writes ``xla_compilations`` (total compiled graphs, XLA or torch.compile) into every Trainer log entry.

    Attributes:
        compilations: graphs compiled since ``on_train_begin``.
        compilations_after_warmup: graphs compiled in windows that were past their warm-up.
        events: one message per recompilation seen.

    Args:
        warmup_steps: optimizer steps whose compilations are expected (the first step builds the optimizer
            state, so its graph differs from the second one's).
        action: ``"warn"`` (``logging`` + ``warnings.warn(RuntimeWarning)``) or ``"raise"``
            (:class:`hf_tpu_ext.errors.RecompilationError`, raised out of ``trainer.train()``).

    Raises:
        ArgumentError: an unknown ``action`` or ``warmup_steps < 1``.
    """

    def __init__(self, warmup_steps: int = 3, action: str = "warn"):
        self.warmup_steps = check_guard_arguments(action, warmup_steps, "warmup_steps")
        self.init_guard(action)
        self.compilations = 0
        self.compilations_after_warmup = 0
        self._windows = StepWindows(self.warmup_steps)
        self.mode: Optional[str] = None
        self._count = _xla_compile_count
        self._reset()

    @classmethod
    def from_run(cls, run) -> "XLARecompileGuard":
        """Configure for hf-tpu-ext's torch_xla trainer: warn."""
        return cls()

    def _reset(self):
        self._base: Optional[int] = None
        self._mark: Optional[int] = None
        self._windows.reset()

    def _close_window(self, state) -> None:
        count = self._count()
        if count is None or self._mark is None:
            self._mark = count
            return
        new = count - self._mark
        self._mark = count
        self.compilations = count - self._base
        what = self._windows.close(new)
        if what is None:
            return
        self.compilations_after_warmup += new
        compiler = "XLA" if self.mode == "xla" else "torch.compile"
        message = (f"{compiler} compiled {new} new graph(s) at global step {state.global_step} (window: {what}), "
                   f"after warm-up; {self.compilations} in all. Each new input shape, dtype or baked-in Python value "
                   "costs a full compilation: keep batches static (dataloader_drop_last=True, pad to max_seq_length).")
        self.act(message)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._reset()
        device = _model_device_type(model)
        if device == "xla" and _xla_compile_count() is not None:
            self.mode, self._count = "xla", _xla_compile_count
        elif _uses_torch_compile(args, model):
            self.mode, self._count = "torch_compile", _dynamo_compile_count
        else:
            self.mode = None
            message = (f"XLARecompileGuard: nothing to guard: the model runs eagerly on {device or 'an unknown device'}"
                       " (no XLA device, no torch.compile), so no graph is ever compiled. Use a torch_xla device or "
                       "TrainingArguments(torch_compile=True) to guard compilations, or drop this callback.")
            logger.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return
        self._base = self._mark = self._count()

    def on_step_begin(self, args, state, control, **kwargs):
        if self._base is None:
            return
        if self._windows.step is not None:
            self._close_window(state)
        self._windows.open(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._base is None:
            return
        self._windows.events.add("log")
        count = self._count()
        if count is not None and state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["xla_compilations"] = count - self._base

    def on_evaluate(self, args, state, control, **kwargs):
        self._windows.events.add("evaluate")

    def on_save(self, args, state, control, **kwargs):
        self._windows.events.add("save")

    def on_epoch_end(self, args, state, control, **kwargs):
        self._windows.events.add("epoch_end")

    def on_train_end(self, args, state, control, **kwargs):
        if self._base is None:
            return
        if self._windows.step is not None:
            self._windows.events.add("end")
            self._close_window(state)
            self._windows.step = None
