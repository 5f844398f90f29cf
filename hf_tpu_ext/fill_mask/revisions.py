"""The revisions of a fill-mask model repo the test bench offers, and the cache of loaded revisions.

Revisions come from ``HfApi.list_repo_refs`` / ``list_repo_commits`` at ``HF_ENDPOINT``; a commit is offered
only when its files (``HfApi.list_repo_files`` at that commit, cached by commit: a commit never changes) hold a
model: ``config.json``, weights and tokenizer files. The repo's first commit ("initial commit", only
``.gitattributes``) and card-only commits are listed with ``loadable: False`` and the reason, and left out of
the page's choices.
"""

from __future__ import annotations

import collections
import json
import os
import re
import threading
from typing import Any, Dict, Iterable, List, Optional, Tuple

_STEP_RE = re.compile(r"\bstep[ _-]?(\d+)", re.IGNORECASE)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "tf_model.h5")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer_config.json", "sentencepiece.bpe.model",
                   "spiece.model")
_files_cache: Dict[Tuple[str, str], List[str]] = {}
_files_lock = threading.Lock()


def step_from_title(title: Optional[str]) -> Optional[int]:
    """The training step a push callback's commit title names ("Training in progress, step 200" -> 200)."""
    m = _STEP_RE.search(title or "")
    return int(m.group(1)) if m else None


def is_local_model(model: str) -> bool:
    """True for an existing folder (a model folder, not a Hub repo id)."""
    return os.path.isdir(model)


def missing_model_files(files: Iterable[str]) -> Optional[str]:
    """Why a revision with these files (paths at the repo root) cannot be loaded, or ``None`` when it can.

    Returns:
        ``"no config.json"``, ``"no model weights (model.safetensors)"``, ``"no tokenizer files"`` (the
        first that applies; several joined with ", "), or ``None``.
    """
    names = set(files)
    missing = []
    if "config.json" not in names:
        missing.append("no config.json")
    if not names & set(WEIGHT_FILES) and not any(n.startswith("model-") and n.endswith(".safetensors") for n in names):
        missing.append("no model weights (model.safetensors)")
    if not names & set(TOKENIZER_FILES):
        missing.append("no tokenizer files")
    return ", ".join(missing) or None


def revision_files(api, model: str, sha: str) -> List[str]:
    """``api.list_repo_files(model, revision=sha)``, cached per ``(model, sha)`` for the process (commits never change)."""
    key = (model, sha)
    with _files_lock:
        if key in _files_cache:
            return _files_cache[key]
    files = list(api.list_repo_files(model, revision=sha))
    with _files_lock:
        _files_cache[key] = files
    return files


def list_revisions(model: str, token: Optional[str] = None) -> List[Dict[str, Any]]:
    """The revisions of a Hub model repo, newest first, one entry per commit, each marked loadable or not.

    Branches (and tags) come first, then the other commits of the default branch, newest first. A commit that a
    branch or tag points to is listed once, under that name (``main`` stays ``main``, so the page follows the
    branch), never again as a commit: two entries of one commit would be scored and compared with themselves.
    Whether a revision holds a model is read from its file list (:func:`revision_files`, one request per new
    commit).

    Args:
        model: a Hub repo id (a local folder gives one entry, ``value=""``).
        token: Hub token for a private repo (default: ``HF_TOKEN`` / the cached login).

    Returns:
        ``[{"value": ref name or full commit sha, "label": str, "kind": "branch"|"tag"|"commit"|"local",
        "refs": names of the branches and tags at that commit, "sha": commit sha or None, "title": commit title,
        "step": int or None, "date": ISO time or None, "loadable": bool, "reason": why not (str) or None}]``.
        A revision whose files cannot be listed counts as loadable (loading it then says what is wrong).

    Raises:
        huggingface_hub errors (``RepositoryNotFoundError``, connection errors) of the ref/commit listing.
    """
    if is_local_model(model):
        return [{"value": "", "label": f"local folder {os.path.basename(os.path.normpath(model))}", "kind": "local",
                 "refs": [], "sha": None, "title": "", "step": _local_step(model), "date": None, "loadable": True,
                 "reason": None}]
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    refs = api.list_repo_refs(model)
    commits = api.list_repo_commits(model)
    by_sha = {c.commit_id: c for c in commits}
    named: Dict[str, List[Tuple[str, str]]] = {}  # sha -> [(ref name, kind)], main first
    for kind, entries in (("branch", refs.branches), ("tag", refs.tags or [])):
        for ref in sorted(entries, key=lambda r: (r.name != "main", r.name)):
            named.setdefault(ref.target_commit, []).append((ref.name, kind))
    out = [_ref_entry(sha, names, by_sha.get(sha)) for sha, names in named.items()]
    for c in commits:  # the Hub lists them newest first
        if c.commit_id not in named:
            out.append({"value": c.commit_id, "label": f"{c.title} · {c.commit_id[:7]}", "kind": "commit", "refs": [],
                        "sha": c.commit_id, "title": c.title, "step": step_from_title(c.title),
                        "date": c.created_at.isoformat()})
    for entry in out:
        try:
            reason = missing_model_files(revision_files(api, model, entry["sha"]))
        except Exception:  # a listing that fails must not hide the revision: loading it will say why
            reason = None
        entry.update(loadable=reason is None, reason=reason)
    return out


def _ref_entry(sha: str, names: List[Tuple[str, str]], commit) -> Dict[str, Any]:
    """The one entry of a commit that branches/tags point to: named by the first (``main`` first)."""
    title = commit.title if commit else ""
    shown = ", ".join(f"{name} ({kind})" for name, kind in names)
    label = " · ".join(part for part in (shown, title, sha[:7]) if part)
    return {"value": names[0][0], "label": label, "kind": names[0][1], "refs": [name for name, _ in names],
            "sha": sha, "title": title, "step": step_from_title(title),
            "date": commit.created_at.isoformat() if commit else None}


def _local_step(folder: str) -> Optional[int]:
    try:
        with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ModelCache:
    """Loaded :class:`~hf_tpu_ext.fill_mask.predictor.FillMaskPredictor` s by ``(model, commit)``, least recently used out.

    Args:
        max_models: models kept (>= 1); loading one more drops the least recently used.
        loader: ``(model, revision) -> FillMaskPredictor``.
    """

    def __init__(self, max_models: int, loader):
        self.max_models = max(1, int(max_models))
        self._loader = loader
        self._models: "collections.OrderedDict[Tuple[str, str], Any]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._loading: Dict[Tuple[str, str], threading.Lock] = {}
        self.loads = 0

    def keys(self) -> List[Tuple[str, str]]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._models)

    def put(self, key: Tuple[str, str], predictor: Any) -> None:
        with self._lock:
            self._models[key] = predictor
            self._models.move_to_end(key)
            while len(self._models) > self.max_models:
                self._models.popitem(last=False)

    def get(self, model: str, revision: str) -> Any:
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



def hub_step(model: str, sha: Optional[str]) -> Optional[int]:
    """``global_step`` of the ``trainer_state.json`` at a commit ("End of training" names no step)."""
    if not sha:
        return None
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(model, "trainer_state.json", revision=sha)
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except Exception:  # no trainer_state.json at that commit: the chart places it by order instead
        return None
