"""Render the model card (``README.md``) of a trained fill-mask model folder (the render job of :mod:`hf_tpu_ext.hub.model_card`).

The card is rendered from the package template ``hf_tpu_ext/templates/model_card.md`` with
:meth:`huggingface_hub.ModelCard.from_template`. Metadata comes from ``training_summary.json``
(:func:`hf_tpu_ext.outputs.read_training_summary`); when it is missing, from what the folder shows
(``config.json``, the tokenizer's mask token, ``trainer_state.json``). A rendered card carries the marker of a
generated card (:func:`hf_tpu_ext.hub.card_guard.mark_generated`); writing it without losing a user's README.md is
:mod:`hf_tpu_ext.hub.card_guard`'s job, checking it :mod:`hf_tpu_ext.hub.card_check`'s.
"""

from __future__ import annotations

import logging
import math
import os
import re
from importlib import resources
from typing import Any, Dict, List, Optional, Tuple

from hf_tpu_ext.fileio import read_json_object
from hf_tpu_ext.hub.card_facts import framework_versions, strategy_label
from hf_tpu_ext.hub.card_guard import mark_generated
from hf_tpu_ext.hub.model_ref import hub_url, is_hub_repo_id
from hf_tpu_ext.outputs import read_training_summary

logger = logging.getLogger("hf_tpu_ext.hub")

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$|^[A-Za-z0-9][\w.\-]*$")


def default_template_path() -> str:
    """Filesystem path of the packaged card template (``hf_tpu_ext/templates/model_card.md``)."""
    return str(resources.files("hf_tpu_ext").joinpath("templates", "model_card.md"))


_read_json = read_json_object  # missing or damaged run files read as {}


