"""What a push is, decided once: the ``hub_strategy`` table, commit titles, which checkpoint goes, the best model,
and how a run pushes (:class:`PushConfig`, transformers' ``TrainingArguments`` names, validated at construction).

No I/O, no clock, no framework: facts go in (the strategy, the global step, whether it is the final state, a
SIGINT/SIGTERM, the commit budget's wait), one frozen :class:`PushPlan` per save comes out. The push session
(:mod:`hf_tpu_ext.hub.push_session`: whether a save is pushed now, its snapshot and commits) carries plans out;
nothing else decides.

``hub_strategy`` (the names and meaning of :class:`transformers.TrainingArguments`), :data:`STRATEGY_TABLE`:

- ``"end"``: only the final push (the model folder);
- ``"every_save"``: the model folder at every save;
- ``"checkpoint"``: the model folder and the save's checkpoint under ``last-checkpoint/`` *in one commit* (a newer
  save replaces a pending one and the one on the Hub), so a resumable checkpoint lands with every push that lands;
- ``"all_checkpoints"``: as ``"every_save"``, plus each checkpoint under ``checkpoint-<step>/`` in a commit of its
  own (never replaced; the final one included, as transformers' Trainer pushes them).

Whether a save is pushed now (:func:`plan_save`, in this order): the final state always; ``"end"``: no other
save; a save at the run's last step (``step == max_steps``) coalesces into the final push that follows with the
same state; the save of a SIGINT/SIGTERM is pushed past the budget's pacing (what a resume starts from); a save
the commit budget has no room for (``budget_wait > 0``) coalesces into the next push; any other save is pushed.

Example:
    >>> plan_save("checkpoint", 100).checkpoint_path
    'last-checkpoint'
    >>> plan_save("end", 100).push, plan_save("end", 200, final=True).commit_message
    (False, 'End of training')
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from hf_tpu_ext import cadence
from hf_tpu_ext.args import HUB_STRATEGIES, check_repo_id
from hf_tpu_ext.best_metric import BestMetric
from hf_tpu_ext.errors import ArgumentError, check_choice
from hf_tpu_ext.hub import commit_budget
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT

FINAL_COMMIT_TITLE = "End of training"
SAVE_COMMIT_TITLE = "Training in progress, step {step}"
CHECKPOINT_COMMIT_TITLE = "Checkpoint at step {step}"
CHECKPOINT_PREFIX = "checkpoint-"
#: what a push configuration or pusher pushes unless told (as transformers' ``TrainingArguments``)
DEFAULT_HUB_STRATEGY = "every_save"

#: where a save's checkpoint goes: in the model's commit (``last-checkpoint/``), or a commit of its own
WITH_MODEL, OWN_COMMIT = "with_model", "own_commit"

#: why a plan pushes or not (:attr:`PushPlan.reason`)
REASONS = ("final", "signal", "paced", "end_strategy", "last_step", "budget")


@dataclasses.dataclass(frozen=True)
class StrategyRule:
    """One ``hub_strategy`` value: what its saves push, and when.

    Attributes:
        name: the ``--hub_strategy`` value.
        pushes_saves: saves before the end are pushed (``False``: the final push only).
        checkpoint: where a save's resumable checkpoint goes: :data:`WITH_MODEL` (``last-checkpoint/`` in the
            model's commit), :data:`OWN_COMMIT` (``checkpoint-<step>/``, its own commit) or ``None`` (nowhere).
    """

    name: str
    pushes_saves: bool
    checkpoint: Optional[str]


#: every ``--hub_strategy`` value -> its rule (keys in :data:`hf_tpu_ext.args.HUB_STRATEGIES`' order)
STRATEGY_TABLE: Mapping[str, StrategyRule] = types.MappingProxyType({
    "end": StrategyRule("end", pushes_saves=False, checkpoint=None),
    "every_save": StrategyRule("every_save", pushes_saves=True, checkpoint=None),
    "checkpoint": StrategyRule("checkpoint", pushes_saves=True, checkpoint=WITH_MODEL),
    "all_checkpoints": StrategyRule("all_checkpoints", pushes_saves=True, checkpoint=OWN_COMMIT),
})


def check_hub_strategy(value: str, name: str = "hub_strategy") -> str:
    """``value`` when it is a ``hub_strategy`` (:data:`STRATEGY_TABLE`), else :class:`~hf_tpu_ext.errors.ArgumentError`
    ``"<name> must be one of end, every_save, checkpoint, all_checkpoints, got ..."`` (``--hub_strategy`` is the
    same check: :func:`hf_tpu_ext.errors.check_choice` over :data:`~hf_tpu_ext.args.HUB_STRATEGIES`)."""
    return check_choice(value, HUB_STRATEGIES, name)


def strategy_rule(hub_strategy: str) -> StrategyRule:
    """The :class:`StrategyRule` of ``hub_strategy``. Raises: ArgumentError: an unknown one."""
    return STRATEGY_TABLE[check_hub_strategy(hub_strategy)]


def commit_title(step: int, final: bool = False, checkpoint_only: bool = False) -> str:
    """The commit summary of a push: ``"End of training"``, ``"Training in progress, step N"`` or, for a
    ``checkpoint-N/`` folder of ``hub_strategy="all_checkpoints"``, ``"Checkpoint at step N"``."""
    if final:
        return FINAL_COMMIT_TITLE
    return (CHECKPOINT_COMMIT_TITLE if checkpoint_only else SAVE_COMMIT_TITLE).format(step=int(step))


def checkpoint_folder_name(step: int) -> str:
    """``checkpoint-<step>``: the Trainer's name for a checkpoint folder, also the Hub folder of ``all_checkpoints``."""
    return f"{CHECKPOINT_PREFIX}{int(step)}"


