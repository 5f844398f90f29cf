"""Candidate words -> vocabulary ids: special ids that never count, whole-word tokens, a candidate's tokens at a mask.

Framework-free (numpy and a ``transformers`` tokenizer object).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from hf_tpu_ext.probes.parsing import MASK_RE

_REPLACEMENT = "\ufffd"  # what a lone byte of a multi-byte UTF-8 character decodes to


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
