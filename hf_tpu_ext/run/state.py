"""The run's state on disk: ``run_state.json`` (which phases are done, what only the training process measured,
each process's push report), the trainer state saved with every checkpoint, and ``training_summary.json``.

``output_dir/run_state.json`` (:data:`RUN_STATE_NAME`) is ``{"global_step", "max_steps", "phases": {phase:
"done" | "pushed" | "skipped" | "failed"}, "fit_metrics", "compiler", "hub_pushes": [{"process", "report"}]}``;
it lets ``--resume_from_checkpoint true`` after a kill finish what the killed process did not.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any, Callable, Dict, List, Optional

from hf_tpu_ext.backends.base import run_progress, tokens_seen
from hf_tpu_ext.data.loading import describe_data_source
from hf_tpu_ext.fileio import atomic_write_text
from hf_tpu_ext.flops import flops_per_token
from hf_tpu_ext.hub.model_card import initialization_fields
from hf_tpu_ext.outputs import TrainerState, build_training_summary
from hf_tpu_ext.run.history import best_metric_of, best_of

PHASES = ("train", "export", "card", "push", "space")
RUN_STATE_NAME = "run_state.json"


def read_run_state(output_dir: str) -> Dict[str, Any]:
    """``output_dir/run_state.json`` (``{}`` when missing or unreadable): ``{"global_step", "max_steps",
    "phases": {phase: "done" | "pushed" | "skipped"}}``."""
    try:
        with open(os.path.join(output_dir, RUN_STATE_NAME), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_json(path: str, data) -> None:
    """``data`` as indented, key-sorted JSON at ``path``, atomically (:func:`hf_tpu_ext.fileio.atomic_write_text`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_run_state(output_dir: str, run_state: Dict[str, Any]) -> None:
    """``output_dir/run_state.json``, atomically."""
    write_json(os.path.join(output_dir, RUN_STATE_NAME), run_state)


def resumed_run_state(output_dir: str, resume_latest: bool, start: int, total_steps: int) -> Dict[str, Any]:
    """The run state a run starting at global step ``start`` of ``total_steps`` continues: the saved one when it
    resumes the same checkpoint of a run of the same length (``resume_latest``), else ``{}`` (nothing after
    training done); the earlier processes' push reports (``hub_pushes``) are kept either way."""
    previous = read_run_state(output_dir) if resume_latest else {}
    run_state = previous
    if run_state.get("global_step") != start or run_state.get("max_steps") != total_steps:
        run_state = {}  # another checkpoint or another length: nothing after training is done
    if previous.get("hub_pushes"):  # the push reports of the earlier processes of this run
        run_state["hub_pushes"] = previous["hub_pushes"]
    return run_state


def phase_pending(run_state: Dict[str, Any], phase: str, pushing: bool, space_id: Optional[str]) -> bool:
    """Whether ``phase`` (one of :data:`PHASES`) is still to run: ``push`` only with a push session (``pushing``),
    ``space`` only with ``--hub_space_id`` and a push session."""
    value = run_state.get("phases", {}).get(phase)
    if phase == "push":
        return pushing and value != "pushed"
    if phase == "space":
        return bool(space_id) and pushing and value != "done"
    return value != "done"


def merge_push_reports(reports: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """One ``hub_pushes`` report for a run of several processes (a resume after a signal or a kill).

    Totals (int fields: ``pushed``, ``failed``, ``superseded``, ...) are summed, ``pushes`` (the outcomes) are
    concatenated (the last 100 kept), ``final_pushed`` is true when any process landed the final push; the
    other fields (``pending``, ``timed_out``, ``repo_id``, ...) are the last process's. ``processes`` counts
    the reports merged. ``None`` for no report.
    """
    reports = [r for r in reports if isinstance(r, dict)]
    if not reports:
        return None
    merged: Dict[str, Any] = dict(reports[-1])
    for key in set().union(*reports):
        values = [r.get(key) for r in reports if key in r]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            merged[key] = sum(values)
        elif key == "pushes" and all(isinstance(v, list) for v in values):
            merged[key] = [o for v in values for o in v][-100:]
    merged["final_pushed"] = any(bool(r.get("final_pushed")) for r in reports)
    merged["processes"] = len(reports)
    return merged


def record_push_report(run_state: Dict[str, Any], process_id: str, report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Keep ``report`` as process ``process_id``'s entry of ``run_state["hub_pushes"]`` (one entry per process of
    the run); returns the merged report of every process (:func:`merge_push_reports`)."""
    history = run_state.setdefault("hub_pushes", [])
    if not history or history[-1].get("process") != process_id:
        history.append({"process": process_id})
    history[-1].update(report=report)
    return merge_push_reports([h.get("report") for h in history])


def backend_flops_per_token(backend) -> Optional[float]:
    """The FLOPs per token the backend counts for its model (its run context's ``flops_per_token``: the
    architecture's own count on the Keras backend), or None before the model is built or where it has none."""
    try:
        return getattr(backend.run_context(), "flops_per_token", None)
    except AttributeError:  # no model built yet (a resume that only exports): the formula's count is used
        return None


def trainer_state(step: int, runtime: float, plan, training_args, data_args, log_history: List[Dict[str, Any]],
                  model_config: Callable[[], Any], best_model_checkpoint: Optional[str],
                  model_flops_per_token: Optional[float] = None, place: Optional[Dict[str, Any]] = None):
    """The :class:`~hf_tpu_ext.outputs.TrainerState` saved with the checkpoint of global step ``step``.

    Args:
        runtime: training seconds so far (every process of the run). plan: the run's
            :class:`~hf_tpu_ext.backends.base.RunPlan`. model_config: returns the backend's model config (for
            FLOPs; a config without the fields FLOPs need gives ``total_flos`` 0). best_model_checkpoint: the
            backend's, or ``None``. model_flops_per_token: the backend's own count (the architecture's: ModernBERT's
            local layers count their window), else the encoder formula of :func:`hf_tpu_ext.flops.flops_per_token`.
        place: :func:`~hf_tpu_ext.backends.base.run_progress` of ``step`` (unrounded); its ``epoch``, none for a
            ``--streaming`` run (``null``: a stream has no epochs; its entries say ``stream_passes``).
    """

    args = training_args
    metric, greater = best_metric_of(args)
    best, best_step = best_of(log_history, metric, greater)
    tokens = tokens_seen(plan, step)  # every phase's length (a context extension's too)
    try:
        flops = tokens * (model_flops_per_token or flops_per_token(
            model_config(), data_args.max_seq_length, data_args.max_predictions_per_seq / data_args.max_seq_length))
    except Exception:  # a config without the fields flops needs: leave it out
        flops = 0.0
    return TrainerState(
        global_step=step, epoch=(place or run_progress(plan, step, digits=None)).get("epoch"),
        max_steps=plan.total_steps,
        num_train_epochs=int(-(-plan.total_steps // plan.steps_per_epoch)), logging_steps=args.logging_steps,
        eval_steps=args.eval_steps, save_steps=args.save_steps, train_batch_size=plan.global_batch_size,
        log_history=[dict(e) for e in log_history], best_metric=best, best_global_step=best_step,
        best_model_checkpoint=best_model_checkpoint,
        num_input_tokens_seen=tokens, total_flos=flops, train_runtime=runtime,
        phases=run_phases(data_args, plan, step))


def run_phases(data_args, plan, step: int) -> List[Dict[str, Any]]:
    """``phases`` of ``trainer_state.json`` and ``training_summary.json`` at global step ``step``: the run's stretches
    of one ``max_seq_length`` and ``mlm_probability``, each ``{"start_step", "end_step", "max_seq_length",
    "mlm_probability", "tokens"}`` (``tokens``: the training tokens of its steps). A resume that changes one of them
    starts a new phase at its step, one that changes none extends the last (the checkpoint's phases:
    ``data_args.resumed_phases``, :func:`hf_tpu_ext.run.resume.checkpoint_phases`); ``None`` values: a phase saved
    before phases were recorded. A longer ``--max_seq_length`` phase is a phase of its own the same way."""
    phases = [dict(p) for p in getattr(data_args, "resumed_phases", None) or ()]
    start, length = (int(phases[-1]["end_step"]) if phases else 0), int(plan.seq_length)
    tokens = max(0, int(step) - start) * int(plan.global_batch_size) * length
    last = phases[-1] if phases else {}
    if phases and (last.get("max_seq_length"), last.get("mlm_probability")) == (length, data_args.mlm_probability):
        last.update(end_step=max(int(step), start), tokens=(last.get("tokens") or 0) + tokens)
    elif int(step) > start or not phases:
        phases.append({"start_step": start, "end_step": int(step), "max_seq_length": length,
                       "mlm_probability": data_args.mlm_probability, "tokens": tokens})
    return phases


def run_summary(model_args, data_args, training_args, backend, plan, results: Dict[str, Any],
                log_history: List[Dict[str, Any]], description: str, mask_token: str, run_state: Dict[str, Any],
                push_report: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``training_summary.json`` of the run (:class:`hf_tpu_ext.outputs.TrainingSummary`'s fields, built by
    :func:`hf_tpu_ext.outputs.build_training_summary`: what the model card needs) from its ``results`` (:func:`hf_tpu_ext.run.history.run_results`), the backend's model and device
    summaries, and ``hub_pushes``: the merged push report of every process (when pushing)."""

    fields = backend.model_summary()
    summary = build_training_summary(
        model_args, data_args, training_args, backend=backend.name,
        device=backend.device_summary(), global_batch_size=plan.global_batch_size,
        global_step=results["global_step"], steps_per_epoch=plan.steps_per_epoch,
        total_steps=plan.total_steps, train_metrics=results, log_history=log_history,
        model_fields={k: v for k, v in fields.items()
                      if k not in ("optimizer", "jit_compile", "steps_per_execution", "compiler", "precision")},
        optimizer=fields.get("optimizer", ""), dataset_description=description,
        mask_token=mask_token, jit_compile=fields.get("jit_compile"),
        steps_per_execution=fields.get("steps_per_execution", 1),
        compiler=fields.get("compiler") or run_state.get("compiler"),
        initialization=initialization_fields(model_args.model_name_or_path), precision=fields.get("precision"))
    summary["phases"] = run_phases(data_args, plan, results["global_step"])
    summary["tokens_seen"] = tokens_seen(plan, results["global_step"])  # a context extension's phases summed
    if getattr(plan, "num_eval_blocks", 0):
        summary["evaluation"] = evaluation_fields(data_args, plan)
    if getattr(plan, "streaming", False):  # a stream has no epochs: its passes over the data, when counted
        summary.update(epoch=None, stream_passes=results.get("stream_passes"))
    if push_report is not None:
        summary["hub_pushes"] = push_report
    return summary


def evaluation_fields(data_args, plan) -> Dict[str, Any]:
    """``training_summary.json`` ``evaluation``: what each evaluation reads, for the card's sentence: ``data`` (in
    words: the ``--validation_file``, the Hub dataset's validation data, or the share held out of the training
    text), ``blocks`` (sequences) and ``tokens`` (``blocks x max_seq_length``)."""
    if data_args.validation_file:
        name = data_args.validation_file.rstrip("/")
        data = f"the validation file {name if '://' in name else os.path.basename(name)}"
    elif data_args.dataset_name:
        data = f"the validation data of {describe_data_source(data_args)}"
    else:
        data = f"{data_args.validation_split_percentage}% of {describe_data_source(data_args)}, held out of training"
    if getattr(data_args, "max_eval_samples", None) or getattr(plan, "streaming", False):
        data = f"the first blocks of {data}"
    blocks = int(plan.num_eval_blocks)
    return {"data": data, "blocks": blocks, "tokens": blocks * int(plan.seq_length)}


def interrupted_fields(signum: int, step: int, checkpoints: List[str], output_dir: str, grace: float,
                       not_pushed: List[str], completed: bool) -> Dict[str, Any]:
    """``training_summary.json`` ``interrupted`` of a run stopped by ``signum`` at global step ``step``: the signal's
    name, the step, the checkpoint written for it (relative to ``output_dir``; ``None`` when the newest of
    ``checkpoints`` is of another step), the grace budget (s) and what did not reach the Hub; ``completed: true``
    when every phase finished within the grace budget."""
    fields = {
        "signal": signal.Signals(signum).name, "global_step": step,
        "checkpoint": (os.path.relpath(checkpoints[0], output_dir)
                       if checkpoints and checkpoints[0].endswith(f"-{step}") else None),
        "save_on_signal_timeout": grace, "not_pushed": not_pushed}
    if completed:
        fields["completed"] = True
    return fields