@dataclasses.dataclass(frozen=True)
class PushPlan:
    """What one save pushes (:func:`plan_save`).

    Attributes:
        step: the global optimizer step of the save.
        final: the final state.
        push: pushed now (``False``: not written or uploaded; :attr:`coalesced` says whether a later push
            carries its state).
        reason: one of :data:`REASONS`: ``"final"``, ``"signal"``, ``"paced"`` (pushed); ``"end_strategy"``,
            ``"last_step"``, ``"budget"`` (not pushed).
        commit_message: the title of the model's commit.
        checkpoint: :data:`WITH_MODEL`, :data:`OWN_COMMIT` or ``None``: where the save's checkpoint goes.
        checkpoint_path: the checkpoint's folder in the repo (``"last-checkpoint"``, ``"checkpoint-<step>"``; None).
        checkpoint_message: the title of the checkpoint's own commit (:data:`OWN_COMMIT` only, else ``None``).
        inherit: snapshot folders a push replacing a pending one takes over (``("last-checkpoint",)`` with
            :data:`WITH_MODEL`, so replacing a push never drops the checkpoint only it carried).
        budget_wait: seconds until the commit budget has room (``"budget"`` only, else 0).
    """

    step: int
    final: bool
    push: bool
    reason: str
    commit_message: str
    checkpoint: Optional[str] = None
    checkpoint_path: Optional[str] = None
    checkpoint_message: Optional[str] = None
    inherit: Tuple[str, ...] = ()
    budget_wait: float = 0.0

    @property
    def coalesced(self) -> bool:
        """Not pushed now, its state carried by the next push (the last step's save, or no room in the budget)."""
        return self.reason in ("last_step", "budget")


def _pushed_now(rule: StrategyRule, step: int, final: bool, max_steps: Optional[int], signalled: bool,
                budget_wait: float) -> str:
    """The reason of a plan (see the module doc for the order)."""
    if final:
        return "final"
    if not rule.pushes_saves:
        return "end_strategy"
    if max_steps and step == int(max_steps):
        return "last_step"
    if signalled:
        return "signal"
    return "budget" if budget_wait > 0 else "paced"


def plan_save(hub_strategy: str, step: int, *, final: bool = False, max_steps: Optional[int] = None,
              signalled: bool = False, budget_wait: float = 0.0, commit_message: Optional[str] = None) -> PushPlan:
    """The one decision about a save: whether it is pushed now, its commit titles, where its checkpoint goes.

    Args:
        hub_strategy: one of :data:`STRATEGY_TABLE`.
        step: the global optimizer step of the save.
        final: the final state (always pushed).
        max_steps: the run's last global step (``None``/0: unknown); a save there coalesces into the final push.
        signalled: a SIGINT/SIGTERM was received (its save is pushed past the budget's pacing).
        budget_wait: seconds until the commit budget has room for a non-final commit (0: now).
        commit_message: the model commit's title instead of :func:`commit_title` (``hf-tpu push --commit_message``).

    Returns:
        The :class:`PushPlan`.

    Raises:
        ArgumentError: an unknown ``hub_strategy``.
    """
    rule, step = strategy_rule(hub_strategy), int(step)
    reason = _pushed_now(rule, step, bool(final), max_steps, bool(signalled), float(budget_wait))
    where = rule.checkpoint
    path = {WITH_MODEL: LAST_CHECKPOINT, OWN_COMMIT: checkpoint_folder_name(step)}.get(where)
    return PushPlan(step=step, final=bool(final), push=reason in ("final", "signal", "paced"), reason=reason,
                    commit_message=commit_message or commit_title(step, final), checkpoint=where,
                    checkpoint_path=path,
                    checkpoint_message=commit_title(step, checkpoint_only=True) if where == OWN_COMMIT else None,
                    inherit=(LAST_CHECKPOINT,) if where == WITH_MODEL else (),
                    budget_wait=float(budget_wait) if reason == "budget" else 0.0)


