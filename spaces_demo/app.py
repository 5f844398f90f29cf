"""Gradio fill-mask demo for a RoBERTa-style masked language model.

This file is both the local demo (``hf-tpu demo``) and the ``app.py`` of the Hub Space that
``hf-tpu deploy-space`` creates, so it imports nothing from ``hf_tpu_ext`` at module level and needs
only ``transformers``, ``gradio``, ``numpy`` and one of ``torch`` / TensorFlow.

Which model is shown (first match wins): the ``model`` argument of :func:`build_demo` / ``--model``,
the ``MODEL_ID`` environment variable, the first line of ``model_id.txt`` next to this file (written
by ``hf-tpu deploy-space``).

Several masks in one sentence are predicted **independently from one forward pass**: each mask
position gets its own ranked candidates given the other masks still masked, and the "filled" sentence
puts each position's top candidate in its place (no left-to-right re-encoding).

Scores are probabilities of the softmax over the vocabulary at the mask position with every special
token (``<s>``, ``<pad>``, ``</s>``, ``<unk>``, ``<mask>``, ...) removed from the softmax, so special
tokens are never candidates. With ``targets`` the scores stay those probabilities (not renormalized
over the targets), as in transformers' fill-mask pipeline.

API: the event ``/fill_mask`` takes ``(text: str, top_k: int, targets: str)`` and returns one JSON
dict (see :meth:`FillMaskPredictor.predict`), e.g.::

    from gradio_client import Client
    Client("http://127.0.0.1:7860/").predict("The <mask> sat.", 5, "", api_name="/fill_mask")
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

BACKENDS = ("auto", "torch", "tensorflow")
BACKEND_ENV = "FILL_MASK_BACKEND"
MODEL_ENV = "MODEL_ID"
MODEL_ID_FILE = "model_id.txt"
DEFAULT_TOP_K = 5
DEFAULT_CONCURRENCY_LIMIT = 4
# Tokenizers without a real limit report a huge sentinel (int(1e30)) as model_max_length.
_NO_LIMIT = 1_000_000

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
    """One forward pass with ``transformers.AutoModelForMaskedLM`` (PyTorch, CPU or the first GPU)."""

    name = "torch"

    def __init__(self, model_id_or_path: str, revision: Optional[str] = None):
        import torch
        from transformers import AutoModelForMaskedLM

        self._torch = torch
        self.model = AutoModelForMaskedLM.from_pretrained(model_id_or_path, revision=revision)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Args: int64 ``[B, L]`` arrays. Returns: float32 logits ``[B, L, V]``."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.as_tensor(input_ids, device=self.device),
                attention_mask=torch.as_tensor(attention_mask, device=self.device),
            )
        return out.logits.float().cpu().numpy()


class _TensorFlowForward:
    """One forward pass with the TF model from ``hf_tpu_ext.backends.tensorflow.export.load_tf_model``."""

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

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Args: int64 ``[B, L]`` arrays. Returns: float32 logits ``[B, L, V]``."""
        tf = self._tf
        out = self.model(
            input_ids=tf.constant(input_ids, dtype=tf.int32),
            attention_mask=tf.constant(attention_mask, dtype=tf.int32),
            training=False,
        )
        logits = out["logits"] if isinstance(out, dict) or hasattr(out, "keys") else getattr(out, "logits", out)
        return np.asarray(logits, dtype=np.float32)


RESULT_KEYS = ("ok", "message", "masks", "filled", "text", "top_k", "rejected_targets", "num_tokens",
               "max_length", "mask_token", "backend")


def _empty_result(message: str, **extra: Any) -> Dict[str, Any]:
    """A result without predictions (``ok=False``), with every key of :data:`RESULT_KEYS` present."""
    result: Dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    result.update(ok=False, message=message, masks=[], rejected_targets=[])
    result.update(extra)
    return result


