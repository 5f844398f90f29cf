"""The run's push adapter: how ``hf-tpu train`` drives its :class:`~hf_tpu_ext.hub.push_session.PushSession`.

The backend decides when to save; the session decides what a save pushes, when, and the commit budget (its
``admit`` gives the save's one plan, its ``save`` carries it out). This module opens the session (token, repo id,
write access; nothing created), finds a final push an earlier process of the run landed after it stopped, and
settles the pushes after a signal within the grace budget.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from hf_tpu_ext import interrupts
from hf_tpu_ext.hub.checkpoint_layouts import push_later_command
from hf_tpu_ext.hub.preflight import check_push_access, resolve_token
from hf_tpu_ext.hub.push_session import PushConfig, PushSession
from hf_tpu_ext.hub.resume import looks_like_repo_spec

logger = logging.getLogger("hf_tpu_ext")


def push_repo(training_args) -> str:
    """The repo ``--push_to_hub`` pushes to: ``--hub_model_id``, else the output folder's name (the namespace is
    then the token's user)."""
    return training_args.hub_model_id or os.path.basename(os.path.abspath(training_args.output_dir))


def open_push_session(training_args, data_args, backend) -> Tuple[Optional[str], Any]:
    """``(token, session)`` before any data or compute work: the token (with ``--push_to_hub`` or a Hub resume),
    and on the chief with ``--push_to_hub`` the session, the repo id and write access checked
    (:func:`~hf_tpu_ext.hub.preflight.check_push_access`, nothing created); ``None`` for what the run does not
    need. The repo is created by the session's preflight after the data checks, so a run refused for its data
    leaves no empty repo.

    Raises:
        HubAuthError: no token, or one without write access to the repo. HubRepoError: an invalid repo id.
    """
    args, token, session = training_args, None, None
    hub_resume = bool(args.resume_from_checkpoint) and not args.resume_latest and looks_like_repo_spec(
        args.resume_from_checkpoint)
    if args.push_to_hub or hub_resume:
        token = resolve_token(args.hub_token)
    if args.push_to_hub and backend.is_chief:
        repo = push_repo(args)
        # the backend decides when to save; the session what a save pushes, when, and the budget
        config = PushConfig.from_training_args(args, data_args, hub_model_id=repo, hub_token=token,
                                               save_strategy="no", save_steps=None)
        session = PushSession(config, is_chief=True)

        check_push_access(repo, token)  # on the command line, the answer of the early check (one whoami per run)
    return token, session


def landed_final_push(run_state: Dict[str, Any], process_id: str, step: int, session) -> Optional[str]:
    """The commit id of the final push of ``step`` that an earlier process of this run left in flight when it
    stopped (``run_state.json`` keeps its push id) and that landed on the Hub after all (looked up by the session);
    its entry then counts it (``final_pushed``, no longer ``unfinished``). ``None``: push again."""
    for entry in run_state.get("hub_pushes", []):
        report = entry.get("report") or {}
        for push in list(report.get("unfinished") or []) if entry.get("process") != process_id else []:
            oid = (push.get("final") and push.get("step") == step and push.get("push_id")
                   and session.find_push(push["push_id"]))
            if oid:
                logger.info("The final push of step %d by the process before landed after it stopped (commit "
                            "%s): not pushed again.", step, oid[:8])
                report.update(final_pushed=True, unfinished=[u for u in report["unfinished"] if u is not push])
                return oid
    return None


def final_push_failure(training_args, step: int, repo_id: str) -> str:
    """The one line of a final push that did not land: the local folder is complete, the command that pushes it."""
    args = training_args
    return (f"The final model (step {step}) could not be pushed to {repo_id}; the local "
            f"folder {args.output_dir} is complete. Push it and its newest checkpoint with `"
            f"{push_later_command(args.output_dir, repo_id, args.hub_revision)}`, "
            "or resume this run to push again.")


def settle_on_signal(session, find_checkpoints: Callable[[], List[str]], step: int, start_step: int,
                     push: Callable[[Any, str], None]) -> List[str]:
    """After a signal: push the checkpoint of ``step`` (the newest of ``find_checkpoints()`` when it is of that step)
    when no save pushed it (the budget had coalesced it, or it is the last step's; ``push(plan, checkpoint)`` with
    the session's plan of that save), wait
    for the pushes within the grace budget (not after a second signal), close the session; returns what did not
    land (pending and failed pushes)."""
    try:
        checkpoints = find_checkpoints()
        plan = (session.admit(step) if interrupts.count() < 2 and session.active and interrupts.seconds_left()
                and checkpoints and checkpoints[0].endswith(f"-{step}") and step > start_step
                and step not in session.pushed_steps else None)
        if plan is not None:
            try:  # a signal is a save: what a resume from the Hub starts from
                push(plan, checkpoints[0])
            except Exception as err:  # noqa: BLE001 (the local checkpoint is whole: say so, go on)
                logger.warning("The checkpoint of step %d was not pushed (%s: %s).", step,
                               type(err).__name__, err)
        if interrupts.count() < 2:
            interrupts.wait_until(lambda: not session.report().pending, interrupts.seconds_left() or 0.0)
        report = session.finish(timeout=0)
    except KeyboardInterrupt:  # a second signal: stop waiting
        report = session.report()
    finally:
        session.close()
    return list(report.pending) + [m for m, _ in report.failed]
