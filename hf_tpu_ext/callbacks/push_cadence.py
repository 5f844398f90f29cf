"""The push callbacks' half of a push session (framework-free): their save cadence, the card and
``trainer_state.json`` they write, what they measured.

:class:`CallbackSession` is the :class:`~hf_tpu_ext.hub.push_session.PushSession` of the tf_keras, Keras 3 and
``Trainer`` push callbacks: the same one push object (preflight, plan, budget, queue), plus what only a callback
needs, because ``hf-tpu train`` decides these itself (its loop's cadence, its own card and trainer state):

- **cadence**: ``save_strategy``/``save_steps`` (global steps, a multiple crossed inside one execution counts),
  ``save_best_only`` on ``monitor``/``mode`` (:meth:`CallbackSession.is_save_step`, :meth:`CallbackSession.due`);
- **the card's fields**: what the callbacks measured (:meth:`CallbackSession.note_logs`: throughput, steps, wall
  time) and what the folder shows (:meth:`CallbackSession.write_card`);
- **trainer_state.json** of a checkpoint (:meth:`CallbackSession.write_trainer_state`: one shape,
  :class:`hf_tpu_ext.outputs.TrainerState`).

:class:`SessionBacked` gives an adapter its session's fields as read-only properties.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any, Dict, Optional

from hf_tpu_ext.errors import ModelCardError
from hf_tpu_ext.fileio import atomic_write_text
from hf_tpu_ext.hub.card_check import validate_model_card
from hf_tpu_ext.hub.card_facts import eval_results_from_logs
from hf_tpu_ext.hub.card_guard import write_card
from hf_tpu_ext.hub.card_render import initialization_fields, load_summary, render_model_card
from hf_tpu_ext.hub.push_policy import PushConfig, crossed_save_step, improves, monitor_value  # noqa: F401 (PushConfig: the adapters')
from hf_tpu_ext.hub.push_session import PushSession
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT
from hf_tpu_ext.outputs import TrainerState

logger = logging.getLogger("hf_tpu_ext.hub")


class CallbackSession(PushSession):
    """A push callback's session (see the module doc; arguments as :class:`PushSession`'s).

    Attributes:
        best, best_step: the best ``monitor`` value so far and its step (``save_best_only``).
    """

    def __init__(self, config: PushConfig, **kwargs):
        super().__init__(config, **kwargs)
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self._last_save_step: Optional[int] = None
        self._last_due_step: Optional[int] = None
        self._measured: Dict[str, Any] = {}
        self._started: Optional[float] = None
        self._warned_monitor = False

    # ---- cadence -----------------------------------------------------------------------------
    def begin(self, step: int) -> None:
        """Training starts (or resumes) at global ``step``: the save cadence and the wall clock start here."""
        self._last_save_step = int(step)
        if self._started is None:
            self._started = time.monotonic()

    def is_save_step(self, step: int) -> bool:
        """``save_strategy="steps"``: ``step`` crossed a multiple of ``save_steps`` since the last save (with
        ``steps_per_execution > 1`` the step jumps; the save happens at the first step past the multiple)."""
        c = self.config
        return c.save_strategy == "steps" and crossed_save_step(step, self._last_save_step, c.save_steps)

    @property
    def saves_each_epoch(self) -> bool:
        """``save_strategy="epoch"``: a save at every epoch end."""
        return self.config.save_strategy == "epoch"

    def due(self, step: int, logs: Optional[dict] = None) -> bool:
        """Whether the save point at ``step`` saves: not a second save of the step just saved, and with
        ``save_best_only`` an improvement. Every process asks (the answer is the same on all: checkpoint
        writes may be collective); the cadence of :meth:`is_save_step` restarts at ``step`` either way."""
        step = int(step)
        if step == self._last_due_step:
            return False
        self._last_save_step = self._last_due_step = step
        return self.improved(logs, step)

    def save_interval(self, steps_per_epoch: Optional[int] = None) -> Optional[int]:
        """Global steps between saves: ``save_steps``; with ``save_strategy="epoch"`` ``steps_per_epoch`` (None
        when unknown); None with ``"no"`` (a trainer state's ``save_steps``)."""
        if self.config.save_strategy == "steps":
            return int(self.config.save_steps)
        return int(steps_per_epoch) if self.config.save_strategy == "epoch" and steps_per_epoch else None

    def checkpoint_folder(self) -> str:
        """The local folder an adapter writes a save's resumable checkpoint into (``output_dir/last-checkpoint``,
        rewritten by each save, so the push copies it; ``all_checkpoints`` names it ``checkpoint-<step>/`` on the
        Hub). Model pushes never include it."""
        return os.path.join(self.config.output_dir or ".", LAST_CHECKPOINT)

    def improved(self, logs: Optional[dict], step: int) -> bool:
        """``save_best_only``: whether ``logs[monitor]`` (Keras' ``val_*`` or ``eval_*`` name) beats the best so far.

        Without ``save_best_only`` always True. A missing or NaN value is not an improvement (warned once).
        """
        c = self.config
        if not c.save_best_only:
            return True
        value = monitor_value(logs, c.monitor)
        if value is None:
            if not self._warned_monitor:
                logger.warning("save_best_only: %r is not in the logs at step %d; nothing saved.", c.monitor, step)
                self._warned_monitor = True
            return False
        if improves(value, self.best, c.mode):
            self.best, self.best_step = value, int(step)
            return True
        return False

    def save(self, plan, model_folder, **checkpoint) -> None:
        """:meth:`PushSession.save`; the cadence of :meth:`is_save_step` restarts at the plan's step."""
        super().save(plan, model_folder, **checkpoint)
        if plan is not None and self.active:
            self._last_save_step = plan.step

    # ---- measurements and files -------------------------------------------------------------
    def note_logs(self, logs: Optional[dict], step: Optional[int] = None, epoch: Optional[float] = None) -> None:
        """Remember what the callbacks measured, for the card (``tokens_per_second`` of the throughput callback,
        evaluation results, the step and epoch)."""
        logs = logs or {}
        m = self._measured
        for key, name in (("tokens_per_second", "train_tokens_per_second"), ("samples_per_second", "samples_per_second")):
            value = logs.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
                m[name] = float(value)
        found = eval_results_from_logs(logs)
        if found:
            m["eval_results"] = found
        if step is not None:
            m["global_step"] = int(step)
        if epoch is not None:
            m["epoch"] = float(epoch)

    def measured(self, **known) -> Dict[str, Any]:
        """The card fields this session measured, completed with ``known`` ones (the adapter's: batch size,
        accelerator, precision): wall time so far (seconds), throughput, tokens seen (``step x batch x sequence``,
        with the sequence length from the throughput figures)."""
        out = dict(self._measured)
        out.update({k: v for k, v in known.items() if v is not None})
        if self._started is not None:
            out.setdefault("train_runtime", time.monotonic() - self._started)
        tps, sps = out.get("train_tokens_per_second"), out.pop("samples_per_second", None)
        if out.get("global_step") and out.get("global_batch_size") and tps and sps:
            out.setdefault("tokens_seen", int(out["global_step"] * out["global_batch_size"] * round(tps / sps)))
        return out

    def write_card(self, folder: str, summary=None, name_or_path: Optional[str] = None, **known) -> Optional[str]:
        """Render the fill-mask card of ``folder`` into ``folder/README.md`` (checked locally; the Hub checks
        it in the push job).

        Args:
            folder: the model folder.
            summary: the run's training summary, or a callable returning it (a failing one is logged and
                ignored); ``None``: what the folder holds, completed with what this session measured and ``known``.
            name_or_path: what the weights were loaded from (the card's ``base_model``/``initialized_from``).
            **known: the adapter's facts (``global_batch_size``, ``accelerator``, ``backend``, ``precision``, ...).

        Returns:
            The card path, or ``None`` when the card did not validate (logged; training goes on).
        """
        if callable(summary):
            try:
                summary = summary()
            except Exception as err:  # a summary problem must not stop training
                logger.warning("summary_fn failed (%s: %s); the card uses what the output folder shows.",
                               type(err).__name__, err)
                summary = None
        if summary is None:
            summary = load_summary(folder)
            facts = dict(self.measured(**known), **initialization_fields(name_or_path))
            for key, value in facts.items():
                if summary.get(key) in (None, {}, "") and value is not None:
                    summary[key] = value
        try:
            card = render_model_card(folder, repo_id=self.repo_id or self.config.hub_model_id, summary=summary,
                                     **self.config.card_fields)
            validate_model_card(card, remote=False)
            write_card(folder, card)  # a README.md the user wrote keeps its text (metadata merged)
            return os.path.join(folder, "README.md")
        except ModelCardError as err:
            logger.error("Model card not updated: %s", err)
            return None

    def write_trainer_state(self, folder: str, step: int, *, epoch: float, max_steps: int = 0,
                            state: Optional[dict] = None, name: str = "trainer_state.json",
                            known_only: bool = False) -> str:
        """Write ``folder/trainer_state.json`` of a save (:class:`hf_tpu_ext.outputs.TrainerState`'s shape).

        Args:
            folder: the checkpoint folder.
            step, epoch, max_steps: where training is (global optimizer steps; epochs as a float).
            state: the run's state (log history, best metric, ...); ``global_step``, ``epoch`` and
                ``max_steps`` are set from the arguments, ``best_metric``/``best_global_step`` from this session
                when the state has none.
            name: the file name.
            known_only: write only the fields given (``state``'s, the arguments', a best metric) instead of every
                :class:`~hf_tpu_ext.outputs.TrainerState` field with its default (a drop-in callback's fit does
                not know them all; transformers' ``TrainerState`` fills a missing field with its own default).

        Returns:
            The path written.
        """
        fields = {f.name for f in dataclasses.fields(TrainerState)}
        data = {k: v for k, v in dict(state or {}).items() if k in fields}
        data.update(global_step=int(step), epoch=float(epoch), max_steps=int(max_steps or 0))
        if data.get("best_metric") is None:
            data.update(best_metric=self.best, best_global_step=self.best_step)
        if self.config.save_steps and "save_steps" not in (state or {}):
            data["save_steps"] = self.config.save_steps
        if not known_only:
            return TrainerState(**data).save(os.path.join(folder, name))
        given = set(data) - ({"best_metric", "best_global_step"} if data.get("best_metric") is None else set())
        full = dataclasses.asdict(TrainerState(**data))  # only TrainerState field names, as its save writes them
        return atomic_write_text(os.path.join(folder, name),
                                 json.dumps({k: v for k, v in full.items() if k in given}, indent=2, sort_keys=True) + "\n")


def _from_session(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.session, name), doc=doc)


