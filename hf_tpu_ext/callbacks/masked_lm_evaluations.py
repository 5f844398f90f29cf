"""The framework-free core of the ``masked_lm_metrics`` callbacks (tf_keras, Keras 3, torch).

The framework adapters run one evaluation on their device (:mod:`hf_tpu_ext.metrics.masked_lm_tf`, the Keras 3
``batch_sums``, :mod:`hf_tpu_ext.metrics.masked_lm_torch`) and translate their framework's hooks; the checked
arguments, the cadence (every N global steps, or per epoch) and the record of each evaluation (``results``,
``history``, the log line) are here, once (:class:`MaskedLMEvaluations`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional

from hf_tpu_ext.errors import ArgumentError

logger = logging.getLogger("hf_tpu_ext")


def check_evaluation_arguments(owner: str, eval_dataset, hint: str, **counts: Optional[int]) -> None:
    """Refuse a missing ``eval_dataset`` and a count below 1 (``None`` passes).

    Args:
        owner: the callback's class name, first word of each message.
        hint: what to give instead of a missing dataset (``"give validation data."``).
        counts: ``name=value`` of the counts to check (``every_n_steps``, ``eval_steps``, ...).

    Raises:
        ArgumentError: ``eval_dataset`` is None, or a count < 1.
    """
    if eval_dataset is None:
        raise ArgumentError(f"{owner} needs an eval_dataset: {hint}")
    for name, value in counts.items():
        if value is not None and int(value) < 1:
            raise ArgumentError(f"{owner}: {name} must be >= 1 (or None), got {value}.")


class MaskedLMEvaluations:
    """When a masked-LM callback evaluates, and what it keeps (a mixin: the adapter calls :meth:`init_evaluations`).

    Attributes:
        eval_dataset: the adapter's evaluation data (any iterable or dataset; not read here).
        eval_steps: batches per evaluation (None: all).
        every_n_steps: evaluate every N global steps (None: per epoch).
        results: the latest evaluation, ``{log key: number}``.
        history: every evaluation, its results plus ``step`` (int or None).
    """

    eval_dataset: Any
    eval_steps: Optional[int]
    every_n_steps: Optional[int]
    results: Dict[str, Any]
    history: List[Dict[str, Any]]

    def init_evaluations(self, eval_dataset, eval_steps: Optional[int], every_n_steps: Optional[int]) -> None:
        self.eval_dataset, self.eval_steps, self.every_n_steps = eval_dataset, eval_steps, every_n_steps
        self.results = {}
        self.history = []

    def crossed(self, before: int, step: int) -> bool:
        """True when ``every_n_steps`` is set and a multiple of it lies in ``(before, step]`` (one call may run
        several steps: ``steps_per_execution``)."""
        return bool(self.every_n_steps) and step // self.every_n_steps > before // self.every_n_steps

    def due_at_epoch_end(self) -> bool:
        """True when an epoch's end evaluates: per-epoch evaluation, or no evaluation yet."""
        return not self.every_n_steps or not self.results

    def record(self, raw: Mapping[str, Any], keys: Mapping[str, str], step: Optional[int],
               level: int = logging.INFO) -> Dict[str, Any]:
        """Keep one evaluation: ``raw`` (the ``masked_lm`` metric's names) under ``keys``; logs one line.

        Returns:
            The prefixed results (also :attr:`results`, and appended to :attr:`history` with ``step``).
        """
        self.results = {keys[k]: v for k, v in raw.items()}
        self.history.append(dict(self.results, step=step))
        logger.log(level, "eval at step %s: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in self.results.items()))
        return self.results