def load_summary(output_dir: str) -> Dict[str, Any]:
    """The training summary of ``output_dir``, completed from the folder's files where it is missing.

    Args:
        output_dir: a folder written by ``hf-tpu train`` / ``save_model_folder``.

    Returns:
        A dict with (some of) the keys of ``training_summary.json``; always ``model_config`` (possibly
        empty) and ``mask_token``.
    """
    summary: Dict[str, Any] = {}
    try:
        summary = dict(read_training_summary(output_dir) or {})
    except (OSError, ValueError, KeyError) as err:
        logger.info("No training summary in the output folder (%s); the card uses what the folder shows.", type(err).__name__)
    if not summary.get("model_config"):
        summary["model_config"] = _read_json(os.path.join(output_dir, "config.json"))
    if not summary.get("mask_token"):
        tok = _read_json(os.path.join(output_dir, "tokenizer_config.json")).get("mask_token")
        if tok is None:
            tok = _read_json(os.path.join(output_dir, "special_tokens_map.json")).get("mask_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        summary["mask_token"] = tok or "<mask>"
    if summary.get("global_step") is None:
        state = _read_json(os.path.join(output_dir, "trainer_state.json"))
        for key in ("global_step", "epoch", "max_steps"):
            if state.get(key) is not None:
                summary.setdefault(key, state[key])
    return summary


def _finite(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _mfu_row(info: Dict[str, Any]) -> Tuple[str, str]:
    """The card's MFU row: of the steady rate, against a stated peak; or "n/a" with the reason."""
    mfu, peak = _finite(info.get("mfu")), _finite(info.get("mfu_peak_flops"))
    if mfu is not None and peak:
        return ("MFU (steady rate x FLOPs per token / peak FLOP/s)",
                f"{mfu:.1%} (peak {peak:.3g} FLOP/s per replica; {_fmt(info.get('mfu_peak_source') or 'source n/a')})")
    note = str(info.get("mfu_note") or "MFU left out").removeprefix("MFU left out: ")
    return ("MFU", f"n/a ({_fmt(note)})")


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if (abs(value) < 1e-3 or abs(value) >= 1e5) and value != 0 else f"{value:.4f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value).replace("|", "\\|")


def _duration(seconds) -> str:
    seconds = _finite(seconds)
    if seconds is None:
        return "n/a"
    h, rem = divmod(int(round(seconds)), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{seconds:.1f} s")


def _framework(backend: str, info: dict) -> str:
    """The training framework in words, from the backend and device the run really used.

    XLA is named only where the run recorded it (``jit_compile`` True) or where it cannot be otherwise:
    ``"tensorflow"``: "TensorFlow + XLA" with ``jit_compile`` True, else "TensorFlow" (False, or not recorded:
    a tf_keras ``compile`` without ``jit_compile=True`` runs without XLA); ``"torch_xla"``: "PyTorch/XLA";
    ``"keras"``: "Keras 3 on JAX + XLA" (JAX always compiles with XLA), "Keras 3 on TensorFlow" (+ XLA with
    ``jit_compile`` True), "Keras 3 on PyTorch"; any other (``"pytorch"``: a plain transformers ``Trainer``):
    "PyTorch (transformers Trainer) on <accelerator>" (the summary's ``accelerator``, e.g. CPU or GPU; "CPU/GPU"
    when unknown).
    """
    xla = info.get("jit_compile") is True
    if backend == "tensorflow":
        return "TensorFlow + XLA" if xla else "TensorFlow"
    if backend == "torch_xla":
        return "PyTorch/XLA"
    if backend == "keras":
        name = str(info.get("keras_backend") or "jax").lower()
        label = {"jax": "JAX", "tensorflow": "TensorFlow", "torch": "PyTorch"}.get(name, name)
        return f"Keras 3 on {label}" + (" + XLA" if name == "jax" or (xla and name == "tensorflow") else "")
    return f"PyTorch (transformers Trainer) on {str(info.get('accelerator') or 'CPU/GPU').upper().replace('CUDA', 'GPU')}"


# weight files transformers' PyTorch and TensorFlow loaders read (single file or sharded index)
_PT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TF_WEIGHTS = ("tf_model.h5", "tf_model.h5.index.json")


def weight_formats(output_dir: str) -> Dict[str, bool]:
    """Which weight formats a model folder holds: ``{"pytorch": bool, "tensorflow": bool}``.

    ``pytorch``: ``model.safetensors`` / ``pytorch_model.bin`` (or their sharded index); ``tensorflow``:
    ``tf_model.h5`` (or its index). The card's usage snippets show only the loaders these files serve.
    """
    def has(names):
        return any(os.path.isfile(os.path.join(output_dir, n)) for n in names)

    return {"pytorch": has(_PT_WEIGHTS), "tensorflow": has(_TF_WEIGHTS)}


def keras_preset_task(output_dir: str, folder: Optional[str]) -> str:
    """The keras-hub task class of the preset in ``output_dir/folder`` (its ``task.json``'s ``class_name``:
    ``RobertaMaskedLM``, ``BertMaskedLM``, ``DistilBertMaskedLM``); ``RobertaMaskedLM`` when it does not say."""
    name = _read_json(os.path.join(output_dir, folder or "", "task.json")).get("class_name")
    return name if isinstance(name, str) and name.isidentifier() else "RobertaMaskedLM"


def keras_preset_folder(output_dir: str) -> Optional[str]:
    """The subfolder of ``output_dir`` holding a keras-hub task preset (the Keras backend writes ``keras_hub/``).

    A preset is recognized by keras-hub's own files: ``task.json`` and a ``config.json`` with
    ``registered_name`` (a serialized Keras object, what ``from_preset`` checks). Returns the folder name, or
    ``None`` when there is none; the card then shows no keras-hub snippet.
    """
    try:
        names = sorted(n for n in os.listdir(output_dir) if not n.startswith("."))
    except OSError:
        return None
    for name in names:
        folder = os.path.join(output_dir, name)
        if os.path.isfile(os.path.join(folder, "task.json")) and "registered_name" in _read_json(
                os.path.join(folder, "config.json")):
            return name
    return None


def _is_hub_id(value) -> bool:
    return isinstance(value, str) and bool(_REPO_ID.match(value)) and is_hub_repo_id(value)


def initialization_fields(name_or_path: Optional[str]) -> Dict[str, Optional[str]]:
    """What a model was initialized from, for the summary and card.

    Args:
        name_or_path: ``--model_name_or_path`` or a model's ``name_or_path`` (``""``/None: from scratch).

    Returns:
        ``{"base_model": repo id or None, "initialized_from": name or None}``: ``base_model`` only for a Hub repo
        id that is not a local path (the card's ``base_model`` metadata and link); ``initialized_from`` is the
        repo id, or just the folder name of a local path (no machine path lands in a card).
    """
    if not name_or_path:
        return {"base_model": None, "initialized_from": None}
    if _is_hub_id(name_or_path):
        return {"base_model": name_or_path, "initialized_from": name_or_path}
    return {"base_model": None, "initialized_from": os.path.basename(os.path.normpath(str(name_or_path)))}


def _framework_versions(summary: dict) -> List[Tuple[str, str]]:  # the run's stack only (hub/card_facts.py)
    return framework_versions(summary.get("backend"), summary.get("framework_versions"))


def progress_note(info: dict) -> Optional[str]:
    """``"Training in progress, step N of M"`` for a card pushed before the run's last step, else ``None``.

    Args:
        info: the summary/card fields: ``global_step`` and ``max_steps`` (or ``hyperparameters.total_steps``,
            what ``training_summary.json`` holds); ``training_in_progress`` (bool) says it where ``max_steps`` is
            unknown or the run ends early (a callback's final save: False); at ``max_steps`` there is no note.
    """
    step = info.get("global_step")
    total = info.get("max_steps") or (info.get("hyperparameters") or {}).get("total_steps")
    in_progress = info.get("training_in_progress")
    if step is None or (total and int(step) >= int(total)):  # at the last step the run's weights are final
        return None
    if in_progress is None:
        in_progress = bool(total)
    if not in_progress:
        return None
    of = f" of {int(total)}" if total else ""
    return (f"Training in progress, step {int(step)}{of}: these weights are a snapshot of an unfinished run "
            "(later pushes update them and this card).")


def _card_tags(info: dict, backend: str, accelerator: Optional[str], config: dict, keras_preset: Optional[str],
               extra_tags: List[str]) -> List[str]:
    """The card's tags: the project's, the framework's, the hardware's, the model type's, then ``extra_tags``."""
    tags = ["hf-tpu-ext", "fill-mask", "tensorflow" if backend == "tensorflow" else "pytorch"]
    if backend == "torch_xla":
        tags.append("torch_xla")
    if info.get("jit_compile"):
        tags.append("xla")
    if accelerator == "TPU":
        tags.append("tpu")
    if config.get("model_type"):
        tags.append(str(config["model_type"]))
    if keras_preset:
        tags.append("keras-hub")
    return tags + [t for t in extra_tags if t not in tags]


def _eval_results(evals: dict, dataset_name: Optional[str], description: str, config_name=None) -> list:
    """The card's ``model-index`` results (:class:`huggingface_hub.EvalResult`): perplexity, accuracy, loss."""
    from huggingface_hub import EvalResult

    ds_kwargs = dict(dataset_name=dataset_name, dataset_type=dataset_name) if dataset_name else dict(
        dataset_name=description, dataset_type="text")
    if config_name:
        ds_kwargs["dataset_config"] = str(config_name)
    results = []
    for key, mtype, mname in (("perplexity", "perplexity", "Perplexity"), ("eval_accuracy", "accuracy", "Masked-token accuracy"),
                              ("eval_loss", "loss", "Eval loss (nats)")):
        value = _finite(evals.get(key))
        if value is not None:
            results.append(EvalResult(task_type="fill-mask", task_name="Masked Language Modeling", metric_type=mtype,
                                      metric_value=round(value, 6), metric_name=mname, **ds_kwargs))
    return results


def _model_description(config: dict, info: dict, backend: str, base_model: Optional[str],
                       initialized_from: Optional[str], description: str) -> str:
    """The card's first paragraph: architecture and size, what the weights started from, the framework."""
    arch = config.get("architectures", ["RobertaForMaskedLM"])[0] if config.get("architectures") else "RoBERTa-style masked LM"
    size = []
    for key, label in (("num_hidden_layers", "layers"), ("hidden_size", "hidden size"), ("num_attention_heads", "heads"),
                       ("vocab_size", "vocabulary")):
        if config.get(key):
            size.append(f"{config[key]} {label}" if key != "vocab_size" else f"a {config[key]:,}-token vocabulary")
    if info.get("num_parameters"):
        size.append(f"{int(info['num_parameters']):,} parameters")
    shape = f" ({', '.join(size)})" if size else ""
    if base_model:
        what = (f"This model continues the masked-language-model pre-training of [{base_model}]({hub_url(base_model)}) "
                f"on {description} (fine-tuned from its weights).")
    elif initialized_from:
        what = (f"This model continues the masked-language-model pre-training of a local model folder "
                f"(`{initialized_from}`, not on the Hub) on {description} (fine-tuned from its weights).")
    else:
        what = f"This model was pre-trained from scratch (randomly initialized weights) on {description} with masked language modeling."
    return (f"A {arch}{shape} for the fill-mask task. {what} It was trained with "
            f"hf-tpu-ext using {_framework(backend, info)}.")


def _procedure_rows(info: dict, backend: str, accelerator: Optional[str]) -> List[Tuple[str, str]]:
    """The card's "Training procedure" table: hardware, distribution, precision, steps, tokens, time, throughput, MFU."""
    acc_text = accelerator or "n/a"
    if info.get("num_devices"):
        acc_text = f"{info['num_devices']} x {accelerator or 'device'}"
    return [
        ("Backend", backend),
        ("Accelerator", acc_text),
        ("Distribution strategy", strategy_label(info.get("strategy"))),
        ("Replicas", _fmt(info.get("num_replicas")) if info.get("num_replicas") else "n/a"),
        ("Global batch size (sequences)", _fmt(info.get("global_batch_size")) if info.get("global_batch_size") else "n/a"),
        ("Precision", info.get("precision") or "n/a"),
        ("XLA compilation", _fmt(bool(info.get("jit_compile"))) if info.get("jit_compile") is not None else "n/a"),
        ("Compiler path", info.get("compiler") or "n/a"),
        ("Optimizer steps", _fmt(int(info["global_step"])) if info.get("global_step") is not None else "n/a"),
        _epochs_row(info),
        ("Tokens seen", _fmt(int(info["tokens_seen"])) if info.get("tokens_seen") else "n/a"),
        ("Training wall time", _duration(info.get("train_runtime"))),
        ("Throughput, whole run (tokens/s: tokens seen / training wall time)", _fmt(round(float(info["train_tokens_per_second"]), 1)) if _finite(info.get("train_tokens_per_second")) else "n/a"),
        ("Throughput, steady (tokens/s of the median training step; compilation, evaluation and checkpoints excluded)",
         _fmt(round(float(info["steady_tokens_per_second"]), 1)) if _finite(info.get("steady_tokens_per_second")) else "n/a"),
        _mfu_row(info),
    ]


def _results_sentence(info: dict, description: str) -> str:
    """The sentence above the evaluation results: what was evaluated (``training_summary.json`` ``evaluation``:
    the validation file, the dataset's validation data or the share held out) and its size in blocks and tokens."""
    evaluation = info.get("evaluation") or {}
    blocks, tokens = evaluation.get("blocks"), evaluation.get("tokens")
    if evaluation.get("data") and blocks and tokens:
        return (f"Measured after training on {evaluation['data']}: {int(blocks):,} blocks of "
                f"{int(tokens) // int(blocks)} tokens ({int(tokens):,} tokens).")
    return f"Measured on the held-out split after training ({description})."


def _epochs_row(info: dict) -> Tuple[str, str]:
    """Epochs done; a ``--streaming`` run (``stream_passes`` in the summary) has no epochs of known length: the
    passes over the stream it completed."""
    if "stream_passes" in info:
        passes = info.get("stream_passes")
        return ("Passes over the data (streamed)", f"{int(passes):,} complete" if passes is not None else "n/a")
    return ("Epochs", _fmt(float(info["epoch"])) if _finite(info.get("epoch")) is not None else "n/a")


def throughput_rows(info: dict) -> List[Tuple[str, str]]:
    """The "Training procedure" rows a throughput meter fills (tokens seen, whole-run and steady tokens/s, MFU),
    with the labels of :func:`render_model_card`'s table: for cards rendered elsewhere (the Keras 3 callback's)."""
    return [row for row in _procedure_rows(info, "", None) if row[0].startswith(("Tokens seen", "Throughput", "MFU"))]


def _result_rows(evals: dict) -> List[Tuple[str, str]]:
    """The card's "Evaluation results" table: loss, perplexity, accuracy, cloze probes (those measured)."""
    rows = []
    probe_n = f" ({int(evals['probe_n'])} probes)" if _finite(evals.get("probe_n")) else ""
    for key, label in (("eval_loss", "Eval loss (mean cross-entropy over masked tokens, nats)"), ("perplexity", "Perplexity"),
                       ("eval_accuracy", "Masked-token accuracy"), ("probe_top1", f"Cloze probes: top-1 accuracy{probe_n}"),
                       ("probe_top5", f"Cloze probes: top-5 accuracy{probe_n}"),
                       ("probe_mrr", f"Cloze probes: mean reciprocal rank{probe_n}")):
        value = _finite(evals.get(key))
        if value is not None:
            rows.append((label, _fmt(round(value, 4))))
    return rows


def _card_info(output_dir: str, summary: Optional[dict], card_fields: dict) -> Tuple[dict, List[str]]:
    """The summary with ``card_fields`` laid over it (``tags`` taken out: the extra tags), mask token filled in."""
    info = dict(summary if summary is not None else load_summary(output_dir))
    extra_tags = list(card_fields.pop("tags", None) or [])
    info.update({k: v for k, v in card_fields.items() if v is not None})
    if not info.get("mask_token"):
        info["mask_token"] = load_summary(output_dir).get("mask_token", "<mask>")
    return info, extra_tags


def render_model_card(output_dir: str, repo_id: Optional[str] = None, summary: Optional[dict] = None,
                      template_path: Optional[str] = None, **card_fields):
    """Render the model card of a trained model folder.

    Args:
        output_dir: the output folder (read for the summary, ``config.json``, tokenizer files, ``loss_curve.png``).
        repo_id: the Hub repo id, used in the usage snippet and as the model name.
        summary: the training summary dict (default: :func:`load_summary` of ``output_dir``).
        template_path: another Jinja2 card template (default: the packaged one).
        **card_fields: overrides of the summary and card: ``license``, ``language``, ``dataset_name`` (a Hub
            dataset id), ``dataset_description``, ``base_model``, ``model_name``, ``tags`` (extra tags),
            ``backend``, ``accelerator``, ...

    Returns:
        A :class:`huggingface_hub.ModelCard` (``card.data`` holds the metadata, ``str(card)`` the text).
    """
    from huggingface_hub import ModelCard, ModelCardData


    info, extra_tags = _card_info(output_dir, summary, card_fields)
    config = info.get("model_config") or _read_json(os.path.join(output_dir, "config.json"))
    backend = info.get("backend") or "tensorflow"
    accelerator = str(info.get("accelerator") or "").upper() or None
    name = info.get("model_name") or (repo_id.split("/")[-1] if repo_id else os.path.basename(os.path.abspath(output_dir)))
    base_model = info.get("base_model") or None
    initialized_from = info.get("initialized_from") or None
    if base_model and not _is_hub_id(base_model):  # a local folder: named, never linked or in the metadata
        initialized_from, base_model = initialized_from or initialization_fields(base_model)["initialized_from"], None
    dataset_name = info.get("dataset_name") or None
    description = info.get("dataset_description") or ("the Hub dataset " + dataset_name if dataset_name else "a custom text corpus")
    keras_preset = keras_preset_folder(output_dir)
    evals = info.get("eval_results") or {}
    data = ModelCardData(
        language=info.get("language") or None, license=info.get("license") or None, library_name="transformers",
        pipeline_tag="fill-mask", tags=_card_tags(info, backend, accelerator, config, keras_preset, extra_tags),
        datasets=[dataset_name] if dataset_name else None, base_model=base_model, model_name=name,
        eval_results=_eval_results(evals, dataset_name, description, info.get("dataset_config_name")) or None,
    )
    hyper = info.get("hyperparameters") or {}
    formats = weight_formats(output_dir)
    if not (formats["pytorch"] or formats["tensorflow"]):  # a card rendered before the weights are written
        formats = {"pytorch": backend != "tensorflow", "tensorflow": backend == "tensorflow"}
    card = ModelCard.from_template(
        data,
        template_path=template_path or default_template_path(),
        model_name=name,
        model_description=_model_description(config, info, backend, base_model, initialized_from, description),
        progress_note=progress_note(info),
        model_ref=repo_id or name,
        has_pytorch_weights=formats["pytorch"],
        has_tf_weights=formats["tensorflow"],
        keras_preset=keras_preset,
        keras_preset_task=keras_preset_task(output_dir, keras_preset) if keras_preset else None,
        mask_token=info.get("mask_token") or "<mask>",
        data_description=(f"[{dataset_name}]({hub_url(dataset_name, 'dataset')})" if dataset_name else
                          f"{description[0].upper() + description[1:]} (not a Hub dataset)."),
        procedure_intro=(f"Masked language modeling ({_finite(hyper.get('mlm_probability')) or 0.15:.0%} of the tokens "
                         "chosen per sequence, 80% masked / 10% random / 10% kept; the loss is computed at the chosen "
                         "positions only)." + _phases_sentence(info.get("phases"))),
        procedure_rows=_procedure_rows(info, backend, accelerator),
        hyperparameter_rows=[(k, _fmt(v)) for k, v in hyper.items() if "token" not in k.lower() and v is not None],
        result_rows=_result_rows(evals),
        results_sentence=_results_sentence(info, description),
        loss_curve=os.path.isfile(os.path.join(output_dir, "loss_curve.png")),
        framework_rows=_framework_versions(info),
        limitations=_limitations(description),
    )
    return mark_generated(card)


def _phases_sentence(phases) -> str:
    """The card's words for a run of several phases (``training_summary.json`` ``phases``: a resume changed the
    masking rate or the block length), e.g. `` Trained in 2 phases: steps 0-4 masking 15% of 32-token sequences
    (2,048 tokens), steps 4-6 masking 15% of 64-token sequences (2,048 tokens).``; ``""`` for one phase."""
    if not isinstance(phases, list) or len(phases) < 2:
        return ""
    parts = []
    for phase in phases:
        rate, length = _finite(phase.get("mlm_probability")), phase.get("max_seq_length")
        parts.append(f"steps {phase.get('start_step')}-{phase.get('end_step')} masking "
                     f"{f'{rate:.0%}' if rate is not None else 'an unrecorded share'} of "
                     f"{f'{length}-token' if length else 'the'} sequences"
                     + (f" ({phase['tokens']:,} tokens)" if isinstance(phase.get("tokens"), int) else ""))
    return f" Trained in {len(phases)} phases: {', '.join(parts)}."


def _limitations(description: str) -> str:
    return ("This is a masked language model: it predicts tokens hidden behind the mask token and is meant as a "
            "starting point for fine-tuning (classification, token classification), not for open-ended generation. "
            f"It reflects the content and biases of its training data ({description}); a small model trained briefly "
            "gives low-quality predictions. Evaluate it on your task before use.")
