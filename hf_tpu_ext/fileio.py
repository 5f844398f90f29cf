"""Atomic file writes for the output folder (an interrupted save never leaves a half-written file), and the one
choice of how files at a URL are read and written (:func:`remote_files`)."""

from __future__ import annotations

import os
import tempfile
from typing import Callable, NamedTuple

from hf_tpu_ext.errors import OutputDirError


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


#: the prefix of the empty folder :func:`check_writable_dir` creates and removes at once: processes of one run
#: that share ``output_dir`` check it at the same moment, so another's probe is not "a file in the folder"
WRITE_CHECK_PREFIX = ".hf-tpu-write-check-"


def check_writable_dir(path: str, option: str = "--output_dir") -> None:
    """Fail fast when ``path`` (a folder, existing or to be created) cannot be written; nothing is created.

    Checks the folder itself when it exists, else its nearest existing parent: ``os.access`` with write and
    search rights, then an empty folder created and removed there (a file on the way is refused too).

    Raises:
        OutputDirError: the folder or its parent is not writable, or a file stands where a folder is needed.
    """
    target = os.path.abspath(path)
    probe = target
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise OutputDirError(f"{option} {path!r}: {probe!r} is a file, not a folder; choose another path.")
    where = "it" if probe == target else f"its parent {probe!r}"
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputDirError(f"{option} {path!r} is not writable: permission denied on {where}. Choose a folder you can "
                             "write to (or fix its permissions).")
    try:  # what os.access cannot see: a read-only file system, /proc-like folders, root squash
        os.rmdir(tempfile.mkdtemp(prefix=WRITE_CHECK_PREFIX, dir=probe))
    except OSError as err:
        raise OutputDirError(f"{option} {path!r} is not writable: creating a folder in {where} failed "
                             f"({err.strerror or type(err).__name__}). Choose a folder you can write to.") from None


def read_json_object(path: str) -> dict:
    """The JSON object in ``path``; ``{}`` when the file is missing, unreadable, not JSON or not an object
    (run files are optional: a reader treats a damaged one as absent)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class RemoteFiles(NamedTuple):
    """File operations at a URL (see :func:`remote_files`); paths are full URLs, local paths plain paths.

    Attributes:
        makedirs: ``makedirs(folder_url)``: the folder and its parents; an existing one is fine.
        exists: ``exists(url) -> bool``.
        put: ``put(local_path, url)``: copy one local file there (an existing file is replaced).
        get: ``get(url, local_path)``: copy one file here (an existing file is replaced).
    """

    makedirs: Callable[[str], None]
    exists: Callable[[str], bool]
    put: Callable[[str, str], None]
    get: Callable[[str, str], None]


def remote_files(url: str) -> RemoteFiles:
    """How to read and write files at ``url``: ``gs://`` through ``tf.io.gfile`` where TensorFlow is installed
    (its GCS client comes with it: nothing more to install on a TPU VM), any other URL, and ``gs://`` without
    TensorFlow, through fsspec (``gs://`` then needs gcsfs).

    Raises:
        ImportError / ValueError: fsspec has no file system for the URL's protocol (fsspec's own message).
    """
    if url.startswith("gs://"):
        try:
            import tensorflow as tf
        except ImportError:
            pass
        else:
            gfile = tf.io.gfile
            return RemoteFiles(makedirs=gfile.makedirs, exists=gfile.exists,
                               put=lambda src, dst: gfile.copy(src, dst, overwrite=True),
                               get=lambda src, dst: gfile.copy(src, dst, overwrite=True))
    import fsspec.core

    fs, _ = fsspec.core.url_to_fs(url)
    return RemoteFiles(makedirs=lambda folder: fs.makedirs(folder, exist_ok=True), exists=fs.exists,
                       put=fs.put_file, get=fs.get_file)
