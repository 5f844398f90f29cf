"""What a Keras 3 model's Hub repo holds, beside the push callback that writes it.

- the model folder: a keras-hub task model (``keras_hub.models.Task``: ``RobertaMaskedLM``...) as its preset
  (``model.save_to_preset``: ``config.json``, ``task.json``, ``model.weights.h5``, ``metadata.json``,
  ``tokenizer.json``/``preprocessor.json``, ``assets/``), which
  ``keras_hub.models.<Task>.from_preset("hf://<repo_id>")`` loads; any other Keras 3 model as ``model.keras``
  (``model.save``; ``keras.saving.load_model`` loads it) -- :func:`save_model`;
- ``README.md``: a card whose metadata makes the Hub show a keras-hub model (``library_name: keras-hub``,
  ``pipeline_tag: fill-mask``, tags) or a Keras one (``library_name: keras``) -- :func:`render_card`;
- a resumable checkpoint: ``checkpoint.weights.h5`` (``model.save_weights``: the model's and the optimizer's
  variables) beside the session's ``trainer_state.json`` (its fields:
  :func:`hf_tpu_ext.callbacks.fit_history.session_trainer_state`) -- :func:`save_checkpoint`, :func:`restore_checkpoint`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import keras

from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.hub.card_facts import KERAS_BACKEND_DISTRIBUTIONS, keras_framework_versions
from hf_tpu_ext.hub.card_render import throughput_rows
from hf_tpu_ext.hub.model_card import eval_results_from_logs, mark_generated, write_card
from hf_tpu_ext.hub.resume import download_last_checkpoint

CHECKPOINT_WEIGHTS = "checkpoint.weights.h5"
TRAINER_STATE = "trainer_state.json"
KERAS_FILE = "model.keras"


def is_keras_hub_task(model) -> bool:
    """True for a keras-hub task model (it has ``save_to_preset`` and a ``backbone``)."""
    return callable(getattr(model, "save_to_preset", None)) and getattr(model, "backbone", None) is not None


def _task_tags(model) -> List[str]:
    tags = ["keras-hub", "keras"]
    backbone = getattr(model, "backbone", None)
    if backbone is not None:
        tags.append(type(backbone).__name__.replace("Backbone", "").lower())
    return tags


def render_card(model, repo_id: str, *, step: int, epoch: float, logs: Optional[Dict[str, Any]] = None,
                final: bool = False, max_steps: Optional[int] = None, facts: Optional[Dict[str, Any]] = None,
                loss_curve: bool = False, **card_fields) -> str:
    """The model card text (``huggingface_hub.ModelCard``) for a save of ``model`` at ``step``.

    Args:
        model: the Keras 3 model.
        repo_id: the Hub repo (named in the loading example).
        step, epoch: where training is (global optimizer steps; epochs completed, float).
        logs: the latest Keras logs (loss, eval metrics, throughput), shown as a table.
        final: the end-of-training card (else it says "Training in progress, step N of M").
        max_steps: the run's total optimizer steps (``M``; Keras' ``epochs x steps``), when known.
        facts: what the fit's throughput meter measured
            (:func:`hf_tpu_ext.callbacks.throughput_meter.card_facts_of`: ``tokens_seen``,
            ``train_tokens_per_second``, ``steady_tokens_per_second`` in tokens/s, ``mfu`` a fraction with
            ``mfu_peak_flops`` in FLOP/s, or ``mfu_note``): a "Training procedure" table with the rows of
            ``hf-tpu train``'s card (:func:`hf_tpu_ext.hub.card_render.throughput_rows`); empty or ``None``:
            one row saying the fit had no ``ThroughputCallback``.
        loss_curve: the model folder holds ``loss_curve.png`` (the "Loss curve" section shows it, as in
            ``hf-tpu train``'s card).
        **card_fields: ``license``, ``language``, ``datasets``, ``base_model``, ``tags`` (added to the
            defaults), ``pipeline_tag`` (default ``fill-mask`` for a keras-hub masked LM).

    Returns:
        Markdown with YAML metadata: ``library_name`` (``keras-hub`` for a keras-hub task, else ``keras``),
        ``pipeline_tag``, ``tags``, and ``model-index`` with the evaluation in ``logs`` (``val_loss`` or
        ``eval_loss`` in nats, ``perplexity``, accuracy: :func:`hf_tpu_ext.hub.model_card.eval_results_from_logs`),
        also shown as an "Evaluation results" table; the "Training procedure" table (see ``facts``); the loss
        curve; "Framework versions" (:func:`hf_tpu_ext.hub.card_facts.keras_framework_versions` of the Keras
        backend, transformers listed only when this process imported it).
    """
    from huggingface_hub import ModelCard, ModelCardData

    keras_hub = is_keras_hub_task(model)
    name = type(model).__name__
    tags = (_task_tags(model) if keras_hub else ["keras"]) + list(card_fields.pop("tags", None) or [])
    pipeline_tag = card_fields.pop("pipeline_tag", "fill-mask" if "MaskedLM" in name or not keras_hub else None)
    evals = _eval_results(logs, pipeline_tag, card_fields)
    data = ModelCardData(library_name="keras-hub" if keras_hub else "keras", pipeline_tag=pipeline_tag,
                         tags=list(dict.fromkeys(tags)), model_name=repo_id.split("/")[-1],
                         eval_results=evals or None, **{k: v for k, v in card_fields.items() if v is not None})
    if keras_hub:
        load = (f"```python\nimport keras_hub\n\nmodel = keras_hub.models.{name}.from_preset(\"hf://{repo_id}\")\n```")
    else:
        load = (f"```python\nimport keras\nfrom huggingface_hub import hf_hub_download\n\n"
                f"model = keras.saving.load_model(hf_hub_download(\"{repo_id}\", \"{KERAS_FILE}\"))\n```")
    rows = "\n".join(f"| {k} | {v:.6g} |" for k, v in sorted((logs or {}).items())
                     if isinstance(v, (int, float)) and not isinstance(v, bool))

    status = "end of training" if final else "training in progress"
    progress = "" if final or not max_steps else (
        f"\n\n**Training in progress, step {step} of {int(max_steps)}**: these weights are a snapshot of an "
        "unfinished run (later pushes update them and this card).")
    content = (
        f"---\n{data.to_yaml()}\n---\n\n# {repo_id.split('/')[-1]}\n\n"
        f"A `{name}` trained with Keras {keras.__version__} on the {keras.backend.backend()} backend "
        f"({status}: step {step}, epoch {epoch:g}).{progress}\n\n## How to load\n\n{load}\n"
        + ("\n## Evaluation results\n\n| metric | value |\n|---|---|\n"
           + "".join(f"| {r.metric_name} | {r.metric_value:.6g} |\n" for r in evals) if evals else "")
        + _procedure_table(facts)
        + ("\n### Loss curve\n\n![Training and evaluation loss](loss_curve.png)\n" if loss_curve else "")
        + (f"\n## Latest training logs\n\n| metric | value |\n|---|---|\n{rows}\n" if rows else "")
        + _versions_section()
    )
    return str(mark_generated(ModelCard(content)))  # marked: a later save or `hf-tpu push` may replace it


def write_model_card(model, folder: str, history, repo_id: str, **render_fields) -> str:
    """Write ``folder/loss_curve.png`` (the ``FitHistory``'s loss samples and evaluations; none without a loss
    or matplotlib) and ``folder/README.md`` (:func:`render_card` with ``render_fields``; a README.md the user wrote
    keeps its text, the card's metadata merged in: :func:`hf_tpu_ext.hub.model_card.write_card`); returns the
    write's outcome (``"written"``, ``"merged"``...)."""
    from huggingface_hub import ModelCard


    curve = history.write_curve(folder) is not None
    return write_card(folder, ModelCard(render_card(model, repo_id, loss_curve=curve, **render_fields)))


def _procedure_table(facts: Optional[Dict[str, Any]]) -> str:
    """The card's "Training procedure" table of the throughput meter's ``facts`` (Markdown, starting with a blank line)."""
    rows = throughput_rows(facts) if facts else [
        ("Throughput, MFU", "n/a (no hf_tpu_ext ThroughputCallback in this fit's callbacks)")]
    return "\n## Training procedure\n\n| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def _versions_section() -> str:
    """The card's "Framework versions" list (the template's format), the Keras backend's distribution marked."""
    import sys


    backend = keras.backend.backend()
    rows = keras_framework_versions(backend, uses_transformers="transformers" in sys.modules)
    marked = KERAS_BACKEND_DISTRIBUTIONS[backend][0]
    return "\n## Framework versions\n\n" + "".join(
        f"- {name} {version}{' (the Keras backend)' if name == marked else ''}\n" for name, version in rows)


def _eval_results(logs, pipeline_tag, card_fields) -> list:
    """``huggingface_hub.EvalResult`` rows (the card's model-index) of the evaluation in ``logs``."""
    from huggingface_hub import EvalResult


    found = eval_results_from_logs(logs)
    datasets = card_fields.get("datasets") or []
    dataset = datasets[0] if isinstance(datasets, list) and datasets else (datasets or None)
    where = dict(dataset_name=dataset, dataset_type=dataset) if dataset else dict(dataset_name="validation data",
                                                                                    dataset_type="text")
    task = dict(task_type=pipeline_tag or "fill-mask", task_name="Masked Language Modeling")
    names = (("eval_loss", "loss", "Eval loss (nats)"), ("perplexity", "perplexity", "Perplexity"),
             ("eval_accuracy", "accuracy", "Masked-token accuracy"))
    return [EvalResult(metric_type=mtype, metric_value=round(found[key], 6), metric_name=mname, **task, **where)
            for key, mtype, mname in names if key in found]


def fit_epoch(params: Optional[Dict[str, Any]], step: int, epochs_done: int) -> float:
    """Epochs done at global ``step``: ``step / steps per epoch`` (Keras' ``params["steps"]``; a fraction between
    epoch ends, right for a resumed fit of the same data), else ``epochs_done`` (a dataset of unknown length)."""
    steps = (params or {}).get("steps")
    return step / steps if steps else float(epochs_done)


def save_model(model, folder: str) -> None:
    """Write ``model``'s folder: its keras-hub preset, or ``model.keras`` for any other Keras 3 model."""
    os.makedirs(folder, exist_ok=True)
    if is_keras_hub_task(model):
        model.save_to_preset(folder)
    else:
        model.save(os.path.join(folder, KERAS_FILE))


def save_checkpoint(model, folder: str) -> str:
    """Write ``folder/checkpoint.weights.h5`` (the model's and the optimizer's variables); returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    model.save_weights(os.path.join(folder, CHECKPOINT_WEIGHTS))
    return folder


def is_checkpoint(folder: str) -> bool:
    """True when ``folder`` holds a Keras 3 checkpoint (:data:`CHECKPOINT_WEIGHTS`)."""
    return os.path.isfile(os.path.join(folder, CHECKPOINT_WEIGHTS))


def restore_checkpoint(model, folder: str) -> Dict[str, Any]:
    """Load a checkpoint folder into a compiled ``model`` (weights and optimizer state); returns its trainer state.

    Raises:
        CheckpointError: the model is not compiled (its optimizer receives the state).
    """
    if getattr(model, "optimizer", None) is None:
        raise CheckpointError("restore_from_hub needs a compiled model (its optimizer receives the state).")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.load_weights(os.path.join(folder, CHECKPOINT_WEIGHTS))
    with open(os.path.join(folder, TRAINER_STATE), encoding="utf-8") as f:
        return json.load(f)


def restore_from_hub(model, hub_model_id: str, token: Optional[str] = None, local_dir: Optional[str] = None) -> Dict[str, Any]:
    """Restore the model's and optimizer's variables from the repo's ``last-checkpoint/``.

    Call after ``model.compile(...)`` and before ``fit``; pass ``initial_epoch=int(state["epoch"])`` to ``fit``
    so the epoch count continues.

    Args:
        model: a compiled Keras 3 model of the same architecture.
        hub_model_id: ``"user/name"`` or ``"user/name@revision"``.
        token: Hub token (private repos; default ``HF_TOKEN`` or the cached login).
        local_dir: download folder (default: a temp folder, removed afterwards).

    Returns:
        The checkpoint's ``trainer_state.json`` (``global_step``, ``epoch``, ... as
        :class:`hf_tpu_ext.outputs.TrainerState` writes it).

    Raises:
        CheckpointError: no ``last-checkpoint/`` with a Keras 3 checkpoint, or ``model`` is not compiled.
        HubRepoError, HubError: the repo cannot be read.
    """
    import logging
    import tempfile


    with tempfile.TemporaryDirectory(prefix="hf-tpu-resume-") as tmp:
        folder = download_last_checkpoint(hub_model_id, token, local_dir or tmp, is_checkpoint=is_checkpoint,
                                          kind=f"Keras 3 checkpoint ({CHECKPOINT_WEIGHTS})")
        state = restore_checkpoint(model, folder)
    logging.getLogger("hf_tpu_ext").info("Resumed from %s at global step %s (epoch %s).", hub_model_id,
                                         state.get("global_step"), state.get("epoch"))
    return state
