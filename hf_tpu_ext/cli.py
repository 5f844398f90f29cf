"""The ``hf-tpu`` console script: one sub-command per job.

Each sub-command lives in ``hf_tpu_ext/commands/<name>.py`` and exposes ``main(argv) -> int``;
it is imported only when called, so ``hf-tpu --help`` does not import TensorFlow.
"""

import importlib
import os
import sys

from hf_tpu_ext.errors import HfTpuExtError

# name -> (module, one-line help)
COMMANDS = {
    "train": ("hf_tpu_ext.commands.train", "Train a fill-mask model (TensorFlow + XLA, or --backend torch_xla)."),
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
        from hf_tpu_ext import __version__

        return __version__


def _usage() -> str:
    lines = ["usage: hf-tpu <command> [<args>]", "       hf-tpu --version", "", "commands:"]
    width = max(len(n) for n in COMMANDS)
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run `hf-tpu <command> --help` for the arguments of a command.")
    return "\n".join(lines)


def main(argv=None) -> int:
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
        print(f"hf-tpu: unknown command {name!r}.\n\n{_usage()}", file=sys.stderr)
        return 2
    from hf_tpu_ext.console import VERBOSE_LEVELS, filter_native_stderr, requested_log_level

    if requested_log_level(rest) not in VERBOSE_LEVELS:
        # TensorFlow's C++ start-up logs (and a CUDA probe error on CPU-only machines) say nothing
        # actionable. The variable hides TensorFlow's own; absl's early lines need the fd filter.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if console_script:
            filter_native_stderr()
    if console_script:
        import hf_tpu_ext.console as console

        console.whole_process = True  # an interrupted command may end the process at once (console.exit_now)
    module = importlib.import_module(COMMANDS[name][0])
    try:
        code = int(module.main(rest) or 0)
    except HfTpuExtError as err:
        print(f"hf-tpu {name}: error: {err}", file=sys.stderr)
        return 1
    return code

if __name__ == "__main__":
    sys.exit(main())
