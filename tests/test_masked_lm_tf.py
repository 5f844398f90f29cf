"""hf_tpu_ext.metrics.masked_lm_tf.evaluate_masked_lm traces its step without AutoGraph (a tiny transformers model's
first evaluation: 7.5 s with it, 0.4 s without) and retraces with it for a model whose call() needs it."""

import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")

Output = collections.namedtuple("Output", "logits")
VOCAB, SEQ = 11, 6


class BranchingLM(tf_keras.Model):
    """Embedding -> Dense logits; with ``branch`` its call() has Python control flow on a tensor (an ``if`` on a
    tensor's value), which only traces under AutoGraph. The branch is always taken, so both variants compute
    the same logits."""

    def __init__(self, branch):
        super().__init__()
        self.branch = branch
        self.embed = tf_keras.layers.Embedding(VOCAB, 4)
        self.head = tf_keras.layers.Dense(VOCAB)

    def call(self, features, training=False):
        hidden = self.embed(features["input_ids"])
        if self.branch:
            if tf.reduce_min(features["input_ids"]) >= 0:  # a tensor as a Python bool
                hidden = hidden * 1.0
        return Output(self.head(hidden))


def _dataset():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(8, SEQ)).astype("int32")
    labels = np.where(rng.random((8, SEQ)) < 0.5, ids, -100).astype("int32")
    labels[:, 0] = ids[:, 0]  # at least one predicted token per row
    return ids, labels, tf.data.Dataset.from_tensor_slices(({"input_ids": ids}, labels)).batch(4)


def _expected(model, ids, labels):
    """eval_loss (mean cross-entropy over labelled tokens) and eval_tokens computed eagerly in NumPy."""
    logits = model({"input_ids": tf.constant(ids)}).logits.numpy().astype("float64")
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
        -1, keepdims=True)
    keep = labels != -100
    picked = np.take_along_axis(logp, np.where(keep, labels, 0)[..., None], axis=-1)[..., 0]
    return float(-(picked * keep).sum() / keep.sum()), int(keep.sum())


def test_a_model_that_needs_autograph_is_evaluated_after_one_retrace(hf_log):
    from hf_tpu_ext.metrics.masked_lm_tf import evaluate_masked_lm

    ids, labels, dataset = _dataset()
    plain, branching = BranchingLM(False), BranchingLM(True)
    plain({"input_ids": tf.constant(ids)}), branching({"input_ids": tf.constant(ids)})  # build both
    branching.set_weights(plain.get_weights())
    loss, tokens = _expected(plain, ids, labels)

    retraced = "tracing the evaluation step again with AutoGraph"
    plain_result = evaluate_masked_lm(plain, dataset)
    assert "needs AutoGraph" not in hf_log.text
    first = evaluate_masked_lm(branching, dataset)
    logged = hf_log.text.count(retraced)
    assert logged >= 1
    second = evaluate_masked_lm(branching, dataset)  # the AutoGraph step is kept for this model: no new line
    assert hf_log.text.count(retraced) == logged
    for result in (plain_result, first, second):
        assert result["eval_tokens"] == tokens
        assert result["eval_loss"] == pytest.approx(loss, rel=1e-5)
        assert result["perplexity"] == pytest.approx(np.exp(loss), rel=1e-5)
