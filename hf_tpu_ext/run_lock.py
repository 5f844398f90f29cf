"""One run owns its output folder: the lock file ``output_dir/.hf-tpu-train.lock`` (:data:`LOCK_NAME`).

``hf-tpu train`` takes the lock before its checks write anything and releases it when it ends, also after an
error or a signal (the training run's ``finally``). The file holds the owner as JSON::

    {"pid": 4242, "host": "tpu-vm-0", "since": "2026-12-01T22:06:44Z", "start_ticks": 123456}

and the owner holds a kernel lock on it (``fcntl.flock``), which the kernel drops when the process ends in any
way, ``SIGKILL`` included. So a second process on the same folder is refused at once (:class:`RunLockedError`,
one line naming the first: pid, host, since), and a lock left by a killed run is *stale*: the next run takes it
over and says so. A lock naming another host is never taken over (its process cannot be checked from here):
the message says which file to delete once that run has ended.

A lock is stale when nobody holds the kernel lock, or when its process is gone on this host (a leftover child
that inherited the descriptor keeps the kernel lock, not the run alive; ``start_ticks`` from ``/proc`` tells a
reused PID). Only local folders are locked (a ``gs://`` output folder is not) and only the process that writes
the folder takes it (the chief; not the processes a backend spawns).

Standard library only (ground layer).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
from typing import Any, Dict, Optional

from hf_tpu_ext import distributed
from hf_tpu_ext.distributed import (after_jax_initialize, cancel_after_jax_initialize, jax_process_id_pending,
                                    note_output_dir)
from hf_tpu_ext.errors import OutputDirError
from hf_tpu_ext.fileio import check_writable_dir

logger = logging.getLogger("hf_tpu_ext")

LOCK_NAME = ".hf-tpu-train.lock"

try:
    import fcntl
except ImportError:  # not POSIX: the PID check alone
    fcntl = None


class RunLockedError(OutputDirError):
    """Another ``hf-tpu train`` owns the output folder (the message names it: pid, host, since)."""


#: set to "1" in a process a backend spawned for a run (``Backend.spawn``): the parent holds the lock
SPAWNED_CHILD_ENV = "HF_TPU_XLA_CHILD"


def spawned_child() -> bool:
    """Whether this process is one a backend spawned for a run (:data:`SPAWNED_CHILD_ENV`, its one reader)."""
    return os.environ.get(SPAWNED_CHILD_ENV) == "1"


def _start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), ``None`` unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int, start_ticks: Optional[int] = None) -> bool:
    """Whether process ``pid`` (started at ``start_ticks``, when known) still runs on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    now = _start_ticks(pid)
    return start_ticks is None or now is None or now == start_ticks


def describe(owner: Dict[str, Any]) -> str:
    """``pid 4242 on host tpu-vm-0, since 2026-12-01T22:06:44Z`` for a lock's owner."""
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}, since {owner.get('since', '?')}"


def _read(fd: int) -> Dict[str, Any]:
    """The owner a lock file names: ``{}`` when empty, ``{"pid": 0, "host": None}`` (nobody) when damaged."""
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return {}
    if not data.strip():
        return {}
    try:
        owner = json.loads(data.decode("utf-8"))
    except ValueError:
        owner = None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else {"pid": 0, "host": None}


