"""Model cards (``README.md``) for trained fill-mask models, and their validation.

The card is rendered from the package template ``hf_tpu_ext/templates/model_card.md`` with
:meth:`huggingface_hub.ModelCard.from_template`. Metadata comes from ``training_summary.json``
(:func:`hf_tpu_ext.outputs.read_training_summary`); when it is missing, from what the folder shows
(``config.json``, the tokenizer's mask token, ``trainer_state.json``).

A README.md is never lost: a generated card starts with :data:`GENERATED_MARKER` (a checksum of its body), so
:func:`write_card` replaces only an unchanged generated card and merges the metadata hf-tpu-ext owns into any
other (:func:`merge_card`: the user's text and keys kept). On the Hub a card is never an LFS pointer
(:func:`keep_card_out_of_lfs`, called by the pusher's preflight) and the metadata the Hub parsed is read back
after the final push (:func:`check_card_on_hub`, called by :meth:`hf_tpu_ext.hub.pusher.HubPusher.finish`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from importlib import resources
from typing import Any, Callable, Dict, List, Optional, Tuple

from hf_tpu_ext.fileio import read_json_object
from hf_tpu_ext.errors import ModelCardError
from hf_tpu_ext.hub.card_facts import eval_results_from_logs, framework_versions, strategy_label  # noqa: F401

logger = logging.getLogger("hf_tpu_ext.hub")

KNOWN_LICENSES = {
    "apache-2.0", "mit", "bsd", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-4.0", "cc-by-sa-4.0",
    "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "gpl-2.0", "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "unlicense",
    "openrail", "openrail++", "llama2", "llama3", "gemma", "odc-by", "pddl", "other", "unknown",
}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$|^[A-Za-z0-9][\w.\-]*$")


def default_template_path() -> str:
    """Filesystem path of the packaged card template (``hf_tpu_ext/templates/model_card.md``)."""
    return str(resources.files("hf_tpu_ext").joinpath("templates", "model_card.md"))


_read_json = read_json_object  # missing or damaged run files read as {}


def load_summary(output_dir: str) -> Dict[str, Any]:
    """The training summary of ``output_dir``, completed from the folder's files where it is missing.

    Args:
        output_dir: a folder written by ``hf-tpu train`` / ``save_model_folder``.

    Returns:
        A dict with (some of) the keys of ``training_summary.json``; always ``model_config`` (possibly
        empty) and ``mask_token``.
    """
    summary: Dict[str, Any] = {}
    try:
        from hf_tpu_ext.outputs import read_training_summary

        summary = dict(read_training_summary(output_dir) or {})
    except ImportError:
        summary = _read_json(os.path.join(output_dir, "training_summary.json"))
    except (OSError, ValueError, KeyError) as err:
        logger.info("No training summary in the output folder (%s); the card uses what the folder shows.", type(err).__name__)
    if not summary.get("model_config"):
        summary["model_config"] = _read_json(os.path.join(output_dir, "config.json"))
    if not summary.get("mask_token"):
        tok = _read_json(os.path.join(output_dir, "tokenizer_config.json")).get("mask_token")
        if tok is None:
            tok = _read_json(os.path.join(output_dir, "special_tokens_map.json")).get("mask_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        summary["mask_token"] = tok or "<mask>"
    if summary.get("global_step") is None:
        state = _read_json(os.path.join(output_dir, "trainer_state.json"))
        for key in ("global_step", "epoch", "max_steps"):
            if state.get(key) is not None:
                summary.setdefault(key, state[key])
    return summary


def _finite(value) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _mfu_row(info: Dict[str, Any]) -> Tuple[str, str]:
    """The card's MFU row: of the steady rate, against a stated peak; or "n/a" with the reason."""
    mfu, peak = _finite(info.get("mfu")), _finite(info.get("mfu_peak_flops"))
    if mfu is not None and peak:
        return ("MFU (steady rate x FLOPs per token / peak FLOP/s)",
                f"{mfu:.1%} (peak {peak:.3g} FLOP/s per replica; {_fmt(info.get('mfu_peak_source') or 'source n/a')})")
    note = str(info.get("mfu_note") or "MFU left out").removeprefix("MFU left out: ")
    return ("MFU", f"n/a ({_fmt(note)})")


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if (abs(value) < 1e-3 or abs(value) >= 1e5) and value != 0 else f"{value:.4f}".rstrip("0").rstrip(".")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value).replace("|", "\\|")


