"""The framework-free core of the ``xla_recompile_guard`` callbacks (tf_keras, Keras 3, torch).

A framework adapter reads its compiler's counters (a ``tf.function``'s traces, XLA's dump folder, JAX's compile
events, torch_xla's or TorchDynamo's counters) and translates its framework's hooks; this module holds what is the
same for all three: the checked arguments, the warm-up and the one action per recompilation
(:class:`RecompileGuardCore`), how two traced input signatures differ (:func:`describe_change`), the compilations
of one train function (:class:`FunctionCompilations`) and the step windows of a ``Trainer`` run
(:class:`StepWindows`).
"""

from __future__ import annotations

import logging
import warnings
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from hf_tpu_ext.errors import ArgumentError, RecompilationError

logger = logging.getLogger("hf_tpu_ext")

Signature = Tuple[Tuple[str, str], ...]  # ((input path, "shape dtype" or repr), ...)
ACTIONS = ("warn", "raise")


def check_guard_arguments(action: str, warmup: int, warmup_name: str = "warmup_compilations") -> int:
    """``warmup`` as an int after checking both arguments.

    Raises:
        ArgumentError: ``action`` not in :data:`ACTIONS`, or ``warmup < 1``.
    """
    if action not in ACTIONS:
        raise ArgumentError(f"XLARecompileGuard: action must be 'warn' or 'raise', got {action!r}.")
    if int(warmup) < 1:
        raise ArgumentError(f"XLARecompileGuard: {warmup_name} must be >= 1, got {warmup}.")
    return int(warmup)


class RecompileGuardCore:
    """The guard's action, shared by the three adapters (a mixin: the adapter's ``__init__`` calls
    :meth:`init_guard`).

    Attributes:
        action: ``"warn"`` or ``"raise"``.
        events: one message per recompilation seen (str).
    """

    action: str
    events: List[str]

    def init_guard(self, action: str) -> None:
        self.action = action
        self.events = []

    def act(self, message: str) -> None:
        """Record ``message``; ``"raise"``: raise it, ``"warn"``: log it and ``warnings.warn(RuntimeWarning)``.

        Raises:
            RecompilationError: with ``action="raise"``.
        """
        self.events.append(message)
        if self.action == "raise":
            raise RecompilationError(message)
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def describe_change(old: Signature, new: Signature) -> str:
    """Human-readable differences between two input signatures (which input changed and how)."""
    old_d, new_d = dict(old), dict(new)
    changes = []
    for path in new_d:
        if path not in old_d:
            changes.append(f"new input {path} ({new_d[path]})")
        elif old_d[path] != new_d[path]:
            changes.append(f"input {path} changed {old_d[path]} -> {new_d[path]}")
    changes.extend(f"input {path} ({old_d[path]}) is gone" for path in old_d if path not in new_d)
    return "; ".join(changes) or "the input signature is unchanged (a Python argument or captured value changed)"


def recompiled_message(function: str, where: str, n: int, expected: int, cause: str) -> str:
    """The tf_keras guard's line: ``model.<function>`` compiled again (compilation ``n`` of ``expected``)."""
    return (f"model.{function} was compiled again{where} (compilation {n}, {expected} expected): {cause}. Each new "
            "input shape or dtype costs a full XLA compilation; keep batches static (drop_remainder=True, one "
            "max_seq_length, fixed dtypes).")


class FunctionCompilations:
    """The XLA compilations of one train function (Keras 3): a new function object starts a new count.

    Attributes:
        compiled: the compilations seen, ``{"fun_name": str, ...}`` each.
    """

    def __init__(self):
        self.compiled: List[Dict] = []
        self._function = None

    def add(self, function, new: List[Dict]) -> List[Tuple[int, Dict]]:
        """Count ``new`` compilations of ``function``; returns ``(n, event)`` of each (``n``: 1-based)."""
        if function is not self._function:  # compile() made Keras build a new train function
            self._function, self.compiled = function, []
        out = []
        for event in new:
            self.compiled.append(event)
            out.append((len(self.compiled), event))
        return out


class StepWindows:
    """A ``Trainer`` run cut into step windows (one ``on_step_begin`` to the next) for the torch guard.

    Each window has a kind, the set of Trainer events inside it (``log``, ``evaluate``, ``save``, ``epoch_end``,
    ``end``): compilations during the first ``warmup_steps`` windows, or the first window of a kind, are warm-up.
    """

    def __init__(self, warmup_steps: int):
        self.warmup_steps = warmup_steps
        self.reset()

    def reset(self) -> None:
        self.step: Optional[int] = None
        self.events: Set[str] = set()
        self.count = 0
        self._seen_kinds: Set[FrozenSet[str]] = set()
        self.per_kind: Dict[FrozenSet[str], int] = {}

    def open(self, step: int) -> None:
        """A new window starts at global step ``step``."""
        self.count += 1
        self.step, self.events = step, set()

    def close(self, new: int) -> Optional[str]:
        """The window ends with ``new`` compilations in it; returns its kind's words (``"log+save"``, ``"a plain
        train step"``) when they are past warm-up, else ``None``."""
        kind = frozenset(self.events)
        in_warmup = self.count <= self.warmup_steps or kind not in self._seen_kinds
        self._seen_kinds.add(kind)
        if new <= 0:
            return None
        self.per_kind[kind] = self.per_kind.get(kind, 0) + new
        return None if in_warmup else ("+".join(sorted(kind)) or "a plain train step")
