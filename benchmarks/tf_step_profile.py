"""Where the TensorFlow backend's training step spends its time, per TensorFlow op type (issue 29 item 2).

Runs ``hf-tpu train --backend tensorflow`` on the small preset in this process with a callback that records
``--profile_steps`` steady steps with ``tf.profiler`` (after ``--warmup`` steps), then sums the op events of the
host plane's executor threads (``tf_Compute/*``) per op type (``MatMul``, ``Cast``, ``_MklLayerNorm``, ...).

Figures, per profiled step (milliseconds):

* ``op_ms``: the summed wall time of that op type's kernels. Kernels of two executor threads can overlap (inter-op
  parallelism) and one kernel may use both cores (the Eigen pool), so the column sums to more than the step when
  ops overlap: it says where the executor is busy, not a partition of the step.
* ``pass``: the same split by the part of the step an op belongs to: ``backward`` (names under ``gradients`` /
  ``gradient_tape``), ``optimizer`` (``AdamWeightDecay`` / ``Adam``), ``forward`` (the rest).
* ``step_ms``, ``cpu_ms``: the step's wall time and the process's CPU time (all threads) from
  :mod:`benchmarks.step_timer` (medians of the profiled steps; the CPU time over the wall time says how many
  cores the step keeps busy).

The whole-step XLA program (``--jit_compile true``) leaves no op events here (only its ``step_ms``); on the fused
bf16 path (``--jit_compile`` unset, native-bf16 CPU) each XLA cluster between two oneDNN kernels is one ``_XlaRun``.
This profile is for TensorFlow's kernels (``hf_tpu_ext/precision.py``, ``backends/tensorflow/fusion.py``).

A benchmark, not a test: it prints a table and JSON and asserts nothing. Usage (repository root, the TensorFlow
venv; ``--bf16`` / ``--jit_compile`` are passed to ``hf-tpu train``)::

    python -m benchmarks.tf_step_profile --bf16 true --jit_compile false [--global_batch_size 32] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any, Dict, List

#: names of a profile's bookkeeping events on the executor threads (not op kernels)
_BOOKKEEPING = ("ThreadpoolListener", "Memory", "ExecutorState")


def op_pass(op_name: str) -> str:
    """``backward``, ``optimizer`` or ``forward``: the part of the training step a TensorFlow op name belongs to."""
    if "gradients" in op_name or "gradient_tape" in op_name:
        return "backward"
    if "AdamWeightDecay" in op_name or "/Adam/" in op_name:
        return "optimizer"
    return "forward"


def summarize_xplane(path: str, steps: int) -> Dict[str, Any]:
    """Per-op-type and per-pass kernel milliseconds per step from one ``*.xplane.pb`` of ``steps`` steps."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    by_type: Dict[str, float] = collections.Counter()
    count: Dict[str, int] = collections.Counter()
    by_pass: Dict[str, float] = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                meta = plane.event_metadata[event.metadata_id]
                if not meta.display_name or meta.name.startswith(_BOOKKEEPING):
                    continue
                ms = event.duration_ps / 1e9
                by_type[meta.display_name] += ms
                count[meta.display_name] += 1
                by_pass[op_pass(meta.name)] += ms
    per_step = {k: v / steps for k, v in by_type.items()}
    return {
        "op_ms": dict(sorted(per_step.items(), key=lambda kv: -kv[1])),
        "op_calls": {k: count[k] / steps for k in per_step},
        "pass_ms": {k: v / steps for k, v in by_pass.items()},
        "kernel_ms_total": sum(per_step.values()),
    }


def profile_run(train_args: List[str], global_batch_size: int, warmup: int, steps: int) -> Dict[str, Any]:
    """Run the small preset with ``train_args`` and return :func:`summarize_xplane` of ``steps`` steady steps."""
    import tensorflow as tf
    import tf_keras

    from benchmarks import step_timer
    from benchmarks.common import PRESETS, train_argv
    from benchmarks.jobs import job_prepare_data
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.callbacks import register_callback
    from hf_tpu_ext.run import train

    workdir = Path(tempfile.mkdtemp(prefix="tf-step-profile-"))
    logdir = workdir / "profile"
    preset = PRESETS["small"]

    @register_callback("bench_tf_profile", "Benchmarks: tf.profiler over a window of steady steps.")
    class StepWindowProfiler(tf_keras.callbacks.Callback):
        calls = 0

        @classmethod
        def from_run(cls, run):
            return cls()

        def on_train_batch_begin(self, batch, logs=None):
            if StepWindowProfiler.calls == warmup:
                tf.profiler.experimental.start(str(logdir))
            elif StepWindowProfiler.calls == warmup + steps:
                tf.profiler.experimental.stop()
            StepWindowProfiler.calls += 1

    try:
        job_prepare_data(preset, workdir)
        argv = train_argv(preset, workdir, workdir / "out", warmup + steps + 2, "bench_tf_profile,bench_step_timer",
                          ["--per_device_train_batch_size", str(global_batch_size), *train_args])
        results = train(*parse_args(argv))
        timer = step_timer.last_instance()
        intervals = timer.intervals[warmup:warmup + steps]
        cpu = [b - a for a, b in zip(timer.cpu_begins, timer.cpu_begins[1:])][warmup:warmup + steps]
        summary = summarize_xplane(sorted(glob.glob(str(logdir / "plugins/profile/*/*.xplane.pb")))[-1], steps)
        summary.update(step_ms=statistics.median(intervals) * 1e3, cpu_ms=statistics.median(cpu) * 1e3,
                       train_args=train_args, global_batch_size=global_batch_size, profiled_steps=steps,
                       load_average=[round(x, 2) for x in os.getloadavg()])
        return summary
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bf16", default="false")
    parser.add_argument("--jit_compile", default=None, help="true/false; unset: the backend's choice")
    parser.add_argument("--global_batch_size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5, help="steps before the profile (the first compiles)")
    parser.add_argument("--profile_steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=25, help="op types in the printed table")
    args = parser.parse_args(argv)
    jit = [] if args.jit_compile is None else ["--jit_compile", args.jit_compile]
    summary = profile_run(["--backend", "tensorflow", "--bf16", args.bf16, *jit],
                          args.global_batch_size, args.warmup, args.profile_steps)
    print(f"step {summary['step_ms']:.1f} ms, process CPU {summary['cpu_ms']:.1f} ms (medians of "
          f"{args.profile_steps}); kernels "
          f"{summary['kernel_ms_total']:.1f} ms/step; " +
          ", ".join(f"{k} {v:.1f}" for k, v in sorted(summary["pass_ms"].items())))
    for name, ms in list(summary["op_ms"].items())[:args.top]:
        print(f"{name:<40} {ms:9.2f} ms/step  {summary['op_calls'][name]:7.1f} calls/step")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
