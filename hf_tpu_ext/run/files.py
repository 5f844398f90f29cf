"""The run's files in ``output_dir`` besides the backend's model folder and checkpoints: the folder made ready
once every check passed, the export's run files (``training_args.json``, ``trainer_state.json``,
``all_results.json``, ``training_summary.json``, ``loss_curve.png``) and the model card ``README.md``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional

from hf_tpu_ext import outputs
from hf_tpu_ext.hub.checkpoint_layouts import clear_for_overwrite
from hf_tpu_ext.hub.model_card import base_model_license, save_model_card
from hf_tpu_ext.outputs import plot_loss_curve, read_training_summary, write_all_results, write_training_args
from hf_tpu_ext.run.resume import TOKENIZER_FILES

logger = logging.getLogger("hf_tpu_ext")


def prepare_output_dir(training_args, backend, tokenizer, resumed: bool) -> None:
    """Every check passed: from here on ``output_dir`` is written (chief only). Creates it; with
    ``--overwrite_output_dir`` (not resuming) removes an earlier run's saves and run files; saves the tokenizer
    unless a resumed folder holds it already; removes what a stopped save or export left (logged)."""
    args = training_args
    if not backend.is_chief:
        return
    os.makedirs(args.output_dir, exist_ok=True)
    if args.overwrite_output_dir and not args.resume_from_checkpoint:  # an earlier run's saves must go
        clear_for_overwrite(args.output_dir)
    if not all(os.path.isfile(os.path.join(args.output_dir, f)) for f in TOKENIZER_FILES) or not resumed:
        tokenizer.save_pretrained(args.output_dir)
    removed = backend.remove_incomplete_checkpoints(args.output_dir)
    if removed:  # a save or export that was killed half-way (the checkpoint resumed from is whole)
        logger.info("removed what a stopped save left: %s", ", ".join(removed))


def clear_earlier_events(training_args, backend) -> None:
    """``--overwrite_output_dir`` (not resuming): the earlier run's TensorBoard events in ``output_dir/runs`` (the
    default ``--logging_dir``) are removed before the backend opens this run's writer, so only this run's events are
    kept and pushed (a ``--logging_dir`` outside ``output_dir`` is the user's and stays). Chief only; logged."""
    import shutil

    args = training_args
    if not (backend.is_chief and args.overwrite_output_dir and not args.resume_from_checkpoint):
        return
    out, logs = os.path.abspath(args.output_dir), os.path.abspath(args.logging_dir or "")
    if not logs.startswith(out + os.sep) or not os.path.isdir(logs):
        return
    shutil.rmtree(logs)
    logger.info("--overwrite_output_dir: removed the earlier run's TensorBoard events %s.", os.path.relpath(logs, out))


def write_training_summary(output_dir: str, summary: Dict[str, Any]) -> None:
    """``output_dir/training_summary.json`` (:func:`hf_tpu_ext.outputs.write_training_summary`)."""
    outputs.write_training_summary(output_dir, summary)


def write_run_files(model_args, data_args, training_args, trainer_state, results: Dict[str, Any],
                    summary: Callable[[], Dict[str, Any]], log_history: List[Dict[str, Any]]) -> None:
    """The export's run files beside the model folder, in this order: ``training_args.json``,
    ``trainer_state.json``, ``all_results.json`` (the numeric ``results``), ``training_summary.json`` (``summary()``,
    built after the files before it) and ``loss_curve.png``."""
    out = training_args.output_dir
    write_training_args(out, model_args, data_args, training_args)
    trainer_state.save(os.path.join(out, "trainer_state.json"))
    write_all_results(out, {k: v for k, v in results.items() if isinstance(v, (int, float))})
    write_training_summary(out, summary())
    plot_loss_curve(log_history, os.path.join(out, "loss_curve.png"))


def write_card(model_args, training_args, repo_id: Optional[str]) -> None:
    """``output_dir/README.md``, the model card of ``repo_id`` from ``training_summary.json``
    (:func:`hf_tpu_ext.hub.model_card.save_model_card`): ``--license``/``--language`` only when given; unset, the
    license of the Hub model ``--model_name_or_path`` continues (:func:`~hf_tpu_ext.hub.model_card.base_model_license`)."""
    args = training_args
    # only what the user gave (or the continued Hub model's own license): no license or language is assumed
    license = args.license or base_model_license(model_args.model_name_or_path, model_args.model_revision)
    save_model_card(args.output_dir, repo_id=repo_id, summary=read_training_summary(args.output_dir),
                    license=license, language=args.language)
