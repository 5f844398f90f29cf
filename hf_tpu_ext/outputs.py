"""The run files of an output folder besides the model: arguments, trainer state, results, summary, loss plot.

Backend-neutral and light: nothing here imports TensorFlow or torch (matplotlib only inside
:func:`plot_loss_curve`). JSON files are written to a temporary name and moved into place, so a background
Hub upload never sends a half-written file.

Files (in ``output_dir``):

* ``training_args.json`` -- :func:`write_training_args`
* ``trainer_state.json`` -- :class:`TrainerState` (same field names as transformers' ``trainer_state.json``)
* ``all_results.json`` -- :func:`write_all_results` (merged like transformers' ``save_metrics("all", ...)``)
* ``training_summary.json`` -- :func:`write_training_summary` (what the model card needs)
* ``loss_curve.png`` -- :func:`plot_loss_curve`
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from typing import Any, Dict, List, Optional

from hf_tpu_ext.best_metric import BestMetric
from hf_tpu_ext.fileio import atomic_write, atomic_write_text

TRAINING_ARGS_NAME = "training_args.json"
TRAINER_STATE_NAME = "trainer_state.json"
ALL_RESULTS_NAME = "all_results.json"
TRAINING_SUMMARY_NAME = "training_summary.json"
LOSS_CURVE_NAME = "loss_curve.png"
REDACTED = "<redacted>"

#: Distributions reported by :func:`framework_versions` (those installed).
FRAMEWORK_DISTRIBUTIONS = (
    "hf-tpu-ext",
    "transformers",
    "tensorflow",
    "tf-keras",
    "torch",
    "torch-xla",
    "keras", "keras-hub", "jax", "jaxlib",  # the Keras backend's stack (only the installed ones are listed)
    "datasets",
    "tokenizers",
    "huggingface-hub",
    "evaluate",
    "safetensors",
)


def _json_default(obj):
    """JSON for numpy scalars/arrays, enums and other odd values (``str`` as the last resort)."""
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "value") and type(obj).__module__ != "builtins":  # enums
        return obj.value
    return str(obj)


def _write_json(path: str, data, indent: int = 2) -> str:
    """Write ``data`` as JSON (sorted keys) atomically; returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    text = json.dumps(data, indent=indent, sort_keys=True, default=_json_default) + "\n"
    atomic_write_text(path, text)
    return path


def _as_dict(obj) -> Dict[str, Any]:
    if obj is None:
        return {}
    if hasattr(obj, "to_sanitized_dict"):
        return dict(obj.to_sanitized_dict())
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return dict(obj)


def write_training_args(output_dir: str, model_args, data_args, training_args) -> str:
    """Write ``training_args.json``: the three argument dataclasses merged into one flat dict.

    The training arguments go through ``to_sanitized_dict()``, so ``hub_token`` is written as
    ``"<redacted>"``; any other non-empty field whose name ends in ``token`` is redacted as well.

    Args:
        output_dir: folder to write into (created if missing).
        model_args, data_args: :class:`hf_tpu_ext.args.ModelArguments` / ``DataTrainingArguments`` (or dicts).
        training_args: :class:`hf_tpu_ext.args.TrainingArguments` (or anything with ``to_sanitized_dict``).

    Returns:
        The path of the written file.
    """
    merged: Dict[str, Any] = {}
    for part in (_as_dict(model_args), _as_dict(data_args), _as_dict(training_args)):
        merged.update(part)
    for key, value in list(merged.items()):
        if key.endswith("token") and isinstance(value, str) and value:
            merged[key] = REDACTED
    return _write_json(os.path.join(output_dir, TRAINING_ARGS_NAME), merged)


