"""A README.md is never lost, locally or on the Hub: the marker of a generated card, the merge, the LFS guard.

A generated card starts with :data:`GENERATED_MARKER` (a checksum of its body), so :func:`write_card` replaces
only an unchanged generated card and merges the metadata hf-tpu-ext owns into any other (:func:`merge_card`: the
user's text and keys kept). On the Hub a card is never an LFS pointer (:func:`keep_card_out_of_lfs`, called by the
pusher's preflight). Part of :mod:`hf_tpu_ext.hub.model_card` (its guard and merge job).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Callable, Optional, Tuple

from hf_tpu_ext.errors import ArgumentError, ModelCardError

logger = logging.getLogger("hf_tpu_ext.hub")

# ---- who wrote README.md: the marker of a generated card --------------------------------------------
#: first line of a generated card's body; ``sha256`` is over the rest of the body, so an edit is detected
GENERATED_MARKER = "<!-- hf-tpu-ext generated this card; sha256={digest} (an edited card is kept) -->"
_MARKER_RE = re.compile(r"<!-- hf-tpu-ext generated this card; sha256=([0-9a-f]{16}) [^\n]*-->[ \t]*\r?\n?")
#: metadata keys the generated card owns (replaced on a merge; ``tags`` are united); every other key of an
#: existing README.md (``language``, ``license``, ``base_model``, ...) keeps the user's value unless it was
#: given explicitly (``--license``, ``--language``)
OWNED_METADATA = ("library_name", "pipeline_tag", "tags", "model-index", "datasets")


def _body_digest(body: str) -> str:
    text = _MARKER_RE.sub("", body, count=1).replace("\r\n", "\n").strip()
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def mark_generated(card):
    """Put :data:`GENERATED_MARKER` (an HTML comment, invisible on the Hub) first in ``card``'s body; returns ``card``."""
    body = _MARKER_RE.sub("", card.text, count=1).lstrip("\r\n")
    card.text = "\n" + GENERATED_MARKER.format(digest=_body_digest(body)) + "\n\n" + body
    return card


def card_origin(text: str) -> str:
    """Who wrote the card text ``text`` (a README.md).

    Returns:
        ``"generated"``: hf-tpu-ext wrote it and its body is unchanged (it may be replaced);
        ``"edited"``: hf-tpu-ext wrote it and someone changed its body since; ``"user"``: no marker.
    """
    match = _MARKER_RE.search(text)
    if not match:
        return "user"
    body = text[match.start():]
    return "generated" if match.group(1) == _body_digest(body) else "edited"


def merge_card(existing: str, generated, explicit: Tuple[str, ...] = ()):
    """The user's card ``existing`` with the metadata hf-tpu-ext owns merged in; its text is kept as it is.

    Metadata: the keys of :data:`OWNED_METADATA` take the generated card's values (``tags``: the user's, then
    the generated ones not already there; a key the generated card does not set keeps the user's value); any
    other key keeps the user's value (e.g. ``language: en``) unless it is in ``explicit``; keys only the
    generated card has are added. The user's key order comes first.

    Args:
        existing: the text of the README.md found (``---`` YAML block optional).
        generated: the :class:`huggingface_hub.ModelCard` hf-tpu-ext rendered.
        explicit: metadata keys given explicitly (``"license"``, ``"language"``): the generated value wins.

    Returns:
        ``(card, changed)``: the merged :class:`huggingface_hub.ModelCard` and the metadata keys whose value changed.

    Raises:
        ModelCardError: the YAML block of ``existing`` does not parse (nothing is written).
    """
    from huggingface_hub import ModelCard, ModelCardData

    try:
        user = ModelCard(existing, ignore_metadata_errors=True)
    except Exception as err:  # yaml.YAMLError, ValueError (not a mapping)
        raise ModelCardError(f"README.md's metadata block does not parse ({type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}).") from None
    old = user.data.to_dict()
    new = generated.data.to_dict()
    merged = dict(old)
    for key, value in new.items():
        if key == "tags":
            mine = old.get("tags") or []
            mine = [mine] if isinstance(mine, str) else list(mine)
            merged["tags"] = mine + [t for t in value if t not in mine]
        elif key in OWNED_METADATA or key in explicit or key not in old:
            merged[key] = value
    changed = [k for k in merged if merged.get(k) != old.get(k)]
    data = ModelCardData(**merged, ignore_metadata_errors=True)
    yaml_text = data.to_yaml(original_order=list(old) + [k for k in merged if k not in old])
    return ModelCard(f"---\n{yaml_text}\n---\n{user.text}", ignore_metadata_errors=True), changed


CARD_MODES = ("merge", "overwrite", "keep")


