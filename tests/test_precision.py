"""``--bf16`` / ``--jit_compile`` resolution (hf_tpu_ext.precision) and a tiny bf16 run on TensorFlow's kernels."""

import itertools
import json
import os

import numpy as np
import pytest

from hf_tpu_ext.precision import (NATIVE_BF16_CPU_FLAGS, cpu_flags, parse_bf16, resolve_precision,
                                  xla_bf16_dots_faster)

ZEN3_FLAGS = "flags\t\t: fpu sse sse2 avx avx2 fma f16c bmi2 sha_ni vaes"  # AMD EPYC Milan: no bf16
GENOA_FLAGS = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni avx512_bf16 vaes"
SAPPHIRE_FLAGS = "flags\t\t: avx512f amx_bf16 amx_tile amx_int8"
ARM_FEATURES = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm"


@pytest.mark.parametrize("text,native", [(ZEN3_FLAGS, False), (GENOA_FLAGS, True), (SAPPHIRE_FLAGS, True),
                                         (ARM_FEATURES, True), ("model name : x", False)])
def test_cpu_flags_native_bf16(text, native):
    assert bool(cpu_flags(text) & NATIVE_BF16_CPU_FLAGS) is native


def test_parse_bf16():
    assert [parse_bf16(v) for v in (None, True, False, "true", "False", "AUTO", "1", "no")] == \
        [None, True, False, True, False, "auto", True, False]
    with pytest.raises(ValueError, match="--bf16 must be one of auto, true, false, got 'fp8'"):
        parse_bf16("fp8")


@pytest.mark.parametrize("bf16,jit,accel,native,expected", [
    # (bf16, jit_compile, precision, compiler)
    (None, None, "CPU", True, (False, True, "float32", "XLA")),
    (None, None, "TPU", False, (True, True, "bf16 mixed", "XLA")),
    ("auto", None, "CPU", True, (True, False, "bf16 mixed", "TensorFlow kernels (oneDNN)")),
    ("auto", None, "CPU", False, (False, True, "float32", "XLA")),
    ("auto", None, "GPU", True, (True, True, "bf16 mixed", "XLA")),
    ("auto", None, "GPU", False, (False, True, "float32", "XLA")),
    (True, None, "CPU", True, (True, False, "bf16 mixed", "TensorFlow kernels (oneDNN)")),
    (True, None, "CPU", False, (True, True, "bf16 mixed", "XLA")),  # emulated bf16: XLA is faster
    (True, True, "CPU", True, (True, True, "bf16 mixed", "XLA")),  # an explicit --jit_compile is kept
    (False, False, "GPU", True, (False, False, "float32", "TensorFlow kernels")),
    # jit_compile=True without bf16 dots (TensorFlow's XLA): XLA:CPU multiplies bf16 in float32, auto keeps float32
    ("auto", True, "CPU", True, (False, True, "float32", "XLA")),
    ("auto", False, "CPU", True, (True, False, "bf16 mixed", "TensorFlow kernels (oneDNN)")),
    ("auto", True, "GPU", True, (True, True, "bf16 mixed", "XLA")),
    ("auto", True, "TPU", False, (True, True, "bf16 mixed", "XLA")),
])
def test_resolve_precision(bf16, jit, accel, native, expected):
    plan = resolve_precision(bf16, jit, accel, native)
    assert (plan.bf16, plan.jit_compile, plan.precision, plan.compiler) == expected


def test_the_plan_carries_the_dot_routing_and_the_keras_policy():
    """The Keras backend's step routes its dots only on an XLA:CPU step that asked for it (one decision, here)."""
    cpu = resolve_precision(True, True, "CPU", True, bf16_dots=True)
    assert (cpu.bf16, cpu.bf16_dots, cpu.keras_policy) == (True, True, "mixed_bfloat16")
    tpu = resolve_precision(False, True, "TPU", True, bf16_dots=True)
    assert (tpu.bf16, tpu.bf16_dots, tpu.keras_policy) == (False, False, "float32")
    tf_kernels = resolve_precision(True, None, "CPU", True)  # TensorFlow's kernels: no XLA step to route
    assert (tf_kernels.jit_compile, tf_kernels.bf16_dots) == (False, False)
    assert resolve_precision(False, True, "CPU", False, bf16_dots=True).bf16_dots  # float32: the flat dots


