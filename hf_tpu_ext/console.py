"""What the ``hf-tpu`` commands print: their own log lines, not third-party start-up noise.

With the default ``--log_level passive`` (transformers' name and default):

- TensorFlow/XLA's C++ log lines (``I0000 ... cudart_stub.cc:31] Could not find cuda drivers``,
  ``E0000 ... failed call to cuInit: ... UNKNOWN ERROR (303)``, absl's ``WARNING: All log messages before
  absl::InitializeLog() is called are written to STDERR``) are filtered out of the process' stderr.
  ``TF_CPP_MIN_LOG_LEVEL`` alone cannot hide them: TensorFlow's own logging honours it, but XLA's CUDA
  probe logs through absl, and absl writes everything logged before ``absl::InitializeLog()`` straight to
  file descriptor 2, whatever the variable says. So :func:`filter_native_stderr` points fd 2 at a pipe
  read by a small forked filter process, while Python's ``sys.stderr`` keeps writing to the terminal
  directly. The filter is a process, not a thread, so it drains the pipe even when this process dies:
  a fatal ``F...`` line (and anything else that is not a log line) still shows.
- transformers' "TensorFlow and JAX classes are deprecated" warning, and transformers 5's "PyTorch was not found"
  notice at import (a venv without torch), are dropped; other warnings stay.
- huggingface_hub's own progress bars (the upload bars of background pushes) and datasets' ("Filter",
  "Tokenizing train") are off during training.
- huggingface_hub's own retry lines (``Retrying in 1s [Retry 1/5].``, ``HTTP Error 503 thrown while
  requesting ...``) are held back: a push says its retries once, in its own words (``hub/push_queue.py``).
- hf_tpu_ext's (and transformers') log lines are written with ``tqdm.write`` while a progress bar is
  open (:func:`console_session`), so no line is glued onto the bar; when the stream is not a terminal (a file,
  a pipe) the bar's line is ended first, so a log line never follows the bar's ``\\r`` on one line.
- the resume line of an interrupted run (:func:`resume_hint`) is its command line again without the token: the
  token flags in every spelling and any token value elsewhere are left out (:func:`redact_argv`).

``--log_level debug``, ``info`` or ``warning`` bring all of it back (C++ lines included);
``error``/``critical`` keep the filter and raise the level of the package's own lines.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shlex
import sys
from typing import Iterator, List, Optional

from hf_tpu_ext.environment import process_variables
from hf_tpu_ext.errors import ArgumentError, MissingExtraError

LOG_LEVELS = ("passive", "debug", "info", "warning", "error", "critical")
# levels at which third-party output (C++ log lines, deprecation warnings, Hub bars) is shown
VERBOSE_LEVELS = ("debug", "info", "warning")

# absl/TF C++ log line: severity letter, MMDD, time (absl's early lines print it oddly), thread id, file:line]
NATIVE_LOG_LINE = re.compile(
    rb"^(?:[IWE]\d{4} [\d:.]+\s+\d+ [^\s:\]]+:\d+\] "
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags)"
)
DEPRECATION_NOISE = "TensorFlow and JAX classes are deprecated"
# transformers 5's notice at import when torch is absent (the Keras/JAX venv trains without it): says nothing actionable
IMPORT_NOTICES = ("PyTorch was not found. Models won't be available",)
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: True when the command runs as the ``hf-tpu`` console script (the whole process is the command's)
whole_process = False
# huggingface_hub's retry lines (``http_backoff`` in huggingface_hub/utils/_http.py, 0.36 ... 2.x)
HUB_RETRY_LOGGER = "huggingface_hub.utils._http"
HUB_RETRY_WORDS = ("Retrying in ", "Rate limited. Waiting ", " thrown while requesting ")
#: flags whose value is a secret, in every spelling argparse accepts (``--hub-token`` is HfArgumentParser's alias)
SECRET_FLAGS = ("hub_token",)


def peek_argument(argv: List[str], name: str):
    """The value a command line gives ``--name`` before any parsing: ``--name X``, ``--name=X`` (the last one
    wins) or else the field of a leading JSON config file; None when it gives none. A JSON value keeps its
    type; an unreadable config counts as giving none (the parser reports it later)."""
    value = None
    if argv and argv[0].endswith(".json") and os.path.isfile(argv[0]):
        try:
            with open(argv[0], encoding="utf-8") as f:
                data = json.load(f)
            value = data.get(name) if isinstance(data, dict) else None
        except (OSError, ValueError):
            pass
    flag = f"--{name}"
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


#: the line ``hf-tpu train`` answers when ``--backend`` is unset and no backend's packages are installed
NO_BACKEND_MESSAGE = ('No training backend is installed: pip install "hf-tpu-ext[jax]" (Keras 3 on JAX, the default) '
                      'or pip install "hf-tpu-ext[tensorflow]" (TensorFlow 2.21 + transformers 4), then rerun.')


def default_backend(find_spec=None) -> str:
    """The ``--backend`` an unset flag means; the one place that decides it (``args.py``, the backend registry
    and ``hf-tpu train``'s pre-parse ask here).

    ``"keras"`` when Keras 3 and JAX are importable, else ``"tensorflow"`` when TensorFlow, tf_keras and
    transformers 4 are, else ``"torch_xla"`` when torch_xla is (a ``[torch-xla]`` venv). Checked with ``importlib.util.find_spec`` and package metadata: nothing is imported.

    Args:
        find_spec: replaces ``importlib.util.find_spec`` (tests).

    Raises:
        MissingExtraError: neither is installed (:data:`NO_BACKEND_MESSAGE`, naming both extras).
    """
    import importlib.util
    from importlib import metadata

    find = find_spec or importlib.util.find_spec

    def importable(module: str) -> bool:
        try:
            return find(module) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken parent
            return False

    def major(distribution: str):
        try:
            return int(metadata.version(distribution).split(".")[0])
        except (metadata.PackageNotFoundError, ValueError):
            return None

    if importable("keras") and importable("jax") and (major("keras") or 3) >= 3:
        return "keras"
    if importable("tensorflow") and importable("tf_keras") and major("transformers") in (4, None):
        return "tensorflow"
    if importable("torch_xla"):  # a venv of `[torch-xla]` alone: the backend it was installed for
        return "torch_xla"
    raise MissingExtraError(NO_BACKEND_MESSAGE)


def resolve_backend(name, known) -> str:
    """``--backend name`` checked against the ``known`` names; unset (``None``/``""``): :func:`default_backend`.

    Raises:
        ArgumentError: an unknown name (the line lists the known ones).
        MissingExtraError: unset, and no backend is installed.
    """
    name = name or default_backend()
    if name not in known:
        raise ArgumentError(f"Unknown --backend {name!r}; choose one of: {', '.join(known)}.")
    return name


def requested_backend(argv: List[str]):
    """The ``--backend`` of a command line (:func:`peek_argument`), or :func:`default_backend` when it gives none
    (``None`` then, instead of raising, when no backend is installed: the parser reports that)."""
    backend = peek_argument(argv, "backend")
    if isinstance(backend, str):
        return backend
    try:
        return default_backend()
    except ImportError:
        return None


def requested_log_level(argv: List[str]) -> str:
    """The ``--log_level`` a command line asks for (:func:`peek_argument`), lower-cased; ``"passive"`` when none.
    Read before any parsing, so the C++ filter can be in place before TensorFlow is imported."""
    level = peek_argument(argv, "log_level")
    return str(level).lower() if level else "passive"


def _pump(read_fd: int, write_fd: int, native=NATIVE_LOG_LINE) -> None:
    """Copy ``read_fd`` to ``write_fd`` line by line, leaving out the lines ``native`` matches (C++ log lines),
    until end of file."""
    pending = b""
    skipping = False  # inside a multi-line C++ message
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        out = []
        for line in lines:
            if native.match(line):
                skipping = True
                continue
            if skipping and line.startswith(b"To enable the following instructions"):
                continue
            skipping = False
            out.append(line + b"\n")
        if len(pending) > 65536:  # a very long line without a newline: pass it on
            out.append(pending)
            pending = b""
        if out:
            os.write(write_fd, b"".join(out))
    if pending and not native.match(pending):
        os.write(write_fd, pending)


def filter_native_stderr() -> bool:
    """Leave TensorFlow/XLA C++ log lines out of this process' stderr (fd 2); Python output is unchanged.

    Call once, early, before TensorFlow is imported (``hf_tpu_ext.cli`` does for the console script).
    ``sys.stderr`` is re-opened on a duplicate of the original fd 2, so tracebacks, logging and progress
    bars go to the terminal directly; only what C/C++ code writes to fd 2 passes the filter process.

    Returns:
        True when the filter is in place; False where it cannot be (no ``os.fork``, e.g. Windows, or fd 2
        closed): nothing is changed then.
    """
    stream = _filter_fd(2, NATIVE_LOG_LINE, sys.stderr, line_buffering=True)
    if stream is None:
        return False
    sys.stderr = stream
    return True


#: what C++ libraries write to stdout in a multi-process JAX run: gloo's "[Gloo] Rank 0 is connected to 1 peer
#: ranks. Expected number of connected peer ranks is : 1", once per collective group and process
#: (two gloo threads' writes may interleave, leaving a line's tail without its "[Gloo] Rank " head)
NATIVE_STDOUT_LINE = re.compile(rb"^\[Gloo\] |.*Expected number of connected peer ranks is : \d+$")


def filter_native_stdout() -> bool:
    """Leave gloo's connection lines (:data:`NATIVE_STDOUT_LINE`) out of this process' stdout (fd 1), as
    :func:`filter_native_stderr` does for fd 2: ``sys.stdout`` keeps writing to the original fd 1 directly.

    Returns:
        True when the filter is in place; False where it cannot be (nothing changed).
    """
    stream = _filter_fd(1, NATIVE_STDOUT_LINE, sys.stdout, line_buffering=_isatty(sys.stdout))
    if stream is None:
        return False
    sys.stdout = stream
    return True


def _filter_fd(fd: int, native, current, line_buffering: bool):
    """Point ``fd`` at a pipe drained by a forked filter process that drops the lines ``native`` matches; return
    a text stream on a duplicate of the original ``fd`` for Python's own writes (``None``: not possible)."""
    if not hasattr(os, "fork"):
        return None
    try:
        current.flush()
        original = os.dup(fd)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
    except (OSError, ValueError, AttributeError):
        return None
    if pid == 0:  # the filter process
        status = 0
        try:
            import signal

            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the command, not its output
            os.close(write_fd)
            os.dup2(original, fd)
            _pump(read_fd, original, native)
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(read_fd)
    os.dup2(write_fd, fd)
    os.close(write_fd)
    encoding = getattr(current, "encoding", None) or "utf-8"
    return io.TextIOWrapper(io.FileIO(original, "w"), encoding=encoding, errors="backslashreplace",
                            line_buffering=line_buffering)


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in str(record.msg)


def drop_import_notices(drop: bool = True) -> None:
    """Drop (``drop=False``: bring back) transformers' import-time notices (:data:`IMPORT_NOTICES`), a filter on
    its ``transformers`` logger set before transformers is imported (the notice is logged while it imports)."""
    logger = logging.getLogger("transformers")
    for old in [f for f in logger.filters if isinstance(f, _DropMessage) and f.text in IMPORT_NOTICES]:
        logger.removeFilter(old)
    if drop:
        for text in IMPORT_NOTICES:
            logger.addFilter(_DropMessage(text))


def is_hub_retry_line(record: logging.LogRecord) -> bool:
    """True for a record of huggingface_hub's own retry loop (:data:`HUB_RETRY_WORDS`)."""
    return record.name == HUB_RETRY_LOGGER and any(words in str(record.msg) for words in HUB_RETRY_WORDS)


class _HubRetryLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not is_hub_retry_line(record)


def hold_back_hub_retries(hold: bool = True) -> None:
    """Hold back (``hold=False``: bring back) huggingface_hub's retry lines in every thread: a filter on its
    :data:`HUB_RETRY_LOGGER` logger (idempotent)."""
    logger = logging.getLogger(HUB_RETRY_LOGGER)
    for old in [f for f in logger.filters if isinstance(f, _HubRetryLines)]:
        logger.removeFilter(old)
    if hold:
        logger.addFilter(_HubRetryLines())


def setup_logging(log_level: str = "passive") -> None:
    """Configure the ``hf_tpu_ext`` logger (``HH:MM:SS LEVEL name: message`` on stderr) and transformers'.

    Args:
        log_level: one of :data:`LOG_LEVELS`. ``passive``: the package logs at INFO, transformers keeps its
            own level minus the TF deprecation warning. Any other level is applied to both.

    Raises:
        ValueError: an unknown level.
    """
    level = str(log_level).lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}.")
    drop_import_notices(level not in VERBOSE_LEVELS)
    hold_back_hub_retries(level not in VERBOSE_LEVELS)
    ours = logging.getLogger("hf_tpu_ext")
    if not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
        ours.addHandler(handler)
        ours.propagate = False
    ours.setLevel(logging.INFO if level == "passive" else getattr(logging, level.upper()))
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.get_logger("transformers")  # creates transformers' handler on sys.stderr
    if level != "passive":
        hf_logging.set_verbosity(getattr(logging, level.upper()))
    if level not in VERBOSE_LEVELS:
        for handler in logging.getLogger("transformers").handlers:
            if not any(isinstance(f, _DropMessage) for f in handler.filters):
                handler.addFilter(_DropMessage(DEPRECATION_NOISE))


