"""``hf-tpu train``: see :mod:`hf_tpu_ext.run` and the README's argument reference.

Exit status: 0 when the run finished and (with ``--push_to_hub``) its final state is on the Hub; 128 + the
signal's number after a signal, as shells report it (130: SIGINT, 143: SIGTERM; one line on stderr: ``interrupted at step N; resume with: hf-tpu train ...``); other errors
as ``hf-tpu`` reports them (non-zero).

Output: the log on stderr ends with the line naming the model folder (and the repo it was pushed to); when stdout is
not a terminal (a script's pipe) it gets the numeric results as one JSON line first (``all_results.json`` holds them
too).
"""

import json
import os
import sys

from hf_tpu_ext import console, interrupts
from hf_tpu_ext.args import parse_args
from hf_tpu_ext.commands.early_checks import check_before_imports
from hf_tpu_ext.console import console_session, requested_backend
from hf_tpu_ext.distributed import ProcessLines, is_main_process
from hf_tpu_ext.errors import TrainingInterrupted
from hf_tpu_ext.extras import require_extra
from hf_tpu_ext.hub.preflight import endpoint
from hf_tpu_ext.outputs import read_training_summary
from hf_tpu_ext.run_lock import lock_output_dir


def _backend_in_argv(argv) -> str:
    """The ``--backend`` a command line asks for (``--backend X``, ``--backend=X`` or a leading JSON config), else
    the default (:func:`hf_tpu_ext.console.requested_backend`)."""
    return requested_backend(argv)


def saved_line(output_dir: str) -> str:
    """The run's last line: where the model is and what the folder holds (``model saved to out: model.safetensors,
    config.json, tokenizer, model card README.md``), plus ``; pushed to ENDPOINT/REPO`` when
    ``training_summary.json`` says the final push landed; ``""`` when the folder has no config.json (not the chief)."""
    def has(*names):
        return any(os.path.isfile(os.path.join(output_dir, name)) for name in names)

    if not has("config.json"):
        return ""
    parts = [name for name in ("model.safetensors", "tf_model.h5", "config.json") if has(name)]
    parts += (["tokenizer"] if has("tokenizer.json", "tokenizer_config.json") else [])
    parts += (["model card README.md"] if has("README.md") else [])
    line = f"model saved to {output_dir}: {', '.join(parts)}"
    try:
        pushes = (read_training_summary(output_dir) or {}).get("hub_pushes") or {}
    except ValueError:
        pushes = {}
    if pushes.get("final_pushed") and pushes.get("repo_id"):
        revision = pushes.get("revision")
        tree = f"/tree/{revision}" if revision and revision != "main" else ""
        line += f"; pushed to {endpoint()}/{pushes['repo_id']}{tree}"
    return line


def one_run_terminal() -> None:
    """The package's log lines through :class:`hf_tpu_ext.distributed.ProcessLines`: a slice's processes print
    process 0's lines once, and another process only its own warnings and errors, tagged ``[process i]``."""
    import logging

    for handler in logging.getLogger("hf_tpu_ext").handlers:
        if not any(isinstance(f, ProcessLines) for f in handler.filters):
            handler.addFilter(ProcessLines())


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the one look before parsing (console.peek_argument: flags and a leading JSON config); everything else,
    # the model references included, is read by parse_args
    if _backend_in_argv(argv) == "torch_xla":
        os.environ.setdefault("USE_TF", "0")  # keep transformers from importing TensorFlow before torch_xla
        if "--help" not in argv and "-h" not in argv:
            # first: the extra also brings what other flags need (tensorboard for --report_to, accelerate)
            require_extra("torch-xla", "--backend torch_xla")
    model_args, data_args, training_args = parse_args(argv)
    check_before_imports(model_args, data_args, training_args)  # a bad model or data file: before the frameworks
    # a second run on a busy folder is refused now, before transformers and the frameworks load (seconds)
    lock = lock_output_dir(training_args.output_dir)
    # here, not at the top: the run's modules (numpy, yaml: +0.15 s measured) stay out of `hf-tpu train --help`
    from hf_tpu_ext.run import train

    try:
        with console_session(training_args.log_level):  # log lines above the progress bar, no Hub upload bars
            one_run_terminal()
            results = train(model_args, data_args, training_args, argv=argv)
    except TrainingInterrupted as err:
        if is_main_process():  # the others stopped at the same step: process 0's line says it for all
            print(str(err), file=sys.stderr, flush=True)
        if console.whole_process:  # checkpoints, push report and staging folders are settled: skip TF's teardown
            if lock is not None:
                lock.release()
            console.exit_now(128 + err.signum)
        return 128 + err.signum
    except KeyboardInterrupt:  # before the run took over the signals (arguments, imports): nothing to resume
        print("interrupted before training started; nothing was written.", file=sys.stderr, flush=True)
        return 130
    finally:
        if lock is not None:
            lock.release()
    def late(signum: int) -> None:  # the console process's teardown: say it, end with the run's status
        print(late_signal_line(signum, training_args.output_dir), file=sys.stderr, flush=True)
        console.exit_now(0)

    # the run is complete: a signal now has nothing to save
    with interrupts.finished(then=late if console.whole_process else None) as after:
        # a script reads the results from stdout (a terminal has all_results.json); one run, one result: process 0's
        if not sys.stdout.isatty() and is_main_process():
            print(json.dumps({k: v for k, v in results.items() if isinstance(v, (int, float))}), flush=True)
        line = saved_line(training_args.output_dir)
        if line:  # the run's last line: where the model is (and the repo)
            import logging

            logging.getLogger("hf_tpu_ext").info(line)
    if after.late is not None:
        print(late_signal_line(after.late, training_args.output_dir), file=sys.stderr, flush=True)
    interrupts.kill_for_test("after_results")
    return 0


def late_signal_line(signum: int, output_dir: str) -> str:
    """What a SIGINT/SIGTERM after a completed run prints (the run's exit status stays 0)."""
    import signal

    return (f"{signal.Signals(signum).name} received after the run finished: nothing left to save; the run is "
            f"complete in {output_dir}.")


if __name__ == "__main__":
    sys.exit(main())