def _duration(seconds) -> str:
    seconds = _finite(seconds)
    if seconds is None:
        return "n/a"
    h, rem = divmod(int(round(seconds)), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{seconds:.1f} s")


def _framework(backend: str, info: dict) -> str:
    """The training framework in words, from the backend and device the run really used.

    ``"tensorflow"``: "TensorFlow + XLA" (or "TensorFlow" when ``jit_compile`` is False); ``"torch_xla"``:
    "PyTorch/XLA"; any other (``"pytorch"``: a plain transformers ``Trainer``): "PyTorch (transformers
    Trainer) on <accelerator>" (the summary's ``accelerator``, e.g. CPU or GPU; "CPU/GPU" when unknown).
    """
    if backend == "tensorflow":
        return "TensorFlow" if info.get("jit_compile") is False else "TensorFlow + XLA"
    if backend == "torch_xla":
        return "PyTorch/XLA"
    if backend == "keras":  # Keras 3 compiles its train step with XLA on every backend it runs on
        keras_backend = {"jax": "JAX", "tensorflow": "TensorFlow", "torch": "PyTorch"}.get(
            str(info.get("keras_backend") or "jax").lower(), str(info.get("keras_backend")))
        return f"Keras 3 on {keras_backend} + XLA"
    return f"PyTorch (transformers Trainer) on {str(info.get('accelerator') or 'CPU/GPU').upper().replace('CUDA', 'GPU')}"


# weight files transformers' PyTorch and TensorFlow loaders read (single file or sharded index)
_PT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TF_WEIGHTS = ("tf_model.h5", "tf_model.h5.index.json")


def weight_formats(output_dir: str) -> Dict[str, bool]:
    """Which weight formats a model folder holds: ``{"pytorch": bool, "tensorflow": bool}``.

    ``pytorch``: ``model.safetensors`` / ``pytorch_model.bin`` (or their sharded index); ``tensorflow``:
    ``tf_model.h5`` (or its index). The card's usage snippets show only the loaders these files serve.
    """
    def has(names):
        return any(os.path.isfile(os.path.join(output_dir, n)) for n in names)

    return {"pytorch": has(_PT_WEIGHTS), "tensorflow": has(_TF_WEIGHTS)}


def keras_preset_folder(output_dir: str) -> Optional[str]:
    """The subfolder of ``output_dir`` holding a keras-hub task preset (the Keras backend writes ``keras_hub/``).

    A preset is recognized by keras-hub's own files: ``task.json`` and a ``config.json`` with
    ``registered_name`` (a serialized Keras object, what ``from_preset`` checks). Returns the folder name, or
    ``None`` when there is none; the card then shows no keras-hub snippet.
    """
    try:
        names = sorted(n for n in os.listdir(output_dir) if not n.startswith("."))
    except OSError:
        return None
    for name in names:
        folder = os.path.join(output_dir, name)
        if os.path.isfile(os.path.join(folder, "task.json")) and "registered_name" in _read_json(
                os.path.join(folder, "config.json")):
            return name
    return None


def _is_hub_id(value) -> bool:
    from hf_tpu_ext.hub.model_ref import is_hub_repo_id

    return isinstance(value, str) and bool(_REPO_ID.match(value)) and is_hub_repo_id(value)


def initialization_fields(name_or_path: Optional[str]) -> Dict[str, Optional[str]]:
    """What a model was initialized from, for the summary and card.

    Args:
        name_or_path: ``--model_name_or_path`` or a model's ``name_or_path`` (``""``/None: from scratch).

    Returns:
        ``{"base_model": repo id or None, "initialized_from": name or None}``: ``base_model`` only for a Hub repo
        id that is not a local path (the card's ``base_model`` metadata and link); ``initialized_from`` is the
        repo id, or just the folder name of a local path (no machine path lands in a card).
    """
    if not name_or_path:
        return {"base_model": None, "initialized_from": None}
    if _is_hub_id(name_or_path):
        return {"base_model": name_or_path, "initialized_from": name_or_path}
    return {"base_model": None, "initialized_from": os.path.basename(os.path.normpath(str(name_or_path)))}


def _framework_versions(summary: dict) -> List[Tuple[str, str]]:  # the run's stack only (hub/card_facts.py)
    return framework_versions(summary.get("backend"), summary.get("framework_versions"))


def progress_note(info: dict) -> Optional[str]:
    """``"Training in progress, step N of M"`` for a card pushed before the run's last step, else ``None``.

    Args:
        info: the summary/card fields: ``global_step`` and ``max_steps`` (or ``hyperparameters.total_steps``,
            what ``training_summary.json`` holds); ``training_in_progress`` (bool) says it where ``max_steps`` is
            unknown or the run ends early (a callback's final save: False); at ``max_steps`` there is no note.
    """
    step = info.get("global_step")
    total = info.get("max_steps") or (info.get("hyperparameters") or {}).get("total_steps")
    in_progress = info.get("training_in_progress")
    if step is None or (total and int(step) >= int(total)):  # at the last step the run's weights are final
        return None
    if in_progress is None:
        in_progress = bool(total)
    if not in_progress:
        return None
    of = f" of {int(total)}" if total else ""
    return (f"Training in progress, step {int(step)}{of}: these weights are a snapshot of an unfinished run "
            "(later pushes update them and this card).")


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
        card: the generated :class:`huggingface_hub.ModelCard` (from :func:`render_model_card`).
        mode: ``"merge"`` (default): a missing or unchanged generated README.md is replaced; one the user wrote
            or edited keeps its text and gets the owned metadata merged in (:func:`merge_card`).
            ``"overwrite"``: the generated card replaces any README.md. ``"keep"``: an existing README.md is
            left as it is (a missing one is written).
        explicit: see :func:`merge_card`.
        check_merged: called with a merged card's text before it is written (e.g. :func:`validate_model_card`:
            the user's metadata must pass too); what it raises leaves README.md as it was.

    Returns:
        What happened: ``"written"``, ``"merged"`` or ``"kept"``.

    Raises:
        ArgumentError: an unknown ``mode``.
        ModelCardError: ``"merge"`` of a README.md whose metadata does not parse (nothing is written).
    """
    from hf_tpu_ext.errors import ArgumentError

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


# ---- the card on the Hub: never an LFS pointer, and read back ------------------------------------
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


def render_model_card(output_dir: str, repo_id: Optional[str] = None, summary: Optional[dict] = None,
                      template_path: Optional[str] = None, **card_fields):
    """Render the model card of a trained model folder.

    Args:
        output_dir: the output folder (read for the summary, ``config.json``, tokenizer files, ``loss_curve.png``).
        repo_id: the Hub repo id, used in the usage snippet and as the model name.
        summary: the training summary dict (default: :func:`load_summary` of ``output_dir``).
        template_path: another Jinja2 card template (default: the packaged one).
        **card_fields: overrides of the summary and card: ``license``, ``language``, ``dataset_name`` (a Hub
            dataset id), ``dataset_description``, ``base_model``, ``model_name``, ``tags`` (extra tags),
            ``backend``, ``accelerator``, ...

    Returns:
        A :class:`huggingface_hub.ModelCard` (``card.data`` holds the metadata, ``str(card)`` the text).
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    info = dict(summary if summary is not None else load_summary(output_dir))
    extra_tags = list(card_fields.pop("tags", None) or [])
    info.update({k: v for k, v in card_fields.items() if v is not None})
    if not info.get("mask_token"):
        info["mask_token"] = load_summary(output_dir).get("mask_token", "<mask>")
    config = info.get("model_config") or _read_json(os.path.join(output_dir, "config.json"))

    backend = info.get("backend") or "tensorflow"
    accelerator = str(info.get("accelerator") or "").upper() or None
    name = info.get("model_name") or (repo_id.split("/")[-1] if repo_id else os.path.basename(os.path.abspath(output_dir)))
    base_model = info.get("base_model") or None
    initialized_from = info.get("initialized_from") or None
    if base_model and not _is_hub_id(base_model):  # a local folder: named, never linked or in the metadata
        initialized_from, base_model = initialized_from or initialization_fields(base_model)["initialized_from"], None
    dataset_name = info.get("dataset_name") or None
    description = info.get("dataset_description") or ("the Hub dataset " + dataset_name if dataset_name else "a custom text corpus")

    tags = ["hf-tpu-ext", "fill-mask", "tensorflow" if backend == "tensorflow" else "pytorch"]
    if backend == "torch_xla":
        tags.append("torch_xla")
    if info.get("jit_compile"):
        tags.append("xla")
    if accelerator == "TPU":
        tags.append("tpu")
    if config.get("model_type"):
        tags.append(str(config["model_type"]))
    keras_preset = keras_preset_folder(output_dir)
    if keras_preset:
        tags.append("keras-hub")
    tags += [t for t in extra_tags if t not in tags]

    eval_results = []
    evals = info.get("eval_results") or {}
    ds_kwargs = dict(dataset_name=dataset_name, dataset_type=dataset_name) if dataset_name else dict(
        dataset_name=description, dataset_type="text")
    if info.get("dataset_config_name"):
        ds_kwargs["dataset_config"] = str(info["dataset_config_name"])
    for key, mtype, mname in (("perplexity", "perplexity", "Perplexity"), ("eval_accuracy", "accuracy", "Masked-token accuracy"),
                              ("eval_loss", "loss", "Eval loss (nats)")):
        value = _finite(evals.get(key))
        if value is not None:
            eval_results.append(EvalResult(task_type="fill-mask", task_name="Masked Language Modeling", metric_type=mtype,
                                           metric_value=round(value, 6), metric_name=mname, **ds_kwargs))

    data = ModelCardData(
        language=info.get("language") or None,
        license=info.get("license") or None,
        library_name="transformers",
        pipeline_tag="fill-mask",
        tags=tags,
        datasets=[dataset_name] if dataset_name else None,
        base_model=base_model,
        model_name=name,
        eval_results=eval_results or None,
    )

    arch = config.get("architectures", ["RobertaForMaskedLM"])[0] if config.get("architectures") else "RoBERTa-style masked LM"
    size = []
    for key, label in (("num_hidden_layers", "layers"), ("hidden_size", "hidden size"), ("num_attention_heads", "heads"),
                       ("vocab_size", "vocabulary")):
        if config.get(key):
            size.append(f"{config[key]} {label}" if key != "vocab_size" else f"a {config[key]:,}-token vocabulary")
    if info.get("num_parameters"):
        size.append(f"{int(info['num_parameters']):,} parameters")
    shape = f" ({', '.join(size)})" if size else ""
    from hf_tpu_ext.hub.model_ref import hub_url

    if base_model:
        what = (f"This model continues the masked-language-model pre-training of [{base_model}]({hub_url(base_model)}) "
                f"on {description} (fine-tuned from its weights).")
    elif initialized_from:
        what = (f"This model continues the masked-language-model pre-training of a local model folder "
                f"(`{initialized_from}`, not on the Hub) on {description} (fine-tuned from its weights).")
    else:
        what = f"This model was pre-trained from scratch (randomly initialized weights) on {description} with masked language modeling."
    model_description = (f"A {arch}{shape} for the fill-mask task. {what} It was trained with "
                         f"hf-tpu-ext using {_framework(backend, info)}.")

    acc_text = accelerator or "n/a"
    if info.get("num_devices"):
        acc_text = f"{info['num_devices']} x {accelerator or 'device'}"
    procedure_rows = [
        ("Backend", backend),
        ("Accelerator", acc_text),
        ("Distribution strategy", strategy_label(info.get("strategy"))),
        ("Replicas", _fmt(info.get("num_replicas")) if info.get("num_replicas") else "n/a"),
        ("Global batch size (sequences)", _fmt(info.get("global_batch_size")) if info.get("global_batch_size") else "n/a"),
        ("Precision", info.get("precision") or "n/a"),
        ("XLA compilation", _fmt(bool(info.get("jit_compile"))) if info.get("jit_compile") is not None else "n/a"),
        ("Compiler path", info.get("compiler") or "n/a"),
        ("Optimizer steps", _fmt(int(info["global_step"])) if info.get("global_step") is not None else "n/a"),
        ("Epochs", _fmt(float(info["epoch"])) if _finite(info.get("epoch")) is not None else "n/a"),
        ("Tokens seen", _fmt(int(info["tokens_seen"])) if info.get("tokens_seen") else "n/a"),
        ("Training wall time", _duration(info.get("train_runtime"))),
        ("Throughput, whole run (tokens/s: tokens seen / training wall time)", _fmt(round(float(info["train_tokens_per_second"]), 1)) if _finite(info.get("train_tokens_per_second")) else "n/a"),
        ("Throughput, steady (tokens/s of the median training step; compilation, evaluation and checkpoints excluded)",
         _fmt(round(float(info["steady_tokens_per_second"]), 1)) if _finite(info.get("steady_tokens_per_second")) else "n/a"),
        _mfu_row(info),
    ]
    hyper = info.get("hyperparameters") or {}
    hyperparameter_rows = [(k, _fmt(v)) for k, v in hyper.items() if "token" not in k.lower() and v is not None]
    result_rows = []
    probe_n = f" ({int(evals['probe_n'])} probes)" if _finite(evals.get("probe_n")) else ""
    for key, label in (("eval_loss", "Eval loss (mean cross-entropy over masked tokens, nats)"), ("perplexity", "Perplexity"),
                       ("eval_accuracy", "Masked-token accuracy"), ("probe_top1", f"Cloze probes: top-1 accuracy{probe_n}"),
                       ("probe_top5", f"Cloze probes: top-5 accuracy{probe_n}"),
                       ("probe_mrr", f"Cloze probes: mean reciprocal rank{probe_n}")):
        value = _finite(evals.get(key))
        if value is not None:
            result_rows.append((label, _fmt(round(value, 4))))

    model_ref = repo_id or name
    formats = weight_formats(output_dir)
    if not (formats["pytorch"] or formats["tensorflow"]):  # a card rendered before the weights are written
        formats = {"pytorch": backend != "tensorflow", "tensorflow": backend == "tensorflow"}
    limitations = (
        "This is a masked language model: it predicts tokens hidden behind the mask token and is meant as a "
        "starting point for fine-tuning (classification, token classification), not for open-ended generation. "
        f"It reflects the content and biases of its training data ({description}); a small model trained briefly "
        "gives low-quality predictions. Evaluate it on your task before use."
    )
    card = ModelCard.from_template(
        data,
        template_path=template_path or default_template_path(),
        model_name=name,
        model_description=model_description,
        progress_note=progress_note(info),
        model_ref=model_ref,
        has_pytorch_weights=formats["pytorch"],
        has_tf_weights=formats["tensorflow"],
        keras_preset=keras_preset,
        mask_token=info.get("mask_token") or "<mask>",
        data_description=(f"[{dataset_name}]({hub_url(dataset_name, 'dataset')})" if dataset_name else
                          f"{description[0].upper() + description[1:]} (not a Hub dataset)."),
        procedure_intro=(f"Masked language modeling ({_finite(hyper.get('mlm_probability')) or 0.15:.0%} of the tokens "
                         "chosen per sequence, 80% masked / 10% random / 10% kept; the loss is computed at the chosen "
                         "positions only)."),
        procedure_rows=procedure_rows,
        hyperparameter_rows=hyperparameter_rows,
        result_rows=result_rows,
        results_dataset=description,
        loss_curve=os.path.isfile(os.path.join(output_dir, "loss_curve.png")),
        framework_rows=_framework_versions(info),
        limitations=limitations,
    )
    return mark_generated(card)


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

    The endpoint is ``huggingface_hub.constants.ENDPOINT`` read at call time (``HF_ENDPOINT``), not the
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
    from huggingface_hub import constants
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

    url = f"{constants.ENDPOINT}/api/validate-yaml"
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


def save_model_card(output_dir: str, repo_id: Optional[str] = None, summary: Optional[dict] = None, *,
                    validate: bool = False, token: Optional[str] = None, card_mode: str = "merge",
                    **card_fields) -> str:
    """Render the card of ``output_dir`` and write it to ``output_dir/README.md`` (see :func:`write_card`).

    A README.md hf-tpu-ext did not write (or that was edited) keeps its text; the metadata hf-tpu-ext owns is
    merged into it (``card_mode="merge"``).

    Args:
        output_dir, repo_id, summary, **card_fields: see :func:`render_model_card`.
        validate: also run :func:`validate_model_card` before writing.
        token: passed to :func:`validate_model_card`.
        card_mode: ``"merge"``, ``"overwrite"`` or ``"keep"`` (see :func:`write_card`).

    Returns:
        The path of the written README.md.

    Raises:
        ModelCardError: ``validate`` is set and the card does not validate (nothing is written).
    """
    card = render_model_card(output_dir, repo_id=repo_id, summary=summary, **card_fields)
    if validate:
        validate_model_card(card, token=token)
    write_card(output_dir, card, mode=card_mode,
               explicit=tuple(k for k in ("license", "language") if card_fields.get(k) is not None))
    return os.path.join(output_dir, "README.md")
