"""One fill-mask model revision: tokenizer, masked-LM forward pass, the input rules of the test bench.

Framework-neutral: the forward pass is ``transformers``' ``AutoModelForMaskedLM`` (PyTorch) or
``TFAutoModelForMaskedLM`` (TensorFlow, which reads the PyTorch-format ``model.safetensors`` ``hf-tpu train``
writes), imported inside functions, so importing this module loads no framework. No ``hf_tpu_ext`` module
besides :mod:`hf_tpu_ext.probes` is used: ``hf-tpu deploy-space`` uploads this package with the Space.

Several masks in one sentence are predicted **independently from one forward pass**. Scores are
probabilities of the softmax over the vocabulary at the mask position with every special token removed,
so special tokens are never candidates. With ``targets`` the scores stay those probabilities (not
renormalized over the targets), as in transformers' fill-mask pipeline.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from hf_tpu_ext import probes
from hf_tpu_ext.model_types import max_sequence_length

BACKENDS = ("auto", "torch", "tensorflow")
BACKEND_ENV = "FILL_MASK_BACKEND"
DEFAULT_TOP_K = 5
PROBE_BATCH_SIZE = 64
# Tokenizers without a real limit report a huge sentinel (int(1e30)) as model_max_length.
_NO_LIMIT = 1_000_000

# "<mask>" and "[MASK]" in any case, with stray inner spaces ("< mask >").
_MASK_VARIANTS = (r"<\s*mask\s*>", r"\[\s*mask\s*\]")


def other_mask_spelling(mask_token: str) -> str:
    """The other spelling :meth:`FillMaskPredictor.normalize` reads as ``mask_token``: ``"[MASK]"`` for
    ``"<mask>"`` (and any other token), ``"<mask>"`` for ``"[MASK]"``."""
    return "<mask>" if mask_token.lower() == "[mask]" else "[MASK]"


def no_mask_message(mask_token: str) -> str:
    """The answer to a sentence with no mask: names the model's mask token once, and the other spelling read as it
    (``"No mask in the input: put <mask> where the missing word goes ([MASK] works too)."``)."""
    return (f"No mask in the input: put {mask_token} where the missing word goes "
            f"({other_mask_spelling(mask_token)} works too).")


def select_backend(backend: Optional[str] = None) -> str:
    """Pick the forward-pass backend.

    Args:
        backend: ``"torch"``, ``"tensorflow"`` or ``"auto"``/``None``; ``None`` reads the
            ``FILL_MASK_BACKEND`` environment variable (default ``auto``).

    Returns:
        ``"torch"`` when torch is importable (or asked for), else ``"tensorflow"``.

    Raises:
        ValueError: an unknown backend name.
    """
    name = (backend or os.environ.get(BACKEND_ENV) or "auto").strip().lower()
    if name in ("pt", "pytorch"):
        name = "torch"
    if name in ("tf",):
        name = "tensorflow"
    if name not in BACKENDS:
        raise ValueError(f"Unknown fill-mask backend {name!r}; use one of: {', '.join(BACKENDS)}.")
    if name == "auto":
        name = "torch" if importlib.util.find_spec("torch") is not None else "tensorflow"
    return name


class _TorchForward:
    """Forward passes with ``transformers.AutoModelForMaskedLM`` (PyTorch, CPU or the first GPU)."""

    name = "torch"

    def __init__(self, model_id_or_path: str, revision: Optional[str] = None):
        import torch
        from transformers import AutoModelForMaskedLM

        self._torch = torch
        self.model = AutoModelForMaskedLM.from_pretrained(model_id_or_path, revision=revision)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()

    def gather_logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray,
                      cols: np.ndarray) -> np.ndarray:
        """Args: int64 ``[B, L]`` ids and mask, int ``[K]`` row/column pairs. Returns: float32 ``[K, V]``."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(input_ids=torch.as_tensor(input_ids, device=self.device),
                             attention_mask=torch.as_tensor(attention_mask, device=self.device))
            picked = out.logits[torch.as_tensor(rows, device=self.device), torch.as_tensor(cols, device=self.device)]
        return picked.float().cpu().numpy()