# ---- the best model (``save_best_only`` on ``monitor``/``mode``) and the save cadence -------------------
#: ``save_best_only`` watches this metric (transformers' name; Keras' ``val_loss`` is its alias), lower is better
DEFAULT_MONITOR, DEFAULT_MODE = "eval_loss", "min"
#: Keras and transformers name the same metrics differently
MONITOR_ALIASES = types.MappingProxyType({"eval_loss": "val_loss", "val_loss": "eval_loss",
                                          "eval_accuracy": "val_accuracy", "val_accuracy": "eval_accuracy"})


def monitor_value(logs: Optional[dict], monitor: str) -> Optional[float]:
    """``logs[monitor]`` (or its Keras/transformers alias, :data:`MONITOR_ALIASES`) as a float; ``None`` when
    missing, not a number, or NaN."""
    logs = logs or {}
    for key in (monitor, MONITOR_ALIASES.get(monitor)):
        if key and logs.get(key) is not None:
            try:
                value = float(logs[key])
            except (TypeError, ValueError):
                return None
            return None if math.isnan(value) else value
    return None


def improves(value: float, best: Optional[float], mode: str) -> bool:
    """Whether ``value`` beats ``best`` (``None``: none yet) in ``mode`` (``"min"``: lower is better, ``"max"``);
    the run's own rule (:meth:`hf_tpu_ext.best_metric.BestMetric.better`: a non-finite value never wins)."""
    return BestMetric(greater=mode == "max").better(value, best)


def crossed_save_step(step: int, last_save_step: Optional[int], save_steps: int) -> bool:
    """``save_strategy="steps"``: global ``step`` crossed a multiple of ``save_steps`` since ``last_save_step``
    (with ``steps_per_execution > 1`` the step jumps; the save happens at the first step past the multiple): the
    loops' rule, :func:`hf_tpu_ext.cadence.crossed`."""
    return cadence.crossed(int(last_save_step or 0), int(step), int(save_steps))


# ---- how a run pushes: its configuration ---------------------------------------------------------------
SAVE_STRATEGIES = ("no", "steps", "epoch")
DEFAULT_SAVE_STRATEGY = "epoch"


