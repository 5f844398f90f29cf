"""The ``hf-tpu`` console script: one sub-command per job.

Each sub-command lives in ``hf_tpu_ext/commands/<name>.py`` and exposes ``main(argv) -> int``;
it is imported only when called, so ``hf-tpu --help`` imports no framework (Keras, JAX, TensorFlow, torch).
"""

import importlib
import os
import sys

from hf_tpu_ext import __version__, console
from hf_tpu_ext.console import (VERBOSE_LEVELS, drop_import_notices, filter_native_stderr, filter_native_stdout,
                                multi_process_environment, requested_log_level)
from hf_tpu_ext.distributed import agreed_exit_status
from hf_tpu_ext.errors import HfTpuExtError

# name -> (module, one-line help)
COMMANDS = {
    "train": ("hf_tpu_ext.commands.train", "Train a fill-mask model (Keras 3 on JAX by default; --backend tensorflow or torch_xla)."),
    "prepare-data": ("hf_tpu_ext.commands.prepare_data", "Tokenize a corpus into TFRecord shards (local or gs://)."),
    "push": ("hf_tpu_ext.commands.push", "Push an existing output folder and its model card to the Hub."),
    "callbacks": ("hf_tpu_ext.commands.callbacks", "List the registered callbacks."),
    "demo": ("hf_tpu_ext.commands.demo", "Launch the Gradio fill-mask demo for a model folder or repo id."),
    "deploy-space": ("hf_tpu_ext.commands.deploy_space", "Create a Hub Space running the fill-mask demo for a model."),
    "probe": ("hf_tpu_ext.commands.probe", "Score cloze probes (top-1/top-5 accuracy, MRR) on a model or Hub revisions."),
}


def _version() -> str:
    """The installed distribution's version (the package's own ``__version__`` when run from a source tree)."""
    from importlib import metadata

    try:
        return metadata.version("hf-tpu-ext")
    except metadata.PackageNotFoundError:
        return __version__


def _usage() -> str:
    lines = ["usage: hf-tpu <command> [<args>]", "       hf-tpu --version", "", "commands:"]
    width = max(len(n) for n in COMMANDS)
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run `hf-tpu <command> --help` for the arguments of a command.")
    return "\n".join(lines)


def unknown_command_message(name: str) -> str:
    """What ``hf-tpu <name>`` prints for a command that does not exist: the closest command names (difflib's
    ratio >= 0.6, e.g. ``trian`` -> ``train``), then the usage."""
    import difflib

    close = difflib.get_close_matches(name, list(COMMANDS), n=2)
    hint = f" Did you mean: {' or '.join(f'`hf-tpu {c}`' for c in close)}?" if close else ""
    return f"hf-tpu: unknown command {name!r}.{hint}\n\n{_usage()}"


def _quiet_broken_pipe() -> int:
    """A reader closed our stdout (``hf-tpu train --help | head -3``): no traceback, no flush error at exit.

    Python ignores SIGPIPE and raises ``BrokenPipeError`` instead; stdout is pointed at ``os.devnull`` so the
    interpreter's final flush has nowhere to fail (the recipe of Python's ``signal`` module documentation).

    Returns:
        141, the status a shell reports for a process ended by SIGPIPE (128 + 13).
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (captured, closed)
        pass
    return 141


def main(argv=None) -> int:
    """The ``hf-tpu`` console script (``argv``: the arguments after ``hf-tpu``; default ``sys.argv[1:]``).

    Returns:
        The command's exit status: 0 done, 1 an :class:`~hf_tpu_ext.errors.HfTpuExtError` (printed as one
        ``hf-tpu <command>: error: ...`` line), 2 an unknown command or argument, 141 when stdout was closed
        by its reader.
    """
    try:
        try:
            code = _main(argv)
        except SystemExit:  # argparse's --help and usage errors exit after printing
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # here, not at exit: a closed pipe is caught below, not "Exception ignored in: ..."
        return code
    except BrokenPipeError:
        if not _stdout_closed():  # a broken pipe of something else (a subprocess, a socket): a real error
            raise
        return _quiet_broken_pipe()


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader is gone (poll reports an error on its write end); True where this
    cannot be told (no ``select.poll``, no file descriptor)."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def _main(argv=None) -> int:
    console_script = argv is None  # the real process: its stderr (fd 2) may be filtered
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("--version", "-V", "version"):
        print(f"hf-tpu-ext {_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(unknown_command_message(name), file=sys.stderr)
        return 2
    if requested_log_level(rest) not in VERBOSE_LEVELS:
        drop_import_notices()  # before anything imports transformers (it logs "PyTorch was not found" then)
        # TensorFlow's C++ start-up logs (and a CUDA probe error on CPU-only machines) say nothing
        # actionable. The variable hides TensorFlow's own; absl's early lines need the fd filter.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if console_script:
            filter_native_stderr()
            if name == "train" and multi_process_environment():
                filter_native_stdout()  # gloo's "[Gloo] Rank 0 is connected to ..." lines, per process
    if console_script:
        console.whole_process = True  # an interrupted command may end the process at once (console.exit_now)
    module = importlib.import_module(COMMANDS[name][0])
    try:
        code = int(module.main(rest) or 0)
    except HfTpuExtError as err:
        print(f"hf-tpu {name}: error: {err}", file=sys.stderr)
        code = 1
    return agreed_exit_status(code)  # the processes of one run end with its status (process 0's)

if __name__ == "__main__":
    sys.exit(main())
