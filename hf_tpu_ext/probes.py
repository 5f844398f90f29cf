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

Formats (:func:`parse_probes`):

* plain lines: ``<sentence>[ | <sentence>...] ⇒ <answer>[ | <distractor>...]`` (or ``=>``; split at the last
  arrow); blank lines and lines starting with ``#`` are skipped;
* CSV (or TSV): columns ``text`` and ``answer`` named in a header (aliases ``sentence``/``input`` and
  ``target``/``label``), an optional ``distractors`` column, or, without such a header, the first two columns;
  ``|`` separates templates and distractors inside a cell;
* JSONL: one object per line with the same keys; ``text`` and ``distractors`` may also be lists.

The mask may be written ``<mask>`` or ``[MASK]`` (any case); it is replaced by the tokenizer's mask token.

Scoring (:func:`score_encoded`): a candidate of k tokens (its tokenization at the mask: after a space the
spaced form, ``Ġparis``) is scored by replacing the one mask by k masks and summing log-probabilities
left to right, :func:`candidate_rows` (PLL-word-l2r: Kauf & Ivanova, ACL 2023). Log-probabilities are
those of the softmax over the non-special vocabulary, in nats. The rank of the answer is
``1 + (number of competitors with a strictly greater score)``; competitors are the distractors when the
probe gives them, else every single non-special vocabulary entry at the (one) mask (for a multi-token answer
all but its own first token, which is a piece of the answer rather than a rival), so a single-token answer
without distractors gets exactly the rank of the single-mask ranking (the figures of earlier versions).
top-1 and top-5 accuracy are the shares of probes with rank <= 1 and <= 5; MRR is the mean of ``1 / rank``
(Voorhees, TREC-8 QA track, 1999; no cut-off). ``loglik`` is the mean log-probability of the whole answer
string and ``loglik_per_char`` the mean of that divided by the answer's characters: a probability of a string,
so comparable across tokenizers (a 3-token answer is not penalised for a vocabulary that splits it more
finely, apart from the model's own uncertainty).
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
SEPARATOR = "|"  # between templates (before the arrow) and between answer and distractors (after it)
DISTRACTOR_KEYS = ("distractors", "candidates", "choices")
_REPLACEMENT = "\ufffd"  # what a lone byte of a multi-byte UTF-8 character decodes to


class ProbeError(ValueError):
    """A probe set that cannot be scored; the message names the lines and what to change."""


@dataclass(frozen=True)
class Probe:
    """One cloze probe.

    Attributes:
        text: the sentence with one mask, spelled ``<mask>`` here (the tokenizer's token at encoding time).
        answer: the expected answer (one or more words), stripped.
        line: 1-based line (row) of the source, for messages; probes of one line are one fact.
        distractors: the other candidates the answer is ranked against (empty: the whole vocabulary).
        template: 0-based index of this wording among the templates of its line.
    """

    text: str
    answer: str
    line: int
    distractors: Tuple[str, ...] = ()
    template: int = 0


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
    ti, ai, di = _pick(header, TEXT_KEYS), _pick(header, ANSWER_KEYS), _pick(header, DISTRACTOR_KEYS)
    if ti is not None and ai is not None:
        ti, ai = header.index(ti), header.index(ai)
        di = header.index(di) if di is not None else None
        table = table[1:]
    else:
        ti, ai, di = 0, 1, None
    rows, bad = [], []
    for n, row in table:
        if len(row) <= max(ti, ai):
            bad.append(n)
            continue
        answer = row[ai].strip()
        if di is not None and di < len(row) and row[di].strip():
            answer = f"{answer} {SEPARATOR} {row[di].strip()}"
        rows.append((n, row[ti].strip(), answer))
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
        dk = _pick(list(obj), DISTRACTOR_KEYS)
        answer = str(obj[ak]).strip()
        if dk is not None and obj[dk]:
            answer = f" {SEPARATOR} ".join([answer, *(_as_list(obj[dk]))])
        rows.append((n, f" {SEPARATOR} ".join(_as_list(obj[tk])), answer))
    return rows


def _as_list(value) -> List[str]:
    """A JSON value as strings: a list's items, or one string (``|`` inside it separates items later)."""
    return [str(v).strip() for v in value] if isinstance(value, list) else [str(value).strip()]


def _split(field: str) -> List[str]:
    return [part.strip() for part in field.split(SEPARATOR)]


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
        The probes in source order, masks spelled ``<mask>``: one :class:`Probe` per template of a line
        (``template`` 0, 1, ...), each with the line's answer and distractors (duplicates and the answer itself
        dropped from the distractors).

    Raises:
        ProbeError: an unknown format, an empty set, more than :data:`MAX_PROBES` probes, a malformed line
            (no arrow, bad JSON, missing column), a template without exactly one mask, or an empty answer.
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
    for n, sentences, answers in rows:
        templates = [t for t in _split(sentences) if t] if SEPARATOR in sentences else [sentences.strip()]
        counts = [len(MASK_RE.findall(t)) for t in templates] or [0]
        if any(c != 1 for c in counts):
            wrong_masks.append((n, next(c for c in counts if c != 1)))
            continue
        answer, *others = _split(answers) if SEPARATOR in answers else [answers.strip()]
        if not answer:
            no_answer.append(n)
            continue
        distractors = tuple(dict.fromkeys(d for d in others if d and d != answer))
        for i, template in enumerate(templates):
            probes.append(Probe(MASK_RE.sub("<mask>", template), answer, n, distractors, i))
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


