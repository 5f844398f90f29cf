"""Masked-LM evaluation on device: per-replica sums, one cross-replica SUM, three scalars to the host.

Logits never leave the device: each replica computes ``(loss_sum, num_correct, num_tokens)`` of its
share of the batch, ``strategy.reduce(SUM)`` combines them, and only those three scalars per batch reach
the host, where the package's ``masked_lm`` ``evaluate`` metric turns them into ``eval_loss``,
``perplexity`` and ``eval_accuracy``. Sums (not per-replica means) make the result independent of how
the data is split over replicas.

Two batch formats are understood (decided from the batch's keys at trace time):

- hf-tpu-ext's format (ARCHITECTURE.md): ``masked_lm_positions``/``masked_lm_ids``/``masked_lm_weights``;
  the LM head runs only at the masked positions (:func:`masked_lm_sums`).
- transformers' stock format: ``labels`` int [B, L] with -100 where no prediction is made (as
  ``DataCollatorForLanguageModeling`` writes it), inside the feature dict or as the ``y`` of an
  ``(x, y)`` element; the model's full logits [B, L, V] are computed on device.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf

from hf_tpu_ext import probes
from hf_tpu_ext.errors import DataError
from hf_tpu_ext.metrics.masked_lm import load_masked_lm_metric


IGNORE_INDEX = -100
_FORMAT_HELP = (
    "Evaluation batches need masked_lm_positions/masked_lm_ids/masked_lm_weights (hf-tpu-ext format) "
    "or labels with -100 for unmasked tokens (transformers format)"
)

# model -> {(id(strategy), jit_compile, autograph): tf.function}; a cached function is traced once per input shape
_STEP_CACHE: "weakref.WeakKeyDictionary[Any, Dict[Tuple[int, Optional[bool], bool], Any]]" = weakref.WeakKeyDictionary()
_NEEDS_AUTOGRAPH: "weakref.WeakSet[Any]" = weakref.WeakSet()  # models whose call() failed to trace without it
logger = logging.getLogger("hf_tpu_ext")



def masked_lm_head(model):
    """The callable mapping hidden states [..., H] to vocabulary logits [..., V] of a transformers TF masked LM.

    transformers 4.57's TF classes name their heads differently: ``TFRobertaForMaskedLM`` (and XLM-R, CamemBERT)
    ``lm_head``, ``TFBertForMaskedLM`` ``mlm`` (``mlm.predictions``: transform, LayerNorm, tied decoder + bias),
    ``TFDistilBertForMaskedLM`` ``vocab_transform`` -> activation -> ``vocab_layer_norm`` -> ``vocab_projector``
    (the same order as its ``call``).

    Raises:
        TypeError: a model with none of these heads (named, with the classes that have one).
    """
    if hasattr(model, "lm_head"):
        return lambda hidden, training: model.lm_head(hidden, training=training)
    if hasattr(model, "mlm"):
        return lambda hidden, training: model.mlm(hidden)  # no dropout in BERT's head; its call takes no flag
    if hasattr(model, "vocab_projector"):
        def distilbert_head(hidden, training):
            hidden = model.act(model.vocab_transform(hidden))
            return model.vocab_projector(model.vocab_layer_norm(hidden))

        return distilbert_head
    raise TypeError(f"{type(model).__name__} has no masked-LM head this package knows (lm_head, mlm, vocab_projector: "
                    "TFRobertaForMaskedLM, TFBertForMaskedLM, TFDistilBertForMaskedLM).")


def masked_lm_logits(model, batch: Dict[str, tf.Tensor], training: bool = False) -> tf.Tensor:
    """Vocabulary logits at the masked positions only.

    Args:
        model: a ``TFRobertaForMaskedLM``, ``TFBertForMaskedLM`` or ``TFDistilBertForMaskedLM`` (the encoder is
            ``model.<base_model_prefix>``, the head :func:`masked_lm_head`).
        batch: the training batch dict (see ARCHITECTURE.md): ``input_ids``/``attention_mask`` int32 [B, L],
            ``masked_lm_positions`` int32 [B, P].
        training: dropout on/off.

    Returns:
        float logits [B, P, vocab_size] (float32, or the compute dtype under mixed precision).
    """
    encoder = getattr(model, model.base_model_prefix)
    hidden = encoder(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training
    )[0]  # [B, L, H]
    gathered = tf.gather(hidden, batch["masked_lm_positions"], batch_dims=1)  # [B, P, H]
    return masked_lm_head(model)(gathered, training)


def masked_lm_sums(model, batch: Dict[str, tf.Tensor], training: bool = False) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Sums for the masked-LM loss and accuracy of one (per-replica) batch.

    Returns:
        ``(loss_sum, num_correct, num_tokens)``, float32 scalars: the summed cross-entropy (nats) over the
        masked tokens, how many of them the argmax predicts right, and how many there are
        (``sum(masked_lm_weights)``). Mean loss = ``loss_sum / num_tokens``; perplexity = ``exp`` of it.
    """
    logits = tf.cast(masked_lm_logits(model, batch, training=training), tf.float32)
    labels = batch["masked_lm_ids"]
    weights = tf.cast(batch["masked_lm_weights"], tf.float32)
    token_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)  # [B, P]
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
    return tf.reduce_sum(token_loss * weights), tf.reduce_sum(correct * weights), tf.reduce_sum(weights)


