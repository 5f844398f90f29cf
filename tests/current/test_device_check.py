"""benchmarks/device_check.py (the accelerator check) in its CPU dry run, and device_check.sh's install plan.

Runs in the current-releases venv (``KERAS_BACKEND=jax JAX_PLATFORMS=cpu``): the module runs the Keras backend's
own compiled step at tiny shapes, in process.
"""

import json
import os
import re
import subprocess

import pytest

from conftest import REPO_ROOT

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("the Keras backend's JAX step", allow_module_level=True)
os.environ.setdefault("KERAS_BACKEND", "jax")


def test_dry_run_prints_the_figures_and_writes_the_json(tmp_path, capsys):
    from benchmarks import device_check

    path = tmp_path / "result" / "device_check.json"
    assert device_check.main(["--dry-run", "--steps", "2", "--json", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["device", "shapes", "compilations", "step time", "tokens/s",
                                                       "MFU", "device memory", "result"]
    assert lines[1] == "shapes: hidden 32, layers 2, heads 2, ffn 64, seq 32, batch 4, vocab 128, bf16 mixed"
    assert re.fullmatch(r"compilations: 1 \(first step \d+\.\d s, compiling \d+\.\d s\)", lines[2])
    assert re.fullmatch(r"step time: \d+\.\d\d ms \(median of 2 steps\)", lines[3])
    assert re.fullmatch(r"tokens/s: [\d,]+", lines[4])
    assert re.fullmatch(r"MFU: \d+\.\d% of [\d.]+ TFLOP/s \(CPU formula: .+\)", lines[5])
    assert re.fullmatch(r"device memory: n/a on cpu \(host peak RSS \d+\.\d\d GiB\)", lines[6])
    assert lines[7] == f"result: {path}"

    result = json.loads(path.read_text())
    assert tuple(result) == device_check.RESULT_KEYS
    assert (result["ok"], result["problems"], result["compilations"], result["steps_timed"]) == (True, [], 1, 2)
    assert result["shapes"] == device_check.TINY_SHAPES and result["dtype"] == "bf16 mixed"
    assert (result["platform"], result["num_devices"], result["peak_bytes_in_use"]) == ("cpu", 1, None)
    # FLOPs per token of hf_tpu_ext.flops at these shapes, by hand: 6 x 2 x (4 x 32^2 + 2 x 32 x 64) +
    # 12 x 2 x 32 x 32 + 6 x (32^2 + 32 x 128) x 5/32 (5 = round(0.15 x 32) masked positions)
    assert result["flops_per_token"] == 98304 + 24576 + 4800
    assert result["tokens_per_second"] == pytest.approx(4 * 32 / (result["step_time_ms"] / 1e3))
    assert result["mfu"] == pytest.approx(result["tokens_per_second"] * 127680 / result["peak_flops"])
    assert result["peak_source"].startswith("CPU formula: ") and result["host_max_rss_bytes"] > 0


def test_a_spent_budget_is_a_problem_and_exit_1(tmp_path, capsys, monkeypatch):
    from benchmarks import device_check

    monkeypatch.setenv("OUT", str(tmp_path))  # the result goes to $OUT/device_check.json
    assert device_check.main(["--dry-run", "--layers", "1", "--steps", "3", "--budget-seconds", "0"]) == 1
    out = capsys.readouterr().out
    assert "problem: only 0 of 3 timed steps ran within --budget-seconds 0\n" in out
    assert "step time: n/a (median of 0 steps)\n" in out and "tokens/s: n/a\n" in out
    result = json.loads((tmp_path / "device_check.json").read_text())
    assert (result["ok"], result["steps_timed"], result["mfu"], result["compilations"]) == (False, 0, None, 1)


def test_bad_shapes_are_refused_before_any_compute(capsys):
    from benchmarks import device_check

    with pytest.raises(SystemExit) as exit_info:
        device_check.main(["--hidden", "30", "--heads", "4", "--steps", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m benchmarks.device_check: error: each size must be >= 1 and hidden a multiple of heads: "
        "--steps 0, --hidden 30 is not a multiple of --heads 4")


@pytest.mark.parametrize("driver,extras", [("580.65.06", ["cuda13", "cuda12"]), ("550.54.15", ["cuda12"]),
                                           (None, ["cuda12"])])
def test_install_plan_picks_the_cuda_build_of_the_driver(tmp_path, driver, extras):
    """``device_check.sh --plan``: CUDA 13's jax on a driver >= 580 with CUDA 12's as the fallback, else CUDA 12."""
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "DEVICE_CHECK_VENV": str(tmp_path / "venv"),
           "DEVICE_CHECK_UV": "0"}  # pip's commands, whether or not uv is on PATH
    if driver:
        (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\necho {driver}\n")
        (tmp_path / "nvidia-smi").chmod(0o755)
    out = subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "device_check.sh"), "--plan", "--batch", "32"],
                         env=env, capture_output=True, text=True, check=True, timeout=30).stdout
    py = f"{tmp_path}/venv/bin/python"
    installs = [line for line in out.splitlines() if line.startswith(f"+ {py} -m pip install")]
    assert installs == [f"+ {py} -m pip install -q --upgrade pip", f"+ {py} -m pip install -q -e .[jax]"] + [
        f"+ {py} -m pip install -q jax[{extra}]==<the jax version [jax] installed>" for extra in extras]
    assert out.splitlines()[-1] == f"+ KERAS_BACKEND=jax timeout 480 {py} -m benchmarks.device_check --batch 32"
    assert out.splitlines()[-2] == (f"+ env KERAS_BACKEND=jax timeout 480 {py} -m benchmarks.compiled_memory "
                                    "--accelerator --models bert-base modernbert-large")  # the FSDP line
    assert f"NVIDIA driver {driver.split('.')[0] if driver else 0}: jax CUDA extras to try: {' '.join(extras)}" in out


