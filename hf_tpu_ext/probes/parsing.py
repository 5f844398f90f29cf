"""Probe sets as text -> :class:`Probe` s: plain lines, CSV/TSV, JSONL; templates and distractors.

A malformed line (no arrow, not exactly one mask, an empty answer, bad JSON, a missing column) is an error with
``strict=True`` (the training run's ``--probe_file``, ``hf-tpu probe --strict``); with ``strict=False`` it is
listed in :attr:`ProbeSet.malformed` and skipped, like a probe the tokenizer cannot score.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

ARROWS = ("\u21d2", "=>")  # "⇒" and its ASCII spelling
MASK_RE = re.compile(r"<\s*mask\s*>|\[\s*mask\s*\]", re.IGNORECASE)
TEXT_KEYS = ("text", "sentence", "input", "prompt")
ANSWER_KEYS = ("answer", "target", "label", "word")
FORMATS = ("lines", "csv", "tsv", "jsonl")
MAX_PROBES = 100_000
SEPARATOR = "|"  # between templates (before the arrow) and between answer and distractors (after it)
DISTRACTOR_KEYS = ("distractors", "candidates", "choices")
_EXAMPLE_JSON = '{"text": "The capital of France is <mask>.", "answer": "Paris"}'

Rows = List[Tuple[int, str, str]]  # (1-based line, templates field, answers field)
Malformed = List[Tuple[int, str]]  # (1-based line, why it is not a probe)


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


class ProbeSet(list):
    """The probes of a parsed set (a ``list`` of :class:`Probe`) and the malformed lines left out of it.

    Attributes:
        malformed: ``[(line, reason)]`` of the lines that are not probes (empty when parsed with ``strict``).
    """

    def __init__(self, probes: Iterable[Probe] = (), malformed: Sequence[Tuple[int, str]] = ()):
        super().__init__(probes)
        self.malformed: Malformed = list(malformed)


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


def _lines(numbers: Sequence[int], limit: int = 5) -> str:
    shown = ", ".join(str(n) for n in numbers[:limit])
    more = f" and {len(numbers) - limit} more" if len(numbers) > limit else ""
    return f"line{'s' if len(numbers) > 1 else ''} {shown}{more}"


def _has(numbers: Sequence[int]) -> str:
    return "has" if len(numbers) == 1 else "have"


def _parse_lines(text: str, malformed: Optional[Malformed]) -> Rows:
    """Rows of ``sentence ⇒ answer`` lines; lines without an arrow go to ``malformed`` (``None``: raise)."""
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
    _report_bad(bad, malformed, "no arrow: write 'The capital of France is <mask>. \u21d2 Paris' (or '=>').",
                "no arrow: write 'sentence with <mask> \u21d2 answer' (or '=>')")
    return rows


def _report_bad(bad: List[int], malformed: Optional[Malformed], error: str, reason: str) -> None:
    """The lines ``bad`` of a file: strict (``malformed`` None) one :class:`ProbeError` naming them and ``error``,
    else each listed in ``malformed`` with the short ``reason``."""
    if bad and malformed is None:
        raise ProbeError(f"{_lines(bad)} {_has(bad)} {error}")
    for n in bad:
        malformed.append((n, reason))


def _parse_csv(text: str, delimiter: str, malformed: Optional[Malformed]) -> Rows:
    """Rows of a CSV/TSV table (header ``text,answer[,distractors]`` or the first two columns)."""
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
    _report_bad(bad, malformed, "fewer than 2 columns: give a text column and an answer column (header 'text,answer').",
                "fewer than 2 columns (a text column and an answer column)")
    return rows


def _json_row(n: int, raw: str) -> Tuple[Optional[Tuple[int, str, str]], Optional[Tuple[str, str]]]:
    """``(row, None)`` or ``(None, (error message, short reason))`` for one JSONL line."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as err:
        return None, (f"line {n} is not valid JSON ({err.msg}); one object per line, e.g. {_EXAMPLE_JSON}.",
                      f"not valid JSON ({err.msg})")
    if not isinstance(obj, dict):
        return None, (f"line {n} is not a JSON object; write {_EXAMPLE_JSON}.", "not a JSON object")
    tk, ak = _pick(list(obj), TEXT_KEYS), _pick(list(obj), ANSWER_KEYS)
    if tk is None or ak is None:
        why = f"needs the keys 'text' and 'answer', got {sorted(obj)}"
        return None, (f"line {n} {why}.", why)
    dk = _pick(list(obj), DISTRACTOR_KEYS)
    answer = str(obj[ak]).strip()
    if dk is not None and obj[dk]:
        answer = f" {SEPARATOR} ".join([answer, *(_as_list(obj[dk]))])
    return (n, f" {SEPARATOR} ".join(_as_list(obj[tk])), answer), None