def _split_element(element) -> Tuple[Dict[str, tf.Tensor], Optional[tf.Tensor]]:
    """``(features, labels)`` from a dict element or an ``(x, y[, sample_weight])`` tuple."""
    if isinstance(element, (tuple, list)):
        features = element[0]
        labels = element[1] if len(element) > 1 else None
    else:
        features, labels = element, None
    if not isinstance(features, dict):
        raise DataError(
            f"Evaluation batches must be dicts of tensors (input_ids, attention_mask, ...), got {type(features).__name__}."
        )
    if labels is None and "labels" in features:
        labels = features["labels"]
        features = {k: v for k, v in features.items() if k != "labels"}
    return features, labels


def stock_labels_sums(model, features: Dict[str, tf.Tensor], labels: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Sums for transformers' stock MLM batch (full logits, ``labels == -100`` ignored).

    Args:
        model: a transformers TF masked LM.
        features: model inputs (``input_ids`` int [B, L], ``attention_mask`` int [B, L], ...).
        labels: int [B, L], the original id at predicted positions and -100 elsewhere.

    Returns:
        ``(loss_sum, num_correct, num_tokens)`` float32 scalars (see ``masked_lm_sums``).
    """
    logits = tf.cast(model(features, training=False).logits, tf.float32)  # [B, L, V], stays on device
    labels = tf.cast(labels, tf.int32)
    weights = tf.cast(tf.not_equal(labels, IGNORE_INDEX), tf.float32)
    safe_labels = tf.where(labels == IGNORE_INDEX, tf.zeros_like(labels), labels)
    token_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe_labels, logits=logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), safe_labels), tf.float32)
    return tf.reduce_sum(token_loss * weights), tf.reduce_sum(correct * weights), tf.reduce_sum(weights)


def batch_sums(model, element) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(loss_sum, num_correct, num_tokens)`` of one (per-replica) batch in either format.

    Raises:
        DataError: the batch has neither ``masked_lm_positions`` nor ``labels``.
    """
    features, labels = _split_element(element)
    if "masked_lm_positions" in features:
        return masked_lm_sums(model, features, training=False)
    if labels is None:
        raise DataError(_FORMAT_HELP + f"; got keys {sorted(features)}.")
    return stock_labels_sums(model, features, labels)


def make_eval_step(model, strategy: tf.distribute.Strategy, jit_compile: Optional[bool] = None,
                   autograph: bool = False):
    """A ``tf.function(distributed_batch) -> (loss_sum, num_correct, num_tokens)`` reduced over replicas.

    Args:
        model: the masked LM (variables created under ``strategy.scope()``).
        strategy: the strategy the batches are distributed with.
        jit_compile: XLA-compile the per-replica computation (None: leave it to the strategy; TPUs always
            compile). Only the per-replica part is compiled, which also works under ``MirroredStrategy``.
        autograph: convert the model's Python control flow on tensors (AutoGraph). Off by default, as the
            training step: a tiny transformers model's first evaluation traced in 7.5 s with it and 0.4 s
            without (2026-12-02); :func:`evaluate_masked_lm` retraces with it for a model that needs it.

    Returns:
        The step function, cached per (model, strategy, jit_compile, autograph) so repeated evaluations do not
        retrace.
    """
    per_model = _STEP_CACHE.setdefault(model, {})
    key = (id(strategy), jit_compile, autograph)
    if key in per_model:
        return per_model[key][1]

    def replica_fn(element):
        return batch_sums(model, element)

    if jit_compile:
        replica_fn = tf.function(replica_fn, jit_compile=True, autograph=autograph)

    @tf.function(reduce_retracing=True, autograph=autograph)  # a partial last batch should not trace per shape
    def step(element):
        sums = strategy.run(replica_fn, args=(element,))
        return tuple(strategy.reduce(tf.distribute.ReduceOp.SUM, s, axis=None) for s in sums)

    per_model[key] = (strategy, step)  # keep the strategy alive so its id is not reused
    return step


def _is_distributed(dataset) -> bool:
    return not isinstance(dataset, tf.data.Dataset) and hasattr(dataset, "element_spec") and hasattr(dataset, "__iter__")


def evaluate_masked_lm(model, dataset, steps: Optional[int] = None, strategy: Optional[tf.distribute.Strategy] = None,
                       jit_compile: Optional[bool] = None) -> Dict[str, float]:
    """Masked-LM loss, perplexity and accuracy over a dataset, computed on device.

    Args:
        model: a transformers TF masked LM (e.g. ``TFRobertaForMaskedLM``).
        dataset: a ``tf.data.Dataset`` of GLOBAL batches (distributed here with
            ``strategy.experimental_distribute_dataset``) or an already distributed dataset. Elements are
            dicts in hf-tpu-ext's or transformers' format (see the module docstring), or ``(x, y)`` tuples.
        steps: batches to evaluate (None: until the dataset ends; give it for a repeated dataset).
        strategy: the distribution strategy (default: ``model.distribute_strategy``, i.e. the one the model
            was built under, else the default strategy).
        jit_compile: XLA-compile the per-replica computation (see :func:`make_eval_step`).

    Returns:
        ``{"eval_loss": float (nats per masked token), "perplexity": float (exp of it),
        "eval_accuracy": float in [0, 1], "eval_tokens": int (masked tokens evaluated)}``.

    Raises:
        DataError: the dataset yielded no batch or no masked token, or its batches have neither format.
    """
    if strategy is None:
        strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    spec = getattr(dataset, "element_spec", None)
    if spec is not None:  # fail here with a clear message rather than inside a trace
        features, labels = _split_element(spec)
        if "masked_lm_positions" not in features and labels is None:
            raise DataError(_FORMAT_HELP + f"; got keys {sorted(features)}.")
    if not _is_distributed(dataset):
        dataset = strategy.experimental_distribute_dataset(dataset)
    step = make_eval_step(model, strategy, jit_compile, autograph=model in _NEEDS_AUTOGRAPH)

    rows = []  # device scalars; converted together at the end (one wait instead of one per batch)
    iterator = iter(dataset)
    while steps is None or len(rows) < steps:
        try:
            element = next(iterator)
        except StopIteration:
            break
        try:
            rows.append(step(element))
        except tf.errors.OperatorNotAllowedInGraphError:
            if rows or model in _NEEDS_AUTOGRAPH:
                raise
            logger.info("This model's call() needs AutoGraph (Python control flow on tensors); tracing the "
                        "evaluation step again with AutoGraph (slower to start, same values).")
            _NEEDS_AUTOGRAPH.add(model)
            step = make_eval_step(model, strategy, jit_compile, autograph=True)
            rows.append(step(element))
    if not rows:
        raise DataError("The evaluation dataset yielded no batch; give validation data with at least one global batch.")
    values = tf.stack([tf.stack(r) for r in rows]).numpy().astype("float64")  # [batches, 3]
    if values[:, 2].sum() <= 0:
        raise DataError("The evaluation data has no masked tokens (all masked_lm_weights are 0 / all labels -100).")
    metric = load_masked_lm_metric()
    metric.add_batch(
        loss_sum=values[:, 0].tolist(),
        num_correct=[int(round(v)) for v in values[:, 1]],
        num_tokens=[int(round(v)) for v in values[:, 2]],
    )
    return metric.compute()


def make_probe_scorer(model, tokenizer, probe_file: str, max_seq_length: int, batch_size: int = 64):
    """A ``() -> {"probe_top1", "probe_top5", "probe_mrr", "probe_n"}`` scorer of a cloze probe file.

    The probes are parsed and tokenized here, once (a probe longer than ``max_seq_length`` or an answer that
    is not one word-level token fails now, before training); each call runs the model's forward pass on
    batches padded to ``[batch_size, max_seq_length]`` (one trace) and ranks the answers with
    :mod:`hf_tpu_ext.probes`, the scoring of ``hf-tpu probe`` and of the Space's ``/probe``.

    Args:
        model: the transformers TF masked LM being trained.
        tokenizer: its tokenizer.
        probe_file: path of the probe file (lines, CSV or JSONL; see :func:`hf_tpu_ext.probes.parse_probes`).
        max_seq_length: the run's sequence length (longest probe allowed, and the padded length).
        batch_size: probes per forward pass.

    Raises:
        DataError: the file cannot be parsed, or a probe cannot be scored with this tokenizer.
    """
    vocab_size = int(model.config.vocab_size)
    try:
        encoded = probes.encode_probes(probes.read_probe_file(probe_file), tokenizer, vocab_size, max_seq_length)
    except probes.ProbeError as err:
        raise DataError(f"--probe_file {err}") from None
    blocked = probes.blocked_ids(tokenizer, vocab_size)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @tf.function(reduce_retracing=True)
    def gather(input_ids, attention_mask, mask_index):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, training=False).logits  # [B, L, V]
        return tf.cast(tf.gather(logits, mask_index, axis=1, batch_dims=1), tf.float32)  # [B, V]

    def mask_logits(input_ids, attention_mask, mask_index):
        return gather(tf.constant(input_ids, tf.int32), tf.constant(attention_mask, tf.int32),
                      tf.constant(mask_index, tf.int32)).numpy()

    def score() -> Dict[str, float]:
        result = probes.score_encoded(encoded, mask_logits, blocked, pad_id, batch_size=batch_size,
                                      pad_to=max_seq_length)
        return result.log_entry()

    return score