def test_resolve_precision_says_why():
    assert "no native bf16" in resolve_precision("auto", None, "CPU", False).reason
    emulated = resolve_precision(True, None, "CPU", False).reason
    assert "emulated" in emulated and "--bf16 auto would keep float32" in emulated
    assert "oneDNN bf16 kernels, not XLA" in resolve_precision(True, None, "CPU", True).reason
    assert emulated.endswith("; XLA, faster than TensorFlow's kernels on emulated bf16")


@pytest.mark.parametrize("backend,flags,jit", [("tensorflow", SAPPHIRE_FLAGS, None), ("keras", SAPPHIRE_FLAGS, True),
                                               ("tensorflow", GENOA_FLAGS, None), ("keras", GENOA_FLAGS, True),
                                               ("keras", ZEN3_FLAGS, True), ("tensorflow_xla", SAPPHIRE_FLAGS, True),
                                               ("keras", ARM_FEATURES, True)])
def test_bf16_auto_never_picks_the_slower_path_on_a_cpu(backend, flags, jit):
    """``--bf16 auto`` on a CPU as each backend calls it (native bf16 from the CPU flags; the Keras backend passes
    jit_compile=True, bf16_dots=True and whether the CPU has AMX): bf16 on TensorFlow's oneDNN kernels (1.14x its
    float32 with AMX, 1.21x on Zen 4's AVX512-BF16) and on the Keras backend's XLA step with AMX, whose bf16 x bf16
    -> float32 dots run natively (benchmarks/NOTES.md "Round six"), and with AVX512-BF16 alone (1.18x its float32
    on Zen 4, benchmarks/RESULTS.md 2026-12-03); float32 on the Keras backend with Arm BF16 (not measured) and on
    an XLA:CPU step without those dots (TensorFlow with --jit_compile true), with the exact reason."""
    native = bool(cpu_flags(flags) & NATIVE_BF16_CPU_FLAGS)
    plan = resolve_precision("auto", jit, "CPU", native, bf16_dots=backend == "keras",
                             bf16_dots_faster=xla_bf16_dots_faster("CPU", cpu_flags(flags)))
    if not native:
        assert (plan.precision, plan.reason) == ("float32", "--bf16 auto: this CPU has no native bf16, float32 is faster")
    elif backend == "tensorflow":
        assert (plan.precision, plan.compiler, plan.reason) == (
            "bf16 mixed", "TensorFlow kernels (oneDNN)",
            "--bf16 auto: this CPU has native bf16; TensorFlow's oneDNN bf16 kernels, not XLA: about 2x XLA:CPU's "
            "bf16 matmul rate")
    elif backend == "keras" and flags == ARM_FEATURES:
        assert (plan.bf16, plan.precision, plan.compiler, plan.reason) == (
            False, "float32", "XLA",
            "--bf16 auto: float32, this CPU has native bf16 but neither AMX nor AVX512-BF16: the XLA step's bf16 "
            "dots are not known to beat float32 here")
    elif backend == "keras":
        assert (plan.bf16, plan.precision, plan.compiler, plan.reason) == (
            True, "bf16 mixed", "XLA",
            "--bf16 auto: this CPU has native bf16 and the step's matmuls multiply bf16 natively on XLA:CPU "
            "(bf16 x bf16 -> float32 dots)")
    else:
        assert (plan.bf16, plan.precision, plan.compiler, plan.reason) == (
            False, "float32", "XLA",
            "--bf16 auto: float32, this CPU has native bf16 but the step runs on XLA:CPU, which multiplies bf16 -> "
            "bf16 dots in float32: slower than float32")


def test_bf16_true_on_xla_cpu_says_it_is_slower():
    """An explicit ``--bf16 true`` is kept on XLA:CPU (the user asked), and the reason says what auto would do;
    with the Keras backend's bf16 dots there is nothing to warn about."""
    plan = resolve_precision(True, True, "CPU", True)
    assert (plan.bf16, plan.compiler) == (True, "XLA")
    assert plan.reason == ("--bf16 true; XLA:CPU multiplies bf16 -> bf16 dots in float32 even on this native-bf16 "
                           "CPU: slower than float32, and --bf16 auto would keep float32")
    assert resolve_precision(True, True, "CPU", True, bf16_dots=True).reason == "--bf16 true"
    assert resolve_precision(True, True, "CPU", True, bf16_dots=True, bf16_dots_faster=False).reason == (
        "--bf16 true; the XLA step's bf16 dots are not known to beat float32 without AMX or AVX512-BF16, and --bf16 "
        "auto would keep float32")
    assert resolve_precision(True, True, "GPU", True).reason == "--bf16 true"