@dataclasses.dataclass
class TrainerState:
    """Progress of a run, saved as ``trainer_state.json`` with transformers' ``TrainerState`` field names.

    Attributes:
        global_step: optimizer steps done.
        epoch: epochs done (float, e.g. ``1.5``); ``None`` for a ``--streaming`` run (a stream has no length: its
            log entries say ``stream_passes``, the passes over the stream completed).
        max_steps: total optimizer steps of the run.
        num_train_epochs: epochs of the run (float).
        logging_steps, eval_steps, save_steps: intervals in global steps.
        train_batch_size: global training batch size (sequences per optimizer step).
        num_input_tokens_seen: tokens consumed by training so far.
        log_history: one dict per log event, e.g. ``{"step": 10, "epoch": 0.1, "loss": 5.2, "learning_rate": 1e-4}``
            or ``{"step": 100, "eval_loss": 4.1, "perplexity": 60.3}``.
        best_metric: best value of ``metric_for_best_model`` (default ``eval_loss``) so far (None before the
            first evaluation).
        best_global_step: global step of ``best_metric``.
        best_model_checkpoint: checkpoint path of ``best_metric``.
        is_local_process_zero, is_world_process_zero: whether this process writes files.
        total_flos: floating point operations of the training so far.
        train_runtime: training wall time so far in seconds, summed over every resumed segment of the run.
        phases: the run's stretches of one ``max_seq_length`` and ``mlm_probability``
            (:func:`hf_tpu_ext.run.state.run_phases`): what a resume continues.
    """

    global_step: int = 0
    epoch: Optional[float] = 0.0
    max_steps: int = 0
    num_train_epochs: float = 0.0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: Optional[int] = None
    num_input_tokens_seen: int = 0
    log_history: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    best_metric: Optional[float] = None
    best_global_step: Optional[int] = None
    best_model_checkpoint: Optional[str] = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    total_flos: float = 0.0
    train_runtime: float = 0.0
    phases: List[Dict[str, Any]] = dataclasses.field(default_factory=list)

    def save(self, path: str) -> str:
        """Write the state as JSON to ``path`` (atomically). Returns ``path``."""
        return _write_json(path, dataclasses.asdict(self))

    @classmethod
    def load(cls, path: str) -> "TrainerState":
        """Read a state written by :meth:`save` (or by transformers' Trainer; unknown fields are ignored).

        Raises:
            FileNotFoundError: ``path`` does not exist.
            ValueError: the file is not JSON.
        """
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def write_all_results(output_dir: str, metrics: Dict[str, Any]) -> str:
    """Merge ``metrics`` into ``all_results.json`` (new values win), as transformers' ``save_metrics("all")``.

    Args:
        output_dir: folder holding ``all_results.json`` (created if missing).
        metrics: e.g. ``{"train_loss": 3.2, "train_runtime": 12.5, "eval_loss": 3.0, "perplexity": 20.1}``.

    Returns:
        The path of the written file.
    """
    merged = read_all_results(output_dir) or {}
    merged.update(metrics)
    return _write_json(os.path.join(output_dir, ALL_RESULTS_NAME), merged, indent=4)


