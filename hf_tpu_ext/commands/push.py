"""``hf-tpu push OUTPUT_DIR --hub_model_id user/name``: push an output folder, its card and what resumes to the Hub.

Checks the token, the namespace and write access first, renders and validates the model card, uploads the
model folder without optimizer state and -- when the folder has a checkpoint in any layout this project writes
(:mod:`hf_tpu_ext.hub.checkpoint_layouts`) -- its newest checkpoint as ``last-checkpoint/`` in the same commit,
so ``hf-tpu train ... --resume_from_checkpoint user/name`` resumes from it. It goes through the same
:class:`~hf_tpu_ext.hub.push_session.PushSession` as training (retries of connection errors, timeouts, 5xx and 429 with
``Retry-After``) and prints the commit URL.

The card: a ``README.md`` hf-tpu-ext did not write (or that was edited since) keeps its text, and only the
metadata hf-tpu-ext owns (tags, ``pipeline_tag``, ``library_name``, ``model-index``, ``datasets``) is merged into
it (``--card merge``, the default; ``--card overwrite`` replaces it, ``--card keep`` pushes it unchanged). A repo
whose ``.gitattributes`` routes README.md through Git LFS gets a line that keeps it a regular file, and after the
push the metadata the Hub parsed is read back: a card the Hub does not show is an error.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
from typing import List, Optional

from hf_tpu_ext.args import check_repo_id
from hf_tpu_ext.errors import ArgumentError, HubError, ModelCardError
from hf_tpu_ext.fileio import read_json_object
from hf_tpu_ext.hub.checkpoint_layouts import layouts_help, newest_checkpoint as newest, pack_checkpoint
from hf_tpu_ext.hub.model_card import CARD_MODES, load_summary, render_model_card, validate_model_card, write_card
from hf_tpu_ext.hub.push_session import PushSession, push_save
from hf_tpu_ext.hub.resume import LAST_CHECKPOINT

#: files that make OUTPUT_DIR a model folder: config.json and weights of one of these formats
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "tf_model.h5")


def _tri_state(value: str) -> Optional[bool]:
    lowered = str(value).strip().lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    if lowered == "auto":
        return None
    raise argparse.ArgumentTypeError(f"expected true, false or auto, got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hf-tpu push``."""
    parser = argparse.ArgumentParser(prog="hf-tpu push", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="The output folder of a training run or a push_to_hub callback (the model "
                                           "and/or its checkpoints).")
    parser.add_argument("--hub_model_id", default=None,
                        help="Repo id 'user/name' (default: the folder's name under your account).")
    parser.add_argument("--hub_token", default=None, help="Hub token (default: HF_TOKEN or the cached login). Never printed.")
    parser.add_argument("--private", action="store_true", default=None, help="Create the repo private.")
    parser.add_argument("--revision", default=None, help="Branch to push to (created when missing; default main).")
    parser.add_argument("--commit_message", default=None,
                        help="The commit summary (default: 'Upload model (step N) and last-checkpoint/ (step M) "
                             "with hf-tpu-ext').")
    parser.add_argument("--license", default=None, help="License for the card (default: the training summary's, else none).")
    parser.add_argument("--language", default=None, help="Language for the card.")
    parser.add_argument("--dataset_name", default=None, help="Hub dataset the model was trained on (for the card).")
    parser.add_argument("--include_checkpoint", nargs="?", const=True, default=None, type=_tri_state,
                        metavar="{true,false,auto}",
                        help="Upload the newest checkpoint as last-checkpoint/ (what --resume_from_checkpoint "
                             "user/name resumes from). Default auto: when the folder has one (checkpoints/ckpt-N, "
                             "checkpoint-N/, checkpoints/checkpoint-N/, last-checkpoint/); true (or the flag "
                             "alone): required; false: the model only.")
    parser.add_argument("--card", choices=CARD_MODES, default="merge",
                        help="README.md: merge (default: a README.md hf-tpu-ext did not write keeps its text and "
                             "your metadata, e.g. language; the tags, pipeline_tag, library_name, model-index and "
                             "datasets are merged in), overwrite (replace it with the generated card), keep (push "
                             "it unchanged).")
    parser.add_argument("--max_retries", type=int, default=5,
                        help="Retries after a connection error, timeout, 5xx or 429 (Retry-After is honoured).")
    parser.add_argument("--timeout", type=float, default=None,
                        help="Seconds to wait for the upload (default: no limit; Ctrl-C stops waiting).")
    return parser


