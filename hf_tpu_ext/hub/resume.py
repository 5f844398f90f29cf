"""Resume training from the ``last-checkpoint/`` folder a run pushed with ``hub_strategy="checkpoint"``.

Example:
    >>> path = download_last_checkpoint("alice/my-model@main", token, "output/hub-last-checkpoint")
    >>> TrainingCheckpointer(...).restore(path)
"""

from __future__ import annotations

import os
import re
from typing import Callable, Optional, Tuple

from hf_tpu_ext.errors import CheckpointError, HubRepoError
from hf_tpu_ext.hub.preflight import endpoint, hub_call

LAST_CHECKPOINT = "last-checkpoint"
_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*)(?:@(?P<rev>[\w.\-/]+))?$")


def parse_repo_spec(spec: str) -> Tuple[str, Optional[str]]:
    """Split ``"user/name[@revision]"`` into ``(repo_id, revision or None)``.

    Raises:
        HubRepoError: ``spec`` is not of that form.
    """
    match = _SPEC.match(spec or "")
    if not match:
        raise HubRepoError(f"{spec!r} is not a Hub repo spec; use 'user/name' or 'user/name@revision'.")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(match.group("repo"))
    except HFValidationError as err:
        raise HubRepoError(f"{spec!r} is not a valid Hub repo id: {err}") from None
    return match.group("repo"), match.group("rev")


def looks_like_repo_spec(value) -> bool:
    """True when ``value`` is not an existing local path and has the form ``user/name[@revision]``."""
    if not isinstance(value, str) or not value or os.path.exists(value):
        return False
    try:
        parse_repo_spec(value)
    except HubRepoError:
        return False
    return True


def _is_tf_checkpoint(folder: str) -> bool:
    return os.path.isdir(folder) and any(n.endswith(".index") for n in os.listdir(folder))


def download_last_checkpoint(spec: str, token: Optional[str], local_dir: str,
                             is_checkpoint: Callable[[str], bool] = _is_tf_checkpoint,
                             kind: str = "checkpoint", also: Tuple[str, ...] = ()) -> str:
    """Download ``last-checkpoint/`` of a Hub repo and return the folder to restore from.

    Args:
        spec: ``"user/name"`` or ``"user/name@revision"``.
        token: Hub token (private repos).
        local_dir: where to put the files (``local_dir/last-checkpoint/...``).
        is_checkpoint: whether the downloaded folder holds a checkpoint this backend restores (default: a
            TensorFlow ``ckpt-N.index``).
        kind: how the error message names the expected checkpoint.
        also: files at the repo root to download too (e.g. the tokenizer's, so a resume never trains another).

    Returns:
        The local ``last-checkpoint`` folder (holds ``ckpt-N.index``, ``ckpt-N.data-*``, ``checkpoint``), which
        ``TrainingCheckpointer.restore`` accepts.

    Raises:
        HubRepoError: the repo or revision does not exist.
        HubError: the Hub could not be reached.
        CheckpointError: the repo has no ``last-checkpoint/`` folder.
    """
    from huggingface_hub import snapshot_download

    repo_id, revision = parse_repo_spec(spec)
    hub_call(f"download {LAST_CHECKPOINT}/ of {spec}", snapshot_download, token, repo_id, revision=revision,
             allow_patterns=[f"{LAST_CHECKPOINT}/*", *also], local_dir=local_dir, token=token, endpoint=endpoint())
    folder = os.path.join(local_dir, LAST_CHECKPOINT)
    if not is_checkpoint(folder):
        raise CheckpointError(
            f"{spec} has no {LAST_CHECKPOINT}/ folder with a {kind}; it is written by runs with "
            "--push_to_hub --hub_strategy checkpoint."
        )
    return folder
