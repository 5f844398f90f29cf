"""Check a model card: its metadata offline and with the Hub, a push snapshot's card, and what the Hub parsed.

:func:`validate_model_card` (local structural checks, then the Hub's ``/api/validate-yaml`` at the configured
endpoint), :func:`validate_card_file` (a push snapshot's card, off the training thread), and after the final push
the read-back of the metadata the Hub parsed (:func:`card_expectations`, :func:`check_card_on_hub`, called by
:meth:`hf_tpu_ext.hub.push_session.PushSession.finish`). Part of :mod:`hf_tpu_ext.hub.model_card` (its check job).
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from hf_tpu_ext.errors import ModelCardError
from hf_tpu_ext.hub.card_guard import CARD_FILE
from hf_tpu_ext.hub.preflight import endpoint

logger = logging.getLogger("hf_tpu_ext.hub")

KNOWN_LICENSES = {
    "apache-2.0", "mit", "bsd", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-4.0", "cc-by-sa-4.0",
    "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "gpl-2.0", "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "unlicense",
    "openrail", "openrail++", "llama2", "llama3", "gemma", "odc-by", "pddl", "other", "unknown",
}


def card_expectations(folder: str) -> Optional[Dict[str, Any]]:
    """What the Hub must show after ``folder/README.md`` is pushed: ``{"pipeline_tag": str or None, "tags": tuple}``
    (the card's own metadata; keyword arguments of :func:`check_card_on_hub`), or ``None`` without a README.md
    or with metadata that does not parse (the push's card check reports that)."""
    from huggingface_hub import ModelCard

    path = os.path.join(folder, CARD_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = ModelCard(f.read(), ignore_metadata_errors=True).data
    except FileNotFoundError:
        return None
    except Exception:  # unreadable metadata: nothing to expect
        return None
    tags = data.tags or []
    return {"pipeline_tag": getattr(data, "pipeline_tag", None),
            "tags": tuple([tags] if isinstance(tags, str) else tags)}


def check_card_on_hub(api, repo_id: str, revision: Optional[str] = None, *, pipeline_tag: Optional[str] = "fill-mask",
                      tags: Tuple[str, ...] = ("fill-mask",)) -> List[str]:
    """Read back the card metadata the Hub parsed at ``revision`` and say what is missing.

    Call it after every push that carried a README.md (``hf-tpu push``, the pusher's final push).

    Args:
        api: a :class:`huggingface_hub.HfApi` with the push's token.
        repo_id: the full repo id.
        revision: the commit id of the push (best) or a branch (``None``: main).
        pipeline_tag: the ``pipeline_tag`` the card sets (``None``: not checked).
        tags: tags the card sets that the Hub must show (``fill-mask`` for every hf-tpu-ext fill-mask card).

    Returns:
        Problems in words, empty when the Hub shows the metadata; e.g. ``"README.md is stored as a Git LFS
        pointer, so the Hub reads no card metadata"``.
    """
    info = api.model_info(repo_id, revision=revision, files_metadata=True)
    readme = next((s for s in info.siblings or [] if s.rfilename == CARD_FILE), None)
    if readme is None:
        return [f"{repo_id} has no {CARD_FILE} at {revision or 'main'}"]
    if getattr(readme, "lfs", None):
        return [f"{CARD_FILE} is stored as a Git LFS pointer (see the repo's .gitattributes), so the Hub reads "
                "no card metadata"]
    data = info.card_data
    if data is None:
        return [f"the Hub parsed no metadata from {CARD_FILE}"]
    problems = []
    have = data.tags or []
    have = [have] if isinstance(have, str) else list(have)
    missing = [t for t in tags if t not in have]
    if missing:
        problems.append(f"the Hub's card metadata lacks the tag(s) {', '.join(missing)} (has: {', '.join(have) or 'none'})")
    if pipeline_tag and getattr(data, "pipeline_tag", None) != pipeline_tag:
        problems.append(f"the Hub's card metadata has pipeline_tag {getattr(data, 'pipeline_tag', None)!r}, "
                        f"not {pipeline_tag!r}")
    return problems

def check_card_metadata(metadata) -> List[str]:
    """Offline structural checks of card metadata (what the Hub rejects for cards we write).

    Returns:
        A list of problems (empty when none).
    """
    errors: List[str] = []
    if not isinstance(metadata, dict):
        return ["the metadata is not a YAML dictionary"]
    for key in ("datasets", "base_model", "language", "tags", "license"):
        if key in metadata:
            v = metadata[key]
            if not ((isinstance(v, str) and v) or (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v))):
                errors.append(f"'{key}' must be a string or a list of strings, got {v!r}")
    if isinstance(metadata.get("license"), str) and metadata["license"] not in KNOWN_LICENSES:
        errors.append(f"'license' {metadata['license']!r} is not a known license identifier (e.g. apache-2.0, mit, other)")
    for i, model in enumerate(metadata.get("model-index") or []):
        if not isinstance(model, dict) or not isinstance(model.get("name"), str):
            errors.append(f"model-index[{i}].name must be a string")
            continue
        for j, result in enumerate(model.get("results") or []):
            where = f"model-index[{i}].results[{j}]"
            task, ds = result.get("task") or {}, result.get("dataset") or {}
            if not isinstance(task.get("type"), str):
                errors.append(f"{where}.task.type must be a string")
            for key in ("name", "type"):
                if not isinstance(ds.get(key), str) or not ds.get(key):
                    errors.append(f"{where}.dataset.{key} must be a non-empty string")
            errors += [f"{where}.dataset.{k} must be a string" for k, v in ds.items() if k != "args" and not isinstance(v, str)]
            for k, metric in enumerate(result.get("metrics") or []):
                value = metric.get("value") if isinstance(metric, dict) else None
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    errors.append(f"{where}.metrics[{k}].value must be a finite number, got {value!r}")
    return errors


def validate_model_card(card, token: Optional[str] = None, *, offline_ok: bool = True, remote: bool = True) -> None:
    """Check the card's metadata locally, then with the Hub's ``/api/validate-yaml`` at the configured endpoint.

    The endpoint is :func:`hf_tpu_ext.hub.preflight.endpoint` (``HF_ENDPOINT``) read at call time, not the
    hard-coded huggingface.co URL ``RepoCard.validate`` uses.

    Args:
        card: a :class:`huggingface_hub.ModelCard` (or the card text).
        token: sent as authorization when given (the Hub does not need one).
        offline_ok: when the endpoint cannot be reached or answers 5xx/429 (the Hub's trouble, not the card's),
            log a warning and accept the card after the local checks (True), or raise (False).
        remote: also ask the Hub (False: the local checks only, no network).

    Raises:
        ModelCardError: the local checks or the Hub rejected the metadata; the message is the Hub's.
    """
    import requests
    import yaml
    from huggingface_hub.utils import build_hf_headers, get_session

    text = str(card)
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n?", text, flags=re.S)
    try:
        metadata = yaml.safe_load(match.group(1)) if match else {}
    except yaml.YAMLError as err:
        raise ModelCardError(f"The model card's YAML metadata does not parse: {err}") from None
    problems = check_card_metadata(metadata or {})
    if problems:
        raise ModelCardError("Model card metadata is invalid: " + "; ".join(problems))
    if not remote:
        return

    url = f"{endpoint()}/api/validate-yaml"
    headers = build_hf_headers(token=token or False)
    try:
        response = get_session().post(url, json={"repoType": "model", "content": text}, headers=headers, timeout=30)
    except (requests.ConnectionError, requests.Timeout) as err:
        if offline_ok:
            logger.warning("Could not reach %s to validate the model card (%s); local checks passed.", url, type(err).__name__)
            return
        raise ModelCardError(f"Could not reach {url} to validate the model card; check the network or HF_ENDPOINT.") from None
    if (response.status_code >= 500 or response.status_code == 429) and offline_ok:
        logger.warning("%s answered HTTP %d; the model card passed the local checks and is kept.", url,
                       response.status_code)
        return
    if response.status_code >= 400:
        try:
            message = response.json().get("error") or response.text
        except ValueError:
            message = response.text
        if token:
            message = str(message).replace(token, "<redacted>")
        raise ModelCardError(f"The Hub rejected the model card metadata (HTTP {response.status_code}): {message}")


def validate_card_file(folder: str, token: Optional[str] = None) -> bool:
    """Have the Hub validate ``folder/README.md``; remove the file when the Hub rejects it.

    Meant for a push snapshot (:meth:`hf_tpu_ext.hub.push_queue.PushQueue.submit`'s ``before_upload``): the
    request runs off the training thread, and a card the Hub rejects is left out of the commit so the repo
    keeps its last valid card (the copy in the output folder stays as written). The rejection is logged as
    an error. When the check itself fails (Hub unreachable or 5xx, unreadable file) the card is kept: the
    push of the weights must not depend on it.

    Returns:
        True when the card is kept (no card, validated, or the check could not run); False when the Hub
        rejected it and it was removed from ``folder``.
    """
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return True
    try:
        with open(path, encoding="utf-8") as f:
            validate_model_card(f.read(), token=token)
    except ModelCardError as err:
        logger.error("Model card not pushed: %s", err)
        os.remove(path)
        return False
    except Exception as err:  # the check, not the card, failed
        logger.warning("Could not check the model card with the Hub (%s); pushing it as written.", type(err).__name__)
    return True