@pytest.mark.parametrize("flags", ["avx512f avx512_bf16 amx_bf16 amx_tile", "avx512f avx512_bf16", "avx2 fma",
                                   "fp asimd bf16"])
def test_keras_backend_bf16_auto_on_a_cpu(monkeypatch, flags):
    """``--bf16 auto`` as the Keras backend resolves it on a CPU (fake /proc/cpuinfo flags): bf16 with
    AMX or AVX512-BF16, since its step's bf16 x bf16 -> float32 dots run natively on XLA:CPU (hf_tpu_ext.precision,
    backends/keras/bf16_dot.py; 1.18x its float32 on Zen 4's AVX512-BF16), float32 with Arm BF16 (not measured)
    and without native bf16. Here because the device check's bf16 claims rest on it; it
    belongs beside tests/current/test_keras_backend.py."""
    import hf_tpu_ext.precision as precision
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends import make_backend

    monkeypatch.setattr(precision, "cpu_flags", lambda text=None: frozenset(flags.split()))
    _, _, args = parse_args(["--output_dir", "unused", "--backend", "keras", "--bf16", "auto"])
    backend = make_backend("keras")
    backend.setup(args)
    native = "amx_bf16" in flags or "avx512_bf16" in flags
    assert (backend.precision.bf16, backend.precision.precision, backend.precision.compiler) == (
        native, "bf16 mixed" if native else "float32", "XLA")
    assert args.bf16 == "auto" and backend.precision.bf16_dots  # the plan, not the arguments, carries the decision
    assert backend.precision.reason == (
        "--bf16 auto: this CPU has native bf16 and the step's matmuls multiply bf16 natively on XLA:CPU "
        "(bf16 x bf16 -> float32 dots)" if native
        else "--bf16 auto: float32, this CPU has native bf16 but neither AMX nor AVX512-BF16: the XLA step's bf16 "
        "dots are not known to beat float32 here" if "bf16" in flags.split()
        else "--bf16 auto: this CPU has no native bf16, float32 is faster")
