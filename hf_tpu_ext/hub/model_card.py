"""Model cards (``README.md``) for trained fill-mask models, and their validation.

The card is rendered from the package template ``hf_tpu_ext/templates/model_card.md`` with
:meth:`huggingface_hub.ModelCard.from_template`. Metadata comes from ``training_summary.json``
(:func:`hf_tpu_ext.outputs.read_training_summary`); when it is missing, from what the folder shows
(``config.json``, the tokenizer's mask token, ``trainer_state.json``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from importlib import resources
from typing import Any, Dict, List, Optional, Tuple

from hf_tpu_ext.errors import ModelCardError

logger = logging.getLogger("hf_tpu_ext.hub")

KNOWN_LICENSES = {
    "apache-2.0", "mit", "bsd", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-4.0", "cc-by-sa-4.0",
    "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "gpl-2.0", "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "unlicense",
    "openrail", "openrail++", "llama2", "llama3", "gemma", "odc-by", "pddl", "other", "unknown",
}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$|^[A-Za-z0-9][\w.\-]*$")


def default_template_path() -> str:
    """Filesystem path of the packaged card template (``hf_tpu_ext/templates/model_card.md``)."""
    return str(resources.files("hf_tpu_ext").joinpath("templates", "model_card.md"))


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


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
        from hf_tpu_ext.outputs import read_training_summary

        summary = dict(read_training_summary(output_dir) or {})
    except ImportError:
        summary = _read_json(os.path.join(output_dir, "training_summary.json"))
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
        for key in ("global_step", "epoch"):
            if state.get(key) is not None:
                summary.setdefault(key, state[key])
    return summary


def _finite(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


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

    ``"tensorflow"``: "TensorFlow + XLA" (or "TensorFlow" when ``jit_compile`` is False); ``"torch_xla"``:
    "PyTorch/XLA"; any other (``"pytorch"``: a plain transformers ``Trainer``): "PyTorch (transformers
    Trainer) on <accelerator>" (the summary's ``accelerator``, e.g. CPU or GPU; "CPU/GPU" when unknown).
    """
    if backend == "tensorflow":
        return "TensorFlow" if info.get("jit_compile") is False else "TensorFlow + XLA"
    if backend == "torch_xla":
        return "PyTorch/XLA"
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


def _is_hub_id(value) -> bool:
    from hf_tpu_ext.hub.model_ref import is_hub_repo_id

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


def eval_results_from_logs(logs: Optional[dict]) -> Dict[str, float]:
    """``eval_loss``/``perplexity``/``eval_accuracy`` from Keras or transformers logs (``val_loss`` and
    ``val_accuracy`` are Keras' names); perplexity is ``exp(eval_loss)`` when not logged. Empty when none."""
    logs = logs or {}
    out: Dict[str, float] = {}
    for key, names in (("eval_loss", ("eval_loss", "val_loss")), ("eval_accuracy", ("eval_accuracy", "val_accuracy")),
                       ("perplexity", ("perplexity", "val_perplexity"))):
        for name in names:
            value = _finite(logs.get(name))
            if value is not None:
                out[key] = value
                break
    if "perplexity" not in out and "eval_loss" in out and out["eval_loss"] < 700:
        out["perplexity"] = math.exp(out["eval_loss"])
    return out