def test_precision_log_line_nests_no_parentheses():
    """The line the TensorFlow backend logs ("precision P, compiler path: C. Why: R.") for every plan: one level of
    parentheses at most (it used to nest three: "... (oneDNN) (--bf16 true ... (emulated: ...))")."""
    compiler_paths = ("XLA, whole step in one program", "XLA per-replica forward/backward, update outside XLA",
                      "TensorFlow kernels (oneDNN)", "TensorFlow kernels")
    dot_cases = ((False, True), (True, True), (True, False))  # (bf16_dots, bf16_dots_faster)
    for bf16, jit, accel, native, (dots, faster) in itertools.product(
            (None, "auto", True, False), (None, True, False), ("CPU", "GPU", "TPU"), (True, False), dot_cases):
        plan = resolve_precision(bf16, jit, accel, native, bf16_dots=dots, bf16_dots_faster=faster)
        for path in compiler_paths:
            line = f"precision {plan.precision}, compiler path: {path}. Why: {plan.reason}."
            depth = deepest = 0
            for ch in line:
                depth += {"(": 1, ")": -1}.get(ch, 0)
                deepest = max(deepest, depth)
            assert deepest <= 1 and depth == 0, line


def test_bad_bf16_flag_is_an_argument_error():
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError, match="--bf16 must be one of"):
        parse_args(["--output_dir", "x", "--bf16", "half"])
    assert parse_args(["--output_dir", "x", "--bf16"])[2].bf16 is True  # bare flag, as with a bool field


def _train_bf16_logging(out, *args):
    """An in-process tiny ``--bf16 true`` run of 8 steps: (results, the hf_tpu_ext log messages)."""
    import logging

    import tf_keras
    from conftest import tiny_train_args

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    messages = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("hf_tpu_ext")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        results = train(*parse_args(tiny_train_args(out, "--max_steps", "8", "--bf16", "true", *args,
                                                    "--eval_strategy", "no", "--save_strategy", "no", "--callbacks", "")))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        tf_keras.mixed_precision.set_global_policy("float32")
    return results, messages


def test_bf16_on_tensorflow_kernels_trains_and_exports_float32(tmp_path):
    """``--bf16 true --jit_compile false``: bf16 compute on TF's kernels, float32 weights, card and log say so."""
    from safetensors.numpy import load_file

    out = tmp_path / "bf16"
    results, messages = _train_bf16_logging(out, "--jit_compile", "false")
    assert results["global_step"] == 8 and np.isfinite(results["train_loss"])
    assert results["train_loss"] < 7.0  # ln(500) = 6.2 at the start: it trains, no bf16 overflow
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["precision"] == "bf16 mixed" and summary["jit_compile"] is False
    assert summary["compiler"] == "TensorFlow kernels (oneDNN)"
    weights = load_file(str(out / "model.safetensors"))
    assert {str(w.dtype) for w in weights.values()} == {"float32"}
    card = (out / "README.md").read_text()
    assert "| Precision | bf16 mixed |" in card and "| Compiler path | TensorFlow kernels (oneDNN) |" in card
    assert "trained with hf-tpu-ext using TensorFlow." in card
    assert any("precision bf16 mixed, compiler path: TensorFlow kernels (oneDNN). Why: --bf16 true" in m for m in messages)