@contextlib.contextmanager
def console_session(log_level: str = "passive") -> Iterator[None]:
    """The terminal of a training command: :func:`setup_logging`, log lines through tqdm's
    ``logging_redirect_tqdm`` (never glued onto a progress bar), huggingface_hub's and datasets' progress
    bars (uploads; "Filter", "Tokenizing train") off unless the level is verbose (restored on exit)."""
    import importlib.util

    setup_logging(log_level)
    hub_bars_were_off: Optional[bool] = None
    datasets_bars_were_off: Optional[bool] = None
    if str(log_level).lower() not in VERBOSE_LEVELS:
        try:
            from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

            hub_bars_were_off = are_progress_bars_disabled()
            disable_progress_bars()
        except ImportError:
            pass
        if importlib.util.find_spec("datasets") is not None:  # the TensorFlow and torch_xla extras bring it
            import datasets

            datasets_bars_were_off = datasets.are_progress_bars_disabled()
            datasets.disable_progress_bars()
    loggers = [logging.getLogger("hf_tpu_ext"), logging.getLogger("transformers")]
    try:
        with log_lines_above_bars(loggers):
            yield
    finally:
        if hub_bars_were_off is False:
            from huggingface_hub.utils import enable_progress_bars

            enable_progress_bars()
        if datasets_bars_were_off is False:
            import datasets

            datasets.enable_progress_bars()


