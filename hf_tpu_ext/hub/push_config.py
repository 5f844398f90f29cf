"""How a run pushes: :class:`PushConfig`, transformers' ``TrainingArguments`` names, validated at construction.

The push session (:mod:`hf_tpu_ext.hub.push_session`) and the three push callbacks take one; see the session's
module doc for what each field decides.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Optional

from hf_tpu_ext.args import check_repo_id
from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.hub.commit_budget import DEFAULT_COMMIT_BUDGET
from hf_tpu_ext.hub.push_policy import DEFAULT_HUB_STRATEGY, DEFAULT_MODE, DEFAULT_MONITOR, check_hub_strategy

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
    hub_commit_budget: int = DEFAULT_COMMIT_BUDGET
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
            from hf_tpu_ext.hub import commit_budget

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
                      save_steps=get("save_steps"), hub_commit_budget=get("hub_commit_budget", DEFAULT_COMMIT_BUDGET))
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