def test_bf16_on_a_native_bf16_cpu_fuses_the_element_wise_ops_with_xla(tmp_path):
    """``--bf16 true`` with ``--jit_compile`` unset on an AMX-BF16 CPU (its flags given to the precision plan):
    oneDNN's kernels with XLA-clustered element-wise ops and counter-based dropout; it trains, the summary, card
    and log say so."""
    from conftest import run_train_script, tiny_train_args

    out = tmp_path / "fused"
    proc = run_train_script(tiny_train_args(out, "--max_steps", "8", "--bf16", "true", "--hidden_dropout_prob", "0.1",
                                            "--attention_probs_dropout_prob", "0.1", "--eval_strategy", "no",
                                            "--save_strategy", "no", "--callbacks", "")
                            + ["--cpu_flags", "fma,avx2,avx512f,avx512_bf16,amx_bf16"],
                            env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    summary = json.loads((out / "training_summary.json").read_text())
    path = "TensorFlow kernels (oneDNN), element-wise ops fused by XLA"
    assert (summary["precision"], summary["jit_compile"], summary["compiler"]) == ("bf16 mixed", False, path)
    results = json.loads((out / "all_results.json").read_text())
    assert summary["global_step"] == 8 and 0 < results["train_loss"] < 7.0  # ln(500) = 6.2 at the start
    assert f"| Compiler path | {path} |" in (out / "README.md").read_text()
    assert f"compiler path: {path}. Why: --bf16 true; TensorFlow's oneDNN bf16 kernels" in proc.stderr
    # TensorFlow's own line: auto-clustering compiled at least one cluster of the step
    assert "Compiled cluster using XLA" in proc.stderr


def test_fused_bf16_run_killed_and_resumed_draws_the_uninterrupted_runs_dropout_masks(tmp_path):
    """The fused path's dropout masks are counter-based (seed, step): a run SIGKILLed after its step-4 checkpoint
    and rerun ends with the per-step losses of the run that was never interrupted (TensorFlow's RandomUniform
    would draw other masks after the restart)."""
    from conftest import run_train_script, tiny_train_args

    def args(out, *resume):
        return tiny_train_args(out, "--max_steps", "8", "--bf16", "true", "--hidden_dropout_prob", "0.1",
                               "--attention_probs_dropout_prob", "0.1", "--eval_strategy", "no", "--save_strategy",
                               "steps", "--save_steps", "4", "--logging_steps", "1", "--callbacks", "",
                               *resume) + ["--cpu_flags", "avx512_bf16,amx_bf16"]

    def losses(out):
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        return {e["step"]: e["loss"] for e in history if "loss" in e}

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_train_script(args(whole))
    killed = run_train_script(args(cut) + ["--kill_at_step", "4"], check=False)
    assert killed.returncode == -9 and not (cut / "training_summary.json").exists()
    run_train_script(args(cut, "--resume_from_checkpoint", "true"))
    assert json.loads((cut / "training_summary.json").read_text())["compiler"].endswith("fused by XLA")
    expected, got = losses(whole), losses(cut)
    assert sorted(got) == sorted(expected) == list(range(1, 9))
    # the steps the second process ran; equal here (2026-12-04), while TensorFlow's RandomUniform on the unfused
    # path (--jit_compile false) gave losses 1.3e-4 to 2.5e-3 apart after the same kill and resume
    for step in range(5, 9):
        assert got[step] == pytest.approx(expected[step], rel=1e-6, abs=0), step


def test_bf16_kernels_path_says_when_tensorflow_started_too_early_to_fuse(tmp_path, monkeypatch):
    """On a native-bf16 CPU with ``--jit_compile`` unset but TensorFlow already started (here: this test process),
    TF_XLA_FLAGS can no longer take effect: the kernels run alone and the log says why."""
    import tensorflow as tf

    from hf_tpu_ext import precision

    tf.config.list_physical_devices("CPU")  # TensorFlow has read TF_XLA_FLAGS now
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo_text=None: frozenset({"avx512_bf16", "amx_bf16"}))
    out = tmp_path / "late"
    results, messages = _train_bf16_logging(out)
    summary = json.loads((out / "training_summary.json").read_text())
    assert (summary["precision"], summary["jit_compile"], summary["compiler"]) == (
        "bf16 mixed", False, "TensorFlow kernels (oneDNN)")
    assert results["global_step"] == 8 and "TF_XLA_FLAGS" not in os.environ
    assert ("element-wise ops not fused by XLA: TensorFlow had started before hf-tpu could set TF_XLA_FLAGS; "
            "TensorFlow's kernels run alone (see hf_tpu_ext/backends/tensorflow/fusion.py).") in messages


def test_a_users_own_auto_clustering_flags_are_kept_and_named_in_the_compiler_path(tmp_path):
    """TF_XLA_FLAGS that switch auto-clustering on themselves (here over every op, matmuls too) are left as they are;
    the compiler path says so instead of claiming the kernels run alone or hf-tpu's fusion."""
    from conftest import run_train_script, tiny_train_args

    out = tmp_path / "user"
    proc = run_train_script(tiny_train_args(out, "--max_steps", "4", "--bf16", "true", "--eval_strategy", "no",
                                            "--save_strategy", "no", "--callbacks", "")
                            + ["--cpu_flags", "avx512_bf16,amx_bf16"],
                            env={"TF_XLA_FLAGS": "--tf_xla_cpu_global_jit --tf_xla_auto_jit=2"})
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["compiler"] == "TensorFlow kernels (oneDNN), XLA auto-clustering as TF_XLA_FLAGS sets it"
    assert ("element-wise ops not fused by hf-tpu: your TF_XLA_FLAGS set XLA auto-clustering (--tf_xla_auto_jit=2), "
            "so TensorFlow clusters as they say") in proc.stderr