def newest_checkpoint(output_dir: str) -> Optional[str]:
    """The path of the checkpoint ``hf-tpu push`` uploads as ``last-checkpoint/`` (``None`` when none).

    A TensorFlow checkpoint is named by its prefix (``.../checkpoints/ckpt-N``), the others by their folder;
    see :func:`hf_tpu_ext.hub.checkpoint_layouts.newest_checkpoint`.
    """
    found = newest(output_dir)
    return found.path if found else None


def _global_step(output_dir: str, summary: dict) -> Optional[int]:
    if summary.get("global_step") is not None:
        return int(summary["global_step"])
    step = read_json_object(os.path.join(output_dir, "trainer_state.json")).get("global_step")
    return int(step) if step is not None else None


#: a Keras 3 push_to_hub callback's model folder (a keras-hub preset or a .keras file) with the callback's card
_KERAS_FILES = ("model.weights.h5", "model.keras")


def _model_kind(output_dir: str) -> Optional[str]:
    """``"transformers"`` (config.json + weights: the card is rendered here), ``"keras"`` (a Keras 3 callback's
    folder: its own card is pushed as written) or ``None`` (no model)."""
    def has(name):
        return os.path.isfile(os.path.join(output_dir, name))

    if has("config.json") and any(has(n) for n in _WEIGHTS):
        return "transformers"
    if any(has(n) for n in _KERAS_FILES):
        return "keras"
    return None


def push(output_dir: str, hub_model_id: Optional[str] = None, hub_token: Optional[str] = None, *,
         private: Optional[bool] = None, revision: Optional[str] = None, commit_message: Optional[str] = None,
         include_checkpoint: Optional[bool] = None, card: str = "merge", max_retries: int = 5,
         backoff_seconds: float = 1.0, timeout: Optional[float] = None, **card_fields) -> str:
    """Push ``output_dir`` (model, card, newest checkpoint as ``last-checkpoint/``) in one commit; return its URL.

    Args:
        output_dir: an output folder: ``config.json`` + weights (``model.safetensors``/``tf_model.h5``; the card
            is rendered), or a Keras 3 callback's folder (``model.weights.h5``/``model.keras``; its own card is
            pushed as written), and/or a checkpoint in a layout of
            :data:`hf_tpu_ext.hub.checkpoint_layouts.LAYOUTS` (a folder with only a checkpoint pushes
            ``last-checkpoint/`` alone).
        hub_model_id: ``"user/name"`` or ``"name"`` (default: the folder's name).
        hub_token: the Hub token (default: ``HF_TOKEN`` / cached login).
        private: create the repo private.
        revision: branch to push to.
        commit_message: the commit summary (default names the steps pushed).
        include_checkpoint: ``None`` (default): the newest checkpoint when there is one; ``True``: required;
            ``False``: the model only.
        card: ``"merge"``, ``"overwrite"`` or ``"keep"`` (see :func:`hf_tpu_ext.hub.model_card.write_card`).
        max_retries, backoff_seconds: the retry policy (see :class:`~hf_tpu_ext.hub.push_policy.PushConfig`).
        timeout: seconds to wait for the upload (``None``: no limit).
        **card_fields: ``license``, ``language``, ``dataset_name`` ... for the card (``None`` values ignored).

    Returns:
        The commit URL.

    Raises:
        ArgumentError: a malformed ``hub_model_id``; ``output_dir`` holds neither a model nor a checkpoint, or no
            checkpoint for ``include_checkpoint=True``; an unknown ``card`` mode.
        HubAuthError, HubRepoError, HubError: see :meth:`hf_tpu_ext.hub.push_session.PushSession.preflight`; HubError
            also when the upload failed after its retries or did not finish within ``timeout``.
        ModelCardError: the card does not validate or the user's README.md metadata does not parse (before any
            upload); or the commit landed but the Hub shows no card metadata (the message has the commit URL).
    """
    kind, checkpoint = _what_to_push(output_dir, hub_model_id, include_checkpoint, card)
    has_model = kind is not None
    session = PushSession.for_script(hub_model_id, token=hub_token, hub_strategy="checkpoint" if checkpoint else "end",
                                     private=private, revision=revision, output_dir=output_dir,
                                     max_retries=max_retries, backoff_seconds=backoff_seconds, push_timeout=timeout)
    staging = tempfile.mkdtemp(prefix="hf-tpu-ckpt-") if checkpoint else None
    try:
        with session:
            repo_id = session.preflight()
            summary = load_summary(output_dir) if has_model else {}
            step = _global_step(output_dir, summary) if has_model else None
            if kind == "transformers":
                _write_card(output_dir, repo_id, summary, card, card_fields, session.token)
            folder = pack_checkpoint(checkpoint, os.path.join(staging, LAST_CHECKPOINT)) if checkpoint else None
            what = ([f"model (step {step})" if step is not None else "model"] if has_model else []) + (
                [f"{LAST_CHECKPOINT}/ (step {checkpoint.step})"] if checkpoint else [])
            message = commit_message or f"Upload {' and '.join(what)} with hf-tpu-ext"
            # without a model (a run stopped before its first export) the folder's other files still go: the
            # tokenizer a resume from the repo needs, trainer_state.json, logs
            push_save(session, output_dir, step=checkpoint.step if checkpoint else step or 0,
                      checkpoint_folder=folder, final=True, commit_message=message)
            report = session.finish(timeout)
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
    return _landed_url(report, session.card_problems, output_dir, repo_id, timeout)