def _framework_versions(summary: dict) -> List[Tuple[str, str]]:
    versions = dict(summary.get("framework_versions") or {})
    if not versions:
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("transformers", "tensorflow", "tf-keras", "torch", "tokenizers", "huggingface_hub", "hf-tpu-ext"):
            try:
                versions[dist] = version(dist)
            except PackageNotFoundError:
                pass
    return [(k, str(v)) for k, v in versions.items() if v]


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
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    info = dict(summary if summary is not None else load_summary(output_dir))
    extra_tags = list(card_fields.pop("tags", None) or [])
    info.update({k: v for k, v in card_fields.items() if v is not None})
    if not info.get("mask_token"):
        info["mask_token"] = load_summary(output_dir).get("mask_token", "<mask>")
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

    tags = ["hf-tpu-ext", "fill-mask", "tensorflow" if backend == "tensorflow" else "pytorch"]
    if backend == "torch_xla":
        tags.append("torch_xla")
    if info.get("jit_compile"):
        tags.append("xla")
    if accelerator == "TPU":
        tags.append("tpu")
    if config.get("model_type"):
        tags.append(str(config["model_type"]))
    tags += [t for t in extra_tags if t not in tags]

    eval_results = []
    evals = info.get("eval_results") or {}
    ds_kwargs = dict(dataset_name=dataset_name, dataset_type=dataset_name) if dataset_name else dict(
        dataset_name=description, dataset_type="text")
    if info.get("dataset_config_name"):
        ds_kwargs["dataset_config"] = str(info["dataset_config_name"])
    for key, mtype, mname in (("perplexity", "perplexity", "Perplexity"), ("eval_accuracy", "accuracy", "Masked-token accuracy"),
                              ("eval_loss", "loss", "Eval loss (nats)")):
        value = _finite(evals.get(key))
        if value is not None:
            eval_results.append(EvalResult(task_type="fill-mask", task_name="Masked Language Modeling", metric_type=mtype,
                                           metric_value=round(value, 6), metric_name=mname, **ds_kwargs))

    data = ModelCardData(
        language=info.get("language") or None,
        license=info.get("license") or None,
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=tags,
        datasets=[dataset_name] if dataset_name else None,
        base_model=base_model,
        model_name=name,
        eval_results=eval_results or None,
    )

    arch = config.get("architectures", ["RobertaForMaskedLM"])[0] if config.get("architectures") else "RoBERTa-style masked LM"
    size = []
    for key, label in (("num_hidden_layers", "layers"), ("hidden_size", "hidden size"), ("num_attention_heads", "heads"),
                       ("vocab_size", "vocabulary")):
        if config.get(key):
            size.append(f"{config[key]} {label}" if key != "vocab_size" else f"a {config[key]:,}-token vocabulary")
    if info.get("num_parameters"):
        size.append(f"{int(info['num_parameters']):,} parameters")
    shape = f" ({', '.join(size)})" if size else ""
    from hf_tpu_ext.hub.model_ref import hub_url

    if base_model:
        what = (f"This model continues the masked-language-model pre-training of [{base_model}]({hub_url(base_model)}) "
                f"on {description} (fine-tuned from its weights).")
    elif initialized_from:
        what = (f"This model continues the masked-language-model pre-training of a local model folder "
                f"(`{initialized_from}`, not on the Hub) on {description} (fine-tuned from its weights).")
    else:
        what = f"This model was pre-trained from scratch (randomly initialized weights) on {description} with masked language modeling."
    model_description = (f"A {arch}{shape} for the fill-mask task. {what} It was trained with "
                         f"hf-tpu-ext using {_framework(backend, info)}.")

    acc_text = accelerator or "n/a"
    if info.get("num_devices"):
        acc_text = f"{info['num_devices']} x {accelerator or 'device'}"
    procedure_rows = [
        ("Backend", backend),
        ("Accelerator", acc_text),
        ("Distribution strategy", info.get("strategy") or "n/a"),
        ("Replicas", _fmt(info.get("num_replicas")) if info.get("num_replicas") else "n/a"),
        ("Global batch size (sequences)", _fmt(info.get("global_batch_size")) if info.get("global_batch_size") else "n/a"),
        ("Precision", info.get("precision") or "n/a"),
        ("XLA compilation", _fmt(bool(info.get("jit_compile"))) if info.get("jit_compile") is not None else "n/a"),
        ("Compiler path", info.get("compiler") or "n/a"),
        ("Optimizer steps", _fmt(int(info["global_step"])) if info.get("global_step") is not None else "n/a"),
        ("Epochs", _fmt(float(info["epoch"])) if _finite(info.get("epoch")) is not None else "n/a"),
        ("Tokens seen", _fmt(int(info["tokens_seen"])) if info.get("tokens_seen") else "n/a"),
        ("Training wall time", _duration(info.get("train_runtime"))),
        ("Throughput (tokens/s)", _fmt(round(float(info["train_tokens_per_second"]), 1)) if _finite(info.get("train_tokens_per_second")) else "n/a"),
    ]
    hyper = info.get("hyperparameters") or {}
    hyperparameter_rows = [(k, _fmt(v)) for k, v in hyper.items() if "token" not in k.lower() and v is not None]
    result_rows = []
    probe_n = f" ({int(evals['probe_n'])} probes)" if _finite(evals.get("probe_n")) else ""
    for key, label in (("eval_loss", "Eval loss (mean cross-entropy over masked tokens, nats)"), ("perplexity", "Perplexity"),
                       ("eval_accuracy", "Masked-token accuracy"), ("probe_top1", f"Cloze probes: top-1 accuracy{probe_n}"),
                       ("probe_top5", f"Cloze probes: top-5 accuracy{probe_n}"),
                       ("probe_mrr", f"Cloze probes: mean reciprocal rank{probe_n}")):
        value = _finite(evals.get(key))
        if value is not None:
            result_rows.append((label, _fmt(round(value, 4))))

    model_ref = repo_id or name
    formats = weight_formats(output_dir)
    if not (formats["pytorch"] or formats["tensorflow"]):  # a card rendered before the weights are written
        formats = {"pytorch": backend != "tensorflow", "tensorflow": backend == "tensorflow"}
    limitations = (
        "This is a masked language model: it predicts tokens hidden behind the mask token and is meant as a "
        "starting point for fine-tuning (classification, token classification), not for open-ended generation. "
        f"It reflects the content and biases of its training data ({description}); a small model trained briefly "
        "gives low-quality predictions. Evaluate it on your task before use."
    )
    card = ModelCard.from_template(
        data,
        template_path=template_path or default_template_path(),
        model_name=name,
        model_description=model_description,
        model_ref=model_ref,
        has_pytorch_weights=formats["pytorch"],
        has_tf_weights=formats["tensorflow"],
        mask_token=info.get("mask_token") or "<mask>",
        data_description=(f"[{dataset_name}]({hub_url(dataset_name, 'dataset')})" if dataset_name else
                          f"{description[0].upper() + description[1:]} (not a Hub dataset)."),
        procedure_intro=(f"Masked language modeling ({_finite(hyper.get('mlm_probability')) or 0.15:.0%} of the tokens "
                         "chosen per sequence, 80% masked / 10% random / 10% kept; the loss is computed at the chosen "
                         "positions only)."),
        procedure_rows=procedure_rows,
        hyperparameter_rows=hyperparameter_rows,
        result_rows=result_rows,
        results_dataset=description,
        loss_curve=os.path.isfile(os.path.join(output_dir, "loss_curve.png")),
        framework_rows=_framework_versions(info),
        limitations=limitations,
    )
    return card


