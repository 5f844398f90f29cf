"""Catch XLA recompilations during a ``Trainer`` run on torch_xla (twin of the Keras ``xla_recompile_guard``)."""

from __future__ import annotations

import logging
import warnings
from typing import Dict, FrozenSet, List, Optional

from transformers import TrainerCallback

from hf_tpu_ext.callbacks import register_callback

logger = logging.getLogger("hf_tpu_ext")


def _compile_count() -> Optional[int]:
    from hf_tpu_ext.backends.torch_xla.device import compile_counts

    return compile_counts()["uncached_compile"]


@register_callback("xla_recompile_guard", backend="torch")
class XLARecompileGuard(TrainerCallback):
    """Warn or fail when XLA compiles new graphs after warm-up.

    Reads ``torch_xla.debug.metrics``: the ``UncachedCompile`` counter (graphs compiled, not found in the
    compilation cache) and ``CompileTime`` (seconds spent). The run is cut into step windows (from one
    ``on_step_begin`` to the next); each window has a kind, the set of Trainer events inside it (``log``,
    ``evaluate``, ``save``, ``epoch_end``), because logging, evaluation and saving cut the lazy graph at
    other places and legitimately compile their own graphs once. Compilations during the first
    ``warmup_steps`` windows, or the first window of each kind, are warm-up; any compilation in a later
    window of a kind already seen is a recompilation -- typically a batch of another shape (a partial last
    batch, another sequence length), a dtype change, or a Python value baked into the graph.

    Writes ``xla_compilations`` (total compiled graphs) into every Trainer log entry.

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
        from hf_tpu_ext.errors import ArgumentError

        if action not in ("warn", "raise"):
            raise ArgumentError(f"XLARecompileGuard: action must be 'warn' or 'raise', got {action!r}.")
        if int(warmup_steps) < 1:
            raise ArgumentError(f"XLARecompileGuard: warmup_steps must be >= 1, got {warmup_steps}.")
        self.warmup_steps = int(warmup_steps)
        self.action = action
        self.compilations = 0
        self.compilations_after_warmup = 0
        self.events: List[str] = []
        self._reset()

    @classmethod
    def from_run(cls, run) -> "XLARecompileGuard":
        """Configure for hf-tpu-ext's torch_xla trainer: warn."""
        return cls()

    def _reset(self):
        self._base: Optional[int] = None
        self._mark: Optional[int] = None
        self._window_step: Optional[int] = None
        self._window_events: set = set()
        self._seen_kinds: set = set()
        self._windows = 0
        self._per_kind: Dict[FrozenSet[str], int] = {}

    def _close_window(self, state) -> None:
        count = _compile_count()
        if count is None or self._mark is None:
            self._mark = count
            return
        new = count - self._mark
        self._mark = count
        self.compilations = count - self._base
        kind = frozenset(self._window_events)
        in_warmup = self._windows <= self.warmup_steps or kind not in self._seen_kinds
        self._seen_kinds.add(kind)
        if new <= 0:
            return
        self._per_kind[kind] = self._per_kind.get(kind, 0) + new
        if in_warmup:
            return
        self.compilations_after_warmup += new
        what = "+".join(sorted(kind)) or "a plain train step"
        message = (f"XLA compiled {new} new graph(s) at global step {state.global_step} (window: {what}), after "
                   f"warm-up; {self.compilations} in all. Each new input shape, dtype or baked-in Python value costs "
                   "a full compilation: keep batches static (dataloader_drop_last=True, pad to max_seq_length).")
        self.events.append(message)
        if self.action == "raise":
            from hf_tpu_ext.errors import RecompilationError

            raise RecompilationError(message)
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def on_train_begin(self, args, state, control, **kwargs):
        self._reset()
        self._base = self._mark = _compile_count()
        if self._base is None:
            logger.warning("XLARecompileGuard: torch_xla is not available; nothing to guard.")

    def on_step_begin(self, args, state, control, **kwargs):
        if self._base is None:
            return
        if self._window_step is not None:
            self._close_window(state)
        self._windows += 1
        self._window_step = state.global_step
        self._window_events = set()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._base is None:
            return
        self._window_events.add("log")
        count = _compile_count()
        if count is not None and state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["xla_compilations"] = count - self._base

    def on_evaluate(self, args, state, control, **kwargs):
        self._window_events.add("evaluate")

    def on_save(self, args, state, control, **kwargs):
        self._window_events.add("save")

    def on_epoch_end(self, args, state, control, **kwargs):
        self._window_events.add("epoch_end")

    def on_train_end(self, args, state, control, **kwargs):
        if self._base is None:
            return
        if self._window_step is not None:
            self._window_events.add("end")
            self._close_window(state)
            self._window_step = None