def _from_config(name: str) -> property:
    return property(lambda self: getattr(self.session.config, name), doc=f":attr:`PushConfig.{name}` of the session.")


class SessionBacked:
    """Mixin of the push adapters: ``repo_id``, ``pushed_steps``, ``best``, ``best_step`` and the configuration's
    fields (``hub_model_id``, ``hub_strategy``, ``save_steps``, ``output_dir``, ...; never the token) are read-only
    properties over the adapter's ``session``, so the adapter's public attributes stay what they were."""

    session: CallbackSession

    repo_id = _from_session("repo_id", "The full repo id (after :meth:`preflight`).")
    pushed_steps = _from_session("pushed_steps", ":attr:`PushSession.pushed_steps`.")
    best = _from_session("best", "The best ``monitor`` value so far (``save_best_only``).")
    best_step = _from_session("best_step", "The step of :attr:`best`.")
    output_dir = _from_config("output_dir")
    hub_model_id = _from_config("hub_model_id")
    hub_strategy = _from_config("hub_strategy")
    hub_private_repo = _from_config("hub_private_repo")
    hub_revision = _from_config("hub_revision")
    save_strategy = _from_config("save_strategy")
    save_steps = _from_config("save_steps")
    save_best_only = _from_config("save_best_only")
    monitor = _from_config("monitor")
    mode = _from_config("mode")
    push_timeout = _from_config("push_timeout")
    max_retries = _from_config("max_retries")
    backoff_seconds = _from_config("backoff_seconds")
    hub_commit_budget = _from_config("hub_commit_budget")
    budget_period = _from_config("budget_period")
    card_fields = _from_config("card_fields")

    def preflight(self) -> Optional[str]:
        """Token, write access, repo and card fields before training (chief only; idempotent); returns the repo id
        (:meth:`PushSession.preflight`)."""
        return self.session.preflight()