class _TensorFlowForward:
    """Forward passes with ``transformers.TFAutoModelForMaskedLM`` (TensorFlow, no torch needed).

    A PyTorch-format ``model.safetensors`` (what ``hf-tpu train`` and PyTorch ``save_pretrained`` write) is read
    as numpy arrays and put into the TF model with transformers' ``load_pytorch_state_dict_in_tf2_model``:
    ``TFAutoModelForMaskedLM.from_pretrained`` cannot read it with current safetensors releases (transformers
    4.57 iterates over a ``safe_open`` handle: ``'builtins.safe_open' object is not iterable``). Other folders
    (``tf_model.h5``) load with ``from_pretrained(use_safetensors=False)``.
    """

    name = "tensorflow"

    def __init__(self, model_id_or_path: str, revision: Optional[str] = None):
        import tensorflow as tf
        from transformers import AutoConfig, TFAutoModelForMaskedLM

        self._tf = tf
        folder = model_id_or_path
        if not os.path.isdir(folder):  # a Hub repo id: its files at that revision, from the download cache
            from huggingface_hub import snapshot_download

            folder = snapshot_download(model_id_or_path, revision=revision,
                                       allow_patterns=["*.json", "*.safetensors", "*.h5", "*.txt", "*.model"])
        weights = os.path.join(folder, "model.safetensors")
        if os.path.isfile(weights) and _safetensors_format(weights) == "pt":
            from safetensors.numpy import load_file
            from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model

            model = TFAutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(folder))
            self.model = load_pytorch_state_dict_in_tf2_model(model, load_file(weights), allow_missing_keys=True,
                                                              skip_logger_warnings=True)
        else:
            self.model = TFAutoModelForMaskedLM.from_pretrained(folder, use_safetensors=False)

    def gather_logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray,
                      cols: np.ndarray) -> np.ndarray:
        """Args: int64 ``[B, L]`` ids and mask, int ``[K]`` row/column pairs. Returns: float32 ``[K, V]``."""
        tf = self._tf
        out = self.model(input_ids=tf.constant(input_ids, dtype=tf.int32),
                         attention_mask=tf.constant(attention_mask, dtype=tf.int32), training=False)
        picked = tf.gather_nd(out.logits, tf.stack([tf.constant(rows, tf.int32), tf.constant(cols, tf.int32)], axis=1))
        return np.asarray(picked, dtype=np.float32)


def _safetensors_format(path: str) -> Optional[str]:
    """The ``format`` of a safetensors file's metadata (``"pt"``, ``"tf"``, ...), read without loading tensors."""
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as f:
        return (f.metadata() or {}).get("format")


RESULT_KEYS = ("ok", "message", "masks", "filled", "text", "top_k", "rejected_targets", "targets", "num_tokens",
               "max_length", "mask_token", "backend", "model", "revision")


def empty_result(message: str, **extra: Any) -> Dict[str, Any]:
    """A result without predictions (``ok=False``), with every key of :data:`RESULT_KEYS` present."""
    result: Dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result.update(ok=False, message=message, masks=[], rejected_targets=[], targets=[])
    result.update(extra)
    return result


def parse_top_k(top_k: Any) -> Tuple[Optional[int], Optional[str]]:
    """``(k, None)`` for a whole number >= 1 (int, integral float or numeric string; empty: the default),
    else ``(None, message)``. Non-finite values ("inf", "nan", "1e400") are refused, never raised."""
    if top_k is None or (isinstance(top_k, str) and not top_k.strip()):
        return DEFAULT_TOP_K, None
    if isinstance(top_k, bool):
        return None, f"top_k must be a whole number >= 1, got {top_k!r}."
    try:
        value = float(top_k.strip() if isinstance(top_k, str) else top_k)
    except (TypeError, ValueError):
        return None, f"top_k must be a whole number >= 1, got {top_k!r}."
    if not math.isfinite(value):
        return None, f"top_k must be a finite whole number >= 1, got {top_k!r}."
    if value != int(value):
        return None, f"top_k must be a whole number >= 1, got {top_k!r}."
    if value < 1:
        return None, f"top_k must be >= 1, got {int(value)}."
    return int(value), None


