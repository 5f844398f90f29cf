"""What every push shares beyond one session: the files a model push leaves out, the report's log lines, and the
process exit (the hub layer's one ``atexit`` hook: every live :class:`~hf_tpu_ext.hub.push_session.PushSession`
reports what is pending and removes its staging folders when the interpreter exits).

It imports only the standard library and ground modules: never TensorFlow, torch or Keras, and no session (the
sessions register themselves here).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Optional

from hf_tpu_ext import interrupts
from hf_tpu_ext.args import HUB_STRATEGIES  # noqa: F401 (the flag's choices: defined once, with the argument)
from hf_tpu_ext.hub.checkpoint_layouts import push_later_command
from hf_tpu_ext.hub.push_policy import CHECKPOINT_PREFIX, checkpoint_folder_name  # noqa: F401 (re-exported)
from hf_tpu_ext.hub.push_queue import STAGING_PREFIX, PushReport, note_step  # noqa: F401 (re-exported)
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT

logger = logging.getLogger("hf_tpu_ext.hub")

__all__ = ["HUB_STRATEGIES", "MODEL_IGNORE_PATTERNS", "LAST_CHECKPOINT", "LAST_CHECKPOINT_DELETE_PATTERNS",
           "CHECKPOINT_PREFIX", "STAGING_PREFIX", "PushReport", "checkpoint_folder_name", "log_push_report",
           "note_step", "install_hooks", "remove_hooks"]

# What of an output folder never goes into a model push: optimizer state (TensorFlow checkpoint shards,
# the Trainer's checkpoint folders), local checkpoint folders, temp and hidden files, pickled arguments.
MODEL_IGNORE_PATTERNS = ("checkpoints/*", f"{LAST_CHECKPOINT}/*", "checkpoint-*", f"hub-{LAST_CHECKPOINT}/*",
                         "*.index", "*.data-*", "*.tmp", ".*", "training_args.bin", "run_state.json")
# files under last-checkpoint/ on the Hub that a new checkpoint does not re-upload are deleted in its commit
# (older ckpt-N shards, rng states of other ranks): what lands there is exactly one checkpoint
LAST_CHECKPOINT_DELETE_PATTERNS = (f"{LAST_CHECKPOINT}/*",)
DEFAULT_PUSH_TIMEOUT = 600.0


def log_push_report(report: PushReport, repo_id: str, output_dir: Optional[str], final_step: Optional[int]) -> None:
    """Log what the run left on the Hub, and how to push what did not land.

    Args:
        report: the session's report.
        repo_id: the target repo (for the messages).
        output_dir: the local folder that holds everything (``None``: not said).
        final_step: the last global step (``None``: not said).
    """
    for message, oid in report.pushed[-5:]:
        logger.info("On the Hub: %r (commit %s).", message, oid[:8] if oid else "?")
    missing = [m for m, _ in report.failed] + list(report.pending)
    if missing:
        logger.error(
            "Not pushed to %s: %s. The local folder %s has everything; push it and its newest checkpoint (what "
            "resumes) later with `%s`.", repo_id, "; ".join(missing), output_dir or "the output folder",
            push_later_command(output_dir, repo_id, report.revision))
    else:
        logger.info("All %d pushes to %s landed%s.", report.counts.get("pushed", 0), repo_id,
                    f" (final step {final_step})" if final_step is not None else "")


# ---- process exit: every live session cleans up at interpreter exit; signals are interrupts.py's -----
_LIVE: "weakref.WeakSet" = weakref.WeakSet()
_HOOKS = threading.Lock()
_atexit_done = False


def _close_all_at_exit() -> None:
    for session in list(_LIVE):
        session.abandon("The process is exiting")


def install_hooks(session):
    """atexit cleanup of ``session`` (a preflighted :class:`~hf_tpu_ext.hub.push_session.PushSession`), and its
    ``on_signal`` at the first SIGINT/SIGTERM (:func:`hf_tpu_ext.interrupts.on_signal`, which outside a training
    run makes SIGTERM unwind so ``finally``/atexit clean up): it says what is pending. Returns the signal
    callback's handle (for :func:`remove_hooks`)."""
    global _atexit_done

    with _HOOKS:
        _LIVE.add(session)
        if not _atexit_done:
            atexit.register(_close_all_at_exit)
            _atexit_done = True
    return interrupts.on_signal(session.on_signal)


def remove_hooks(session, handle) -> None:
    """Undo :func:`install_hooks` (the session closed; ``handle``: what it returned, or ``None``); idempotent."""
    with _HOOKS:
        _LIVE.discard(session)
    if handle is not None:
        handle.remove()
