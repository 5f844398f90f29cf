"""Gradio fill-mask test bench for a RoBERTa-style masked language model and its pushed revisions.

This file is both the local demo (``hf-tpu demo``) and the ``app.py`` of the Hub Space that
``hf-tpu deploy-space`` creates, so it imports nothing from ``hf_tpu_ext`` at module level and needs only
``transformers``, ``gradio``, ``numpy``, ``huggingface_hub`` and one of ``torch`` / TensorFlow. The probe
scoring lives in ``hf_tpu_ext/probes.py`` (framework-free); the Space gets it as ``probes.py`` next to
this file.

Which model is shown (first match wins): the ``model`` argument of :func:`build_demo` / ``--model``, the
``MODEL_ID`` environment variable, the first line of ``model_id.txt`` next to this file (written by
``hf-tpu deploy-space``). For a Hub repo the page lists its branches and commits (``HfApi.list_repo_refs`` /
``list_repo_commits`` through ``HF_ENDPOINT``; re-listed on every page load, so new pushes show up without a
restart), labelled with the commit titles the push callback writes ("Training in progress, step 200",
"End of training"). Models are loaded by commit and kept in a least-recently-used cache of
``MODEL_CACHE_SIZE`` models (default 4).

Several masks in one sentence are predicted **independently from one forward pass**. Scores are
probabilities of the softmax over the vocabulary at the mask position with every special token removed,
so special tokens are never candidates. With ``targets`` the scores stay those probabilities (not
renormalized over the targets), as in transformers' fill-mask pipeline.

API (``gradio_client``; only the first argument of each endpoint is required)::

    from gradio_client import Client
    c = Client("http://127.0.0.1:7860/")
    c.predict("The <mask> sat.", api_name="/fill_mask")                       # top_k=5, targets="", revision=""
    c.predict("The <mask> sat.", 3, "", "main", "0a1b2c3", api_name="/compare")  # two revisions side by side
    c.predict("Paris is the <mask> of France. => capital", "main,0a1b2c3", api_name="/probe")
    c.predict(api_name="/revisions")

Concurrency: single-sentence requests (``/fill_mask``, ``/compare`` and the page's Fill button) share one
queue (``concurrency_id="fill_mask"``) and are batched (``batch=True``: up to 16 queued sentences run as one
forward pass); probe sets have their own queue (one at a time, scored 64 probes per forward pass), so a
probe set never holds up single sentences. PyTorch runs one intra-op thread per request
(``FILL_MASK_TORCH_THREADS``, default 1): the parallel requests use the cores instead.
"""

from __future__ import annotations

import argparse
import collections
import functools
import html
import importlib.util
import math
import os
import re
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np


def _load_probes():
    """The probe module: ``probes.py`` next to this file (the Space), else ``hf_tpu_ext.probes``."""
    local = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes.py")
    if os.path.isfile(local):
        spec = importlib.util.spec_from_file_location("fill_mask_probes", local)
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("fill_mask_probes", module)
        spec.loader.exec_module(module)
        return module
    from hf_tpu_ext import probes as module

    return module


probes = _load_probes()

BACKENDS = ("auto", "torch", "tensorflow")
BACKEND_ENV = "FILL_MASK_BACKEND"
MODEL_ENV = "MODEL_ID"
REVISION_ENV = "MODEL_REVISION"
CACHE_ENV = "MODEL_CACHE_SIZE"
THREADS_ENV = "FILL_MASK_TORCH_THREADS"
MODEL_ID_FILE = "model_id.txt"
DEFAULT_TOP_K = 5
DEFAULT_CONCURRENCY_LIMIT = 4
DEFAULT_CACHE_SIZE = 4
MAX_BATCH_SIZE = 16  # queued single sentences run together in one forward pass
PROBE_BATCH_SIZE = 64
REVISIONS_TTL_S = 20.0  # a page load re-lists the repo's revisions at most this often
# Tokenizers without a real limit report a huge sentinel (int(1e30)) as model_max_length.
_NO_LIMIT = 1_000_000
_STEP_RE = re.compile(r"\bstep[ _-]?(\d+)", re.IGNORECASE)
_SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")

# "<mask>" and "[MASK]" in any case, with stray inner spaces ("< mask >").
_MASK_VARIANTS = (r"<\s*mask\s*>", r"\[\s*mask\s*\]")


