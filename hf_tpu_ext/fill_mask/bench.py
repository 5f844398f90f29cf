"""What the test bench serves: one configured model, its revisions, a model cache, fill-mask and probe requests.

Used by ``spaces_demo/app.py`` (the Gradio page and API) and ``hf-tpu probe``; no Gradio here.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from hf_tpu_ext import probes
from hf_tpu_ext.fill_mask import report
from hf_tpu_ext.fill_mask.predictor import FillMaskPredictor, empty_result
from hf_tpu_ext.fill_mask.revisions import ModelCache, hub_step, is_local_model, list_revisions, step_from_title

REVISION_ENV = "MODEL_REVISION"
CACHE_ENV = "MODEL_CACHE_SIZE"
DEFAULT_CACHE_SIZE = 4
REVISIONS_TTL_S = 20.0  # a page load re-lists the repo's revisions at most this often
_SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")


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
                        "kind": "unlisted", "sha": None, "title": "", "step": None, "date": None,
                        "loadable": True, "reason": None}]
        with self._lock:
            self._revisions[model] = (time.monotonic(), listing)
        return listing

    def offered(self, model: str = "", refresh: bool = False) -> List[Dict[str, Any]]:
        """The loadable revisions (what the page offers): :meth:`revisions` without ``loadable: False``."""
        return [r for r in self.revisions(model, refresh) if r.get("loadable", True)]

    def not_offered(self, model: str = "") -> List[Dict[str, Any]]:
        """The revisions left out of the page's choices, each with its ``reason``."""
        return [r for r in self.revisions(model) if not r.get("loadable", True)]

    def default_value(self) -> str:
        """The dropdown value of the default revision."""
        if self.local:
            return ""
        values = [r["value"] for r in self.offered()]
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
            for entry in listing:  # a sha (or prefix) of a commit a branch names resolves to the branch's entry
                if entry.get("sha") and _SHA_RE.match(revision) and entry["sha"].startswith(revision):
                    return entry
        return {"value": revision, "label": revision, "kind": "unlisted", "sha": revision, "title": "",
                "step": step_from_title(revision), "date": None, "loadable": True, "reason": None}

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
        if not info.get("loadable", True):  # known from its file list: no download attempted
            raise OSError(f"Revision {info['label']!r} of {model} has no loadable model ({info['reason']}); "
                          "pick another revision.")
        try:
            predictor = self.cache.get(model, info["sha"] or "")
        except (OSError, ValueError) as err:  # e.g. the repo's initial commit: no config.json / tokenizer yet
            reason = str(err).split("\n")[0]
            reason = reason if len(reason) <= 160 else reason[:157] + "..."
            raise OSError(f"Revision {info['label']!r} of {model} has no loadable model ({reason}); "
                          "pick another revision.") from None
        if info.get("step") is None and info.get("kind") != "local":
            info = dict(info, step=hub_step(model, info["sha"]))
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
                results[i] = empty_result(str(err), model=model or self.model, revision={"value": revision})
                continue
            key = (id(predictor), info["value"])
            loaded[key] = (predictor, info)
            groups.setdefault(key, []).append(i)
        for key, idx in groups.items():
            predictor, info = loaded[key]
            try:
                answers = predictor.predict_many([(requests[i][0], requests[i][1], requests[i][2] or None) for i in idx])
            except Exception as err:  # keep answering with a message, not a traceback
                answers = [empty_result(f"Prediction failed: {type(err).__name__}: {err}",
                                         mask_token=predictor.mask_token, backend=predictor.backend,
                                         max_length=predictor.max_length)] * len(idx)
            for i, answer in zip(idx, answers):
                results[i] = dict(answer, model=predictor.model_id, revision=_public(info))
        return results  # type: ignore[return-value]

    def probe(self, text: str, revisions: Union[str, Sequence[str]] = "", model: str = "",
              strict: bool = False) -> Dict[str, Any]:
        """Score a probe set on one or more revisions.

        Args:
            text: the probe set (plain lines, CSV or JSONL, see ``probes.parse_probes``).
            revisions: comma-separated revisions (or a list); empty: the default revision.
            model: a Hub repo id (default: the configured model).
            strict: a probe that cannot be scored fails the revision instead of being skipped and listed.

        Returns:
            ``{"ok": bool, "message": str, "n": probes parsed, "rows": [...], "comparisons": [...],
            "skipped": [{"line", "template", "reason"}]}``. A row per revision, in the order given:
            ``{"revision", "label", "sha", "step", "n", "top1", "top5", "mrr", "loglik", "loglik_per_char",
            "multi_token", "intervals": {metric: [low, high]}, "templates": spread or None, "seconds",
            "lines_per_second"}`` (see :func:`hf_tpu_ext.fill_mask.report.revision_report`); a comparison per
            revision after the first, against the one before it, Holm-corrected over the comparisons
            (:func:`hf_tpu_ext.fill_mask.report.compare_all`). Revisions naming one commit (``main`` and its
            sha) are scored once. Malformed lines are listed in ``skipped`` (``strict``: an error). Input
            problems give ``ok=False`` and the reason.
        """
        try:
            probe_list = probes.parse_probes(text or "", strict=strict)
        except probes.ProbeError as err:
            return {"ok": False, "message": str(err), "n": 0, "rows": [], "comparisons": [], "skipped": []}
        wanted = revisions.split(",") if isinstance(revisions, str) else list(revisions or [])
        wanted = [w.strip() for w in wanted if w and w.strip()] or [""]
        rows, problems, results, skipped, duplicates, seen = [], [], [], [], [], {}
        for rev in dict.fromkeys(wanted):
            try:
                predictor, info = self.predictor(model, rev)
                if info.get("sha") and info["sha"] in seen:  # one commit under two names: scored once
                    duplicates.append(f"{rev or 'The default revision'} is the same commit as {seen[info['sha']]} ({info['sha'][:7]}): "
                                      "scored once.")
                    continue
                seen[info.get("sha") or rev] = rev or "the default revision"
                result = predictor.score_probes(probe_list, strict=strict)
            except (probes.ProbeError, OSError, ValueError) as err:
                problems.append(f"{rev or 'default revision'}: {err}")
                continue
            results.append(result)
            rows.append({"revision": info["value"], "label": info["label"], "sha": info["sha"],
                         "step": info["step"], **report.revision_report(result),
                         "lines_per_second": round(result.n / max(result.seconds, 1e-9), 1)})
            for entry in rows[-1]["skipped"]:
                if entry not in skipped:
                    skipped.append(entry)
        comparisons = report.compare_all(results, [r["label"] for r in rows]) if len(rows) > 1 else []
        total = len(probe_list) + len(probe_list.malformed)
        return {"ok": bool(rows) and not problems, "message": _probe_message(rows, skipped, problems, duplicates, total),
                "n": len(probe_list), "rows": rows, "comparisons": comparisons, "skipped": skipped}


def _probe_message(rows, skipped, problems, duplicates, total: int) -> str:
    """The one-paragraph status of a probe request: what was scored, skipped, not scored, scored once."""
    plural = "s" if len(rows) != 1 else ""
    if skipped and rows:
        shown = "; ".join(f"line {e['line']}: {e['reason']}" for e in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        message = (f"Scored {rows[0]['n']} of {total} probes on {len(rows)} revision{plural}; skipped "
                   f"{len(skipped)} that cannot be scored: {shown}{more}.")
    else:
        message = f"Scored {total} probes on {len(rows)} revision{plural}."
    if duplicates:
        message += " " + " ".join(duplicates)
    if problems:
        message = (message + " " if rows else "") + "Not scored: " + " | ".join(problems)
    return message


def _public(info: Dict[str, Any]) -> Dict[str, Any]:
    return {k: info.get(k) for k in ("value", "label", "sha", "step", "title")}


