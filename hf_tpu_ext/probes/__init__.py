"""Cloze probes: parse probe sets, map answers to token ids, score top-1/top-5 accuracy, MRR and log-likelihood.

A probe is a sentence with exactly one mask and the answer expected there; the mask stands for the whole answer,
however many tokens it is::

    The capital of France is <mask>. ⇒ Paris
    The capital of France is <mask>. | France's capital is <mask>. ⇒ Paris | Lyon | Marseille

Several templates (wordings) of one fact share a line, separated by ``|`` before the arrow; after the arrow the
answer comes first, then the distractors it is ranked against (optional), separated by ``|``.

Framework-free (stdlib + numpy + a ``transformers`` tokenizer object): the Gradio Space (through
:mod:`hf_tpu_ext.fill_mask`, whose files ``hf-tpu deploy-space`` uploads with this one), ``hf-tpu probe`` and
the training run's ``--probe_file`` all score with this module, so they give the same numbers for the same
weights.

Modules: :mod:`.parsing` (text -> probes), :mod:`.vocabulary` (words -> token ids), :mod:`.scoring` (ranks,
figures); every public name is importable from ``hf_tpu_ext.probes``.

Formats (:func:`parse_probes`):

* plain lines: ``<sentence>[ | <sentence>...] ⇒ <answer>[ | <distractor>...]`` (or ``=>``; split at the last
  arrow); blank lines and lines starting with ``#`` are skipped;
* CSV (or TSV): columns ``text`` and ``answer`` named in a header (aliases ``sentence``/``input`` and
  ``target``/``label``), an optional ``distractors`` column, or, without such a header, the first two columns;
  ``|`` separates templates and distractors inside a cell;
* JSONL: one object per line with the same keys; ``text`` and ``distractors`` may also be lists.

A malformed line (no arrow, not exactly one mask, bad JSON, ...) is an error with ``strict`` (the training run's
``--probe_file``); the test bench and ``hf-tpu probe`` list it and skip it (``--strict``: an error).

The mask may be written ``<mask>`` or ``[MASK]`` (any case); it is replaced by the tokenizer's mask token.

Scoring (:func:`score_encoded`): a candidate of k tokens (its tokenization at the mask: after a space the
spaced form, ``Ġparis``) is scored by replacing the one mask by k masks and summing log-probabilities
left to right, :func:`candidate_rows` (PLL-word-l2r: Kauf & Ivanova, ACL 2023). Log-probabilities are
those of the softmax over the non-special vocabulary, in nats. The rank of the answer is
``1 + (number of competitors with a strictly greater score)``; competitors are the distractors when the
probe gives them, else every single non-special vocabulary entry at the (one) mask, so a single-token answer
without distractors gets exactly the rank of the single-mask ranking. A multi-token answer without distractors
is not scored (listed in ``skipped``, an error with ``strict``): the sum of k log-probabilities against single
tokens' one log-probability ranks it last whatever the model knows, and the vocabulary has no set of k-token
rivals that would make a rank meaningful; its distractors are the candidate set.
top-1 and top-5 accuracy are the shares of probes with rank <= 1 and <= 5; MRR is the mean of ``1 / rank``
(Voorhees, TREC-8 QA track, 1999; no cut-off). ``loglik`` is the mean log-probability of the whole answer
string and ``loglik_per_char`` the mean of that divided by the answer's characters: a probability of a string,
so comparable across tokenizers (a 3-token answer is not penalised for a vocabulary that splits it more
finely, apart from the model's own uncertainty).
"""
from hf_tpu_ext.probes.parsing import (ANSWER_KEYS, ARROWS, DISTRACTOR_KEYS, FORMATS, MASK_RE, MAX_PROBES, SEPARATOR,
                                       TEXT_KEYS, Probe, ProbeError, ProbeSet, detect_format, parse_probes,
                                       read_probe_file)
from hf_tpu_ext.probes.scoring import (TOP_KS, EncodedProbes, MaskLogitsFn, ProbeResult, answer_ranks, candidate_rows,
                                       encode_probes, log_softmax, multi_token_reason, pad_batch, score_encoded,
                                       score_probes, summarize_ranks)
from hf_tpu_ext.probes.vocabulary import (WordToken, answer_token, blocked_ids, candidate_ids, describe_mapping,
                                          word_tokens)

__all__ = ["ANSWER_KEYS", "ARROWS", "DISTRACTOR_KEYS", "EncodedProbes", "FORMATS", "MASK_RE", "MAX_PROBES",
           "MaskLogitsFn", "Probe", "ProbeError", "ProbeResult", "ProbeSet", "SEPARATOR", "TEXT_KEYS", "TOP_KS",
           "WordToken", "answer_ranks", "answer_token", "blocked_ids", "candidate_ids", "candidate_rows",
           "describe_mapping", "detect_format", "encode_probes", "log_softmax", "multi_token_reason", "pad_batch",
           "parse_probes", "read_probe_file", "score_encoded", "score_probes", "summarize_ranks", "word_tokens"]
