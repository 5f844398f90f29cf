"""Atomic file writes for the output folder: an interrupted save never leaves a half-written file."""

from __future__ import annotations

import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write_fn) -> str:
    """Call ``write_fn(tmp_path)`` on a temp file beside ``path``, then ``os.replace`` it onto ``path``.

    The file gets the permissions a plain ``open(path, "w")`` would (``0o666`` minus the umask), not the
    owner-only ``0o600`` of ``mkstemp``, so a model folder stays readable by other users and servers.

    Returns:
        ``path``.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write_fn(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def atomic_write_text(path: str, text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically."""

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, write)
