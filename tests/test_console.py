"""The terminal of `hf-tpu`: no TF C++ lines or deprecation noise, log lines never glued onto the bar,
one throughput figure, short usage on a bad value, MFU from a cached peak."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, TINY_MODEL_ARGS

from hf_tpu_ext.console import NATIVE_LOG_LINE, _pump, requested_log_level

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR) hf_tpu_ext")
STEP_LINE = re.compile(r"step (\d+) \(epoch [\d.]+\): loss [\d.]+, lr \S+ \| ([\d,]+) tokens/s in training steps "
                       r"\(median step; compilation, evaluation and checkpoints excluded\)(, MFU [\d.]+%)?$")


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


def test_peak_flops_is_measured_once_and_cached(tmp_path, monkeypatch):
    from hf_tpu_ext import flops

    calls = []
    monkeypatch.setattr(flops, "measure_peak_flops", lambda dtype="float32": calls.append(dtype) or 3.5e10)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine: a busy one is never cached
    cache = str(tmp_path / "cache" / "peak_flops.json")
    assert flops.peak_flops("CPU", cache_path=cache) == 3.5e10
    assert flops.peak_flops("CPU", cache_path=cache) == 3.5e10
    assert calls == ["float32"]
    (key, value), = json.load(open(cache)).items()
    assert key.startswith("CPU|") and "float32" in key and value == 3.5e10
    assert flops.peak_flops("TPU v4", "bfloat16", cache_path=cache) == 275e12  # datasheet: no probe
    assert calls == ["float32"]
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert flops._peak_cache_path() == str(tmp_path / "home" / "hf_tpu_ext" / "peak_flops.json")


def test_trainer_logs_one_throughput_figure_with_mfu(trained_run):
    from hf_tpu_ext.backends.tensorflow.trainer import _format_entry

    out, results = trained_run
    state = json.load(open(out / "trainer_state.json"))
    train_logs = [e for e in state["log_history"] if "loss" in e]
    assert [e["step"] for e in train_logs] == [5, 10, 15, 20, 25, 30]
    for entry in train_logs:
        assert entry["tokens_per_second"] > 0 and 0 < entry["mfu"] < 2, entry
        assert STEP_LINE.search(_format_entry(entry)), _format_entry(entry)
    assert results["train_step_tokens_per_second"] > results["train_tokens_per_second"] > 0


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
