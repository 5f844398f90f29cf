"""Encoded probes -> ranks, top-1/top-5, MRR and answer log-likelihood (see the package docstring for the rules).

Framework-free: the forward pass is a ``mask_logits`` function the caller gives (PyTorch or TensorFlow).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from hf_tpu_ext.probes.parsing import Probe, ProbeError
from hf_tpu_ext.probes.vocabulary import blocked_ids, candidate_ids

TOP_KS = (1, 5)


@dataclass
class EncodedProbes:
    """Probes as token ids (no padding), with the token ids of every candidate.

    Attributes:
        input_ids: one list of ids per scored probe, special tokens included, with one mask.
        mask_index: position of the mask in each list.
        answer_ids: the first token id of each answer (the answer's id when it is one token).
        probes: the scored probes, same order.
        candidates: per probe, the token ids of each candidate at the mask: ``[answer, distractor, ...]``.
        skipped: ``(probe, reason)`` of the probes that cannot be scored (empty with ``strict=True``).
    """

    input_ids: List[List[int]]
    mask_index: List[int]
    answer_ids: List[int]
    probes: List[Probe]
    candidates: List[List[List[int]]] = field(default_factory=list)
    skipped: List[Tuple[Probe, str]] = field(default_factory=list)



def _where(probe: Probe) -> str:
    return f"line {probe.line}" + (f" (template {probe.template + 1})" if probe.template else "")


def multi_token_reason(tokenizer, probe: Probe, answer_ids: Sequence[int]) -> str:
    """Why a probe whose answer is several tokens and that has no distractors is not scored (see the package
    docstring: a k-token answer's summed log-probability against single vocabulary tokens always comes last)."""
    pieces = tokenizer.convert_ids_to_tokens(list(answer_ids))
    return (f"answer {probe.answer!r} is {len(pieces)} tokens {pieces} and the line has no distractors to rank it "
            f"against (it would rank last against single tokens): add some, '\u21d2 {probe.answer} | other | ...'")


def _encode_one(probe: Probe, ids: List[int], tokenizer, blocked: np.ndarray,
                max_length: int) -> Tuple[Optional[Tuple[int, List[List[int]]]], Optional[str]]:
    """``((mask position, candidate ids), None)`` for a scorable probe, else ``(None, reason)``."""
    positions = [i for i, t in enumerate(ids) if t == tokenizer.mask_token_id]
    if len(positions) != 1:
        return None, "the mask did not survive tokenization"
    cands = []
    for word in (probe.answer, *probe.distractors):
        ids_w, why = candidate_ids(tokenizer, probe.text, word, blocked)
        if ids_w is None:
            return None, ("answer " if word == probe.answer else "distractor ") + why
        cands.append(ids_w)
    if len(cands) == 1 and len(cands[0]) > 1:
        return None, multi_token_reason(tokenizer, probe, cands[0])
    k = max(len(c) for c in cands)
    longest = len(ids) + k - 1
    if longest > max_length:
        return None, (f"{len(ids)} tokens, the model reads at most {max_length}" if k == 1 else
                      f"{longest} tokens with {k} masks for the longest candidate, the model reads at most "
                      f"{max_length}")
    return (positions[0], cands), None


def encode_probes(probes: Sequence[Probe], tokenizer, vocab_size: int, max_length: int,
                  strict: bool = True) -> EncodedProbes:
    """Tokenize probes and their candidates (see :func:`candidate_ids`).

    Args:
        probes: from :func:`parse_probes` (a :class:`ProbeSet`'s ``malformed`` lines count as unscorable).
        tokenizer: a ``transformers`` tokenizer with a mask token.
        vocab_size: rows of the model's output layer.
        max_length: most tokens one probe may have, special tokens included, with its longest candidate's
            k masks in place of the one mask.
        strict: raise on the first unscorable probes (the training run's ``--probe_file``, ``hf-tpu probe
            --strict``); ``False``: list them in ``skipped`` and score the rest.

    Raises:
        ProbeError: the tokenizer has no mask token; with ``strict``, malformed lines, probes that are too long,
            whose mask does not survive tokenization, whose answer or a distractor encodes to special tokens, or
            whose answer is several tokens with no distractors (the message lists the first lines and reasons);
            without ``strict``, only when no probe is left.
    """
    if tokenizer.mask_token is None:
        raise ProbeError("The tokenizer has no mask token, so it cannot score cloze probes.")
    blocked = blocked_ids(tokenizer, vocab_size)
    texts = [p.text.replace("<mask>", tokenizer.mask_token) for p in probes]
    enc = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"] if texts else []
    out = EncodedProbes([], [], [], [])
    # a malformed line has no Probe: a placeholder carries its line number into the skipped list
    problems: List[Tuple[Probe, str]] = [(Probe("", "", n), why) for n, why in getattr(probes, "malformed", [])]
    for probe, ids in zip(probes, enc):
        encoded, reason = _encode_one(probe, list(ids), tokenizer, blocked, max_length)
        if encoded is None:
            problems.append((probe, reason))
            continue
        out.input_ids.append(list(ids))
        out.mask_index.append(encoded[0])
        out.answer_ids.append(encoded[1][0][0])
        out.candidates.append(encoded[1])
        out.probes.append(probe)
    problems.sort(key=lambda pw: (pw[0].line, pw[0].template))
    listed = "; ".join(f"{_where(p)}: {why}" for p, why in problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    total = len(probes) + len(getattr(probes, "malformed", []))
    if problems and (strict or not out.probes):
        raise ProbeError(f"{len(problems)} of {total} probes cannot be scored{more}: {listed}. "
                         "Fix or remove those lines.")
    out.skipped = problems
    return out


def candidate_rows(input_ids: Sequence[int], mask_index: int, candidate: Sequence[int],
                   mask_id: int) -> List[Tuple[List[int], int, int]]:
    """The forward-pass rows that score one candidate of k tokens, left to right.

    The probe's one mask is replaced by k masks; row i has the candidate's first i tokens filled in and tokens
    i..k-1 masked, and asks for token i at position ``mask_index + i``. The candidate's score is the sum of the
    k log-probabilities: ``log p(t_1 | ctx) + log p(t_2 | ctx, t_1) + ...`` (PLL-word-l2r, Kauf & Ivanova,
    "A Better Way to Do Masked Language Model Scoring", ACL 2023). Left to right rather than all-at-once
    (every token predicted with all k masked): it is the chain rule of the answer's probability, so the sum
    is the log-probability of the whole string and is comparable between candidates of different lengths and
    between tokenizers; all-at-once treats the k tokens as independent and scores any multi-token word too
    low. It costs k rows per candidate instead of one, all in the same batched forward passes. For k = 1 the
    one row is the probe itself.

    Returns:
        ``[(ids, position, target id)]``, k entries.
    """
    ids = list(input_ids)
    k = len(candidate)
    rows = []
    for i in range(k):
        row = ids[:mask_index] + list(candidate[:i]) + [mask_id] * (k - i) + ids[mask_index + 1:]
        rows.append((row, mask_index + i, int(candidate[i])))
    return rows


def log_softmax(logits: np.ndarray, blocked: np.ndarray) -> np.ndarray:
    """float64 ``[N, V]`` log-probabilities of the softmax over the non-blocked ids (blocked ids: ``-inf``)."""
    x = np.array(logits[:, : len(blocked)], dtype=np.float64)
    x[:, blocked[: x.shape[1]]] = -np.inf
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def pad_batch(input_ids: Sequence[Sequence[int]], pad_id: int, length: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Right-pad id lists.

    Args:
        input_ids: B lists of ids.
        pad_id: the tokenizer's pad id.
        length: pad to this length (static shapes, e.g. for XLA); ``None``: the longest list.

    Returns:
        ``(input_ids, attention_mask)``, int64 ``[B, L]`` each.
    """
    width = length or max(len(x) for x in input_ids)
    ids = np.full((len(input_ids), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(input_ids), width), dtype=np.int64)
    for row, seq in enumerate(input_ids):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def answer_ranks(logits: np.ndarray, answer_ids: np.ndarray, blocked: np.ndarray) -> np.ndarray:
    """Rank of each answer among the candidates.

    Args:
        logits: float ``[N, V]`` at the mask positions (any monotone score works: logits or log-probs).
        answer_ids: int ``[N]``.
        blocked: bool ``[V]`` (see :func:`blocked_ids`).

    Returns:
        int64 ``[N]``: ``1 + number of non-blocked ids with a strictly greater logit``.
    """
    logits = np.asarray(logits, dtype=np.float64)
    target = logits[np.arange(len(answer_ids)), answer_ids][:, None]
    return 1 + ((logits > target) & ~blocked[None, : logits.shape[1]]).sum(axis=1).astype(np.int64)


def summarize_ranks(ranks: Iterable[int]) -> Dict[str, float]:
    """``{"n": int, "top1": float, "top5": float, "mrr": float}`` (accuracies and MRR in [0, 1])."""
    r = np.asarray(list(ranks), dtype=np.float64)
    if r.size == 0:
        return {"n": 0, "top1": 0.0, "top5": 0.0, "mrr": 0.0}
    out: Dict[str, float] = {"n": int(r.size)}
    for k in TOP_KS:
        out[f"top{k}"] = float((r <= k).mean())
    out["mrr"] = float((1.0 / r).mean())
    return out


MaskLogitsFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class ProbeResult:
    """Scores of one model on one probe set.

    Attributes:
        n, top1, top5, mrr: probes scored, top-1/top-5 accuracy and mean reciprocal rank (floats in [0, 1]).
        ranks: rank of the answer per probe, in probe order.
        seconds: wall time of the forward passes and ranking.
        logprobs: the answer's log-probability per probe (nats, summed over its tokens; see
            :func:`candidate_rows`).
        chars: the answer's length in characters per probe.
        num_tokens: the answer's tokens per probe.
        lines, templates: source line (= fact) and template index per probe.
        skipped: ``(line, template, reason)`` of the probes not scored.
        loglik: mean of ``logprobs``; loglik_per_char: mean of ``logprobs / chars`` (nats per character).
    """

    n: int
    top1: float
    top5: float
    mrr: float
    ranks: List[int] = field(default_factory=list)
    seconds: float = 0.0
    logprobs: List[float] = field(default_factory=list)
    chars: List[int] = field(default_factory=list)
    num_tokens: List[int] = field(default_factory=list)
    lines: List[int] = field(default_factory=list)
    templates: List[int] = field(default_factory=list)
    skipped: List[Tuple[int, int, str]] = field(default_factory=list)
    loglik: float = 0.0
    loglik_per_char: float = 0.0

    def as_dict(self, with_ranks: bool = False) -> Dict[str, object]:
        d: Dict[str, object] = {"n": self.n, "top1": self.top1, "top5": self.top5, "mrr": self.mrr,
                                "loglik": self.loglik, "loglik_per_char": self.loglik_per_char,
                                "multi_token": sum(1 for k in self.num_tokens if k > 1),
                                "skipped": [{"line": ln, "template": t, "reason": r} for ln, t, r in self.skipped],
                                "seconds": round(self.seconds, 4)}
        if with_ranks:
            d["ranks"] = list(self.ranks)
            d["logprobs"] = list(self.logprobs)
        return d

    def log_entry(self, prefix: str = "probe_") -> Dict[str, float]:
        """``{"probe_top1": ..., "probe_top5": ..., "probe_mrr": ..., "probe_n": ...}`` for a log history."""
        return {f"{prefix}top1": self.top1, f"{prefix}top5": self.top5, f"{prefix}mrr": self.mrr,
                f"{prefix}n": self.n}


def _run_rows(rows: Sequence[Tuple[List[int], int]], mask_logits: MaskLogitsFn, pad_id: int, batch_size: int,
              pad_to: Optional[int]):
    """Yield ``(row indices, logits float [B, V])`` over ``rows`` (``(ids, position)``), sorted by length."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    for s in range(0, len(order), batch_size):
        idx = order[s: s + batch_size]
        ids, attn = pad_batch([rows[i][0] for i in idx], pad_id, pad_to)
        pos = np.asarray([rows[i][1] for i in idx], dtype=np.int64)
        yield idx, np.asarray(mask_logits(ids, attn, pos))


def score_encoded(encoded: EncodedProbes, mask_logits: MaskLogitsFn, blocked: np.ndarray, pad_id: int,
                  batch_size: int = 64, pad_to: Optional[int] = None, mask_id: Optional[int] = None) -> ProbeResult:
    """Score encoded probes with a model.

    Two sweeps of batched forward passes, rows sorted by length (less padding): first the left-to-right rows
    of every candidate of two or more tokens (:func:`candidate_rows`), then each probe as written (one mask),
    which scores the one-token candidates and, for a probe without distractors, every vocabulary entry the
    answer is ranked against. A one-token answer without distractors is ranked on the logits, exactly as
    :func:`answer_ranks`.

    Args:
        encoded: from :func:`encode_probes`.
        mask_logits: ``(input_ids int64 [B, L], attention_mask int64 [B, L], mask_index int64 [B])`` ->
            float ``[B, V]``, the logits at one position per row (a framework's forward pass).
        blocked: bool ``[V]`` from :func:`blocked_ids`.
        pad_id: the tokenizer's pad id.
        batch_size: rows per forward pass.
        pad_to: pad every batch to this length (static shapes); ``None``: the batch's longest row.
        mask_id: the tokenizer's mask id (needed only when a candidate has several tokens; default: the id at
            the first probe's mask).

    Returns:
        A :class:`ProbeResult`.

    Raises:
        ProbeError: a probe with a multi-token answer and no distractors (:func:`encode_probes` skips those).
    """
    start = time.perf_counter()
    n = len(encoded.input_ids)
    cands = encoded.candidates or [[[a]] for a in encoded.answer_ids]
    lonely = [i for i in range(n) if len(cands[i]) == 1 and len(cands[i][0]) > 1]
    if lonely:  # encode_probes skips these; an EncodedProbes built by hand must not rank them either
        raise ProbeError(f"{len(lonely)} probes have a multi-token answer and no distractors to rank it against.")
    if mask_id is None and n:
        mask_id = encoded.input_ids[0][encoded.mask_index[0]]
    scores = [np.zeros(len(c), dtype=np.float64) for c in cands]
    multi = [(i, j, row) for i in range(n) for j, c in enumerate(cands[i]) if len(c) > 1
             for row in candidate_rows(encoded.input_ids[i], encoded.mask_index[i], c, mask_id)]
    for idx, logits in _run_rows([(r[0], r[1]) for _, _, r in multi], mask_logits, pad_id, batch_size, pad_to):
        lp = log_softmax(logits, blocked)
        for b, m in enumerate(idx):
            i, j, (_, _, target) = multi[m]
            scores[i][j] += lp[b, target]
    ranks = np.zeros(n, dtype=np.int64)
    rows = [(encoded.input_ids[i], encoded.mask_index[i]) for i in range(n)]
    for idx, logits in _run_rows(rows, mask_logits, pad_id, batch_size, pad_to):
        lp = log_softmax(logits, blocked)
        for b, i in enumerate(idx):
            for j, c in enumerate(cands[i]):
                if len(c) == 1:
                    scores[i][j] = lp[b, c[0]]
            if len(cands[i]) > 1:  # ranked against the distractors
                ranks[i] = 1 + int((scores[i][1:] > scores[i][0]).sum())
            else:  # one token against the vocabulary: on the logits, as answer_ranks
                ranks[i] = answer_ranks(logits[b: b + 1], np.asarray([cands[i][0][0]]), blocked)[0]
    summary = summarize_ranks(ranks)
    logprobs = [float(s[0]) for s in scores]
    chars = [max(1, len(p.answer)) for p in encoded.probes] if encoded.probes else [1] * n
    return ProbeResult(summary["n"], summary["top1"], summary["top5"], summary["mrr"], ranks.tolist(),
                       time.perf_counter() - start, logprobs=logprobs, chars=chars,
                       num_tokens=[len(c[0]) for c in cands],
                       lines=[p.line for p in encoded.probes], templates=[p.template for p in encoded.probes],
                       skipped=[(p.line, p.template, why) for p, why in encoded.skipped],
                       loglik=float(np.mean(logprobs)) if n else 0.0,
                       loglik_per_char=float(np.mean([lp / c for lp, c in zip(logprobs, chars)])) if n else 0.0)


def score_probes(probes: Sequence[Probe], tokenizer, mask_logits: MaskLogitsFn, vocab_size: int, max_length: int,
                 batch_size: int = 64, pad_to: Optional[int] = None, strict: bool = True) -> ProbeResult:
    """Encode and score probes in one call (see :func:`encode_probes` and :func:`score_encoded`).

    Raises:
        ProbeError: see :func:`encode_probes`.
    """
    encoded = encode_probes(probes, tokenizer, vocab_size, max_length, strict=strict)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return score_encoded(encoded, mask_logits, blocked_ids(tokenizer, vocab_size), pad_id, batch_size, pad_to,
                         mask_id=tokenizer.mask_token_id)