"""Masked language modeling metric: mean cross-entropy, perplexity and accuracy from per-batch sums.

An ``evaluate`` metric module. Each row is one batch (or one replica's share of a batch): the summed
cross-entropy over its masked tokens, how many of them the model predicts right, and how many there are.
Summing first and dividing once gives the exact token-weighted mean however the data was split over
batches and replicas.
"""

import math

import datasets
import evaluate

_DESCRIPTION = """
Masked-LM evaluation from sufficient statistics: eval_loss = sum(loss_sum) / sum(num_tokens) (nats per
masked token), perplexity = exp(eval_loss), eval_accuracy = sum(num_correct) / sum(num_tokens).
"""

_KWARGS_DESCRIPTION = """
Args:
    loss_sum (list of float): summed cross-entropy (nats) over the masked tokens of each row.
    num_correct (list of int): masked tokens whose argmax prediction equals the label, per row.
    num_tokens (list of int): masked tokens per row.
Returns:
    eval_loss (float): mean cross-entropy per masked token.
    perplexity (float): exp(eval_loss) (inf when it overflows).
    eval_accuracy (float): share of masked tokens predicted right, in [0, 1].
    eval_tokens (int): masked tokens evaluated.
Examples:
    >>> metric = evaluate.load("hf_tpu_ext/metrics/masked_lm")
    >>> metric.compute(loss_sum=[2.0, 4.0], num_correct=[1, 2], num_tokens=[2, 4])["eval_loss"]
    1.0
"""

_CITATION = """
@inproceedings{devlin2019bert,
  title={BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding},
  author={Devlin, Jacob and Chang, Ming-Wei and Lee, Kenton and Toutanova, Kristina},
  booktitle={NAACL-HLT},
  year={2019}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MaskedLm(evaluate.Metric):
    """Token-weighted masked-LM loss, perplexity and accuracy from per-batch sums."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "loss_sum": datasets.Value("float64"),
                    "num_correct": datasets.Value("int64"),
                    "num_tokens": datasets.Value("int64"),
                }
            ),
        )

    def _compute(self, loss_sum, num_correct, num_tokens):
        tokens = int(sum(num_tokens))
        if tokens <= 0:
            raise ValueError(
                "No masked tokens to evaluate: every row has num_tokens == 0. Check that the evaluation data "
                "has masked positions (masked_lm_weights > 0, or labels != -100)."
            )
        loss = float(math.fsum(loss_sum)) / tokens
        return {
            "eval_loss": loss,
            "perplexity": math.exp(loss) if loss < 709.0 else float("inf"),
            "eval_accuracy": int(sum(num_correct)) / tokens,
            "eval_tokens": tokens,
        }