def check_card_metadata(metadata) -> List[str]:
    """Offline structural checks of card metadata (what the Hub rejects for cards we write).

    Returns:
        A list of problems (empty when none).
    """
    errors: List[str] = []
    if not isinstance(metadata, dict):
        return ["the metadata is not a YAML dictionary"]
    for key in ("datasets", "base_model", "language", "tags", "license"):
        if key in metadata:
            v = metadata[key]
            if not ((isinstance(v, str) and v) or (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v))):
                errors.append(f"'{key}' must be a string or a list of strings, got {v!r}")
    if isinstance(metadata.get("license"), str) and metadata["license"] not in KNOWN_LICENSES:
        errors.append(f"'license' {metadata['license']!r} is not a known license identifier (e.g. apache-2.0, mit, other)")
    for i, model in enumerate(metadata.get("model-index") or []):
        if not isinstance(model, dict) or not isinstance(model.get("name"), str):
            errors.append(f"model-index[{i}].name must be a string")
            continue
        for j, result in enumerate(model.get("results") or []):
            where = f"model-index[{i}].results[{j}]"
            task, ds = result.get("task") or {}, result.get("dataset") or {}
            if not isinstance(task.get("type"), str):
                errors.append(f"{where}.task.type must be a string")
            for key in ("name", "type"):
                if not isinstance(ds.get(key), str) or not ds.get(key):
                    errors.append(f"{where}.dataset.{key} must be a non-empty string")
            errors += [f"{where}.dataset.{k} must be a string" for k, v in ds.items() if k != "args" and not isinstance(v, str)]
            for k, metric in enumerate(result.get("metrics") or []):
                value = metric.get("value") if isinstance(metric, dict) else None
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    errors.append(f"{where}.metrics[{k}].value must be a finite number, got {value!r}")
    return errors


