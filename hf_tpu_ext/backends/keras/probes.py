"""``--probe_file`` on the Keras backend: the cloze probes scored at each evaluation, as on the TensorFlow backend.

The same figures as the TensorFlow backend's scorer (:func:`hf_tpu_ext.metrics.masked_lm_tf.make_probe_scorer`),
``hf-tpu probe`` and the Space's ``/probe`` for the same weights: the probes are parsed and tokenized once, when
training starts (:func:`preparing_probes` around ``KerasBackend.fit``: a probe longer than ``max_seq_length`` or an
answer the tokenizer cannot spell fails before the first step), and each evaluation (:func:`scoring_probes` around
``KerasBackend.evaluate``) runs the model's forward pass and ranks the answers with the framework-free
:func:`hf_tpu_ext.probes.score_encoded` on NumPy logits. Its log-history keys are the TensorFlow backend's:
``probe_top1``, ``probe_top5``, ``probe_mrr`` (floats in [0, 1]) and ``probe_n`` (probes scored).

The forward pass is one ``jax.jit`` program of ``model.stateless_call`` on the training state as it is (the
trainer's weights: :meth:`~hf_tpu_ext.backends.keras.trainer.JaxTrainer.on_weights`), batches padded to
``[batch_size, seq_length]`` (rows repeated, their logits dropped), so it compiles once per run.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict

import numpy as np

from hf_tpu_ext import probes
from hf_tpu_ext.errors import DataError


def wants_probes(backend) -> bool:
    """``--probe_file`` with evaluations (``--eval_strategy`` not ``no``): the backend's ``scores_probes``."""
    args = getattr(backend, "args", None)
    return bool(args is not None and getattr(args, "probe_file", None) and args.eval_strategy != "no")


def _pad_rows(values: np.ndarray, rows: int) -> np.ndarray:
    """``values`` ``[n, ...]`` with its last row repeated up to ``rows`` rows (a fixed shape: one compilation)."""
    if len(values) >= rows:
        return values
    return np.concatenate([values, np.repeat(values[-1:], rows - len(values), axis=0)])


def _mask_logits_function(model, trainer, batch_size: int) -> Callable:
    """``(input_ids [B, L], attention_mask [B, L], mask_index [B]) -> float32 [B, V]``: the logits at one position per
    row of ``model`` with the trainer's current weights (``B <= batch_size``)."""

    def inputs(input_ids, attention_mask, mask_index):
        return {"token_ids": input_ids, "padding_mask": attention_mask, "mask_positions": mask_index[:, None]}

    import jax
    import jax.numpy as jnp

    @jax.jit
    def probe_logits(trainable, non_trainable, input_ids, attention_mask, mask_index):
        logits, _ = model.stateless_call(trainable, non_trainable, inputs(input_ids, attention_mask, mask_index),
                                         training=False)
        return logits[:, 0, :].astype(jnp.float32)

    def on_device(input_ids, attention_mask, mask_index):
        rows = len(input_ids)
        arrays = [_pad_rows(np.asarray(a, np.int32), batch_size) for a in (input_ids, attention_mask, mask_index)]
        out = trainer.on_weights(probe_logits, arrays)
        return np.asarray(out.addressable_data(0))[:rows]  # replicated: this process's copy (multi-host too)

    return on_device


def make_probe_scorer(backend, batch_size: int = 64) -> Callable[[], Dict[str, float]]:
    """A ``() -> {"probe_top1", "probe_top5", "probe_mrr", "probe_n"}`` scorer of ``--probe_file`` for a built
    Keras backend (its tokenizer, config, plan and trainer).

    Args:
        backend: a :class:`~hf_tpu_ext.backends.keras.backend.KerasBackend` after ``build``.
        batch_size: probes per forward pass.

    Raises:
        DataError: the file cannot be parsed, or a probe cannot be scored with this tokenizer and
            ``max_seq_length`` (the message names the line).
    """
    tokenizer, seq_length = backend.tokenizer, int(backend.plan.seq_length)
    vocab_size = int(backend.config.vocab_size)
    try:
        encoded = probes.encode_probes(probes.read_probe_file(backend.args.probe_file), tokenizer, vocab_size,
                                       seq_length)
    except probes.ProbeError as err:
        raise DataError(f"--probe_file {err}") from None
    blocked = probes.blocked_ids(tokenizer, vocab_size)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    mask_logits = _mask_logits_function(backend.model, backend.trainer, batch_size)

    def score() -> Dict[str, float]:
        result = probes.score_encoded(encoded, mask_logits, blocked, pad_id, batch_size=batch_size, pad_to=seq_length)
        return result.log_entry()

    return score


def preparing_probes(fit: Callable) -> Callable:
    """Decorates ``KerasBackend.fit``: with ``--probe_file`` (:func:`wants_probes`) the scorer is made first, as the
    TensorFlow backend's ``fit`` does (``backend.probe_scorer``; batches of ``max(8, per_device_eval_batch_size)``)."""

    @functools.wraps(fit)
    def fit_with_probes(backend, *args, **kwargs):
        if wants_probes(backend) and getattr(backend, "probe_scorer", None) is None:
            batch = max(8, int(backend.args.per_device_eval_batch_size))
            backend.probe_scorer = make_probe_scorer(backend, batch_size=batch)
        return fit(backend, *args, **kwargs)

    return fit_with_probes


def scoring_probes(evaluate: Callable) -> Callable:
    """Decorates ``KerasBackend.evaluate``: its metrics and, once :func:`preparing_probes` made the scorer, the probe
    scores (``probe_top1``, ``probe_top5``, ``probe_mrr``, ``probe_n``), also without a validation split."""

    @functools.wraps(evaluate)
    def evaluate_with_probes(backend) -> Dict[str, float]:
        metrics = evaluate(backend)
        scorer = getattr(backend, "probe_scorer", None)
        return dict(metrics, **scorer()) if scorer is not None else metrics

    return evaluate_with_probes