def filled_sentence(text: str, mask_token: str, fills: Sequence[Tuple[str, str]],
                    continuing_prefix: Optional[str] = None, mask_lstrip: bool = False) -> Optional[str]:
    """``text`` with its masks replaced, left to right, by ``fills``; the rest as the user typed it (casing too).

    Args:
        text: the sentence with ``mask_token`` where words are missing.
        mask_token: the model's mask token (``"<mask>"``, ``"[MASK]"``).
        fills: one ``(token_str, raw_token)`` per mask: the decoded candidate (``" city"`` for byte-level
            ``Ġcity``, ``"city"``, ``"##s"`` for a WordPiece piece) and its vocabulary entry.
        continuing_prefix: the tokenizer's prefix of word-continuing pieces (WordPiece's ``"##"``), or ``None``.
        mask_lstrip: the mask token swallows the space before it (RoBERTa's and ModernBERT's): the model fills
            the mask with that space, so a candidate's own spacing replaces it (a bare piece joins the word).

    Returns:
        The filled sentence: a continuing piece is joined to the word before the mask (``"The cat [MASK] sat"``
        with ``##s`` -> ``"The cats sat"``); a candidate that carries its own leading space (``Ġcity``), or any
        candidate of a ``mask_lstrip`` mask, replaces the space before the mask (no double space; none at the
        start). ``None`` when ``text`` has not one mask per fill.
    """
    parts = text.split(mask_token)
    if len(parts) != len(fills) + 1:
        return None
    out = parts[0]
    for (token_str, raw_token), after in zip(fills, parts[1:]):
        if continuing_prefix and raw_token.startswith(continuing_prefix):
            out = out.rstrip() + token_str[len(continuing_prefix) if token_str.startswith(continuing_prefix) else 0:]
        elif mask_lstrip or token_str[:1].isspace():
            out = out.rstrip() + token_str if out.strip() else token_str.lstrip()
        else:
            out += token_str
        out += after
    return out