def validate_model_card(card, token: Optional[str] = None, *, offline_ok: bool = True, remote: bool = True) -> None:
    """Check the card's metadata locally, then with the Hub's ``/api/validate-yaml`` at the configured endpoint.

    The endpoint is ``huggingface_hub.constants.ENDPOINT`` read at call time (``HF_ENDPOINT``), not the
    hard-coded huggingface.co URL ``RepoCard.validate`` uses.

    Args:
        card: a :class:`huggingface_hub.ModelCard` (or the card text).
        token: sent as authorization when given (the Hub does not need one).
        offline_ok: when the endpoint cannot be reached or answers 5xx/429 (the Hub's trouble, not the card's),
            log a warning and accept the card after the local checks (True), or raise (False).
        remote: also ask the Hub (False: the local checks only, no network).

    Raises:
        ModelCardError: the local checks or the Hub rejected the metadata; the message is the Hub's.
    """
    import requests
    import yaml
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session

    text = str(card)
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n?", text, flags=re.S)
    try:
        metadata = yaml.safe_load(match.group(1)) if match else {}
    except yaml.YAMLError as err:
        raise ModelCardError(f"The model card's YAML metadata does not parse: {err}") from None
    problems = check_card_metadata(metadata or {})
    if problems:
        raise ModelCardError("Model card metadata is invalid: " + "; ".join(problems))
    if not remote:
        return

    url = f"{constants.ENDPOINT}/api/validate-yaml"
    headers = build_hf_headers(token=token or False)
    try:
        response = get_session().post(url, json={"repoType": "model", "content": text}, headers=headers, timeout=30)
    except (requests.ConnectionError, requests.Timeout) as err:
        if offline_ok:
            logger.warning("Could not reach %s to validate the model card (%s); local checks passed.", url, type(err).__name__)
            return
        raise ModelCardError(f"Could not reach {url} to validate the model card; check the network or HF_ENDPOINT.") from None
    if (response.status_code >= 500 or response.status_code == 429) and offline_ok:
        logger.warning("%s answered HTTP %d; the model card passed the local checks and is kept.", url,
                       response.status_code)
        return
    if response.status_code >= 400:
        try:
            message = response.json().get("error") or response.text
        except ValueError:
            message = response.text
        if token:
            message = str(message).replace(token, "<redacted>")
        raise ModelCardError(f"The Hub rejected the model card metadata (HTTP {response.status_code}): {message}")


def validate_card_file(folder: str, token: Optional[str] = None) -> bool:
    """Have the Hub validate ``folder/README.md``; remove the file when the Hub rejects it.

    Meant for a push snapshot (:meth:`hf_tpu_ext.hub.push_queue.PushQueue.submit`'s ``before_upload``): the
    request runs off the training thread, and a card the Hub rejects is left out of the commit so the repo
    keeps its last valid card (the copy in the output folder stays as written). The rejection is logged as
    an error. When the check itself fails (Hub unreachable or 5xx, unreadable file) the card is kept: the
    push of the weights must not depend on it.

    Returns:
        True when the card is kept (no card, validated, or the check could not run); False when the Hub
        rejected it and it was removed from ``folder``.
    """
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return True
    try:
        with open(path, encoding="utf-8") as f:
            validate_model_card(f.read(), token=token)
    except ModelCardError as err:
        logger.error("Model card not pushed: %s", err)
        os.remove(path)
        return False
    except Exception as err:  # the check, not the card, failed
        logger.warning("Could not check the model card with the Hub (%s); pushing it as written.", type(err).__name__)
    return True


def save_model_card(output_dir: str, repo_id: Optional[str] = None, summary: Optional[dict] = None, *,
                    validate: bool = False, token: Optional[str] = None, **card_fields) -> str:
    """Render the card of ``output_dir`` and write it to ``output_dir/README.md``.

    Args:
        output_dir, repo_id, summary, **card_fields: see :func:`render_model_card`.
        validate: also run :func:`validate_model_card` before writing.
        token: passed to :func:`validate_model_card`.

    Returns:
        The path of the written README.md.

    Raises:
        ModelCardError: ``validate`` is set and the card does not validate (nothing is written).
    """
    card = render_model_card(output_dir, repo_id=repo_id, summary=summary, **card_fields)
    if validate:
        validate_model_card(card, token=token)
    path = os.path.join(output_dir, "README.md")
    card.save(path)
    return path
