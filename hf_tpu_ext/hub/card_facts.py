"""Card facts a drop-in callback gathers from its framework (framework-free: the card renderer's inputs).

- :func:`framework_versions`: the versions of the stack the run used (a PyTorch ``Trainer`` run lists PyTorch,
  not the TensorFlow that happens to be installed beside it); :func:`keras_framework_versions` for a Keras 3 fit
  (its backend's distributions only);
- :func:`eval_results_from_logs`: the evaluation in Keras or transformers logs (``hf_tpu_ext.hub.model_card``
  re-exports it);
- :func:`strategy_label`: a ``tf.distribute`` strategy's class name in words (the default strategy is "one device");
- :func:`facts_from_log_history`, :func:`facts_from_trainer_state`: what a ``Trainer``'s state says for the card
  (evaluation results, the steady throughput, wall time, tokens seen).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

#: the distributions each backend's card lists, in this order (those installed)
BACKEND_DISTRIBUTIONS = {
    "tensorflow": ("transformers", "tensorflow", "tf-keras", "tokenizers", "huggingface_hub", "hf-tpu-ext"),
    "pytorch": ("transformers", "torch", "accelerate", "tokenizers", "huggingface_hub", "hf-tpu-ext"),
    "torch_xla": ("transformers", "torch", "torch-xla", "accelerate", "tokenizers", "huggingface_hub", "hf-tpu-ext"),
    "keras": ("keras", "keras-hub", "jax", "jaxlib", "transformers", "huggingface_hub", "hf-tpu-ext"),
}


#: the distributions of each Keras 3 backend (the first is the one the card names as the backend)
KERAS_BACKEND_DISTRIBUTIONS = {"jax": ("jax", "jaxlib"), "tensorflow": ("tensorflow",), "torch": ("torch",)}


def _installed(dists: Iterable[str]) -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found: Dict[str, str] = {}
    for dist in dists:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return found


def keras_framework_versions(keras_backend: str, uses_transformers: bool = False) -> List[Tuple[str, str]]:
    """``[(distribution, version)]`` of a Keras 3 ``fit``'s stack: keras, keras-hub, the Keras backend's
    distributions (:data:`KERAS_BACKEND_DISTRIBUTIONS`: jax and jaxlib, tensorflow or torch), transformers only
    when the run used it (``uses_transformers``), huggingface_hub and hf-tpu-ext; installed ones only.

    Raises:
        ValueError: ``keras_backend`` is not ``"jax"``, ``"tensorflow"`` or ``"torch"``.
    """
    backend = str(keras_backend).lower()
    if backend not in KERAS_BACKEND_DISTRIBUTIONS:
        raise ValueError(f"unknown Keras backend {keras_backend!r} (jax, tensorflow or torch)")
    dists = ("keras", "keras-hub", *KERAS_BACKEND_DISTRIBUTIONS[backend],
             *(("transformers",) if uses_transformers else ()), "huggingface_hub", "hf-tpu-ext")
    return list(_installed(dists).items())


def framework_versions(backend: Optional[str], recorded: Optional[Dict[str, str]] = None) -> List[Tuple[str, str]]:
    """``[(distribution, version)]`` for the card's "Framework versions".

    Args:
        backend: the card's backend (``"tensorflow"``, ``"pytorch"``, ``"torch_xla"``, ``"keras"``; another or None:
            the TensorFlow list).
        recorded: the versions the run recorded (``training_summary.json``'s ``framework_versions``): used as they
            are when given.

    Returns:
        Pairs of strings, only installed distributions (looked up with ``importlib.metadata``).
    """
    versions = dict(recorded or {}) or _installed(
        BACKEND_DISTRIBUTIONS.get(str(backend or "tensorflow"), BACKEND_DISTRIBUTIONS["tensorflow"]))
    return [(k, str(v)) for k, v in versions.items() if v]


def strategy_label(strategy: Optional[str]) -> str:
    """A distribution strategy's name for the card: ``"_DefaultDistributionStrategy"`` (what ``tf.distribute``
    gives without a ``strategy.scope()``) -> ``"one device (no distribution strategy)"``; None -> ``"n/a"``."""
    if not strategy:
        return "n/a"
    if str(strategy).lstrip("_") in ("DefaultDistributionStrategy", "DefaultDistributionStrategyV1"):
        return "one device (no distribution strategy)"
    return str(strategy)


def _finite_value(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


#: the log keys of the Trainer ``masked_lm_metrics`` callback (masked-token figures; the Trainer's own
#: ``eval_loss`` is a mean of batch means over another mask draw): preferred on the card when a history has both
MASKED_LM_TRAINER_KEYS = {"eval_loss": "eval_masked_loss", "perplexity": "eval_perplexity",
                          "eval_accuracy": "eval_masked_accuracy"}


def eval_results_from_logs(logs: Optional[dict]) -> Dict[str, float]:
    """``eval_loss``/``perplexity``/``eval_accuracy`` from Keras or transformers logs (``val_loss`` and
    ``val_accuracy`` are Keras' names; ``eval_masked_loss``, ``eval_perplexity``, ``eval_masked_accuracy`` the
    Trainer ``masked_lm_metrics`` callback's, taken first); perplexity is ``exp(eval_loss)`` when not logged.
    Empty when none."""
    logs = logs or {}
    out: Dict[str, float] = {}
    # val_sparse_categorical_accuracy: the metric keras-hub's masked LMs compile with, weighted by mask_weights
    for key, names in (("eval_loss", ("eval_loss", "val_loss")),
                       ("eval_accuracy", ("eval_accuracy", "val_accuracy", "val_sparse_categorical_accuracy")),
                       ("perplexity", ("perplexity", "val_perplexity"))):
        for name in (MASKED_LM_TRAINER_KEYS[key],) + names:
            value = _finite_value(logs.get(name))
            if value is not None:
                out[key] = value
                break
    if "perplexity" not in out and "eval_loss" in out and out["eval_loss"] < 700:
        out["perplexity"] = math.exp(out["eval_loss"])
    return out


def facts_from_log_history(log_history: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    """The card fields a ``Trainer``'s ``state.log_history`` holds.

    Args:
        log_history: the entries (``{"loss", "step", ...}``, ``{"eval_loss", ...}`` of ``Trainer.evaluate``,
            ``{"eval_masked_loss", "eval_perplexity", ...}`` of the ``masked_lm_metrics`` callback, the final
            ``{"train_runtime", ...}``).

    Returns:
        Some of: ``eval_results`` (the latest evaluation of the ``masked_lm_metrics`` callback, else the latest
        one: ``eval_loss`` nats, ``perplexity``, ``eval_accuracy``; see :func:`eval_results_from_logs`),
        ``steady_tokens_per_second`` and ``mfu`` (the latest log entry the throughput callback filled),
        ``train_runtime`` (s).
    """
    out: Dict[str, Any] = {}
    masked: Dict[str, float] = {}
    for entry in log_history or ():
        if not isinstance(entry, dict):
            continue
        found = eval_results_from_logs({k: v for k, v in entry.items() if k != "loss"})
        if found:
            out["eval_results"] = found
            if MASKED_LM_TRAINER_KEYS["eval_loss"] in entry:
                masked = found
        rate = _number(entry.get("tokens_per_second"))
        if rate and "loss" in entry:
            out["steady_tokens_per_second"] = rate
        runtime = _number(entry.get("train_runtime"))
        if runtime:
            out["train_runtime"] = runtime
    if masked:  # the masked-token figures over the Trainer's own eval_loss
        out["eval_results"] = masked
    return out


def facts_from_trainer_state(state) -> Dict[str, Any]:
    """:func:`facts_from_log_history` of a ``transformers.TrainerState`` (any object with ``log_history``), with
    ``tokens_seen`` from ``num_input_tokens_seen`` where the Trainer counted it
    (``TrainingArguments(include_num_input_tokens_seen=...)``)."""
    out = facts_from_log_history(getattr(state, "log_history", None) or [])
    seen = getattr(state, "num_input_tokens_seen", 0)
    if isinstance(seen, (int, float)) and seen > 0:
        out["tokens_seen"] = int(seen)
    return out