def log_lines_above_bars(loggers: List[logging.Logger]):
    """tqdm's ``logging_redirect_tqdm`` over ``loggers`` (their console handlers write through ``tqdm.write``)
    with one change where the stream is not a terminal: the open bars' line is ended (``\\n``) before the log
    line, which then stands on a line of its own in the file (tqdm clears the bar with ``\\r`` and spaces, which a
    file keeps: the line would follow the bar's last ``\\r`` redraw on the same line)."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    class LineEndingTqdm(tqdm):
        @classmethod
        def write(cls, s, file=None, end="\n", nolock=False):
            fp = sys.stdout if file is None else file
            if _isatty(fp):
                return tqdm.write(s, file=file, end=end, nolock=nolock)
            with contextlib.nullcontext() if nolock else tqdm.get_lock():
                bars = [bar for bar in list(getattr(tqdm, "_instances", ())) if not bar.disable and bar.fp == fp]
                fp.write(("\n" if bars else "") + s + end)
                for bar in bars:
                    bar.refresh(nolock=True)  # the bar goes on, on the next line
            return None

    return logging_redirect_tqdm(loggers=loggers, tqdm_class=LineEndingTqdm)


def exit_now(code: int) -> None:
    """End the process at once with ``code`` after flushing stdout, stderr and the log handlers.

    For a command stopped by a signal whose report is printed and whose files are settled: after an
    interrupted TensorFlow run, releasing the training ``tf.data`` iterator (with the traceback) and interpreter
    shutdown wait for TensorFlow's worker threads, silently, 5 to 60 s.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