class RunLock:
    """The lock of one output folder (see the module doc).

    Args:
        folder: the run's ``output_dir`` (created when missing; removed again on :meth:`release` when the lock
            was all that was in it).

    Attributes:
        path: the lock file, ``folder/.hf-tpu-train.lock``.
        taken_over: the owner of the stale lock this one replaced (``{"pid", "host", "since"}``), or ``None``.
    """

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, LOCK_NAME)
        self.taken_over: Optional[Dict[str, Any]] = None
        self._fd: Optional[int] = None
        self._created_folder: Optional[str] = None
        self._refs = 0  # holders in this process (lock_output_dir): the last release drops the lock
        self.pending = False  # PendingRunLock: waiting for this host's process id

    def acquire(self) -> "RunLock":
        """Take the lock; returns ``self``.

        Raises:
            RunLockedError: a live process (or one on another host) owns the folder; nothing was written.
            OutputDirError: the lock file cannot be written (the folder is read-only or cannot be created).
        """
        missing = os.path.abspath(self.folder)
        while not os.path.isdir(os.path.dirname(missing)) and os.path.dirname(missing) != missing:
            missing = os.path.dirname(missing)
        self._created_folder = None if os.path.isdir(self.folder) else missing  # the first folder made for it
        try:
            os.makedirs(self.folder, exist_ok=True)
            for _ in range(10):  # another process may replace or remove the file between open and lock
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
                if self._lock_fd(fd):
                    return self
        except OutputDirError:  # refused (an OSError too, FileExistsError)
            raise
        except OSError as err:
            self._remove_created_folder()
            raise OutputDirError(f"--output_dir {self.folder!r}: cannot write its lock file {LOCK_NAME} "
                                 f"({err.strerror or err}); choose a writable --output_dir.") from None
        raise RunLockedError(f"--output_dir {self.folder!r}: could not take its lock {LOCK_NAME} (other processes "
                             "keep replacing it); make sure one hf-tpu train runs on this folder.")

    def _lock_fd(self, fd: int) -> bool:
        """Lock the open lock file ``fd`` and write this process into it (True), or close it to retry (False)."""
        owner = _read(fd)
        held = False
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                held = True
        owner = _read(fd) or owner
        host = socket.gethostname()
        if owner and owner.get("host") not in (None, host):
            os.close(fd)
            self._refuse(owner, other_host=True)
        mine = owner.get("pid") == os.getpid()
        alive = bool(owner) and not mine and process_alive(int(owner.get("pid") or 0), owner.get("start_ticks"))
        if held and not owner:  # its owner locked it a moment ago and is writing its name: read again
            os.close(fd)
            time.sleep(0.05)
            return False
        if alive and (held or fcntl is None) or (held and mine):
            os.close(fd)
            self._refuse(owner)
        if held:  # the kernel lock outlived its run (a child inherited it): break it, take a fresh file
            os.close(fd)
            self._unlink_if_same(owner)
            self.taken_over = self.taken_over or owner
            return False
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:  # released (unlinked) by its owner between our open and lock: lock the new file
            os.close(fd)
            return False
        if owner and owner.get("pid") != os.getpid():
            self.taken_over = self.taken_over or owner
        record = {"pid": os.getpid(), "host": host, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "start_ticks": _start_ticks(os.getpid())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        self._fd, self._refs = fd, 1
        _HELD[os.path.realpath(self.folder)] = self
        if self.taken_over:
            logger.warning("--output_dir %s: took over the lock of an ended run (%s; it did not release it: killed?).",
                           self.folder, describe(self.taken_over))
        return True

    def _refuse(self, owner: Dict[str, Any], other_host: bool = False) -> None:
        self._remove_created_folder()
        hint = (f"wait for it to end, or, if it has ended, delete {self.path}" if other_host
                else "wait for it to end or stop it")
        raise RunLockedError(f"--output_dir {self.folder!r} is in use by another hf-tpu train ({describe(owner)}): "
                             f"{hint}, or choose another --output_dir. Nothing was written.")

    def _unlink_if_same(self, owner: Dict[str, Any]) -> None:
        try:
            with open(self.path, "rb") as f:
                if _read(f.fileno()) == owner:
                    os.unlink(self.path)
        except OSError:
            pass

    def _remove_created_folder(self) -> None:
        if not self._created_folder:
            return
        folder = os.path.abspath(self.folder)
        while True:  # the folders made for the lock, when nothing else came into them
            try:
                os.rmdir(folder)
            except OSError:
                return
            if folder == self._created_folder:
                return
            folder = os.path.dirname(folder)

    def release(self) -> None:
        """Remove the lock file and drop the kernel lock (idempotent; with several holders in this process, the
        last one's release); a folder created for the lock alone goes."""
        self._refs -= 1
        if self._refs > 0 or self._fd is None:
            return
        fd, self._fd = self._fd, None
        if _HELD.get(os.path.realpath(self.folder)) is self:
            del _HELD[os.path.realpath(self.folder)]
        try:
            if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)
        self._remove_created_folder()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


