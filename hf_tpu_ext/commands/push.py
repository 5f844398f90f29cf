"""``hf-tpu push OUTPUT_DIR --hub_model_id user/name``: push a finished output folder and its card to the Hub.

Checks the token, the namespace and write access first, renders and validates the model card (written to
``OUTPUT_DIR/README.md``), uploads the folder without optimizer state (checkpoints stay local unless
``--include_checkpoint``) through the same :class:`~hf_tpu_ext.hub.pusher.HubPusher` as training, so it
retries connection errors, timeouts, 5xx and 429 (honouring ``Retry-After``) the same way, and prints the
commit URL.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from typing import List, Optional

from hf_tpu_ext.errors import ArgumentError, HubError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hf-tpu push``."""
    parser = argparse.ArgumentParser(prog="hf-tpu push", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="The output folder of a training run (config.json + model.safetensors).")
    parser.add_argument("--hub_model_id", default=None,
                        help="Repo id 'user/name' (default: the folder's name under your account).")
    parser.add_argument("--hub_token", default=None, help="Hub token (default: HF_TOKEN or the cached login). Never printed.")
    parser.add_argument("--private", action="store_true", default=None, help="Create the repo private.")
    parser.add_argument("--revision", default=None, help="Branch to push to (created when missing; default main).")
    parser.add_argument("--commit_message", default="Upload model trained with hf-tpu-ext", help="The commit summary.")
    parser.add_argument("--license", default=None, help="License for the card (default: the training summary's, else apache-2.0).")
    parser.add_argument("--language", default=None, help="Language for the card.")
    parser.add_argument("--dataset_name", default=None, help="Hub dataset the model was trained on (for the card).")
    parser.add_argument("--include_checkpoint", action="store_true",
                        help="Also upload the newest checkpoint to last-checkpoint/ (training state for "
                             "--resume_from_checkpoint user/name): OUTPUT_DIR/last-checkpoint, else the newest "
                             "OUTPUT_DIR/checkpoint-N.")
    parser.add_argument("--max_retries", type=int, default=5,
                        help="Retries after a connection error, timeout, 5xx or 429 (Retry-After is honoured).")
    parser.add_argument("--timeout", type=float, default=None,
                        help="Seconds to wait for the upload (default: no limit; Ctrl-C stops waiting).")
    return parser


def newest_checkpoint(output_dir: str) -> Optional[str]:
    """The checkpoint folder ``--include_checkpoint`` pushes: ``last-checkpoint/``, else the newest ``checkpoint-N/``."""
    from hf_tpu_ext.hub.pusher import CHECKPOINT_PREFIX, LAST_CHECKPOINT

    last = os.path.join(output_dir, LAST_CHECKPOINT)
    if os.path.isdir(last):
        return last
    numbered = []
    for path in glob.glob(os.path.join(output_dir, f"{CHECKPOINT_PREFIX}*")):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", os.path.basename(path))
        if match and os.path.isdir(path):
            numbered.append((int(match.group(1)), path))
    return max(numbered)[1] if numbered else None


def _global_step(output_dir: str, summary: dict) -> int:
    if summary.get("global_step") is not None:
        return int(summary["global_step"])
    try:
        with open(os.path.join(output_dir, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f).get("global_step") or 0)
    except (OSError, ValueError):
        return 0