class FillMaskPredictor:
    """Tokenizer + masked-LM forward pass + the input rules of the demo.

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
        OSError: the folder/repo has no loadable tokenizer or model (transformers' message).
    """

    def __init__(self, model_id_or_path: str, backend: Optional[str] = None, revision: Optional[str] = None):
        from transformers import AutoConfig, AutoTokenizer

        model_id_or_path = os.fspath(model_id_or_path)
        self.model_id = model_id_or_path
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
        special = set(self.tokenizer.all_special_ids)
        special.update(i for i, tok in self.tokenizer.added_tokens_decoder.items() if tok.special)
        self.special_ids = sorted(i for i in special if 0 <= i < self.vocab_size)
        self._blocked = np.zeros(self.vocab_size, dtype=bool)
        self._blocked[self.special_ids] = True
        self._blocked[min(len(self.tokenizer), self.vocab_size):] = True
        self.num_candidates = int((~self._blocked).sum())
        self._mask_re = re.compile(
            "|".join([re.escape(self.mask_token), *_MASK_VARIANTS]), flags=re.IGNORECASE
        )

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
        """Replace ``<mask>``/``[MASK]`` (any case) and the model's own mask token by the model's mask token.

        Args:
            text: the user's sentence.

        Returns:
            The sentence with every mask spelled as :attr:`mask_token`.
        """
        return self._mask_re.sub(self.mask_token, text)

    def resolve_targets(self, targets: Optional[str | Sequence[str]]) -> tuple[List[int], List[str]]:
        """Map candidate words to vocabulary ids.

        A word is accepted when it is one non-special token either with a leading space (``Ġword``,
        as mid-sentence) or without (``word``, as at the start); when both exist, both are scored
        (spaced form first).
        A raw vocabulary entry (e.g. ``Ġword``) is accepted as is.

        Args:
            targets: comma-separated words, a list of words, or ``None``/``""`` for no restriction.

        Returns:
            ``(ids, rejected)``: unique ids in the order given, and the words that are not a single
            token of this vocabulary.
        """
        if targets is None:
            return [], []
        words = targets.split(",") if isinstance(targets, str) else list(targets)
        ids: List[int] = []
        rejected: List[str] = []
        vocab = self.tokenizer.get_vocab()
        for word in (w.strip() for w in words):
            if not word:
                continue
            found = []
            for variant in (" " + word, word):
                enc = self.tokenizer(variant, add_special_tokens=False)["input_ids"]
                if len(enc) == 1:
                    found.append(enc[0])
            if word in vocab:
                found.append(vocab[word])
            found = [i for i in dict.fromkeys(found) if 0 <= i < self.vocab_size and not self._blocked[i]]
            if not found:
                rejected.append(word)
            for i in found:
                if i not in ids:
                    ids.append(i)
        return ids, rejected

    def predict(self, text: Optional[str], top_k: Any = DEFAULT_TOP_K, targets: Optional[str | Sequence[str]] = None) -> Dict[str, Any]:
        """Fill the masks of one sentence.

        Args:
            text: a sentence with one or more masks (``<mask>``, ``[MASK]`` or the model's token).
            top_k: candidates per mask (int >= 1). Larger than the candidates available (the
                non-special vocabulary, or the accepted targets) is clamped, and the message says so.
            targets: optional comma-separated candidate words; only those are ranked.

        Returns:
            A JSON-able dict:
            ``ok`` (bool), ``message`` (str, what happened or what to type),
            ``masks`` (list with one list per mask, left to right, of
            ``{"rank": int, "token": int id, "token_str": decoded text, "raw_token": vocab entry,
            "score": float in (0, 1]}`` sorted by score, descending),
            ``filled`` (the sentence with each mask replaced by its top candidate, or ``None``),
            ``text`` (the sentence as given to the model), ``mask_token``, ``top_k`` (after clamping),
            ``rejected_targets`` (list[str]), ``num_tokens`` and ``max_length`` (ints), ``backend``.
            Input problems give ``ok=False`` with an explanation, never an exception.
        """
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
        try:
            k = int(float(top_k)) if top_k not in (None, "") else DEFAULT_TOP_K
        except (TypeError, ValueError):
            return _empty_result(f"top_k must be a whole number >= 1, got {top_k!r}.", text=text, **common)
        if k < 1:
            return _empty_result(f"top_k must be >= 1, got {k}.", text=text, **common)

        enc = self.tokenizer(text, return_tensors="np", verbose=False)
        input_ids = enc["input_ids"].astype(np.int64)
        num_tokens = int(input_ids.shape[1])
        common["num_tokens"] = num_tokens
        if num_tokens > self.max_length:
            return _empty_result(
                f"Input too long: it is {num_tokens} tokens (with {self.tokenizer.bos_token or 'start'} and "
                f"{self.tokenizer.eos_token or 'end'}), this model reads at most {self.max_length}. "
                f"Shorten it by {num_tokens - self.max_length} tokens.", text=text, **common)

        notes = []
        target_ids, rejected = self.resolve_targets(targets)
        common["rejected_targets"] = rejected
        if rejected:
            notes.append(
                "Not scored (not a single token in this model's vocabulary): "
                + ", ".join(repr(w) for w in rejected) + ".")
        if rejected and not target_ids:
            return _empty_result(
                " ".join(notes) + " None of the targets can be scored: give words that are one token, or clear targets.",
                text=text, **common)

        available = len(target_ids) if target_ids else self.num_candidates
        if k > available:
            what = "accepted targets" if target_ids else "non-special vocabulary entries"
            notes.append(f"top_k {k} is more than the {available} {what}; showing {available}.")
            k = available

        positions = np.flatnonzero(input_ids[0] == self.mask_token_id)
        logits = self._forward.logits(input_ids, enc["attention_mask"].astype(np.int64))
        logits = np.asarray(logits[0, positions, : self.vocab_size], dtype=np.float64)  # [M, V]
        logits[:, self._blocked] = -np.inf
        logits -= logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)

        masks = []
        filled_ids = input_ids[0].copy()
        for m, pos in enumerate(positions):
            p = probs[m]
            if target_ids:
                cand = np.asarray(target_ids)
                order = cand[np.argsort(-p[cand], kind="stable")][:k]
            else:
                order = np.argsort(-p, kind="stable")[:k]
            ranked = [
                {
                    "rank": r + 1,
                    "token": int(i),
                    "token_str": self.tokenizer.decode([int(i)], clean_up_tokenization_spaces=False),
                    "raw_token": self.tokenizer.convert_ids_to_tokens(int(i)),
                    "score": float(p[i]),
                }
                for r, i in enumerate(order)
            ]
            masks.append(ranked)
            filled_ids[pos] = ranked[0]["token"]
        filled = self.tokenizer.decode(filled_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        head = (f"Filled {len(masks)} masks (each predicted independently in one forward pass)."
                if len(masks) > 1 else "Filled 1 mask.")
        return {"ok": True, "message": " ".join([head, *notes]), "masks": masks, "filled": filled,
                "text": text, "top_k": k, **common}


RESULT_HEADERS = ["mask", "rank", "token", "vocab entry", "id", "score"]


def result_rows(result: Dict[str, Any]) -> List[list]:
    """Table rows ``[mask #, rank, token text (quoted), vocab entry, id, score rounded to 4]`` of a result."""
    rows = []
    for m, ranked in enumerate(result.get("masks") or [], start=1):
        for c in ranked:
            rows.append([m, c["rank"], repr(c["token_str"]), c["raw_token"], c["token"], round(c["score"], 4)])
    return rows


def build_demo(model_id_or_path: Optional[str] = None, *, backend: Optional[str] = None,
               revision: Optional[str] = None, concurrency_limit: int = DEFAULT_CONCURRENCY_LIMIT,
               predictor: Optional[FillMaskPredictor] = None):
    """Build the Gradio app (queued, not launched).

    Args:
        model_id_or_path: model folder or Hub repo id; ``None`` uses :func:`default_model_id`.
        backend: ``"torch"``, ``"tensorflow"`` or ``"auto"``/``None`` (see :func:`select_backend`).
        revision: branch, tag or commit of a Hub repo.
        concurrency_limit: requests run at the same time (the queue's ``default_concurrency_limit``).
        predictor: an already loaded :class:`FillMaskPredictor` (then the model arguments are ignored).

    Returns:
        A ``gr.Blocks`` whose event ``/fill_mask`` (text, top_k, targets) returns the dict of
        :meth:`FillMaskPredictor.predict`.

    Raises:
        ValueError: no model given and none configured, or an unknown backend.
        OSError: the model cannot be loaded.
    """
    import gradio as gr

    if predictor is None:
        model_id_or_path = model_id_or_path or default_model_id()
        if not model_id_or_path:
            raise ValueError(f"No model: pass a model folder or repo id, or set the {MODEL_ENV} environment variable.")
        predictor = FillMaskPredictor(model_id_or_path, backend=backend, revision=revision)
    mask = predictor.mask_token

    def fill_mask(text: str, top_k: float, targets: str) -> dict:
        try:
            return predictor.predict(text, top_k, targets or None)
        except Exception as err:  # keep the UI/API answering with a message, not a traceback
            return _empty_result(f"Prediction failed: {type(err).__name__}: {err}", mask_token=mask,
                                 backend=predictor.backend, max_length=predictor.max_length)

    def render(result: dict):
        result = result or {}
        # escaped: the message quotes the mask token ("<mask>"), which Markdown would drop as an HTML tag
        status = ("" if result.get("ok") else "**Note:** ") + html.escape(str(result.get("message", "")))
        return result_rows(result), result.get("filled") or "", status

    with gr.Blocks(title=f"Fill-mask: {predictor.model_id}") as demo:
        gr.Markdown(
            f"# Fill-mask demo\nModel: `{predictor.model_id}` ({predictor.backend}). Type a sentence with "
            f"`{mask}` (or `[MASK]`) where a word is missing; several masks are predicted independently "
            "in one forward pass.")
        with gr.Row():
            with gr.Column(scale=3):
                text = gr.Textbox(label="Sentence", lines=2, placeholder=f"Paris is the {mask} of France.")
                targets = gr.Textbox(label="Targets (optional, comma-separated candidate words)",
                                     placeholder="capital, city")
            with gr.Column(scale=1):
                top_k = gr.Number(label="top_k", value=DEFAULT_TOP_K, precision=0)
                submit = gr.Button("Fill", variant="primary")
        message = gr.Markdown(elem_id="fill-mask-message")
        filled = gr.Textbox(label="Filled with the best guesses", interactive=False, elem_id="fill-mask-filled")
        table = gr.Dataframe(headers=RESULT_HEADERS, label="Ranked candidates per mask",
                             interactive=False, elem_id="fill-mask-table")
        with gr.Accordion("JSON (what the /fill_mask API returns)", open=False):
            raw = gr.JSON(label="result")
        gr.Examples(
            examples=[[f"Paris is the {mask} of France.", DEFAULT_TOP_K, ""],
                      [f"The {mask} sat on the {mask}.", 3, ""],
                      [f"I like to drink {mask} in the morning.", 5, "coffee, tea, water"]],
            inputs=[text, top_k, targets], cache_examples=False)
        gr.on(triggers=[submit.click, text.submit], fn=fill_mask, inputs=[text, top_k, targets], outputs=raw,
              api_name="fill_mask").then(render, inputs=raw, outputs=[table, filled, message],
                                         api_visibility="private", queue=False)
    demo.queue(default_concurrency_limit=concurrency_limit)
    demo.predictor = predictor
    return demo


def main(argv: Optional[List[str]] = None) -> int:
    """Launch the demo. ``python app.py [--model M] [--host H] [--port P] [--backend B] [--share]``.

    Host and port default to gradio's own defaults (``GRADIO_SERVER_NAME``/``GRADIO_SERVER_PORT``, else
    127.0.0.1:7860), which is what a Hub Space sets.

    Returns:
        0 after the server stops.
    """
    parser = argparse.ArgumentParser(description="Gradio fill-mask demo.")
    parser.add_argument("--model", default=None, help=f"Model folder or Hub repo id (default: ${MODEL_ENV} or {MODEL_ID_FILE}).")
    parser.add_argument("--host", default=None, help="Address to listen on (default: gradio's, 127.0.0.1).")
    parser.add_argument("--port", type=int, default=None, help="Port (default: gradio's, 7860).")
    parser.add_argument("--backend", default=None, choices=BACKENDS, help=f"Forward pass (default: ${BACKEND_ENV} or auto).")
    parser.add_argument("--revision", default=None, help="Branch, tag or commit of a Hub repo.")
    parser.add_argument("--concurrency_limit", type=int, default=DEFAULT_CONCURRENCY_LIMIT)
    parser.add_argument("--share", action="store_true", help="Create a public gradio.live link.")
    args = parser.parse_args(argv)
    demo = build_demo(args.model, backend=args.backend, revision=args.revision, concurrency_limit=args.concurrency_limit)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0


if __name__ == "__main__":
    sys.exit(main())