def _what_to_push(output_dir: str, hub_model_id: Optional[str], include_checkpoint: Optional[bool], card: str):
    """``(model kind, newest checkpoint or None)`` of ``output_dir`` after the checks of :func:`push`'s arguments
    (no I/O beyond listing the folder).

    Raises:
        ArgumentError: see :func:`push`.
    """
    if hub_model_id is not None:
        check_repo_id(hub_model_id, "--hub_model_id")
    if card not in CARD_MODES:
        raise ArgumentError(f"--card must be one of {', '.join(CARD_MODES)}, got {card!r}.")
    kind = _model_kind(output_dir)
    checkpoint = newest(output_dir) if include_checkpoint is not False and os.path.isdir(output_dir) else None
    if include_checkpoint and checkpoint is None:
        raise ArgumentError(f"--include_checkpoint: {output_dir} has no checkpoint; looked for {layouts_help()}.")
    if kind is None and checkpoint is None:
        raise ArgumentError(f"{output_dir} has no config.json + model.safetensors (or tf_model.h5), no Keras model "
                            "(model.weights.h5, model.keras) and no checkpoint; give the output folder of `hf-tpu "
                            "train` or of a push_to_hub callback.")
    return kind, checkpoint


def _write_card(output_dir: str, repo_id: str, summary: dict, card: str, card_fields: dict, token) -> None:
    """Render, validate and write ``output_dir/README.md`` in ``card`` mode (before any upload; part of :func:`push`).

    Raises:
        ModelCardError: the card, or the user's card merged with it, does not validate.
    """
    fields = {k: v for k, v in card_fields.items() if v is not None}  # no license the user did not give
    generated = render_model_card(output_dir, repo_id=repo_id, summary=summary, **fields)
    validate_model_card(generated, token=token)
    # a merged card (the user's metadata too) must pass before it is written or uploaded
    write_card(output_dir, generated, mode=card,
               explicit=tuple(k for k in ("license", "language") if card_fields.get(k) is not None),
               check_merged=functools.partial(validate_model_card, token=token))


def _landed_url(report, card_problems, output_dir: str, repo_id: str, timeout: Optional[float]) -> str:
    """The final commit's URL from the session's ``report`` (part of :func:`push`).

    Raises:
        HubError: the final push did not land. ModelCardError: it landed, but the Hub shows no card metadata
            (``card_problems``: what the session read back, hub.model_card.check_card_on_hub).
    """
    if not report.final_pushed:
        why = report.failed[-1][1] if report.failed else f"not finished within {timeout} s"
        raise HubError(f"Could not push {output_dir} to {repo_id}: {why}. The local folder keeps everything; run "
                       "the command again.")
    landed = [o for o in report.outcomes if o.status == "pushed" and o.final][-1]
    url = landed.commit_url or landed.commit_oid
    if card_problems:
        raise ModelCardError(f"Pushed {url}, but the Hub does not show the model card's metadata: "
                             f"{'; '.join(card_problems)}. Fix README.md (or the repo's .gitattributes) and run "
                             "the command again.")
    return url


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``hf-tpu push``; prints the commit URL. Returns 0, or 130 when interrupted (Ctrl-C)."""
    import sys

    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    args = build_parser().parse_args(argv)
    bars_were_off = are_progress_bars_disabled()
    disable_progress_bars()  # the commit URL (or one error line) is the output, no upload bars
    try:
        url = push(args.output_dir, args.hub_model_id, args.hub_token, private=args.private, revision=args.revision,
                   commit_message=args.commit_message, include_checkpoint=args.include_checkpoint, card=args.card,
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