def candidate_ids(tokenizer, text: str, word: str, blocked: np.ndarray) -> Tuple[Optional[List[int]], Optional[str]]:
    """The token ids a candidate answer is at the mask of ``text``: the tokenization of the word after a space
    (``" paris"`` -> ``Ġparis``) when whitespace precedes the mask, else of the bare word, since that is what the
    tokenizer would produce for the filled sentence.

    Returns:
        ``(ids, None)`` (one or more ids), or ``(None, reason)`` when the word encodes to nothing or to special
        ids (e.g. ``<unk>`` for a character the vocabulary lacks).
    """
    at = MASK_RE.search(text)
    spaced = at is not None and at.start() > 0 and text[at.start() - 1].isspace()
    form = (" " if spaced else "") + word.strip()
    ids = [int(i) for i in tokenizer(form, add_special_tokens=False)["input_ids"]]
    if not ids:
        return None, f"{word.strip()!r} encodes to no tokens"
    bad = [i for i in ids if not 0 <= i < len(blocked) or blocked[i]]
    if bad:
        return None, (f"{word.strip()!r} is tokenized with special tokens {tokenizer.convert_ids_to_tokens(bad)} "
                      "(characters this vocabulary lacks)")
    return ids, None


def _where(probe: Probe) -> str:
    return f"line {probe.line}" + (f" (template {probe.template + 1})" if probe.template else "")


def encode_probes(probes: Sequence[Probe], tokenizer, vocab_size: int, max_length: int,
                  strict: bool = True) -> EncodedProbes:
    """Tokenize probes and their candidates (see :func:`candidate_ids`).

    Args:
        probes: from :func:`parse_probes`.
        tokenizer: a ``transformers`` tokenizer with a mask token.
        vocab_size: rows of the model's output layer.
        max_length: most tokens one probe may have, special tokens included, with its longest candidate's
            k masks in place of the one mask.
        strict: raise on the first unscorable probes (the training run's ``--probe_file``, ``hf-tpu probe
            --strict``); ``False``: list them in ``skipped`` and score the rest.

    Raises:
        ProbeError: the tokenizer has no mask token; with ``strict``, probes that are too long, whose mask
            does not survive tokenization or whose answer or a distractor encodes to special tokens (the
            message lists the first lines and reasons); without ``strict``, only when no probe is left.
    """
    if tokenizer.mask_token is None:
        raise ProbeError("The tokenizer has no mask token, so it cannot score cloze probes.")
    blocked = blocked_ids(tokenizer, vocab_size)
    texts = [p.text.replace("<mask>", tokenizer.mask_token) for p in probes]
    enc = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"] if texts else []
    out = EncodedProbes([], [], [], [])
    problems: List[Tuple[Probe, str]] = []
    for probe, ids in zip(probes, enc):
        positions = [i for i, t in enumerate(ids) if t == tokenizer.mask_token_id]
        if len(positions) != 1:
            problems.append((probe, "the mask did not survive tokenization"))
            continue
        cands, reason = [], None
        for word in (probe.answer, *probe.distractors):
            ids_w, why = candidate_ids(tokenizer, probe.text, word, blocked)
            if ids_w is None:
                reason = ("answer " if word == probe.answer else "distractor ") + why
                break
            cands.append(ids_w)
        if reason:
            problems.append((probe, reason))
            continue
        longest = len(ids) + max(len(c) for c in cands) - 1
        if longest > max_length:
            k = max(len(c) for c in cands)
            problems.append((probe, f"{len(ids)} tokens, the model reads at most {max_length}" if k == 1 else
                             f"{longest} tokens with {k} masks for the longest candidate, the model reads at most "
                             f"{max_length}"))
            continue
        out.input_ids.append(list(ids))
        out.mask_index.append(positions[0])
        out.answer_ids.append(cands[0][0])
        out.candidates.append(cands)
        out.probes.append(probe)
    listed = "; ".join(f"{_where(p)}: {why}" for p, why in problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    if problems and (strict or not out.probes):
        raise ProbeError(f"{len(problems)} of {len(probes)} probes cannot be scored{more}: {listed}. "
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
    """
    import time

    start = time.perf_counter()
    n = len(encoded.input_ids)
    cands = encoded.candidates or [[[a]] for a in encoded.answer_ids]
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
            elif len(cands[i][0]) == 1:  # one token against the vocabulary: on the logits, as answer_ranks
                ranks[i] = answer_ranks(logits[b: b + 1], np.asarray([cands[i][0][0]]), blocked)[0]
            else:  # k tokens against every single vocabulary entry at the one mask but the answer's first token
                rivals = ~blocked[: lp.shape[1]].copy()
                rivals[cands[i][0][0]] = False  # a piece of the answer, not a rival word
                ranks[i] = 1 + int((lp[b][rivals] > scores[i][0]).sum())
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
