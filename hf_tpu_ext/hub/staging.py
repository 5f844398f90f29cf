"""Push snapshots on disk: a save's files taken when it is queued, and the clean-up of those a killed process left.

:class:`~hf_tpu_ext.hub.push_queue.PushQueue` snapshots a save into ``<tmp>/hf-tpu-push-<pid>-*/`` when it is
submitted, so a later save (or the rotation of ``save_total_limit``) cannot tear an upload in flight: a model folder
is copied (:func:`copy_tree`: its writers may rewrite a file in place), a backend's checkpoint is hard-linked
(:func:`link_files`: written once per step and never rewritten, so a link is the file as written, at no cost in
disk or time; a copy where a link cannot be made, e.g. across file systems). A new queue removes the folders of
processes that no longer run (:func:`remove_stale_staging`).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import tempfile
from typing import List, Mapping, Optional, Union

logger = logging.getLogger("hf_tpu_ext.hub")

STAGING_PREFIX = "hf-tpu-push-"


def _matches(path: str, patterns: Optional[List[str]]) -> bool:
    return any(fnmatch.fnmatch(path, p) or (p.endswith("/") and path.startswith(p)) for p in patterns or [])


def remove_stale_staging(tmp: Optional[str] = None) -> List[str]:
    """Remove the ``hf-tpu-push-<pid>-*`` staging folders of processes that no longer run (e.g. killed with -9).

    A folder whose process id is alive (or cannot be checked) is left alone.

    Returns:
        The folders removed.
    """
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        rest = name[len(STAGING_PREFIX):] if name.startswith(STAGING_PREFIX) else ""
        pid = rest.split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or another user's): not ours to touch
        except ProcessLookupError:
            pass
        except (PermissionError, OSError, OverflowError):
            continue
        path = os.path.join(tmp, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        logger.info("Removed %d staging folder(s) of ended processes: %s", len(removed), ", ".join(removed))
    return removed


def copy_tree(src: str, dest: str, allow: Optional[List[str]] = None, ignore: Optional[List[str]] = None,
              link: Optional[List[str]] = None) -> int:
    """Copy the files of ``src`` into ``dest`` (created), filtered like ``upload_folder``; return the file count.

    ``allow``/``ignore`` are fnmatch patterns on paths relative to ``src`` (``/`` separators); a pattern
    ending in ``/`` matches a whole folder. ``.git/`` and ``.cache/`` are always left out. Files are copied,
    not hard-linked (``save_pretrained``/safetensors rewrite files in place; the card is edited in the snapshot),
    except those matching ``link``: files their writer replaces (renamed into place), linked as by :func:`link_files`.
    """
    n_files = 0
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            if allow is not None and not _matches(rel, allow):
                continue
            if _matches(rel, ignore) or rel.startswith(".cache/") or "/.git/" in f"/{rel}":
                continue
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if _matches(rel, link):
                _link_or_copy(path, target)
            else:
                shutil.copy2(path, target)
            n_files += 1
    os.makedirs(dest, exist_ok=True)
    return n_files


def link_files(files: Mapping[str, Union[str, bytes]], dest: str) -> int:
    """Put a checkpoint's files into the snapshot folder ``dest`` (created); return the file count.

    Args:
        files: ``{name in dest (``/`` separators): local file}`` (a backend's ``checkpoint_files``); a ``bytes``
            value is the content of a small file written here (TensorFlow's ``checkpoint`` state file).
        dest: the snapshot folder.

    Each file is hard-linked (the same inode: the file as written, whatever later happens to its folder); where
    the link fails (another file system, a file system without links) it is copied with ``shutil.copy2``.

    Raises:
        FileNotFoundError: a file of ``files`` does not exist.
    """
    os.makedirs(dest, exist_ok=True)
    for name, src in sorted(files.items()):
        target = os.path.join(dest, *name.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if isinstance(src, bytes):
            with open(target, "wb") as f:
                f.write(src)
            continue
        _link_or_copy(src, target)
    return len(files)


def _link_or_copy(src: str, target: str) -> None:
    try:
        os.link(src, target)
    except FileNotFoundError:
        raise
    except OSError:  # EXDEV (another file system), EPERM/ENOTSUP (no hard links there): a copy
        shutil.copy2(src, target)