def read_all_results(output_dir: str) -> Optional[Dict[str, Any]]:
    """The metrics in ``output_dir/all_results.json`` (None when missing or unreadable)."""
    path = os.path.join(output_dir, ALL_RESULTS_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None


@dataclasses.dataclass
class TrainingSummary:
    """``training_summary.json``: the facts of a run the model card is rendered from, the same fields whichever
    backend trained (:func:`build_training_summary`; :func:`write_training_summary` writes every field, ``null``
    when not given). The run adds ``hub_pushes`` (the merged push report of every process,
    :func:`hf_tpu_ext.run.state.merge_push_reports`), and after a signal ``interrupted``
    (:func:`hf_tpu_ext.run.state.interrupted_fields`); other extra keys are kept as given.
    """

    backend: Optional[str] = None
    """the backend that trained: ``"tensorflow"``, ``"keras"`` or ``"torch_xla"``."""
    accelerator: Optional[str] = None
    """``"CPU"``, ``"GPU"`` or ``"TPU"``."""
    device_kind: Optional[str] = None
    """the device's name where the backend knows it (e.g. ``"TPU v5 lite"``, a GPU's model); None otherwise."""
    num_devices: Optional[int] = None
    """accelerator devices used (all workers)."""
    strategy: Optional[str] = None
    """how the devices were used, e.g. ``"TPUStrategy"``, ``"jax.sharding data parallel (Keras 3 on JAX)"``."""
    num_replicas: Optional[int] = None
    """replicas in sync (data-parallel copies of the model)."""
    num_workers: Optional[int] = None
    """hosts (processes with devices)."""
    global_batch_size: Optional[int] = None
    """sequences per optimizer step (all replicas, accumulation included)."""
    per_device_train_batch_size: Optional[int] = None
    """sequences per replica per step (``--per_device_train_batch_size``)."""
    max_seq_length: Optional[int] = None
    """tokens per sequence."""
    precision: Optional[str] = None
    """``"bf16 mixed"`` (``--bf16``) or ``"float32"``."""
    jit_compile: Optional[bool] = None
    """whether the step was XLA-compiled."""
    compiler: Optional[str] = None
    """the compiler path in words (e.g. ``"XLA, whole step in one program"``, ``"TensorFlow kernels (oneDNN)"``;
    :mod:`hf_tpu_ext.precision`)."""
    steps_per_execution: Optional[int] = None
    """optimizer steps per device call (``--steps_per_execution``)."""
    global_step: Optional[int] = None
    """optimizer steps done."""
    epoch: Optional[float] = None
    """epochs done (``global_step / steps_per_epoch``)."""
    tokens_seen: Optional[int] = None
    """training tokens consumed: ``global_step x global_batch_size x max_seq_length``."""
    train_runtime: Optional[float] = None
    """training wall time in seconds (all segments of a resumed run)."""
    train_tokens_per_second: Optional[float] = None
    """the whole run's rate, ``tokens_seen / train_runtime`` (transformers' meaning: compilation, evaluation,
    checkpoints and pushes included)."""
    steady_tokens_per_second: Optional[float] = None
    """tokens per median training step (what the log lines show; compilation, evaluation and checkpoints excluded);
    None where the backend does not time steps."""
    mfu: Optional[float] = None
    """model FLOPs utilization of the steady rate, in [0, 1] (:mod:`hf_tpu_ext.flops`); None when left out."""
    mfu_peak_flops: Optional[float] = None
    """the peak FLOP/s of one replica that ``mfu`` divides by."""
    mfu_peak_source: Optional[str] = None
    """where ``mfu_peak_flops`` comes from (a datasheet, or the CPU formula with its terms)."""
    mfu_note: Optional[str] = None
    """why MFU is left out (None when it is given)."""
    base_model: Optional[str] = None
    """the Hub repo id the weights continued from (None: from scratch or a local folder)."""
    initialized_from: Optional[str] = None
    """the repo id or local folder name the weights came from (None: from scratch)."""
    dataset_name: Optional[str] = None
    """the Hub dataset (None: local files or the default corpus)."""
    dataset_config_name: Optional[str] = None
    """the Hub dataset's configuration."""
    dataset_description: Optional[str] = None
    """one line describing the training text."""
    num_parameters: Optional[int] = None
    """trainable parameters."""
    model_type: Optional[str] = None
    """transformers' ``model_type`` of the trained model (e.g. ``"roberta"``)."""
    model_config: Optional[Dict[str, Any]] = None
    """sizes: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``, ``vocab_size``,
    ``max_position_embeddings``."""
    hyperparameters: Optional[Dict[str, Any]] = None
    """readable values for the card's table: ``learning_rate``, ``lr_scheduler``, ``warmup_steps``, ``optimizer``,
    ``weight_decay``, ``max_grad_norm``, batch sizes, ``mlm_probability``, ``pack_documents`` (only when true),
    ``total_steps``, ``seed``, ..."""
    eval_results: Optional[Dict[str, Any]] = None
    """the last evaluation: ``eval_loss``, ``perplexity``, ``eval_accuracy`` (floats or None; probe scores with
    ``--probe_file``)."""
    framework_versions: Optional[Dict[str, Any]] = None
    """the installed distributions and their versions (:func:`framework_versions`)."""
    mask_token: Optional[str] = None
    """the tokenizer's mask token, e.g. ``"<mask>"``."""
    phases: Optional[List[Dict[str, Any]]] = None
    """the run's phases, each ``{"start_step", "end_step", "max_seq_length", "mlm_probability", "tokens"}``: one
    per stretch of steps with one block length and masking rate (a resume that changes ``--mlm_probability``, as
    mmBERT's 30 -> 15 -> 5 % schedule, starts one; ``None`` values: not recorded by an older checkpoint)."""


def write_training_summary(output_dir: str, summary: Dict[str, Any]) -> str:
    """Write ``training_summary.json``, the facts of the run the model card is rendered from: every
    :class:`TrainingSummary` field (``null`` when not given), extra keys kept.

    Args:
        output_dir: folder to write into.
        summary: the values (missing keys become ``None``).

    Returns:
        The path of the written file.
    """
    data = dataclasses.asdict(TrainingSummary())
    data.update(summary)
    return _write_json(os.path.join(output_dir, TRAINING_SUMMARY_NAME), data)


def read_training_summary(output_dir: str) -> Optional[Dict[str, Any]]:
    """The ``training_summary.json`` of ``output_dir`` as a dict, or ``None`` when the folder has none.

    Raises:
        ValueError: the file exists but is not JSON.
    """
    path = os.path.join(output_dir, TRAINING_SUMMARY_NAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def plot_loss_curve(log_history: List[Dict[str, Any]], path: str) -> Optional[str]:
    """Plot the training loss (line) and eval loss (points) against the global step into a PNG.

    Args:
        log_history: ``TrainerState.log_history`` entries; entries with ``"step"`` and a finite ``"loss"``
            form the training curve, those with ``"step"`` and ``"eval_loss"`` the eval points.
        path: PNG file to write (folder created if missing).

    Returns:
        ``path``, or ``None`` (nothing written) when the history holds no finite loss.
    """
    train = [(e["step"], e["loss"]) for e in log_history if _finite(e.get("step")) and _finite(e.get("loss"))]
    evals = [(e["step"], e["eval_loss"]) for e in log_history if _finite(e.get("step")) and _finite(e.get("eval_loss"))]
    if not train and not evals:
        return None
    # Figure + Agg canvas directly: no pyplot global state, no GUI backend, safe in a background thread.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="training loss", color="tab:blue")
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], "o", label="eval loss", color="tab:orange")
    ax.set_xlabel("global step")
    ax.set_ylabel("masked-LM loss (nats)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    return path


def framework_versions() -> Dict[str, str]:
    """Versions of Python and the installed frameworks, read from package metadata (nothing is imported).

    Returns:
        ``{"python": "3.x.y", "transformers": "4.57.6", "tensorflow": "2.21.0", ...}`` -- keys are the
        distribution names of :data:`FRAMEWORK_DISTRIBUTIONS` that are installed.
    """
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in FRAMEWORK_DISTRIBUTIONS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def last_eval_results(log_history: List[Dict[str, Any]], training_args=None) -> Dict[str, Any]:
    """``eval_loss``, ``perplexity``, ``eval_accuracy`` (and the ``probe_*`` scores of ``--probe_file``) of the
    newest evaluation in a log history ({} if none).

    With ``training_args.load_best_model_at_end``: of the best evaluation (by ``metric_for_best_model`` and
    ``greater_is_better``), the weights the output folder holds.
    """
    evals = [e for e in log_history if "eval_loss" in e or "probe_mrr" in e]
    if training_args is not None and getattr(training_args, "load_best_model_at_end", False):
        best = BestMetric.from_args(training_args).best_entry(evals)  # the first of equals, like the trainers
        if best is not None:
            evals = [best]
    if evals:
        keys = ("eval_loss", "perplexity", "eval_accuracy", "probe_top1", "probe_top5", "probe_mrr", "probe_n")
        return {k: evals[-1][k] for k in keys if k in evals[-1]}
    return {}


def _mfu_fields(train_metrics: Dict[str, Any]) -> Dict[str, Any]:
    """``mfu``, ``mfu_peak_flops``, ``mfu_peak_source`` from the backend's metrics, or ``mfu_note`` saying why not."""
    if train_metrics.get("mfu") is not None:
        return {k: train_metrics.get(k) for k in ("mfu", "mfu_peak_flops", "mfu_peak_source")}
    return {"mfu_note": train_metrics.get("mfu_note") or "MFU left out: this backend does not report it"}


def build_training_summary(model_args, data_args, training_args, *, backend: str, device: Dict[str, Any],
                           global_batch_size: int, global_step: int, steps_per_epoch: int, total_steps: int,
                           train_metrics: Dict[str, Any], log_history: List[Dict[str, Any]],
                           model_fields: Dict[str, Any], optimizer: str, dataset_description: Optional[str],
                           mask_token: Optional[str], jit_compile: bool, steps_per_execution: int,
                           compiler: Optional[str] = None,
                           initialization: Optional[Dict[str, Optional[str]]] = None,
                           precision: Optional[str] = None) -> Dict[str, Any]:
    """The ``training_summary.json`` content (:class:`TrainingSummary`'s fields), the same whichever backend trained.

    Args:
        device: what the backend ran on: ``accelerator``, ``num_devices``, ``strategy``, ``num_replicas``,
            ``num_workers`` (and optionally ``device_kind``).
        model_fields: ``num_parameters``, ``model_type``, ``model_config`` of the trained model.
        optimizer: a readable optimizer description for the card's hyperparameter table.
        initialization: ``{"base_model", "initialized_from"}`` of ``--model_name_or_path``
            (:func:`hf_tpu_ext.hub.model_card.initialization_fields`; the run files sit below the Hub layer and
            do not decide what a Hub id is); ``None``: both ``None`` (from scratch).
        precision: ``"bf16 mixed"`` or ``"float32"``, the backend's :class:`hf_tpu_ext.precision.PrecisionPlan`
            (``--bf16 auto`` resolved); ``None``: bf16 only for an explicit ``--bf16 true`` (a caller without a backend).
    """
    args = training_args
    return {
        "backend": backend,
        **device,
        "global_batch_size": global_batch_size,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "max_seq_length": data_args.max_seq_length,
        "precision": precision or ("bf16 mixed" if args.bf16 is True else "float32"),
        "jit_compile": jit_compile,
        "compiler": compiler or ("XLA" if jit_compile else "eager/graph kernels"),
        "steps_per_execution": steps_per_execution,
        "global_step": global_step,
        "epoch": global_step / steps_per_epoch,
        "tokens_seen": global_step * global_batch_size * data_args.max_seq_length,
        "train_runtime": train_metrics.get("train_runtime"),
        "train_tokens_per_second": train_metrics.get("train_tokens_per_second"),
        "steady_tokens_per_second": train_metrics.get("steady_tokens_per_second"),
        **_mfu_fields(train_metrics),
        "base_model": None,
        "initialized_from": None,
        **(initialization or {}),
        "dataset_name": data_args.dataset_name,
        "dataset_config_name": data_args.dataset_config_name,
        "dataset_description": dataset_description or data_args.dataset_name,
        **model_fields,
        "hyperparameters": {
            "learning_rate": args.learning_rate,
            "lr_scheduler": getattr(args, "lr_scheduler_type", "linear"),
            "warmup_steps": args.num_warmup_steps(total_steps),
            "optimizer": optimizer,
            "weight_decay": args.weight_decay,
            "max_grad_norm": args.max_grad_norm,
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": getattr(args, "gradient_accumulation_steps", 1),
            "global_batch_size": global_batch_size,
            "max_seq_length": data_args.max_seq_length,
            "mlm_probability": data_args.mlm_probability,
            "max_predictions_per_seq": data_args.max_predictions_per_seq,
            # only when on, so an unpacked run's summary and card stay as they were
            **({"pack_documents": True} if getattr(data_args, "pack_documents", False) else {}),
            "total_steps": total_steps,
            "seed": args.seed,
        },
        "eval_results": last_eval_results(log_history, training_args),
        "framework_versions": framework_versions(),
        "mask_token": mask_token,
    }


def data_place(entry: Dict[str, Any]) -> str:
    """A log line's place in the data: `` (epoch 0.16)``; a ``--streaming`` run's `` (stream passes 1)`` (its
    ``stream_passes``: passes over the stream completed), ``""`` when the entry has neither."""
    if entry.get("epoch") is not None:
        return f" (epoch {entry['epoch']:.2f})"
    return f" (stream passes {entry['stream_passes']})" if entry.get("stream_passes") is not None else ""


def format_log_entry(entry: Dict[str, Any], explain: bool = True) -> str:
    """One log line of ``hf-tpu train`` (every backend): a training entry as ``step 10 (epoch 0.16): loss 6.1527, lr 4.97e-04 | steady 5,340 tokens/s
    (median training step; compilation, evaluation and checkpoints excluded), MFU 2.1%`` (the parenthesis only with
    ``explain``: the run's first such line says it, the next ones do not repeat it; a ``--streaming`` run's
    ``step 10 (stream passes 0): ...``, :func:`data_place`); other entries as ``key=value`` pairs."""
    if "loss" not in entry or "tokens_per_second" not in entry:
        return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items())
    text = (f"step {entry['step']}{data_place(entry)}: loss {entry['loss']:.4f}, "
            f"lr {entry['learning_rate']:.3g} | steady {entry['tokens_per_second']:,.0f} tokens/s"
            + (" (median training step; compilation, evaluation and checkpoints excluded)" if explain else ""))
    if entry.get("mfu") is not None:
        text += f", MFU {entry['mfu']:.1%}"
    return text