def default_model_id() -> Optional[str]:
    """The model to show when none is passed: ``MODEL_ID`` env var, else ``model_id.txt`` next to this file.

    Returns:
        The model folder or Hub repo id, or ``None`` when neither is set.
    """
    env = os.environ.get(MODEL_ENV, "").strip()
    if env:
        return env
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), MODEL_ID_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            first = f.readline().strip()
        return first or None
    return None


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
    """Forward passes with the TF model from ``hf_tpu_ext.backends.tensorflow.export.load_tf_model``."""

    name = "tensorflow"

    def __init__(self, model_id_or_path: str, revision: Optional[str] = None):
        try:
            from hf_tpu_ext.backends.tensorflow.export import load_tf_model
        except ImportError as err:
            raise ImportError(
                "The TensorFlow backend of the demo needs hf_tpu_ext (pip install hf-tpu-ext); "
                "or install torch and use the PyTorch backend."
            ) from err
        import tensorflow as tf

        self._tf = tf
        self.model = load_tf_model(model_id_or_path, revision=revision)

    def gather_logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray,
                      cols: np.ndarray) -> np.ndarray:
        """Args: int64 ``[B, L]`` ids and mask, int ``[K]`` row/column pairs. Returns: float32 ``[K, V]``."""
        tf = self._tf
        out = self.model(input_ids=tf.constant(input_ids, dtype=tf.int32),
                         attention_mask=tf.constant(attention_mask, dtype=tf.int32), training=False)
        logits = out["logits"] if isinstance(out, dict) or hasattr(out, "keys") else getattr(out, "logits", out)
        picked = tf.gather_nd(logits, tf.stack([tf.constant(rows, tf.int32), tf.constant(cols, tf.int32)], axis=1))
        return np.asarray(picked, dtype=np.float32)


RESULT_KEYS = ("ok", "message", "masks", "filled", "text", "top_k", "rejected_targets", "targets", "num_tokens",
               "max_length", "mask_token", "backend", "model", "revision")