def push(output_dir: str, hub_model_id: Optional[str] = None, hub_token: Optional[str] = None, *,
         private: Optional[bool] = None, revision: Optional[str] = None,
         commit_message: str = "Upload model trained with hf-tpu-ext", include_checkpoint: bool = False,
         max_retries: int = 5, backoff_seconds: float = 1.0, timeout: Optional[float] = None,
         **card_fields) -> str:
    """Push ``output_dir`` with a fresh, validated model card; return the commit URL.

    Args:
        output_dir: a folder holding at least ``config.json`` and ``model.safetensors``.
        hub_model_id: ``"user/name"`` or ``"name"`` (default: the folder's name).
        hub_token: the Hub token (default: ``HF_TOKEN`` / cached login).
        private: create the repo private.
        revision: branch to push to.
        commit_message: the commit summary.
        include_checkpoint: also upload the newest checkpoint to ``last-checkpoint/`` (same commit).
        max_retries, backoff_seconds: the retry policy (see :class:`~hf_tpu_ext.hub.pusher.HubPusher`).
        timeout: seconds to wait for the upload (``None``: no limit).
        **card_fields: ``license``, ``language``, ``dataset_name`` ... for the card (``None`` values ignored).

    Returns:
        The commit URL.

    Raises:
        ArgumentError: a malformed ``hub_model_id``; ``output_dir`` is not a model folder, or has no checkpoint for
            ``include_checkpoint``.
        HubAuthError, HubRepoError, HubError: see :meth:`hf_tpu_ext.hub.pusher.HubPusher.preflight`; HubError
            also when the upload failed after its retries or did not finish within ``timeout``.
        ModelCardError: the card does not validate.
    """
    from hf_tpu_ext.args import check_repo_id
    from hf_tpu_ext.hub.model_card import load_summary, render_model_card, validate_model_card
    from hf_tpu_ext.hub.pusher import HubPusher

    if hub_model_id is not None:
        check_repo_id(hub_model_id, "--hub_model_id")

    if not os.path.isfile(os.path.join(output_dir, "config.json")) or not os.path.isfile(
            os.path.join(output_dir, "model.safetensors")):
        raise ArgumentError(f"{output_dir} has no config.json + model.safetensors; give the output folder of `hf-tpu train`.")
    checkpoint = newest_checkpoint(output_dir) if include_checkpoint else None
    if include_checkpoint and checkpoint is None:
        raise ArgumentError(f"--include_checkpoint: {output_dir} has no last-checkpoint/ or checkpoint-N/ folder.")
    pusher = HubPusher(hub_model_id, token=hub_token, hub_strategy="checkpoint" if include_checkpoint else "end",
                       private=private, revision=revision, output_dir=output_dir, max_retries=max_retries,
                       backoff_seconds=backoff_seconds)
    with pusher:
        repo_id = pusher.preflight()
        summary = load_summary(output_dir)
        fields = {k: v for k, v in card_fields.items() if v is not None}
        if not fields.get("license") and not summary.get("license"):
            fields["license"] = "apache-2.0"
        card = render_model_card(output_dir, repo_id=repo_id, summary=summary, **fields)
        validate_model_card(card, token=pusher.token)
        card.save(os.path.join(output_dir, "README.md"))
        pusher.push_save(output_dir, step=_global_step(output_dir, summary), checkpoint_folder=checkpoint,
                         final=True, commit_message=commit_message)
        report = pusher.finish(timeout)
    if not report.final_pushed:
        why = report.failed[-1][1] if report.failed else f"not finished within {timeout} s"
        raise HubError(f"Could not push {output_dir} to {repo_id}: {why}. Nothing local changed; run the "
                       "command again.")
    landed = [o for o in report.outcomes if o.status == "pushed" and o.final]
    return landed[-1].commit_url or landed[-1].commit_oid


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``hf-tpu push``; prints the commit URL. Returns 0, or 130 when interrupted (Ctrl-C)."""
    import sys

    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    args = build_parser().parse_args(argv)
    bars_were_off = are_progress_bars_disabled()
    disable_progress_bars()  # the commit URL (or one error line) is the output, no upload bars
    try:
        url = push(args.output_dir, args.hub_model_id, args.hub_token, private=args.private, revision=args.revision,
                   commit_message=args.commit_message, include_checkpoint=args.include_checkpoint,
                   max_retries=args.max_retries, timeout=args.timeout, license=args.license,
                   language=args.language, dataset_name=args.dataset_name)
    except KeyboardInterrupt:
        print("hf-tpu push: interrupted before the upload landed; nothing local changed, run the command again.",
              file=sys.stderr)
        return 130
    finally:
        if not bars_were_off:
            enable_progress_bars()
    print(url)
    return 0
