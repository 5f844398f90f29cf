"""``hf-tpu push OUTPUT_DIR --hub_model_id user/name``: push a finished output folder and its card to the Hub.

Checks the token and namespace first, renders and validates the model card (written to
``OUTPUT_DIR/README.md``), uploads the folder without optimizer state (checkpoints stay local) and prints
the commit URL.
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional

from hf_tpu_ext.errors import ArgumentError


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
                        help="Also upload last-checkpoint/ (training state for --resume_from_checkpoint user/name).")
    return parser


def push(output_dir: str, hub_model_id: Optional[str] = None, hub_token: Optional[str] = None, *,
         private: Optional[bool] = None, revision: Optional[str] = None,
         commit_message: str = "Upload model trained with hf-tpu-ext", include_checkpoint: bool = False,
         **card_fields) -> str:
    """Push ``output_dir`` with a fresh, validated model card; return the commit URL.

    Args:
        output_dir: a folder holding at least ``config.json`` and ``model.safetensors``.
        hub_model_id: ``"user/name"`` or ``"name"`` (default: the folder's name).
        hub_token: the Hub token (default: ``HF_TOKEN`` / cached login).
        private: create the repo private.
        revision: branch to push to.
        commit_message: the commit summary.
        include_checkpoint: also upload ``last-checkpoint/``.
        **card_fields: ``license``, ``language``, ``dataset_name`` ... for the card (``None`` values ignored).

    Returns:
        The commit URL.

    Raises:
        ArgumentError: ``output_dir`` is not a model folder.
        HubAuthError, HubRepoError, HubError: see :func:`hf_tpu_ext.hub.preflight.preflight`.
        ModelCardError: the card does not validate.
    """
    from hf_tpu_ext.callbacks.push_to_hub import MODEL_IGNORE_PATTERNS
    from hf_tpu_ext.hub.model_card import load_summary, render_model_card, validate_model_card
    from hf_tpu_ext.hub.preflight import _api, hub_call, preflight, resolve_token

    if not os.path.isfile(os.path.join(output_dir, "config.json")) or not os.path.isfile(
            os.path.join(output_dir, "model.safetensors")):
        raise ArgumentError(f"{output_dir} has no config.json + model.safetensors; give the output folder of `hf-tpu train`.")
    token = resolve_token(hub_token)
    repo_id = preflight(hub_model_id, token, private=private, revision=revision,
                        default_name=os.path.basename(os.path.abspath(output_dir)))
    summary = load_summary(output_dir)
    fields = {k: v for k, v in card_fields.items() if v is not None}
    if not fields.get("license") and not summary.get("license"):
        fields["license"] = "apache-2.0"
    card = render_model_card(output_dir, repo_id=repo_id, summary=summary, **fields)
    validate_model_card(card, token=token)
    card.save(os.path.join(output_dir, "README.md"))
    ignore = [p for p in MODEL_IGNORE_PATTERNS if not (include_checkpoint and p == "last-checkpoint/*")]
    if include_checkpoint:  # the checkpoint's own files are optimizer state by design
        ignore = [p for p in ignore if p not in ("*.index", "*.data-*")] + ["checkpoints/*"]
    info = hub_call(f"upload {output_dir} to {repo_id}", _api(token).upload_folder, token, repo_id=repo_id,
                    folder_path=output_dir, commit_message=commit_message, revision=revision, ignore_patterns=ignore)
    return info.commit_url


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``hf-tpu push``; prints the commit URL. Returns 0."""
    args = build_parser().parse_args(argv)
    url = push(args.output_dir, args.hub_model_id, args.hub_token, private=args.private, revision=args.revision,
               commit_message=args.commit_message, include_checkpoint=args.include_checkpoint, license=args.license,
               language=args.language, dataset_name=args.dataset_name)
    print(url)
    return 0