def write_card(output_dir: str, card, *, mode: str = "merge", explicit: Tuple[str, ...] = (),
               check_merged: Optional[Callable[[str], None]] = None) -> str:
    """Write ``card`` to ``output_dir/README.md`` without losing a README.md hf-tpu-ext did not write.

    Args:
        output_dir: the model folder.
        card: the generated :class:`huggingface_hub.ModelCard` (from :func:`hf_tpu_ext.hub.card_render.render_model_card`).
        mode: ``"merge"`` (default): a missing or unchanged generated README.md is replaced; one the user wrote
            or edited keeps its text and gets the owned metadata merged in (:func:`merge_card`).
            ``"overwrite"``: the generated card replaces any README.md. ``"keep"``: an existing README.md is
            left as it is (a missing one is written).
        explicit: see :func:`merge_card`.
        check_merged: called with a merged card's text before it is written (e.g. :func:`hf_tpu_ext.hub.card_check.validate_model_card`:
            the user's metadata must pass too); what it raises leaves README.md as it was.

    Returns:
        What happened: ``"written"``, ``"merged"`` or ``"kept"``.

    Raises:
        ArgumentError: an unknown ``mode``.
        ModelCardError: ``"merge"`` of a README.md whose metadata does not parse (nothing is written).
    """
    if mode not in CARD_MODES:
        raise ArgumentError(f"The card mode must be one of {', '.join(CARD_MODES)}, got {mode!r}.")
    path = os.path.join(output_dir, "README.md")
    try:
        with open(path, encoding="utf-8") as f:
            existing = f.read()
    except FileNotFoundError:
        existing = None
    if existing is not None and mode == "keep":
        return "kept"
    if existing is None or mode == "overwrite" or card_origin(existing) == "generated":
        card.save(path)
        return "written"
    merged, changed = merge_card(existing, card, explicit)
    if check_merged is not None:
        check_merged(str(merged))
    merged.save(path)
    logger.info("README.md in %s was not written by hf-tpu-ext (or was edited): its text is kept; metadata "
                "merged: %s.", output_dir, ", ".join(changed) or "nothing changed")
    return "merged"


# ---- the card on the Hub: never an LFS pointer ----------------------------------------------------
CARD_FILE = "README.md"
#: appended to a ``.gitattributes`` that routes README.md through LFS (git: the last matching line decides)
README_NOT_LFS_LINE = "README.md -filter -diff -merge text"


def _gitattributes_matches(pattern: str, path: str) -> bool:
    import fnmatch

    pattern = pattern.lstrip("/") if pattern.startswith("/") else pattern
    if "/" not in pattern:  # a bare pattern matches the file name at any depth
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
    return fnmatch.fnmatchcase(path, pattern.replace("**/", "*"))


def lfs_rule_for(gitattributes: str, path: str = CARD_FILE) -> Optional[str]:
    """The ``.gitattributes`` line that routes ``path`` through Git LFS, or ``None`` when it is a regular file.

    Follows git's rules for the ``filter`` attribute: the last line whose pattern matches decides
    (``filter=lfs`` sets it, ``-filter``/``!filter``/another ``filter=`` unsets it); a pattern without ``/``
    matches the file name in any folder.
    """
    rule = None
    for line in (gitattributes or "").splitlines():
        parts = line.strip().split()
        if not parts or parts[0].startswith("#") or not _gitattributes_matches(parts[0], path):
            continue
        for attr in parts[1:]:
            if attr == "filter=lfs":
                rule = line.strip()
            elif attr in ("-filter", "!filter") or attr.startswith("filter="):
                rule = None
    return rule


def keep_card_out_of_lfs(api, repo_id: str, revision: Optional[str] = None) -> Optional[str]:
    """Make sure a README.md pushed to ``repo_id`` is stored as a regular file, so the Hub reads its metadata.

    The Hub stores a file that ``.gitattributes`` routes through LFS as an LFS pointer, and reads no card
    metadata from a README.md stored that way (no tags, no ``pipeline_tag``, no results), silently. When the
    repo's ``.gitattributes`` routes README.md through LFS (e.g. ``*.md filter=lfs ...``), this commits
    :data:`README_NOT_LFS_LINE` appended to it (the other files keep their rules) and logs a warning.

    Args:
        api: a :class:`huggingface_hub.HfApi` with the push's token.
        repo_id: the full repo id.
        revision: the branch (``None``: main).

    Returns:
        The ``.gitattributes`` line that routed README.md through LFS (now overridden), or ``None``.

    Raises:
        huggingface_hub errors of the download or commit (the caller's retry/preflight handles them).
    """
    from huggingface_hub import CommitOperationAdd
    from huggingface_hub.utils import EntryNotFoundError

    import shutil
    import tempfile

    where = tempfile.mkdtemp(prefix="hf-tpu-attributes-")  # not the user's Hub cache: read once, then gone
    try:
        path = api.hf_hub_download(repo_id, ".gitattributes", revision=revision, local_dir=where)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except EntryNotFoundError:
        return None
    finally:
        shutil.rmtree(where, ignore_errors=True)
    rule = lfs_rule_for(text)
    if rule is None:
        return None
    fixed = text + ("" if text.endswith("\n") or not text else "\n") + README_NOT_LFS_LINE + "\n"
    api.create_commit(repo_id, [CommitOperationAdd(".gitattributes", fixed.encode("utf-8"))], revision=revision,
                      commit_message="Store README.md as a regular file (the Hub reads card metadata only from one)")
    logger.warning("%s's .gitattributes routes README.md through Git LFS (%r), so the Hub would show no card "
                   "metadata; added %r to it.", repo_id, rule, README_NOT_LFS_LINE)
    return rule