#: the locks this process holds, by real path (``hf-tpu train`` takes its lock before the frameworks load, the
#: training run takes the same one again)
_HELD: Dict[str, RunLock] = {}


def lock_output_dir(output_dir: Optional[str]) -> Optional[RunLock]:
    """The held :class:`RunLock` of ``output_dir``, or ``None`` where no lock is taken: no folder, a remote
    (``gs://``) folder, a path that is a file (the folder check reports it), or a process that does not write
    the folder (a spawned child, a worker other than the chief). A lock this process holds already is shared
    (each caller releases it once). A host that learns its process id from ``jax.distributed.initialize``
    (:func:`hf_tpu_ext.distributed.jax_process_id_pending`) gets a :class:`PendingRunLock`: taken then, on the
    chief only.

    Raises:
        OutputDirError: the folder cannot be written (:func:`hf_tpu_ext.fileio.check_writable_dir`).
        RunLockedError: see :meth:`RunLock.acquire`.
    """
    note_output_dir(output_dir)  # every process: a lost-process line names the folder and its last checkpoint
    if not output_dir or "://" in str(output_dir) or (os.path.exists(output_dir) and not os.path.isdir(output_dir)):
        return None
    if spawned_child():
        return None  # a process of a spawned run: the parent holds the lock
    held = _HELD.get(os.path.realpath(str(output_dir)))
    if held is not None and (held._fd is not None or held.pending):
        held._refs += 1
        return held
    if jax_process_id_pending():  # JAX tells this host its id later: the lock is taken then, by the chief only
        return PendingRunLock(str(output_dir))
    try:
        if distributed.process_index() != 0:
            return None
    except ValueError:  # a bad TF_CONFIG: the strategy's check reports it
        return None
    check_writable_dir(str(output_dir), "--output_dir")  # its message, not the lock file's, for a read-only folder
    return RunLock(str(output_dir)).acquire()


class PendingRunLock(RunLock):
    """The lock of a host that learns its process id from ``jax.distributed.initialize`` (``HF_TPU_JAX_DISTRIBUTED=1``
    on a TPU slice): taken right after it (:func:`hf_tpu_ext.distributed.after_jax_initialize`) when this host is
    process 0, never on the others, so hosts sharing one folder do not refuse each other.

    Raises (from the initialization, before any compute):
        RunLockedError, OutputDirError: as :meth:`RunLock.acquire`.
    """

    def __init__(self, folder: str):
        super().__init__(folder)
        self.pending, self._refs = True, 1
        _HELD[os.path.realpath(folder)] = self
        after_jax_initialize(self._take_if_chief)

    def _take_if_chief(self) -> None:
        self.pending = False
        if _HELD.get(os.path.realpath(self.folder)) is self:
            del _HELD[os.path.realpath(self.folder)]
        if self._refs <= 0 or distributed.process_index() != 0:
            return
        refs = self._refs
        check_writable_dir(str(self.folder), "--output_dir")
        self.acquire()
        self._refs = refs  # every holder releases once

    def release(self) -> None:
        if self.pending:
            self._refs -= 1
            if self._refs <= 0:
                self.pending = False
                cancel_after_jax_initialize(self._take_if_chief)
                if _HELD.get(os.path.realpath(self.folder)) is self:
                    del _HELD[os.path.realpath(self.folder)]
            return
        super().release()