def _empty_result(message: str, **extra: Any) -> Dict[str, Any]:
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
        self._mask_re = re.compile("|".join([re.escape(self.mask_token), *_MASK_VARIANTS]), flags=re.IGNORECASE)

    def _max_length(self) -> int:
        limits = []
        positions = getattr(self.config, "max_position_embeddings", None)
        if positions:
            # RoBERTa-family position ids start after padding_idx (= pad_token_id), losing pad_id + 1 slots.
            offset = 0
            if getattr(self.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "roberta-prelayernorm"):
                offset = int(getattr(self.config, "pad_token_id", 1) or 0) + 1
            limits.append(int(positions) - offset)
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if tok_max and tok_max < _NO_LIMIT:
            limits.append(int(tok_max))
        return min(limits) if limits else 512

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
            return _empty_result(
                f"Empty input: type a sentence with {self.mask_token} where a word is missing, "
                f"e.g. 'Paris is the {self.mask_token} of France.'", **common)
        text = self.normalize(str(text))
        if self.mask_token not in text:
            return _empty_result(
                f"No mask in the input: put {self.mask_token} (or [MASK]) where the missing word goes, "
                f"e.g. '{text.strip()} {self.mask_token}'.", text=text, **common)
        k, problem = parse_top_k(top_k)
        if problem:
            return _empty_result(problem, text=text, **common)

        input_ids = self.tokenizer(text, verbose=False)["input_ids"]
        num_tokens = len(input_ids)
        common["num_tokens"] = num_tokens
        if num_tokens > self.max_length:
            return _empty_result(
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
            return _empty_result(
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
            logits = self._forward.gather_logits(ids, attn, rows, cols)
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
            ``filled`` (the sentence with each mask replaced by its top candidate, or ``None``),
            ``text`` (the sentence as given to the model), ``mask_token``, ``top_k`` (after clamping),
            ``targets`` (``[{"target", "scored_as": [...], "note"}]``), ``rejected_targets`` (list[str]),
            ``num_tokens`` and ``max_length`` (ints), ``backend``.
            Input problems give ``ok=False`` with an explanation, never an exception.
        """
        return self.predict_many([(text, top_k, targets)])[0]

    # ---------------------------------------------------------------------------------------- probes
    def mask_logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, mask_index: np.ndarray) -> np.ndarray:
        """Logits at one position per row: float32 ``[B, V]`` (the probe module's ``mask_logits``)."""
        return self._forward.gather_logits(input_ids, attention_mask, np.arange(len(input_ids)), mask_index)

    def score_probes(self, probe_list: Sequence[Any], batch_size: int = PROBE_BATCH_SIZE):
        """Top-1/top-5 accuracy and MRR of this model on parsed probes (``probes.score_probes``).

        Raises:
            probes.ProbeError: a probe that cannot be scored with this tokenizer (too long, answer not one
                word-level token).
        """
        return probes.score_probes(probe_list, self.tokenizer, self.mask_logits, self.vocab_size, self.max_length,
                                   batch_size=batch_size)

    def __call__(self, text, top_k=DEFAULT_TOP_K, targets=None):
        return self.predict(text, top_k, targets)


# ------------------------------------------------------------------------------------------- revisions


def step_from_title(title: Optional[str]) -> Optional[int]:
    """The training step a push callback's commit title names ("Training in progress, step 200" -> 200)."""
    m = _STEP_RE.search(title or "")
    return int(m.group(1)) if m else None


def is_local_model(model: str) -> bool:
    """True for an existing folder (a model folder, not a Hub repo id)."""
    return os.path.isdir(model)


def list_revisions(model: str, token: Optional[str] = None) -> List[Dict[str, Any]]:
    """The revisions of a Hub model repo the page offers, newest first.

    Branches (and tags) come first, then every commit of the default branch, newest first.

    Args:
        model: a Hub repo id (a local folder gives one entry, ``value=""``).
        token: Hub token for a private repo (default: ``HF_TOKEN`` / the cached login).

    Returns:
        ``[{"value": branch name or full commit sha, "label": str, "kind": "branch"|"tag"|"commit"|"local",
        "sha": commit sha or None, "title": commit title, "step": int or None, "date": ISO time or None}]``.

    Raises:
        huggingface_hub errors (``RepositoryNotFoundError``, connection errors) as they come.
    """
    if is_local_model(model):
        return [{"value": "", "label": f"local folder {os.path.basename(os.path.normpath(model))}", "kind": "local",
                 "sha": None, "title": "", "step": _local_step(model), "date": None}]
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    refs = api.list_repo_refs(model)
    commits = api.list_repo_commits(model)
    by_sha = {c.commit_id: c for c in commits}
    out: List[Dict[str, Any]] = []
    for kind, entries in (("branch", refs.branches), ("tag", refs.tags)):
        for ref in sorted(entries, key=lambda r: (r.name != "main", r.name)):
            c = by_sha.get(ref.target_commit)
            title = c.title if c else ""
            out.append({"value": ref.name, "label": f"{ref.name} ({kind}) · {title} · {ref.target_commit[:7]}".replace(" ·  ·", " ·"),
                        "kind": kind, "sha": ref.target_commit, "title": title, "step": step_from_title(title),
                        "date": c.created_at.isoformat() if c else None})
    for c in commits:  # the Hub lists them newest first
        out.append({"value": c.commit_id, "label": f"{c.title} · {c.commit_id[:7]}", "kind": "commit",
                    "sha": c.commit_id, "title": c.title, "step": step_from_title(c.title),
                    "date": c.created_at.isoformat()})
    return out


def _local_step(folder: str) -> Optional[int]:
    import json

    try:
        with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ModelCache:
    """Loaded :class:`FillMaskPredictor` s by ``(model, commit)``, least recently used out.

    Args:
        max_models: models kept (>= 1); loading one more drops the least recently used.
        loader: ``(model, revision) -> FillMaskPredictor``.
    """

    def __init__(self, max_models: int, loader):
        self.max_models = max(1, int(max_models))
        self._loader = loader
        self._models: "collections.OrderedDict[Tuple[str, str], FillMaskPredictor]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._loading: Dict[Tuple[str, str], threading.Lock] = {}
        self.loads = 0

    def keys(self) -> List[Tuple[str, str]]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._models)

    def put(self, key: Tuple[str, str], predictor: FillMaskPredictor) -> None:
        with self._lock:
            self._models[key] = predictor
            self._models.move_to_end(key)
            while len(self._models) > self.max_models:
                self._models.popitem(last=False)

    def get(self, model: str, revision: str) -> FillMaskPredictor:
        """The predictor of ``model`` at ``revision`` (a commit sha, or "" for a local folder), loaded once.

        Raises:
            OSError, ValueError: the revision has no loadable tokenizer/model (transformers' message).
        """
        key = (model, revision)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:  # one load per key even when several requests ask at once
            with self._lock:
                if key in self._models:
                    self._models.move_to_end(key)
                    return self._models[key]
            predictor = self._loader(model, revision or None)
            self.loads += 1
            self.put(key, predictor)
            with self._lock:
                self._loading.pop(key, None)
            return predictor


class FillMaskBench:
    """What the page and the API serve: one configured model, its revisions, a model cache.

    Args:
        model: the configured model folder or Hub repo id.
        backend: forward-pass backend (see :func:`select_backend`).
        revision: the default revision (``None``: ``$MODEL_REVISION``, else the repo's ``main``).
        cache_size: models kept loaded (``None``: ``$MODEL_CACHE_SIZE``, default 4).
        predictor: an already loaded predictor of ``model`` at ``revision`` (tests, ``hf-tpu demo``).

    Raises:
        OSError, ValueError: the default revision cannot be loaded.
    """

    def __init__(self, model: str, backend: Optional[str] = None, revision: Optional[str] = None,
                 cache_size: Optional[int] = None, predictor: Optional[FillMaskPredictor] = None):
        self.model = os.fspath(model)
        self.backend = backend
        self.default_revision = revision or os.environ.get(REVISION_ENV) or None
        size = cache_size if cache_size is not None else int(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_SIZE)
        self.cache = ModelCache(size, lambda m, r: FillMaskPredictor(m, backend=backend, revision=r))
        self._revisions: Dict[str, Tuple[float, List[Dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self.local = is_local_model(self.model)
        if predictor is not None:
            info = self.resolve(self.model, self.default_revision or "")
            self.cache.put((self.model, info["sha"] or ""), predictor)
        self.default = self.predictor(self.model, self.default_revision or "")[0]

    # -- revisions
    def revisions(self, model: str = "", refresh: bool = False) -> List[Dict[str, Any]]:
        """:func:`list_revisions` of ``model`` (default: the configured one), cached for 20 s.

        A repo whose revisions cannot be listed (no Hub, no refs access) gives one entry for its default
        branch, so the page still works.
        """
        model = model or self.model
        with self._lock:
            hit = self._revisions.get(model)
        if hit and not refresh and time.monotonic() - hit[0] < REVISIONS_TTL_S:
            return hit[1]
        try:
            listing = list_revisions(model)
        except Exception as err:  # an unreachable Hub must not take the page down
            listing = [{"value": "", "label": f"default revision (listing failed: {type(err).__name__})",
                        "kind": "unlisted", "sha": None, "title": "", "step": None, "date": None}]
        with self._lock:
            self._revisions[model] = (time.monotonic(), listing)
        return listing

    def default_value(self) -> str:
        """The dropdown value of the default revision."""
        if self.local:
            return ""
        values = [r["value"] for r in self.revisions()]
        want = self.default_revision or "main"
        return want if want in values else (values[0] if values else "")

    def resolve(self, model: str, revision: str) -> Dict[str, Any]:
        """The revision entry of ``revision`` (branch, tag, full or short commit sha; "" = the default).

        Returns:
            An entry as in :func:`list_revisions`; ``sha`` is what the model is loaded with (``None`` for a
            local folder or an unlisted revision, which is then passed to ``from_pretrained`` as given).
        """
        model = model or self.model
        revision = (revision or "").strip()
        if is_local_model(model):
            return self.revisions(model)[0]
        if not revision:
            revision = (self.default_revision or "main") if model == self.model else "main"
        for refresh in (False, True):
            listing = self.revisions(model, refresh=refresh)
            # the exact value first (a commit picked from the list keeps its own label), then a sha prefix
            for entry in listing:
                if revision == entry["value"]:
                    return entry
            for entry in listing:
                if entry["kind"] == "commit" and _SHA_RE.match(revision) and entry["sha"].startswith(revision):
                    return entry
        return {"value": revision, "label": revision, "kind": "unlisted", "sha": revision, "title": "",
                "step": step_from_title(revision), "date": None}

    def check_model(self, model: str) -> str:
        """``model`` as given, when it may be loaded: the configured model, or a valid Hub repo id.

        Raises:
            ValueError: anything else (a local path other than the configured folder, a malformed id).
        """
        model = (model or "").strip()
        if not model or model == self.model:
            return self.model
        if is_local_model(model) or os.path.sep in model.strip("/").replace("/", "", 1):
            raise ValueError(f"{model!r} is not a Hub repo id: give 'user/name' (only the configured model may be a folder).")
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(model)
        except HFValidationError as err:
            raise ValueError(f"{model!r} is not a valid Hub repo id: {err}") from None
        return model

    def predictor(self, model: str, revision: str) -> Tuple[FillMaskPredictor, Dict[str, Any]]:
        """``(predictor, revision entry)`` of ``model`` at ``revision``, loaded through the cache.

        Raises:
            ValueError: a model that may not be loaded (see :meth:`check_model`).
            OSError: the revision has no loadable model (e.g. the repo's initial commit).
        """
        model = self.check_model(model)
        info = self.resolve(model, revision)
        try:
            predictor = self.cache.get(model, info["sha"] or "")
        except (OSError, ValueError) as err:  # e.g. the repo's initial commit: no config.json / tokenizer yet
            reason = str(err).split("\n")[0]
            reason = reason if len(reason) <= 160 else reason[:157] + "..."
            raise OSError(f"Revision {info['label']!r} of {model} has no loadable model ({reason}); "
                          "pick another revision.") from None
        if info.get("step") is None and info.get("kind") != "local":
            info = dict(info, step=_hub_step(model, info["sha"]))
        return predictor, info

    # -- requests
    def fill_mask_many(self, requests: Sequence[Tuple[Any, Any, Any, str, str]]) -> List[Dict[str, Any]]:
        """Answer ``(text, top_k, targets, model, revision)`` requests; one forward pass per model revision."""
        results: List[Optional[Dict[str, Any]]] = [None] * len(requests)
        groups: Dict[Tuple[int, str], List[int]] = {}
        loaded = {}
        for i, (text, top_k, targets, model, revision) in enumerate(requests):
            try:
                predictor, info = self.predictor(model or "", revision or "")
            except Exception as err:
                results[i] = _empty_result(str(err), model=model or self.model, revision={"value": revision})
                continue
            key = (id(predictor), info["value"])
            loaded[key] = (predictor, info)
            groups.setdefault(key, []).append(i)
        for key, idx in groups.items():
            predictor, info = loaded[key]
            try:
                answers = predictor.predict_many([(requests[i][0], requests[i][1], requests[i][2] or None) for i in idx])
            except Exception as err:  # keep answering with a message, not a traceback
                answers = [_empty_result(f"Prediction failed: {type(err).__name__}: {err}",
                                         mask_token=predictor.mask_token, backend=predictor.backend,
                                         max_length=predictor.max_length)] * len(idx)
            for i, answer in zip(idx, answers):
                results[i] = dict(answer, model=predictor.model_id, revision=_public(info))
        return results  # type: ignore[return-value]

    def probe(self, text: str, revisions: Union[str, Sequence[str]] = "", model: str = "") -> Dict[str, Any]:
        """Score a probe set on one or more revisions.

        Args:
            text: the probe set (plain lines, CSV or JSONL, see ``probes.parse_probes``).
            revisions: comma-separated revisions (or a list); empty: the default revision.
            model: a Hub repo id (default: the configured model).

        Returns:
            ``{"ok": bool, "message": str, "n": probes parsed, "rows": [{"revision", "label", "sha", "step",
            "n", "top1", "top5", "mrr", "seconds", "lines_per_second"}]}`` in the order given; input
            problems give ``ok=False`` and the reason.
        """
        try:
            probe_list = probes.parse_probes(text or "")
        except probes.ProbeError as err:
            return {"ok": False, "message": str(err), "n": 0, "rows": []}
        wanted = revisions.split(",") if isinstance(revisions, str) else list(revisions or [])
        wanted = [w.strip() for w in wanted if w and w.strip()] or [""]
        rows, problems = [], []
        for rev in dict.fromkeys(wanted):
            try:
                predictor, info = self.predictor(model, rev)
                result = predictor.score_probes(probe_list)
            except (probes.ProbeError, OSError, ValueError) as err:
                problems.append(f"{rev or 'default revision'}: {err}")
                continue
            rows.append({"revision": info["value"], "label": info["label"], "sha": info["sha"],
                         "step": info["step"], **result.as_dict(),
                         "lines_per_second": round(result.n / max(result.seconds, 1e-9), 1)})
        ok = bool(rows) and not problems
        message = f"Scored {len(probe_list)} probes on {len(rows)} revision{'s' if len(rows) != 1 else ''}."
        if problems:
            message = (message + " " if rows else "") + "Not scored: " + " | ".join(problems)
        return {"ok": ok, "message": message, "n": len(probe_list), "rows": rows}


def _public(info: Dict[str, Any]) -> Dict[str, Any]:
    return {k: info.get(k) for k in ("value", "label", "sha", "step", "title")}


def _hub_step(model: str, sha: Optional[str]) -> Optional[int]:
    """``global_step`` of the ``trainer_state.json`` at a commit ("End of training" names no step)."""
    if not sha:
        return None
    import json

    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(model, "trainer_state.json", revision=sha)
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except Exception:  # no trainer_state.json at that commit: the chart places it by order instead
        return None


# ------------------------------------------------------------------------------------------------ page

RESULT_HEADERS = ["mask", "rank", "token", "vocab entry", "id", "score"]
PROBE_HEADERS = ["revision", "step", "probes", "top-1", "top-5", "MRR", "lines/s"]


def result_rows(result: Dict[str, Any]) -> List[list]:
    """Table rows ``[mask #, rank, token text (quoted), vocab entry, id, score rounded to 4]`` of a result."""
    rows = []
    for m, ranked in enumerate(result.get("masks") or [], start=1):
        for c in ranked:
            rows.append([m, c["rank"], repr(c["token_str"]), c["raw_token"], c["token"], round(c["score"], 4)])
    return rows


def probe_rows(result: Dict[str, Any]) -> List[list]:
    """Table rows ``[revision label, step, probes, top-1, top-5, MRR, lines/s]`` of a probe result."""
    return [[r["label"], r["step"] if r["step"] is not None else "", r["n"], round(r["top1"], 4),
             round(r["top5"], 4), round(r["mrr"], 4), r["lines_per_second"]] for r in result.get("rows") or []]


def probe_frame(result: Dict[str, Any]):
    """Long-format ``pandas.DataFrame`` (``step``, ``score``, ``metric``) of a probe result, by step.

    Revisions without a known step are placed by their order instead (x = 0, 1, ...).
    """
    import pandas as pd

    rows = sorted(result.get("rows") or [], key=lambda r: (r["step"] is None, r["step"] or 0))
    records = []
    for i, r in enumerate(rows):
        x = r["step"] if r["step"] is not None else i
        for key, name in (("top1", "top-1"), ("top5", "top-5"), ("mrr", "MRR")):
            records.append({"step": x, "score": r[key], "metric": name})
    frame = pd.DataFrame(records, columns=["step", "score", "metric"])
    return frame.astype({"step": "float64", "score": "float64", "metric": "object"})


def probe_chart(result: Dict[str, Any]):
    """A matplotlib figure: top-1, top-5 and MRR (y, 0 to 1) against the training step (x) per revision."""
    import matplotlib

    matplotlib.use("Agg")  # no display in a Space
    from matplotlib.figure import Figure

    frame = probe_frame(result)
    fig = Figure(figsize=(9, 3.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for metric, group in frame.groupby("metric", sort=False):
        ax.plot(group["step"], group["score"], marker="o", label=metric)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel("score")
    ax.set_title("Probe scores across revisions")
    ax.grid(alpha=0.3)
    if len(frame):
        ax.legend(loc="lower right")
    return fig


def _choices(listing: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return [(r["label"], r["value"]) for r in listing]


def _batched(fn):
    """Run ``fn`` (one request) over gradio's lists of queued requests (``batch=True``); same signature."""

    @functools.wraps(fn)
    def wrapper(*columns):
        return ([fn(*args) for args in zip(*columns)],)

    return wrapper


def build_demo(model_id_or_path: Optional[str] = None, *, backend: Optional[str] = None,
               revision: Optional[str] = None, concurrency_limit: int = DEFAULT_CONCURRENCY_LIMIT,
               predictor: Optional[FillMaskPredictor] = None, cache_size: Optional[int] = None,
               torch_threads: Optional[int] = None):
    """Build the Gradio app (queued, not launched).

    Args:
        model_id_or_path: model folder or Hub repo id; ``None`` uses :func:`default_model_id`.
        backend: ``"torch"``, ``"tensorflow"`` or ``"auto"``/``None`` (see :func:`select_backend`).
        revision: default branch, tag or commit of a Hub repo.
        concurrency_limit: single-sentence batches run at the same time (probe sets: one at a time, in
            their own queue).
        predictor: an already loaded :class:`FillMaskPredictor` of the default revision.
        cache_size: models kept loaded (default ``$MODEL_CACHE_SIZE`` or 4).
        torch_threads: PyTorch intra-op threads of the process (default ``$FILL_MASK_TORCH_THREADS`` or 1: the
            server's parallel requests use the cores; 0 leaves torch's default).

    Returns:
        A ``gr.Blocks`` with the endpoints ``/fill_mask``, ``/compare``, ``/probe``, ``/revisions`` (see the
        module docstring); ``demo.bench`` is its :class:`FillMaskBench`, ``demo.predictor`` the default
        revision's predictor.

    Raises:
        ValueError: no model given and none configured, or an unknown backend.
        OSError: the model cannot be loaded.
    """
    import gradio as gr

    threads = torch_threads if torch_threads is not None else int(os.environ.get(THREADS_ENV) or 1)
    if threads > 0 and select_backend(backend) == "torch":
        import torch

        # Requests run in parallel threads (batches, the probe queue); intra-op threads on top of them
        # oversubscribe the cores, and OpenMP's spinning then made a probe set 5-10x slower on 2 cores.
        torch.set_num_threads(threads)
    if predictor is not None:
        model_id_or_path = model_id_or_path or predictor.model_id
    model_id_or_path = model_id_or_path or default_model_id()
    if not model_id_or_path:
        raise ValueError(f"No model: pass a model folder or repo id, or set the {MODEL_ENV} environment variable.")
    bench = FillMaskBench(model_id_or_path, backend=backend, revision=revision, cache_size=cache_size,
                          predictor=predictor)
    default = bench.default
    mask = default.mask_token

    # ---- API functions (typed: gradio derives the client's parameters and defaults from these signatures)
    def fill_mask(text: str, top_k: Union[int, str] = DEFAULT_TOP_K, targets: str = "", revision: str = "") -> dict:
        """Fill the masks of `text` with one revision of the model (default: the configured one)."""
        return bench.fill_mask_many([(text, top_k, targets, "", revision)])[0]

    def compare(text: str, top_k: Union[int, str] = DEFAULT_TOP_K, targets: str = "", revision_a: str = "",
                revision_b: str = "", model_b: str = "") -> dict:
        """The same sentence answered by two revisions (or by a revision of another repo, `model_b`)."""
        a, b = bench.fill_mask_many([(text, top_k, targets, "", revision_a),
                                     (text, top_k, targets, model_b, revision_b)])
        return {"a": a, "b": b}

    def probe(probes_text: str, revisions: str = "", model: str = "") -> dict:
        """Top-1/top-5 accuracy and MRR of a probe set on comma-separated revisions."""
        return bench.probe(probes_text, revisions, model)

    def revisions(model: str = "") -> list:
        """The model repo's branches and commits, newest first."""
        try:
            return bench.revisions(bench.check_model(model), refresh=True)
        except ValueError as err:
            return [{"error": str(err)}]

    # ---- page functions
    def ui_fill(text, top_k, targets, rev_a, model_b, rev_b):
        reqs = [(text, top_k, targets, "", rev_a or "")]
        if rev_b or (model_b or "").strip():
            reqs.append((text, top_k, targets, model_b or "", rev_b or ""))
        answers = bench.fill_mask_many(reqs)
        return {"a": answers[0], "b": answers[1] if len(answers) > 1 else None}

    def render_one(result):
        if not result:
            return [], "", "Pick a revision B to compare."
        status = ("" if result.get("ok") else "**Note:** ") + html.escape(str(result.get("message", "")))
        rev = result.get("revision") or {}
        title = f"**{html.escape(str(rev.get('label') or result.get('model') or ''))}**"
        return result_rows(result), result.get("filled") or "", title + "\n\n" + status

    def render(raw):
        raw = raw or {}
        return (*render_one(raw.get("a")), *render_one(raw.get("b")))

    def ui_probe(text, picked, rev_a, rev_b):
        chosen = list(picked or []) or [r for r in (rev_a, rev_b) if r is not None]
        result = bench.probe(text, chosen or [""])
        status = ("" if result["ok"] else "**Note:** ") + html.escape(result["message"])
        return probe_rows(result), probe_chart(result), status, result

    def read_upload(path):
        if not path:
            return gr.update()
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            return f.read()

    def refresh(model_b, rev_a, rev_b):
        listing = bench.revisions(refresh=True)
        choices = _choices(listing)
        values = [v for _, v in choices]
        try:
            listing_b = bench.revisions(bench.check_model(model_b), refresh=True) if (model_b or "").strip() else listing
        except ValueError:
            listing_b = []
        choices_b = [("(none)", "")] + _choices(listing_b)
        a = rev_a if rev_a in values else bench.default_value()
        b = rev_b if rev_b in [v for _, v in choices_b] else ""
        if choices == shown["a"] and choices_b == shown["b"] and a == rev_a and b == rev_b:
            return gr.update(), gr.update(), gr.update()  # nothing new: leave the page's widgets alone
        shown.update(a=choices, b=choices_b)
        return (gr.update(choices=choices, value=a), gr.update(choices=choices_b, value=b),
                gr.update(choices=choices, value=[]))

    listing = bench.revisions()
    choices = _choices(listing)
    shown = {"a": choices, "b": [("(none)", "")] + choices}  # what the page was built with / last updated to
    where = "local folder" if bench.local else "Hub repo"
    with gr.Blocks(title=f"Fill-mask: {bench.model}") as demo:
        gr.Markdown(
            f"# Fill-mask test bench\nModel: `{bench.model}` ({where}, {default.backend}). Pick one or two "
            f"revisions, type a sentence with `{mask}` (or `[MASK]`) where a word is missing, or score a probe "
            "set on several revisions. Several masks are predicted independently in one forward pass.")
        with gr.Row():
            rev_a = gr.Dropdown(label="Revision A", choices=choices, value=bench.default_value(), elem_id="revision-a",
                                scale=3)
            rev_b = gr.Dropdown(label="Revision B (optional)", choices=[("(none)", "")] + choices, value="",
                                elem_id="revision-b", scale=3)
            model_b = gr.Textbox(label="Model B (optional: another repo id)", value="", elem_id="model-b", scale=2)
            refresh_btn = gr.Button("Refresh revisions", scale=1)
        with gr.Tabs():
            with gr.Tab("Fill mask"):
                with gr.Row():
                    with gr.Column(scale=3):
                        text = gr.Textbox(label="Sentence", lines=2, placeholder=f"Paris is the {mask} of France.")
                        targets = gr.Textbox(label="Targets (optional, comma-separated candidate words)", value="",
                                             placeholder="capital, city")
                    with gr.Column(scale=1):
                        top_k = gr.Textbox(label="top_k", value=str(DEFAULT_TOP_K))
                        submit = gr.Button("Fill", variant="primary")
                with gr.Row():
                    with gr.Column():
                        message_a = gr.Markdown(elem_id="fill-mask-message")
                        filled_a = gr.Textbox(label="Filled with the best guesses", interactive=False,
                                              elem_id="fill-mask-filled")
                        table_a = gr.Dataframe(headers=RESULT_HEADERS, label="Ranked candidates (A)",
                                               interactive=False, elem_id="fill-mask-table")
                    with gr.Column():
                        message_b = gr.Markdown(elem_id="fill-mask-message-b")
                        filled_b = gr.Textbox(label="Filled by B", interactive=False, elem_id="fill-mask-filled-b")
                        table_b = gr.Dataframe(headers=RESULT_HEADERS, label="Ranked candidates (B)",
                                               interactive=False, elem_id="fill-mask-table-b")
                with gr.Accordion("JSON (what the /compare API returns)", open=False):
                    raw = gr.JSON(label="result")
                gr.Examples(
                    examples=[[f"Paris is the {mask} of France.", str(DEFAULT_TOP_K), ""],
                              [f"The {mask} sat on the {mask}.", "3", ""],
                              [f"I like to drink {mask} in the morning.", "5", "coffee, tea, water"]],
                    inputs=[text, top_k, targets], cache_examples=False)
            with gr.Tab("Probe set"):
                with gr.Row():
                    probe_text = gr.Textbox(label="Probes, one per line: sentence with <mask> \u21d2 answer "
                                                  "(or CSV text,answer / JSONL)", lines=8, elem_id="probe-text",
                                            placeholder=f"The capital of France is {mask}. \u21d2 Paris", scale=3)
                    probe_file = gr.File(label="Or upload a probe file (.txt, .csv, .jsonl)", type="filepath",
                                         file_types=[".txt", ".csv", ".tsv", ".jsonl", ".json"], scale=1)
                probe_revs = gr.CheckboxGroup(label="Revisions to score (none ticked: revisions A and B)",
                                              choices=choices, value=[], elem_id="probe-revisions")
                score_btn = gr.Button("Score probe set", variant="primary")
                probe_message = gr.Markdown(elem_id="probe-message")
                probe_table = gr.Dataframe(headers=PROBE_HEADERS, label="Scores per revision", interactive=False,
                                           elem_id="probe-table")
                probe_plot = gr.Plot(label="Probe scores across revisions", elem_id="probe-plot")
                probe_raw = gr.JSON(visible=False)

        fill_group = dict(concurrency_id="fill_mask", concurrency_limit=concurrency_limit)
        gr.on(triggers=[submit.click, text.submit], fn=_batched(ui_fill),
              inputs=[text, top_k, targets, rev_a, model_b, rev_b], outputs=raw, batch=True,
              max_batch_size=MAX_BATCH_SIZE, api_visibility="private", **fill_group
              ).then(render, inputs=raw, outputs=[table_a, filled_a, message_a, table_b, filled_b, message_b],
                     api_visibility="private", queue=False)
        score_btn.click(ui_probe, inputs=[probe_text, probe_revs, rev_a, rev_b],
                        outputs=[probe_table, probe_plot, probe_message, probe_raw], api_visibility="private",
                        concurrency_id="probe", concurrency_limit=1)
        probe_file.upload(read_upload, inputs=probe_file, outputs=probe_text, api_visibility="private", queue=False)
        refresh_outputs = [rev_a, rev_b, probe_revs]
        refresh_btn.click(refresh, inputs=[model_b, rev_a, rev_b], outputs=refresh_outputs, api_visibility="private",
                          concurrency_id="hub", concurrency_limit=4)
        model_b.submit(refresh, inputs=[model_b, rev_a, rev_b], outputs=refresh_outputs, api_visibility="private",
                       concurrency_id="hub", concurrency_limit=4)
        demo.load(refresh, inputs=[model_b, rev_a, rev_b], outputs=refresh_outputs, api_visibility="private",
                  concurrency_id="hub", concurrency_limit=4)

        gr.api(_batched(fill_mask), api_name="fill_mask", batch=True, max_batch_size=MAX_BATCH_SIZE, **fill_group)
        gr.api(compare, api_name="compare", **fill_group)
        gr.api(probe, api_name="probe", concurrency_id="probe", concurrency_limit=1)
        gr.api(revisions, api_name="revisions", concurrency_id="hub", concurrency_limit=4)
    demo.queue(default_concurrency_limit=concurrency_limit)
    demo.bench = bench
    demo.predictor = default
    return demo


def main(argv: Optional[List[str]] = None) -> int:
    """Launch the demo. ``python app.py [--model M] [--revision R] [--host H] [--port P] [--backend B] [--share]``.

    Host and port default to gradio's own defaults (``GRADIO_SERVER_NAME``/``GRADIO_SERVER_PORT``, else
    127.0.0.1:7860), which is what a Hub Space sets.

    Returns:
        0 after the server stops.
    """
    parser = argparse.ArgumentParser(description="Gradio fill-mask test bench.")
    parser.add_argument("--model", default=None, help=f"Model folder or Hub repo id (default: ${MODEL_ENV} or {MODEL_ID_FILE}).")
    parser.add_argument("--host", default=None, help="Address to listen on (default: gradio's, 127.0.0.1).")
    parser.add_argument("--port", type=int, default=None, help="Port (default: gradio's, 7860).")
    parser.add_argument("--backend", default=None, choices=BACKENDS, help=f"Forward pass (default: ${BACKEND_ENV} or auto).")
    parser.add_argument("--revision", default=None, help=f"Default branch, tag or commit (default: ${REVISION_ENV} or main).")
    parser.add_argument("--concurrency_limit", type=int, default=DEFAULT_CONCURRENCY_LIMIT)
    parser.add_argument("--cache_size", type=int, default=None, help=f"Models kept loaded (default: ${CACHE_ENV} or 4).")
    parser.add_argument("--share", action="store_true", help="Create a public gradio.live link.")
    args = parser.parse_args(argv)
    demo = build_demo(args.model, backend=args.backend, revision=args.revision, concurrency_limit=args.concurrency_limit,
                      cache_size=args.cache_size)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0


if __name__ == "__main__":
    sys.exit(main())
