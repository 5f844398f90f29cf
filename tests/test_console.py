"""The terminal of `hf-tpu`: no TF C++ lines or deprecation noise, log lines never glued onto the bar,
one throughput figure, short usage on a bad value, MFU against the hardware's peak."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, TINY_MODEL_ARGS

from hf_tpu_ext.console import NATIVE_LOG_LINE, _pump, requested_log_level

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR) hf_tpu_ext")
RATE_WORDS = " (median training step; compilation, evaluation and checkpoints excluded)"
STEP_LINE = re.compile(r"step (\d+) \(epoch [\d.]+\): loss [\d.]+, lr \S+ \| steady ([\d,]+) tokens/s"
                       r"( \(median training step; compilation, evaluation and checkpoints excluded\))?(, MFU [\d.]+%)?$")


def _hf_tpu(args, tmp_path, timeout=900):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HOME=str(tmp_path / "hf_home"))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # what a user's shell has: the CLI must quieten TF itself
    return subprocess.run([sys.executable, "-m", "hf_tpu_ext", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp_path))


def _segments(text):
    """Terminal lines as a reader sees them: split on newlines and carriage returns (bar redraws)."""
    return [s for s in re.split(r"[\r\n]", text) if s.strip()]


def test_pump_drops_native_log_lines_only():
    read_fd, write_fd = os.pipe()
    out_r, out_w = os.pipe()
    os.write(write_fd, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
                       b"I0000 00:00:1796083919.316538    8001 cudart_stub.cc:31] Could not find cuda drivers\n"
                       b"E0000 00:00:1796083929.960017    8001 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n"
                       b"a line of a library\n"
                       b"F0000 00:00:1796083929.960017    8001 x.cc:1] Check failed: fatal stays\n"
                       b"no newline at the end")
    os.close(write_fd)
    _pump(read_fd, out_w)
    os.close(out_w)
    assert os.read(out_r, 4096) == (b"a line of a library\nF0000 00:00:1796083929.960017    8001 x.cc:1] Check failed: "
                                    b"fatal stays\nno newline at the end")


def test_requested_log_level(tmp_path):
    assert requested_log_level(["--output_dir", "x"]) == "passive"
    assert requested_log_level(["--log_level", "INFO"]) == "info"
    assert requested_log_level(["--log_level=debug"]) == "debug"
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"log_level": "warning"}))
    assert requested_log_level([str(config)]) == "warning"
    assert requested_log_level([str(config), "--log_level", "error"]) == "error"


def test_bad_value_prints_short_usage_and_the_error(capsys):
    from hf_tpu_ext.args import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--learning_rate", "fast"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "usage: hf-tpu train [CONFIG.json] [--name value ...]   (every argument: hf-tpu train --help)\n"
        "hf-tpu train: error: argument --learning_rate/--learning-rate: invalid float value: 'fast'\n")


def test_prepare_data_help_lists_no_model_shape_flags(capsys):
    from hf_tpu_ext.commands import prepare_data

    with pytest.raises(SystemExit):
        prepare_data.main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: hf-tpu prepare-data --output_path PATH [--name value ...]")
    for flag in ("--hidden_size", "--num_hidden_layers", "--num_attention_heads", "--intermediate_size",
                 "--hidden_dropout_prob", "--attention_probs_dropout_prob", "--config_name"):
        assert flag not in text
    for flag in ("--tokenizer_name", "--vocab_size", "--train_file", "--max_seq_length", "--output_path"):
        assert flag in text


def test_trainer_logs_one_throughput_figure_with_mfu(trained_run):
    from hf_tpu_ext.backends.tensorflow.trainer import _format_entry

    out, results = trained_run
    state = json.load(open(out / "trainer_state.json"))
    train_logs = [e for e in state["log_history"] if "loss" in e]
    assert [e["step"] for e in train_logs] == [5, 10, 15, 20, 25, 30]
    for entry in train_logs:
        assert entry["tokens_per_second"] > 0 and 0 < entry["mfu"] <= 1, entry
        assert STEP_LINE.search(_format_entry(entry)), _format_entry(entry)
    assert results["steady_tokens_per_second"] > results["train_tokens_per_second"] > 0
    # MFU of the steady rate against the CPU formula's peak (a hardware property), in the results too
    from hf_tpu_ext.flops import device_peak

    peak = device_peak("CPU", "float32")
    assert results["mfu_peak_flops"] == peak.flops and results["mfu_peak_source"] == peak.source
    assert 0 < results["mfu"] <= 1


def test_train_terminal_is_clean(tmp_path):
    """The transcript of a short `hf-tpu train` (progress bar on, plain pipes)."""
    proc = _hf_tpu(["train", "--output_dir", "out", *TINY_MODEL_ARGS, "--max_steps", "6", "--logging_steps", "3",
                    "--eval_strategy", "steps", "--eval_steps", "3", "--save_strategy", "steps", "--save_steps", "3",
                    "--max_train_samples", "64", "--max_eval_samples", "16"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stderr
    segments = _segments(text)
    assert not [s for s in segments if NATIVE_LOG_LINE.match(s.encode()) or "absl" in s or "cuInit" in s]
    assert "deprecated" not in text
    # every log line starts a terminal line of its own: nothing glued onto a bar, no split timestamps
    logged = [s for s in segments if " hf_tpu_ext" in s and ("INFO" in s or "WARNING" in s)]
    assert logged and all(LOG_LINE.match(s) for s in logged), [s for s in logged if not LOG_LINE.match(s)]
    steps = [STEP_LINE.search(s) for s in logged if "tokens/s" in s and "done in" not in s]
    assert [int(m.group(1)) for m in steps] == [3, 6]
    assert [bool(m.group(3)) for m in steps] == [True, False]  # what the steady rate is: said once, on its first line
    assert text.count(RATE_WORDS) == 1
    # the last line says where the model is (stdout keeps the results' JSON)
    assert re.search(r" hf_tpu_ext: model saved to out: .*config\.json, tokenizer, model card README\.md$", logged[-1])
    assert json.loads(proc.stdout)["global_step"] == 6
    # the bar shows the same labelled figure as the log lines, no rate of its own
    figures = {m.group(2) for m in steps}
    bars = [s for s in segments if s.startswith("train:")]
    assert bars and not [b for b in bars if "step/s" in b or "s/step" in b]
    assert {m for b in bars for m in re.findall(r"tokens/s=([\d,]+)", b)} <= figures
    assert "Upload" not in text
    # datasets' map/filter bars ("Tokenizing train", "Filter") are third-party output too
    assert not [s for s in segments if s.startswith(("Tokenizing", "Filter", "Map"))], segments


def test_log_level_info_brings_third_party_output_back(tmp_path):
    proc = _hf_tpu(["train", "--output_dir", "out", *TINY_MODEL_ARGS, "--max_steps", "1", "--eval_strategy", "no",
                    "--save_strategy", "no", "--max_train_samples", "16", "--max_eval_samples", "8",
                    "--disable_tqdm", "true", "--log_level", "info"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TensorFlow and JAX classes are deprecated" in proc.stderr
    assert [s for s in _segments(proc.stderr) if NATIVE_LOG_LINE.match(s.encode())]


# ----------------------------------------------------------------------------- help, closed pipes, unknown commands
FRAMEWORKS = ("tensorflow", "tf_keras", "torch", "jax", "keras", "transformers")


def _run_cli(code: str, tmp_path, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, "-c", code], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=300, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))


def test_help_imports_no_framework_and_says_each_default_once(tmp_path):
    code = ("import sys; from hf_tpu_ext import cli\n"
            "for argv in (['train', '--help'], ['prepare-data', '--help']):\n"
            "    try: cli.main(argv)\n"
            "    except SystemExit as e: assert e.code == 0, e.code\n"
            f"print('IMPORTED', sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    proc = _run_cli(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    train_help, _, rest = proc.stdout.partition("usage: hf-tpu prepare-data")
    assert rest.rstrip().endswith("IMPORTED []")  # transformers (and torch through it) not imported either
    blocks, current = [], None  # one block per option: its "  --flag" line and the indented help lines after it
    for line in train_help.splitlines():
        if line.startswith("  -"):
            current = [line]
            blocks.append(current)
        elif current is not None and line.startswith("   "):
            current.append(line)
        else:
            current = None
    options = {b[0].split()[0].rstrip(","): " ".join(" ".join(b).split()) for b in blocks}
    assert len(options) > 80
    for flag, text in options.items():
        assert text.lower().count("default") <= 1, text
        assert "(default: None)" not in text, text
    assert options["--config_name"].endswith("to train from scratch (default: --model_type's small preset).")
    assert options["--vocab_size"].endswith("Vocabulary size of the tokenizer trained when none is given. (default: 8000)")
    assert options["--no_do_train"].endswith("`hf-tpu train` always trains: false is refused.")  # no "(default: False)"


def test_closed_stdout_exits_without_traceback(tmp_path):
    """`python -m hf_tpu_ext --help | head -3`: the reader is gone before the writer finishes (here: from the start)."""
    for argv in (["--help"], ["callbacks"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # every write now fails with EPIPE (Python ignores SIGPIPE: BrokenPipeError)
        try:
            proc = subprocess.run([sys.executable, "-m", "hf_tpu_ext", *argv], stdout=write_end, stderr=subprocess.PIPE,
                                  text=True, timeout=300, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
        finally:
            os.close(write_end)
        assert (proc.returncode, proc.stderr) == (141, ""), (argv, proc.stderr[-2000:])
    # a broken pipe of something else (stdout still read) is a real error: raised, not hidden as exit 141
    code = ("from hf_tpu_ext import cli\n"
            "def command(argv): raise BrokenPipeError(32, 'Broken pipe: a subprocess went away')\n"
            "cli._main = command\n"
            "cli.main([])")
    proc = _run_cli(code, tmp_path)
    assert proc.returncode == 1 and proc.stderr.rstrip().endswith(
        "BrokenPipeError: [Errno 32] Broken pipe: a subprocess went away"), proc.stderr[-2000:]


def test_unknown_command_suggests_the_close_one(capsys):
    from hf_tpu_ext.cli import _usage, main

    assert main(["trian"]) == 2
    assert capsys.readouterr().err == f"hf-tpu: unknown command 'trian'. Did you mean: `hf-tpu train`?\n\n{_usage()}\n"
    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err == f"hf-tpu: unknown command 'frobnicate'.\n\n{_usage()}\n"


def test_redact_argv_and_resume_hint_drop_flags_with_their_values():
    """One walk of argv for both: a dropped flag takes its value with it unless it holds ``=`` or a flag follows."""
    from hf_tpu_ext.console import redact_argv, resume_hint

    argv = ["--output_dir", "o", "--hub_token", "hf_SECRET", "--push_to_hub", "--hub-token=hf_SECRET",
            "--hub_token", "--note", "hf_SECRET-x", "--resume_from_checkpoint=o/checkpoint-4",
            "--overwrite_output_dir", "--max_steps", "5", "--resume-from-checkpoint"]
    assert redact_argv(argv, secrets=("hf_SECRET",)) == [
        "--output_dir", "o", "--push_to_hub", "--note", "<redacted>-x", "--resume_from_checkpoint=o/checkpoint-4",
        "--overwrite_output_dir", "--max_steps", "5", "--resume-from-checkpoint"]
    assert resume_hint(["train", *argv], secrets=("hf_SECRET",)) == (
        "hf-tpu train --output_dir o --push_to_hub --note '<redacted>-x' --max_steps 5 --resume_from_checkpoint true")


def test_rerun_hint_keeps_the_flags_and_overwrites_only_a_folder_the_run_left_files_in():
    """Before the first checkpoint there is nothing to resume: the same command, redacted; with the run's own files
    in the folder, --overwrite_output_dir true (unless the flags already overwrite or resume)."""
    from hf_tpu_ext.console import rerun_hint

    argv = ["train", "--output_dir", "o", "--hub_token", "hf_SECRET", "--max_steps", "5"]
    assert rerun_hint(argv, secrets=("hf_SECRET",)) == "hf-tpu train --output_dir o --max_steps 5"
    assert rerun_hint(argv, output_dir_has_files=True) == (
        "hf-tpu train --output_dir o --max_steps 5 --overwrite_output_dir true")
    resumed = ["--output_dir", "o", "--resume_from_checkpoint", "user/other-run"]
    assert rerun_hint(resumed, output_dir_has_files=True) == (
        "hf-tpu train --output_dir o --resume_from_checkpoint user/other-run")


@pytest.mark.parametrize("terminal", [True, False])
def test_a_finished_run_ends_on_the_folder_line(tmp_path, monkeypatch, capsys, hf_log, terminal):
    """The terminal's last line names the folder; the results' JSON goes to a pipe only, as one line before it."""
    import hf_tpu_ext.run as run
    from hf_tpu_ext.commands import train as command

    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "README.md"):
        (out / name).write_text("{}")
    order = []
    monkeypatch.setattr(run, "train", lambda *a, **k: {"global_step": 6, "train_loss": 2.5, "note": "x"})
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    write = sys.stdout.write
    monkeypatch.setattr(sys.stdout, "write", lambda text: order.append("stdout") or write(text))
    hf_log.handler.emit = (lambda emit: lambda record: order.append("line") or emit(record))(hf_log.handler.emit)
    assert command.main(["--output_dir", str(out), "--max_steps", "6"]) == 0
    assert hf_log.messages[-1] == f"model saved to {out}: model.safetensors, config.json, model card README.md"
    stdout = capsys.readouterr().out
    assert order[-1] == "line" and ("stdout" in order) is not terminal
    assert stdout == ("" if terminal else '{"global_step": 6, "train_loss": 2.5}\n')


def test_a_log_line_in_a_file_is_not_glued_to_the_bar(monkeypatch):
    """Output redirected to a file: the bar's ``\\r`` line is ended before a log line, which stands alone."""
    import io
    import logging

    from tqdm import tqdm

    from hf_tpu_ext.console import log_lines_above_bars

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    log = logging.getLogger("hf_tpu_ext.test_bar")
    handler = logging.StreamHandler()  # on sys.stderr (the file), as setup_logging's
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    monkeypatch.setattr(log, "handlers", [handler])
    monkeypatch.setattr(log, "propagate", False)
    with log_lines_above_bars([log]):
        bar = tqdm(total=4, desc="train", file=stream, bar_format="{desc}: {n_fmt}/{total_fmt}", mininterval=0)
        bar.update(2)
        log.error("Could not push")
        log.warning("second")
        bar.update(2)
        bar.close()
    # each log line a line of its own; the bar goes on after it (redrawn on the next line)
    assert stream.getvalue().split("\n") == [
        "\rtrain: 0/4\rtrain: 2/4", "ERROR hf_tpu_ext.test_bar: Could not push",
        "\rtrain: 2/4", "WARNING hf_tpu_ext.test_bar: second", "\rtrain: 2/4\rtrain: 4/4\rtrain: 4/4", ""]