@dataclasses.dataclass
class PushConfig:
    """How a run pushes (transformers' ``TrainingArguments`` names); validated at construction.

    Attributes:
        output_dir: the local folder the model folder is written to and pushed from (``None``: the
            ``Trainer``'s, filled in by its adapter).
        hub_model_id: ``"user/name"`` or ``"name"`` (``None``: the name of ``output_dir`` under the token's user).
        hub_token: the Hub token (``None``: ``HF_TOKEN`` or the cached login); never in a repr, log or file.
        hub_strategy: one of :data:`hf_tpu_ext.args.HUB_STRATEGIES` (see :mod:`hf_tpu_ext.hub.push_policy`).
        hub_private_repo: create the repo private (an existing repo is left as it is).
        hub_revision: the branch to push to (created from main when missing).
        save_strategy: ``"epoch"``, ``"steps"`` (every ``save_steps`` global optimizer steps) or ``"no"``.
        save_steps: the interval for ``save_strategy="steps"``.
        save_best_only, monitor, mode: save only when ``monitor`` improves (``"min"``/``"max"``).
        push_timeout: seconds the final push waits for the uploads (``None``: no limit).
        max_retries, backoff_seconds: retries per push and the first retry's wait (seconds, doubling).
        hub_commit_budget: at most this many commits per ``budget_period`` seconds (the final push included;
            ``--hub_commit_budget``).
        budget_period: the budget's window in seconds (``None``: :data:`~hf_tpu_ext.hub.commit_budget.DEFAULT_BUDGET_PERIOD`,
            one hour, the Hub's window; read when the config is made, so a test can scale the quota).
        card_fields: the card's fields (``license``, ``language``, ``dataset_name``, ``tags``, ...).

    Raises:
        ArgumentError: an unknown strategy or mode, ``save_strategy="steps"`` without ``save_steps >= 1``,
            a malformed ``hub_model_id``, a budget below 1 commit.
    """

    output_dir: Optional[str] = None
    hub_model_id: Optional[str] = None
    hub_token: Optional[str] = dataclasses.field(default=None, repr=False)
    hub_strategy: str = DEFAULT_HUB_STRATEGY
    hub_private_repo: Optional[bool] = None
    hub_revision: Optional[str] = None
    save_strategy: str = DEFAULT_SAVE_STRATEGY
    save_steps: Optional[int] = None
    save_best_only: bool = False
    monitor: str = DEFAULT_MONITOR
    mode: str = DEFAULT_MODE
    push_timeout: Optional[float] = 600.0
    max_retries: int = 5
    backoff_seconds: float = 1.0
    hub_commit_budget: int = commit_budget.DEFAULT_COMMIT_BUDGET
    budget_period: Optional[float] = None
    card_fields: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_hub_strategy(self.hub_strategy)
        if self.save_strategy not in SAVE_STRATEGIES:
            raise ArgumentError(f"save_strategy must be one of {', '.join(SAVE_STRATEGIES)}, got {self.save_strategy!r}.")
        if self.save_strategy == "steps" and (self.save_steps is None or int(self.save_steps) < 1):
            raise ArgumentError("save_strategy='steps' needs save_steps >= 1 (global optimizer steps between pushes).")
        if self.mode not in ("min", "max"):
            raise ArgumentError(f"mode must be 'min' or 'max', got {self.mode!r}.")
        if self.budget_period is None:
            self.budget_period = float(commit_budget.DEFAULT_BUDGET_PERIOD)
        if int(self.hub_commit_budget) < 1 or not self.budget_period > 0:
            raise ArgumentError(f"The commit budget must allow at least 1 commit per period, got {self.hub_commit_budget} "
                                f"per {self.budget_period} s.")
        if self.hub_model_id is not None:
            check_repo_id(self.hub_model_id, "hub_model_id")  # at construction, not at the first push
        self.output_dir = os.fspath(self.output_dir) if self.output_dir is not None else None
        self.save_steps = int(self.save_steps) if self.save_steps else None
        self.card_fields = dict(self.card_fields or {})

    @classmethod
    def from_training_args(cls, args, data_args=None, **overrides) -> "PushConfig":
        """The push configuration of ``hf-tpu train``'s (or transformers') ``TrainingArguments``.

        Args:
            args: the training arguments (``output_dir``, ``hub_*``, ``save_strategy``, ``save_steps``,
                ``hub_commit_budget``, ``license``, ``language``; missing ones keep their defaults).
            data_args: the data arguments (``dataset_name`` for the card).
            **overrides: fields to set instead (e.g. ``save_strategy`` of a callback).
        """
        get = _getter(args)
        fields = dict(output_dir=get("output_dir"), hub_model_id=get("hub_model_id"), hub_token=get("hub_token"),
                      hub_strategy=get("hub_strategy", DEFAULT_HUB_STRATEGY), hub_private_repo=get("hub_private_repo"),
                      hub_revision=get("hub_revision"),
                      save_strategy=str(getattr(get("save_strategy", "epoch"), "value", get("save_strategy", "epoch"))),
                      save_steps=get("save_steps"),
                      hub_commit_budget=get("hub_commit_budget", commit_budget.DEFAULT_COMMIT_BUDGET))
        if fields["save_strategy"] == "best":  # transformers 4.5x: saves follow the best metric
            fields.update(save_strategy="epoch", save_best_only=True)
        card = {"license": get("license"), "language": get("language"),
                "dataset_name": getattr(data_args, "dataset_name", None) if data_args is not None else None}
        fields["card_fields"] = {k: v for k, v in card.items() if v is not None}
        fields.update(overrides)
        return cls(**fields)


def _getter(obj) -> Callable[..., Any]:
    """``get(name, default=None)`` over an object's attributes (a dict's keys)."""
    if isinstance(obj, dict):
        return lambda name, default=None: obj.get(name, default) if obj.get(name) is not None else default
    return lambda name, default=None: getattr(obj, name, None) if getattr(obj, name, None) is not None else default