# ---------------------------------------------------------------------------------------------- argv redaction
def _is_secret_flag(arg: str) -> bool:
    """``--hub_token``, ``--hub-token``, ``--hub_token=...``, ``--hub-token=...`` (any flag named ``*token``)."""
    if not arg.startswith("--"):
        return False
    name = arg[2:].split("=", 1)[0].replace("-", "_")
    return name in SECRET_FLAGS or name.endswith("_token")


def _without_flags(argv: List[str], drop) -> List[str]:
    """``argv`` without each word ``drop(word)`` is true of and its value: the next word, unless the flag holds
    ``=`` or the next word is a flag itself (``--push_to_hub --hub_token``: a bool flag without a value)."""
    out: List[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if drop(a):
            skip = "=" not in a and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(a)
    return out


def redact_argv(argv: List[str], secrets: tuple = ()) -> List[str]:
    """``argv`` without the secret flags and their values (:data:`SECRET_FLAGS`, every spelling), and with any
    other occurrence of a ``secrets`` value replaced by ``<redacted>``."""
    out = _without_flags(argv, _is_secret_flag)
    for secret in secrets:
        if secret:
            out = [a.replace(secret, "<redacted>") for a in out]
    return out


def _is_resume_flag(arg: str) -> bool:
    """``--resume_from_checkpoint`` / ``--overwrite_output_dir`` in any spelling (the hint sets its own)."""
    return arg.split("=", 1)[0].replace("-", "_") in ("__resume_from_checkpoint", "__overwrite_output_dir")


#: the variables that make one ``hf-tpu train`` a process of a multi-process JAX run, in the order a hint names them
#: (``JAX_NUM_CPU_DEVICES``: the devices each process simulates on a CPU; the global batch counts them)
PROCESS_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_NUM_CPU_DEVICES",
                     "HF_TPU_JAX_DISTRIBUTED")