class FillMaskPredictor:
    """Tokenizer + masked-LM forward pass + the input rules of the demo, for one model revision.

    Args:
        model_id_or_path: a model folder (``config.json``, tokenizer files, ``model.safetensors``)
            or a Hub repo id.
        backend: ``"torch"``, ``"tensorflow"`` or ``"auto"``/``None`` (see :func:`select_backend`).
        revision: branch, tag or commit of a Hub repo.

    Attributes:
        mask_token (str): the model's mask token, e.g. ``"<mask>"``.
        max_length (int): the most tokens one input may have, ``<s>`` and ``</s>`` included.
        special_ids (list[int]): ids never offered as candidates.
        num_candidates (int): vocabulary entries that can be candidates (non-special).
        backend (str): ``"torch"`` or ``"tensorflow"``.
        forward_passes (int): forward passes run so far (one per :meth:`predict_many` call with work, one per
            probe batch); the batching test counts them.

    Raises:
        ValueError: the tokenizer has no mask token, or an unknown backend.
        OSError: the folder/repo/revision has no loadable tokenizer or model (transformers' message).
    """

    def __init__(self, model_id_or_path: str, backend: Optional[str] = None, revision: Optional[str] = None):
        from transformers import AutoConfig, AutoTokenizer

        model_id_or_path = os.fspath(model_id_or_path)
        self.model_id = model_id_or_path
        self.revision = revision
        self.tokenizer = AutoTokenizer.from_pretrained(model_id_or_path, revision=revision)
        if self.tokenizer.mask_token is None:
            raise ValueError(f"The tokenizer of {model_id_or_path} has no mask token, so it cannot fill masks.")
        self.config = AutoConfig.from_pretrained(model_id_or_path, revision=revision)
        self.mask_token: str = self.tokenizer.mask_token
        self.mask_token_id: int = self.tokenizer.mask_token_id
        self.max_length = self._max_length()

        self.backend = select_backend(backend)
        forward_cls = _TorchForward if self.backend == "torch" else _TensorFlowForward
        self._forward = forward_cls(model_id_or_path, revision=revision)

        self.vocab_size = int(getattr(self.config, "vocab_size", len(self.tokenizer)))
        # Special ids plus rows of the output layer that no tokenizer entry maps to (padded vocab).
        self._blocked = probes.blocked_ids(self.tokenizer, self.vocab_size)
        self.special_ids = sorted(int(i) for i in np.flatnonzero(self._blocked) if i < len(self.tokenizer))
        self.num_candidates = int((~self._blocked).sum())
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.forward_passes = 0
        self._count_lock = threading.Lock()
        self._mask_re = re.compile("|".join([re.escape(self.mask_token), *_MASK_VARIANTS]), flags=re.IGNORECASE)

    def _max_length(self) -> int:
        limits = []
        if getattr(self.config, "max_position_embeddings", None):
            # the model type's record: RoBERTa-family position ids start after padding_idx, losing pad_id + 1 slots
            limits.append(max_sequence_length(self.config))
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if tok_max and tok_max < _NO_LIMIT:
            limits.append(int(tok_max))
        return min(limits) if limits else 512

    def _mask_lstrip(self) -> bool:
        """Whether the tokenizer's mask token swallows the space before it (``AddedToken(lstrip=True)``)."""
        added = (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).get(self.mask_token_id)
        return bool(getattr(added, "lstrip", False))

    def normalize(self, text: str) -> str:
        """Replace ``<mask>``/``[MASK]`` (any case) and the model's own mask token by the model's mask token."""
        return self._mask_re.sub(self.mask_token, text)

    def resolve_targets(self, targets: Optional[str | Sequence[str]]) -> Tuple[List[int], List[str]]:
        """Map candidate words to vocabulary ids (see :meth:`target_mapping`).

        Returns:
            ``(ids, rejected)``: unique ids in the order given, and the words that are not a whole-word token.
        """
        mapping, rejected = self.target_mapping(targets)
        ids: List[int] = []
        for entry in mapping:
            for tok in entry["scored_as"]:
                if tok["token"] not in ids:
                    ids.append(tok["token"])
        return ids, [r["target"] for r in rejected]

    def target_mapping(self, targets: Optional[str | Sequence[str]]) -> Tuple[List[dict], List[dict]]:
        """Map candidate words to the whole-word vocabulary entries they are scored as.

        A word counts as one token after a space (``Ġword``, mid-sentence) and/or bare (``word``, at the
        start of a text), or as a raw vocabulary entry (``Ġword``) that decodes to whole characters; a
        word that is several tokens, or only a lone byte of a multi-byte character (``"é"`` in a byte-level
        vocabulary), is refused with the reason (see ``probes.word_tokens``).

        Args:
            targets: comma-separated words, a list of words, or ``None``/``""`` for no restriction.

        Returns:
            ``(accepted, rejected)``: ``[{"target", "scored_as": [{"token", "token_str", "raw_token"}],
            "note": str or None}]`` and ``[{"target", "reason"}]``, in the order given.
        """
        if targets is None:
            return [], []
        words = targets.split(",") if isinstance(targets, str) else list(targets)
        accepted, rejected, seen = [], [], set()
        for word in (w.strip() for w in words):
            if not word or word in seen:
                continue
            seen.add(word)
            tokens, reason = probes.word_tokens(self.tokenizer, word, self._blocked)
            if not tokens:
                rejected.append({"target": word, "reason": reason})
                continue
            accepted.append({"target": word, "note": probes.describe_mapping(word, tokens),
                             "scored_as": [{"token": t.id, "token_str": t.token_str, "raw_token": t.raw_token}
                                           for t in tokens]})
        return accepted, rejected

    # ----------------------------------------------------------------------------------- fill masks
    def _prepare(self, text: Optional[str], top_k: Any, targets) -> Dict[str, Any]:
        """Validate one request; returns an ``ok=False`` result, or a dict with what the forward pass needs."""
        common = {"mask_token": self.mask_token, "backend": self.backend, "max_length": self.max_length}
        if text is None or not str(text).strip():
            return empty_result(
                f"Empty input: type a sentence with {self.mask_token} where a word is missing, "
                f"e.g. 'Paris is the {self.mask_token} of France.'", **common)
        text = self.normalize(str(text))
        if self.mask_token not in text:
            return empty_result(no_mask_message(self.mask_token), text=text, **common)
        k, problem = parse_top_k(top_k)
        if problem:
            return empty_result(problem, text=text, **common)

        input_ids = self.tokenizer(text, verbose=False)["input_ids"]
        num_tokens = len(input_ids)
        common["num_tokens"] = num_tokens
        if num_tokens > self.max_length:
            return empty_result(
                f"Input too long: it is {num_tokens} tokens (with {self.tokenizer.bos_token or 'start'} and "
                f"{self.tokenizer.eos_token or 'end'}), this model reads at most {self.max_length}. "
                f"Shorten it by {num_tokens - self.max_length} tokens.", text=text, **common)

        notes = []
        accepted, rejected = self.target_mapping(targets)
        common["rejected_targets"] = [r["target"] for r in rejected]
        common["targets"] = accepted
        target_ids = [t["token"] for entry in accepted for t in entry["scored_as"]]
        target_ids = list(dict.fromkeys(target_ids))
        mapped = [entry["note"] for entry in accepted if entry["note"]]
        if mapped:
            notes.append("; ".join(mapped) + ".")
        if rejected:
            notes.append("Not scored: " + "; ".join(f"{r['target']!r} ({r['reason']})" for r in rejected) + ".")
        if rejected and not target_ids:
            return empty_result(
                " ".join(notes) + " None of the targets can be scored: give words that are one token, or clear targets.",
                text=text, **common)

        available = len(target_ids) if target_ids else self.num_candidates
        if k > available:
            what = "accepted targets" if target_ids else "non-special vocabulary entries"
            notes.append(f"top_k {k} is more than the {available} {what}; showing {available}.")
            k = available
        positions = [i for i, t in enumerate(input_ids) if t == self.mask_token_id]
        return {"ok": None, "input_ids": input_ids, "positions": positions, "k": k, "target_ids": target_ids,
                "notes": notes, "text": text, "common": common}

    def _finish(self, prep: Dict[str, Any], logits: np.ndarray) -> Dict[str, Any]:
        """The result of one prepared request from its mask logits (float ``[M, V]``)."""
        logits = np.asarray(logits[:, : self.vocab_size], dtype=np.float64)
        logits[:, self._blocked] = -np.inf
        logits -= logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        k, target_ids = prep["k"], prep["target_ids"]
        masks = []
        filled_ids = list(prep["input_ids"])
        for m, pos in enumerate(prep["positions"]):
            p = probs[m]
            if target_ids:
                cand = np.asarray(target_ids)
                order = cand[np.argsort(-p[cand], kind="stable")][:k]
            else:
                order = np.argsort(-p, kind="stable")[:k]
            ranked = [{"rank": r + 1, "token": int(i),
                       "token_str": self.tokenizer.decode([int(i)], clean_up_tokenization_spaces=False),
                       "raw_token": self.tokenizer.convert_ids_to_tokens(int(i)), "score": float(p[i])}
                      for r, i in enumerate(order)]
            masks.append(ranked)
            filled_ids[pos] = ranked[0]["token"]
        model = getattr(getattr(self.tokenizer, "backend_tokenizer", None), "model", None)
        best = [(ranked[0]["token_str"], ranked[0]["raw_token"]) for ranked in masks]
        filled = filled_sentence(prep["text"], self.mask_token, best, getattr(model, "continuing_subword_prefix", None),
                                 self._mask_lstrip())
        if filled is None:  # a mask the text does not show as the model's token (cannot happen after normalize)
            filled = self.tokenizer.decode(filled_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        head = (f"Filled {len(masks)} masks (each predicted independently in one forward pass)."
                if len(masks) > 1 else "Filled 1 mask.")
        return {"ok": True, "message": " ".join([head, *prep["notes"]]), "masks": masks, "filled": filled,
                "text": prep["text"], "top_k": k, **prep["common"]}

    def predict_many(self, requests: Sequence[Tuple[Any, Any, Any]]) -> List[Dict[str, Any]]:
        """Fill the masks of several sentences with one forward pass.

        Args:
            requests: ``(text, top_k, targets)`` triples (see :meth:`predict`).

        Returns:
            One result dict per request, in order (see :meth:`predict`).
        """
        prepared = [self._prepare(*req) for req in requests]
        todo = [i for i, p in enumerate(prepared) if p["ok"] is None]
        if todo:
            ids, attn = probes.pad_batch([prepared[i]["input_ids"] for i in todo], self.pad_id)
            rows = np.asarray([r for r, i in enumerate(todo) for _ in prepared[i]["positions"]], dtype=np.int64)
            cols = np.asarray([c for i in todo for c in prepared[i]["positions"]], dtype=np.int64)
            logits = self._gather(ids, attn, rows, cols)
            start = 0
            for i in todo:
                m = len(prepared[i]["positions"])
                prepared[i] = self._finish(prepared[i], logits[start: start + m])
                start += m
        return prepared

    def predict(self, text: Optional[str], top_k: Any = DEFAULT_TOP_K,
                targets: Optional[str | Sequence[str]] = None) -> Dict[str, Any]:
        """Fill the masks of one sentence.

        Args:
            text: a sentence with one or more masks (``<mask>``, ``[MASK]`` or the model's token).
            top_k: candidates per mask: a whole number >= 1 (int, float or numeric string). Larger than the
                candidates available (the non-special vocabulary, or the accepted targets) is clamped, and
                the message says so; anything else ("abc", "inf", "nan", "1e400", 0) gives ``ok=False``.
            targets: optional comma-separated candidate words; only those are ranked.

        Returns:
            A JSON-able dict:
            ``ok`` (bool), ``message`` (str, what happened or what to type, including how targets were
            mapped, e.g. "'city' is scored as ' city' (Ġcity)", and why a target was refused),
            ``masks`` (list with one list per mask, left to right, of
            ``{"rank": int, "token": int id, "token_str": decoded text, "raw_token": vocab entry,
            "score": float in (0, 1]}`` sorted by score, descending),
            ``filled`` (the user's sentence, casing kept, with each mask replaced by its top candidate as
            :func:`filled_sentence` puts it in, or ``None``),
            ``text`` (the sentence as given to the model), ``mask_token``, ``top_k`` (after clamping),
            ``targets`` (``[{"target", "scored_as": [...], "note"}]``), ``rejected_targets`` (list[str]),
            ``num_tokens`` and ``max_length`` (ints), ``backend``.
            Input problems give ``ok=False`` with an explanation, never an exception.
        """
        return self.predict_many([(text, top_k, targets)])[0]

    # ---------------------------------------------------------------------------------------- probes
    def _gather(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray,
                cols: np.ndarray) -> np.ndarray:
        with self._count_lock:
            self.forward_passes += 1
        return self._forward.gather_logits(input_ids, attention_mask, rows, cols)

    def mask_logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, mask_index: np.ndarray) -> np.ndarray:
        """Logits at one position per row: float32 ``[B, V]`` (the probe module's ``mask_logits``)."""
        return self._gather(input_ids, attention_mask, np.arange(len(input_ids)), mask_index)

    def score_probes(self, probe_list: Sequence[Any], batch_size: int = PROBE_BATCH_SIZE, strict: bool = False):
        """Top-1/top-5 accuracy, MRR and answer log-likelihood of this model on parsed probes
        (``probes.score_probes``; multi-token answers scored left to right, see ``probes.candidate_rows``).

        Args:
            probe_list: from ``probes.parse_probes``.
            batch_size: rows per forward pass.
            strict: raise on unscorable probes instead of listing them in ``result.skipped``.

        Raises:
            probes.ProbeError: with ``strict``, a probe that cannot be scored with this tokenizer (too long,
                an answer with characters the vocabulary lacks); without it, only when none can be.
        """
        return probes.score_probes(probe_list, self.tokenizer, self.mask_logits, self.vocab_size, self.max_length,
                                   batch_size=batch_size, strict=strict)

    def __call__(self, text, top_k=DEFAULT_TOP_K, targets=None):
        return self.predict(text, top_k, targets)


