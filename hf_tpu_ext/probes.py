"""Cloze probes: parse probe sets, map answers to vocabulary ids, score top-1/top-5 accuracy and MRR.

A probe is a sentence with exactly one mask and the word expected there::

    The capital of France is <mask>. ⇒ Paris

Framework-free (stdlib + numpy + a ``transformers`` tokenizer object): the Gradio Space (``app.py``, where
``hf-tpu deploy-space`` uploads this file as ``probes.py``), ``hf-tpu probe`` and the training run's
``--probe_file`` all score with this module, so they give the same numbers for the same weights.

Formats (:func:`parse_probes`):

* plain lines: ``<sentence> ⇒ <answer>`` (or ``=>``; split at the last arrow); blank lines and lines
  starting with ``#`` are skipped;
* CSV (or TSV): columns ``text`` and ``answer`` named in a header (aliases ``sentence``/``input`` and
  ``target``/``label``), or, without such a header, the first two columns;
* JSONL: one object per line with the same keys.

The mask may be written ``<mask>`` or ``[MASK]`` (any case); it is replaced by the tokenizer's mask token.

Scoring (:func:`score_probes`): the rank of the answer among the candidates at the mask position is
``1 + (number of candidate ids whose logit is strictly greater than the answer's)``, candidates being the
vocabulary without special tokens (as in the demo). top-1 and top-5 accuracy are the shares of probes with
rank <= 1 and <= 5; MRR is the mean of ``1 / rank`` (Voorhees, TREC-8 QA track, 1999; no cut-off).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

ARROWS = ("\u21d2", "=>")  # "⇒" and its ASCII spelling
MASK_RE = re.compile(r"<\s*mask\s*>|\[\s*mask\s*\]", re.IGNORECASE)
TEXT_KEYS = ("text", "sentence", "input", "prompt")
ANSWER_KEYS = ("answer", "target", "label", "word")
FORMATS = ("lines", "csv", "tsv", "jsonl")
MAX_PROBES = 100_000
TOP_KS = (1, 5)
_REPLACEMENT = "\ufffd"  # what a lone byte of a multi-byte UTF-8 character decodes to


class ProbeError(ValueError):
    """A probe set that cannot be scored; the message names the lines and what to change."""


@dataclass(frozen=True)
class Probe:
    """One cloze probe.

    Attributes:
        text: the sentence with one mask, spelled ``<mask>`` here (the tokenizer's token at encoding time).
        answer: the expected word, stripped.
        line: 1-based line (row) of the source, for messages.
    """

    text: str
    answer: str
    line: int


# --------------------------------------------------------------------------------------------- parsing


def detect_format(text: str) -> str:
    """Guess the format of pasted probe text: ``"jsonl"`` (starts with ``{``), ``"lines"`` (any line has an
    arrow, or no separator at all), ``"tsv"`` (tabs, no commas) or ``"csv"``."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        return "lines"
    if lines[0].startswith("{"):
        return "jsonl"
    if any(a in ln for ln in lines for a in ARROWS):
        return "lines"
    if "\t" in lines[0] and "," not in lines[0]:
        return "tsv"
    return "csv" if "," in lines[0] else "lines"


def _pick(keys: Sequence[str], wanted: Sequence[str]) -> Optional[str]:
    lowered = {k.strip().lower(): k for k in keys}
    return next((lowered[w] for w in wanted if w in lowered), None)


def _parse_lines(text: str) -> List[Tuple[int, str, str]]:
    rows, bad = [], []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cut = max(line.rfind(a) for a in ARROWS)
        if cut < 0:
            bad.append(n)
            continue
        arrow = next(a for a in ARROWS if line.startswith(a, cut))
        rows.append((n, line[:cut].strip(), line[cut + len(arrow):].strip()))
    if bad:
        raise ProbeError(f"{_lines(bad)} {'has' if len(bad) == 1 else 'have'} no arrow: write "
                         "'The capital of France is <mask>. \u21d2 Paris' (or '=>').")
    return rows


def _parse_csv(text: str, delimiter: str) -> List[Tuple[int, str, str]]:
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    table = [(n, row) for n, row in enumerate(reader, start=1) if any(c.strip() for c in row)]
    if not table:
        return []
    header = table[0][1]
    ti, ai = _pick(header, TEXT_KEYS), _pick(header, ANSWER_KEYS)
    if ti is not None and ai is not None:
        ti, ai = header.index(ti), header.index(ai)
        table = table[1:]
    else:
        ti, ai = 0, 1
    rows, bad = [], []
    for n, row in table:
        if len(row) <= max(ti, ai):
            bad.append(n)
            continue
        rows.append((n, row[ti].strip(), row[ai].strip()))
    if bad:
        raise ProbeError(f"{_lines(bad)} {'has' if len(bad) == 1 else 'have'} fewer than 2 columns: "
                         "give a text column and an answer column (header 'text,answer').")
    return rows


def _parse_jsonl(text: str) -> List[Tuple[int, str, str]]:
    rows = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ProbeError(f"line {n} is not valid JSON ({err.msg}); one object per line, e.g. "
                             '{"text": "The capital of France is <mask>.", "answer": "Paris"}.') from None
        if not isinstance(obj, dict):
            raise ProbeError(f"line {n} is not a JSON object; write "
                             '{"text": "The capital of France is <mask>.", "answer": "Paris"}.')
        tk, ak = _pick(list(obj), TEXT_KEYS), _pick(list(obj), ANSWER_KEYS)
        if tk is None or ak is None:
            raise ProbeError(f"line {n} needs the keys 'text' and 'answer', got {sorted(obj)}.")
        rows.append((n, str(obj[tk]).strip(), str(obj[ak]).strip()))
    return rows


def _lines(numbers: Sequence[int], limit: int = 5) -> str:
    shown = ", ".join(str(n) for n in numbers[:limit])
    more = f" and {len(numbers) - limit} more" if len(numbers) > limit else ""
    return f"line{'s' if len(numbers) > 1 else ''} {shown}{more}"


def parse_probes(text: str, fmt: Optional[str] = None) -> List[Probe]:
    """Parse a probe set.

    Args:
        text: the probe set's text (a file's content or pasted lines).
        fmt: one of :data:`FORMATS`, or ``None`` to guess with :func:`detect_format`.

    Returns:
        The probes in source order, masks spelled ``<mask>``.

    Raises:
        ProbeError: an unknown format, an empty set, more than :data:`MAX_PROBES` probes, a malformed line
            (no arrow, bad JSON, missing column), a line without exactly one mask, or an empty answer.
            The message names the first offending lines.
    """
    fmt = (fmt or detect_format(text)).lower()
    if fmt not in FORMATS:
        raise ProbeError(f"Unknown probe format {fmt!r}; use one of: {', '.join(FORMATS)}.")
    if fmt == "lines":
        rows = _parse_lines(text)
    elif fmt == "jsonl":
        rows = _parse_jsonl(text)
    else:
        rows = _parse_csv(text, "\t" if fmt == "tsv" else ",")
    if not rows:
        raise ProbeError("The probe set is empty: give lines like 'The capital of France is <mask>. \u21d2 Paris'.")
    if len(rows) > MAX_PROBES:
        raise ProbeError(f"The probe set has {len(rows)} probes; at most {MAX_PROBES} are scored at once, split it.")
    probes, wrong_masks, no_answer = [], [], []
    for n, sentence, answer in rows:
        count = len(MASK_RE.findall(sentence))
        if count != 1:
            wrong_masks.append((n, count))
            continue
        if not answer:
            no_answer.append(n)
            continue
        probes.append(Probe(MASK_RE.sub("<mask>", sentence), answer, n))
    if wrong_masks:
        detail = "; ".join(f"line {n}: {c} masks" for n, c in wrong_masks[:5])
        raise ProbeError(f"A probe has exactly one <mask> (or [MASK]): {detail}"
                         + (f" and {len(wrong_masks) - 5} more" if len(wrong_masks) > 5 else "") + ".")
    if no_answer:
        raise ProbeError(f"{_lines(no_answer)}: the answer after the arrow is empty.")
    return probes


def read_probe_file(path: str | os.PathLike) -> List[Probe]:
    """Read and parse a probe file; the format follows the extension (``.txt`` lines, ``.jsonl``/``.json``,
    ``.csv``, ``.tsv``), else it is guessed from the content.

    Raises:
        ProbeError: the file is missing, not UTF-8 text, or not a valid probe set (see :func:`parse_probes`).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ProbeError(f"Probe file {path} does not exist.")
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise ProbeError(f"Probe file {path} is not UTF-8 text (byte {err.start}); save it as UTF-8.") from None
    ext = os.path.splitext(path)[1].lower()
    fmt = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv", ".txt": "lines"}.get(ext)
    try:
        return parse_probes(text, fmt)
    except ProbeError as err:
        raise ProbeError(f"{os.path.basename(path)}: {err}") from None


# ------------------------------------------------------------------------------ words -> vocabulary ids


def blocked_ids(tokenizer, vocab_size: int) -> np.ndarray:
    """Ids that are never candidates: special tokens and output rows no tokenizer entry maps to.

    Returns:
        bool ``[vocab_size]``, True where blocked.
    """
    special = set(tokenizer.all_special_ids)
    special.update(i for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items() if tok.special)
    blocked = np.zeros(vocab_size, dtype=bool)
    blocked[[i for i in special if 0 <= i < vocab_size]] = True
    blocked[min(len(tokenizer), vocab_size):] = True
    return blocked


@dataclass(frozen=True)
class WordToken:
    """A vocabulary entry a word was mapped to.

    Attributes:
        id: the vocabulary id.
        token_str: its decoded text, e.g. ``" city"`` (a leading space: the word after a space).
        raw_token: the vocabulary entry as stored, e.g. ``"Ġcity"``.
    """

    id: int
    token_str: str
    raw_token: str


def _pieces(tokenizer, text: str) -> List[str]:
    return tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])


def _single(tokenizer, form: str, blocked: np.ndarray) -> Optional[WordToken]:
    """The one id ``form`` encodes to when it is a whole-word token that decodes back to ``form``."""
    ids = tokenizer(form, add_special_tokens=False)["input_ids"]
    if len(ids) != 1 or not 0 <= ids[0] < len(blocked) or blocked[ids[0]]:
        return None
    decoded = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    if _REPLACEMENT in decoded or decoded.strip() != form.strip():
        return None
    return WordToken(int(ids[0]), decoded, tokenizer.convert_ids_to_tokens(int(ids[0])))


def word_tokens(tokenizer, word: str, blocked: np.ndarray) -> Tuple[List[WordToken], Optional[str]]:
    """Map a candidate word to the whole-word vocabulary entries it can be scored as.

    The word is looked up after a space (``" city"`` -> ``Ġcity`` in byte-level BPE, a word mid-sentence)
    and bare (``"city"``, a word at the start of a text); each form counts when it is one non-special token
    that decodes back to the form. A raw vocabulary entry (``"Ġcity"``) counts when it decodes to whole
    characters. A lone byte of a multi-byte character (``"é"`` as the byte entry ``é`` -> ``"\\ufffd"``) never
    counts.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        word: the word as typed (stripped here).
        blocked: bool ``[vocab_size]`` from :func:`blocked_ids`.

    Returns:
        ``(tokens, reason)``: the entries (spaced form first, no duplicates) and ``None``, or ``[]`` and
        why the word cannot be scored.
    """
    word = word.strip()
    found: List[WordToken] = []
    for form in (" " + word, word):
        tok = _single(tokenizer, form, blocked)
        if tok is not None and tok.id not in {t.id for t in found}:
            found.append(tok)
    vocab = tokenizer.get_vocab()
    raw_id = vocab.get(word)
    raw_reason = None
    if raw_id is not None and not found and 0 <= raw_id < len(blocked) and not blocked[raw_id]:
        decoded = tokenizer.decode([raw_id], clean_up_tokenization_spaces=False)
        if _REPLACEMENT in decoded:
            raw_reason = (f"its vocabulary entry {word!r} is one byte of a multi-byte character "
                          f"(it decodes to {decoded!r}), not a whole word")
        elif decoded.strip():
            found.append(WordToken(int(raw_id), decoded, word))
    if found:
        return found, None
    if not word:
        return [], "it is empty"
    if any(ch.isspace() for ch in word):
        return [], "it is several words; give one word"
    spaced, bare = _pieces(tokenizer, " " + word), _pieces(tokenizer, word)
    reason = (f"it is not one word-level token of this vocabulary: ' {word}' is {len(spaced)} tokens "
              f"{spaced} and '{word}' is {len(bare)} tokens {bare}")
    if raw_reason:
        reason += f"; {raw_reason}"
    return [], reason


def describe_mapping(word: str, tokens: Sequence[WordToken]) -> Optional[str]:
    """``"'city' is scored as ' city' (Ġcity) and 'city' (city)"``, or ``None`` when the word is scored as itself."""
    if len(tokens) == 1 and tokens[0].token_str == word.strip() and tokens[0].raw_token == word.strip():
        return None
    shown = " and ".join(f"{t.token_str!r} ({t.raw_token})" for t in tokens)
    return f"{word.strip()!r} is scored as {shown}"


def answer_token(tokenizer, text: str, answer: str, blocked: np.ndarray) -> Tuple[Optional[WordToken], Optional[str]]:
    """The vocabulary entry a probe's answer must be at its mask.

    After whitespace (``"... is <mask>."``) the spaced form (``Ġparis``) is the answer, at the start of the
    text or after a non-space character the bare form, since that is what the tokenizer would produce for
    the filled sentence.

    Returns:
        ``(token, None)`` or ``(None, reason)``.
    """
    at = MASK_RE.search(text)
    spaced = at is not None and at.start() > 0 and text[at.start() - 1].isspace()
    form = (" " if spaced else "") + answer.strip()
    tok = _single(tokenizer, form, blocked)
    if tok is not None:
        return tok, None
    _, reason = word_tokens(tokenizer, answer, blocked)
    where = "after a space" if spaced else "at the start of the text or glued to the previous character"
    pieces = _pieces(tokenizer, form)
    return None, (f"answer {answer.strip()!r} {where} is {len(pieces)} tokens {pieces}, not one word-level token"
                  if len(pieces) != 1 else f"answer {answer.strip()!r}: {reason}")


# ------------------------------------------------------------------------------------ encoding, scoring


@dataclass
class EncodedProbes:
    """Probes as token ids (no padding).

    Attributes:
        input_ids: one list of ids per probe, special tokens included.
        mask_index: position of the mask in each list.
        answer_ids: the answer's vocabulary id per probe.
        probes: the probes, same order.
    """

    input_ids: List[List[int]]
    mask_index: List[int]
    answer_ids: List[int]
    probes: List[Probe]


def encode_probes(probes: Sequence[Probe], tokenizer, vocab_size: int, max_length: int) -> EncodedProbes:
    """Tokenize probes and map their answers (see :func:`answer_token`).

    Args:
        probes: from :func:`parse_probes`.
        tokenizer: a ``transformers`` tokenizer with a mask token.
        vocab_size: rows of the model's output layer.
        max_length: most tokens one probe may have, special tokens included.

    Raises:
        ProbeError: the tokenizer has no mask token; probes longer than ``max_length``; answers that are not
            one word-level token. The message lists the first lines and reasons.
    """
    if tokenizer.mask_token is None:
        raise ProbeError("The tokenizer has no mask token, so it cannot score cloze probes.")
    blocked = blocked_ids(tokenizer, vocab_size)
    texts = [p.text.replace("<mask>", tokenizer.mask_token) for p in probes]
    enc = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
    out = EncodedProbes([], [], [], list(probes))
    problems = []
    for probe, ids in zip(probes, enc):
        if len(ids) > max_length:
            problems.append(f"line {probe.line}: {len(ids)} tokens, the model reads at most {max_length}")
            continue
        positions = [i for i, t in enumerate(ids) if t == tokenizer.mask_token_id]
        if len(positions) != 1:
            problems.append(f"line {probe.line}: the mask did not survive tokenization")
            continue
        tok, reason = answer_token(tokenizer, probe.text, probe.answer, blocked)
        if tok is None:
            problems.append(f"line {probe.line}: {reason}")
            continue
        out.input_ids.append(list(ids))
        out.mask_index.append(positions[0])
        out.answer_ids.append(tok.id)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ProbeError(f"{len(problems)} of {len(probes)} probes cannot be scored{more}: "
                         + "; ".join(problems[:5]) + ". Fix or remove those lines.")
    return out


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
    """

    n: int
    top1: float
    top5: float
    mrr: float
    ranks: List[int] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self, with_ranks: bool = False) -> Dict[str, object]:
        d: Dict[str, object] = {"n": self.n, "top1": self.top1, "top5": self.top5, "mrr": self.mrr,
                                "seconds": round(self.seconds, 4)}
        if with_ranks:
            d["ranks"] = list(self.ranks)
        return d

    def log_entry(self, prefix: str = "probe_") -> Dict[str, float]:
        """``{"probe_top1": ..., "probe_top5": ..., "probe_mrr": ..., "probe_n": ...}`` for a log history."""
        return {f"{prefix}top1": self.top1, f"{prefix}top5": self.top5, f"{prefix}mrr": self.mrr,
                f"{prefix}n": self.n}


def score_encoded(encoded: EncodedProbes, mask_logits: MaskLogitsFn, blocked: np.ndarray, pad_id: int,
                  batch_size: int = 64, pad_to: Optional[int] = None) -> ProbeResult:
    """Score encoded probes with a model.

    Probes are sorted by length and run ``batch_size`` at a time (less padding), then put back in order.

    Args:
        encoded: from :func:`encode_probes`.
        mask_logits: ``(input_ids int64 [B, L], attention_mask int64 [B, L], mask_index int64 [B])`` ->
            float ``[B, V]``, the logits at each row's mask (a framework's forward pass).
        blocked: bool ``[V]`` from :func:`blocked_ids`.
        pad_id: the tokenizer's pad id.
        batch_size: probes per forward pass.
        pad_to: pad every batch to this length (static shapes); ``None``: the batch's longest probe.

    Returns:
        A :class:`ProbeResult`.
    """
    import time

    start = time.perf_counter()
    n = len(encoded.input_ids)
    order = sorted(range(n), key=lambda i: len(encoded.input_ids[i]))
    ranks = np.zeros(n, dtype=np.int64)
    for s in range(0, n, batch_size):
        idx = order[s: s + batch_size]
        ids, attn = pad_batch([encoded.input_ids[i] for i in idx], pad_id, pad_to)
        pos = np.asarray([encoded.mask_index[i] for i in idx], dtype=np.int64)
        logits = np.asarray(mask_logits(ids, attn, pos))
        ranks[idx] = answer_ranks(logits, np.asarray([encoded.answer_ids[i] for i in idx]), blocked)
    summary = summarize_ranks(ranks)
    return ProbeResult(summary["n"], summary["top1"], summary["top5"], summary["mrr"], ranks.tolist(),
                       time.perf_counter() - start)


def score_probes(probes: Sequence[Probe], tokenizer, mask_logits: MaskLogitsFn, vocab_size: int, max_length: int,
                 batch_size: int = 64, pad_to: Optional[int] = None) -> ProbeResult:
    """Encode and score probes in one call (see :func:`encode_probes` and :func:`score_encoded`).

    Raises:
        ProbeError: see :func:`encode_probes`.
    """
    encoded = encode_probes(probes, tokenizer, vocab_size, max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return score_encoded(encoded, mask_logits, blocked_ids(tokenizer, vocab_size), pad_id, batch_size, pad_to)