def multi_process_environment(environ=None) -> bool:
    """Whether this ``hf-tpu train`` is one process of several (:data:`PROCESS_VARIABLES` ask for JAX's start)."""
    env = process_variables() if environ is None else environ
    return any(str(env.get(k, "")).strip() for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                                                      "HF_TPU_JAX_DISTRIBUTED"))


def process_prefix(environ=None) -> str:
    """What a rerun of one process of a multi-process run must say before ``hf-tpu train``, so that it joins the
    same processes with the same global batch (a bare command resumed on one process, with a quarter of the batch):

    - ``JAX_NUM_PROCESSES`` above 1: ``on each process i = 0 .. N-1: JAX_COORDINATOR_ADDRESS=... JAX_NUM_PROCESSES=N
      JAX_PROCESS_ID=$i [JAX_NUM_CPU_DEVICES=...] `` (``$i`` left for the shell of each process);
    - JAX finds the cluster (``HF_TPU_JAX_DISTRIBUTED=1``, or a coordinator alone: Slurm, Open MPI): ``the same
      commands on every host: <the variables set> ``;
    - one process: ``JAX_NUM_CPU_DEVICES=... `` where set, else ``""``.
    """
    env = process_variables() if environ is None else environ
    given = {k: str(env.get(k, "")).strip() for k in PROCESS_VARIABLES}
    count = given["JAX_NUM_PROCESSES"]
    several = count.isdigit() and int(count) > 1
    if not several and not (given["JAX_COORDINATOR_ADDRESS"] or given["HF_TPU_JAX_DISTRIBUTED"]):
        devices = given["JAX_NUM_CPU_DEVICES"]  # one process: its simulated devices are still its global batch
        return f"JAX_NUM_CPU_DEVICES={shlex.quote(devices)} " if devices else ""
    words = [f"{k}={shlex.quote(v)}" if k != "JAX_PROCESS_ID" or not several else f"{k}=$i"
             for k, v in given.items() if v]
    if several:
        return f"on each process i = 0 .. {int(count) - 1}: " + " ".join(words) + " "
    return "the same commands on every host: " + " ".join(words) + " "


def resume_hint(argv: Optional[List[str]] = None, secrets: tuple = (), environ=None) -> str:
    """``hf-tpu train <same flags> --resume_from_checkpoint true``: without the token flags in any spelling
    (``--hub_token``, ``--hub-token``, with ``=`` or not; the token comes from ``HF_TOKEN`` or the login again),
    and with any ``secrets`` value found elsewhere replaced by ``<redacted>``. A process of a multi-process run
    is told the environment each process needs (:func:`process_prefix`), never a one-process command that would
    resume with another global batch."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        argv = argv[1:]
    kept = redact_argv(_without_flags(argv, _is_resume_flag), secrets)
    return (process_prefix(environ) + "hf-tpu train "
            + " ".join(shlex.quote(a) for a in kept + ["--resume_from_checkpoint", "true"]))


def rerun_hint(argv: Optional[List[str]] = None, secrets: tuple = (), output_dir_has_files: bool = False,
               environ=None) -> str:
    """``hf-tpu train <same flags>`` for a run stopped before its first checkpoint (nothing to resume from),
    redacted as :func:`resume_hint`, with its process environment (:func:`process_prefix`); with
    ``--overwrite_output_dir true`` added when the run left files in its output folder and the flags neither
    overwrite nor resume (the rerun would be refused as "not empty")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        argv = argv[1:]
    kept = redact_argv(argv, secrets)
    if output_dir_has_files and not any(_is_resume_flag(a) for a in argv):
        kept += ["--overwrite_output_dir", "true"]
    return process_prefix(environ) + "hf-tpu train " + " ".join(shlex.quote(a) for a in kept)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or replaced by a test's capture
        return False