def _parse_jsonl(text: str, malformed: Optional[Malformed]) -> Rows:
    """Rows of one JSON object per line; with ``malformed`` ``None`` the first bad line raises."""
    rows = []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        row, problem = _json_row(n, raw)
        if problem is None:
            rows.append(row)
        elif malformed is None:
            raise ProbeError(problem[0])
        else:
            malformed.append((n, problem[1]))
    return rows


def _as_list(value) -> List[str]:
    """A JSON value as strings: a list's items, or one string (``|`` inside it separates items later)."""
    return [str(v).strip() for v in value] if isinstance(value, list) else [str(value).strip()]


def _split(field: str) -> List[str]:
    return [part.strip() for part in field.split(SEPARATOR)]


def _rows(text: str, fmt: str, malformed: Optional[Malformed]) -> Rows:
    if fmt == "lines":
        return _parse_lines(text, malformed)
    if fmt == "jsonl":
        return _parse_jsonl(text, malformed)
    return _parse_csv(text, "\t" if fmt == "tsv" else ",", malformed)


def _probes_of_rows(rows: Rows) -> Tuple[List[Probe], List[Tuple[int, int]], List[int]]:
    """``(probes, [(line, masks)] of lines with a template without exactly one mask, lines without an answer)``."""
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
    return probes, wrong_masks, no_answer


def parse_probes(text: str, fmt: Optional[str] = None, strict: bool = True) -> ProbeSet:
    """Parse a probe set.

    Args:
        text: the probe set's text (a file's content or pasted lines).
        fmt: one of :data:`FORMATS`, or ``None`` to guess with :func:`detect_format`.
        strict: a malformed line is an error (the training run's ``--probe_file``, ``hf-tpu probe --strict``);
            ``False``: it is listed in the result's ``malformed`` and skipped (``hf-tpu probe``, the test bench).

    Returns:
        A :class:`ProbeSet`: the probes in source order, masks spelled ``<mask>``, one :class:`Probe` per
        template of a line (``template`` 0, 1, ...), each with the line's answer and distractors (duplicates and
        the answer itself dropped from the distractors); ``malformed`` lists ``(line, reason)`` of the lines
        skipped (empty with ``strict``).

    Raises:
        ProbeError: an unknown format, an empty set, more than :data:`MAX_PROBES` probes; with ``strict``, a
            malformed line (no arrow, bad JSON, missing column, a template without exactly one mask, an empty
            answer); without it, only when no line is a probe. The message names the first offending lines.
    """
    fmt = (fmt or detect_format(text)).lower()
    if fmt not in FORMATS:
        raise ProbeError(f"Unknown probe format {fmt!r}; use one of: {', '.join(FORMATS)}.")
    malformed: Optional[Malformed] = None if strict else []
    rows = _rows(text, fmt, malformed)
    if not rows and not malformed:
        raise ProbeError("The probe set is empty: give lines like 'The capital of France is <mask>. \u21d2 Paris'.")
    if len(rows) > MAX_PROBES:
        raise ProbeError(f"The probe set has {len(rows)} probes; at most {MAX_PROBES} are scored at once, split it.")
    probes, wrong_masks, no_answer = _probes_of_rows(rows)
    if strict and wrong_masks:
        detail = "; ".join(f"line {n}: {c} masks" for n, c in wrong_masks[:5])
        raise ProbeError(f"A probe has exactly one <mask> (or [MASK]): {detail}"
                         + (f" and {len(wrong_masks) - 5} more" if len(wrong_masks) > 5 else "") + ".")
    if strict and no_answer:
        raise ProbeError(f"{_lines(no_answer)}: the answer after the arrow is empty.")
    if strict:
        return ProbeSet(probes)
    malformed += [(n, f"{c} masks: a probe has exactly one <mask> (or [MASK])") for n, c in wrong_masks]
    malformed += [(n, "the answer after the arrow is empty") for n in no_answer]
    malformed.sort()
    if not probes:
        listed = "; ".join(f"line {n}: {why}" for n, why in malformed[:5])
        more = f" (and {len(malformed) - 5} more)" if len(malformed) > 5 else ""
        raise ProbeError(f"No line of the probe set is a probe{more}: {listed}.")
    return ProbeSet(probes, malformed)


def read_probe_file(path: str | os.PathLike, strict: bool = True) -> ProbeSet:
    """Read and parse a probe file; the format follows the extension (``.txt`` lines, ``.jsonl``/``.json``,
    ``.csv``, ``.tsv``), else it is guessed from the content.

    Args:
        path: the probe file.
        strict: see :func:`parse_probes` (``False``: malformed lines listed in ``malformed`` and skipped).

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
        return parse_probes(text, fmt, strict=strict)
    except ProbeError as err:
        raise ProbeError(f"{os.path.basename(path)}: {err}") from None
