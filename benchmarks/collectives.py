"""What JAX's collectives cost on this machine: `hf-tpu train --backend keras` as 2 processes x 1 CPU device
(joined by jax.distributed, gloo all-reduce between processes) vs 1 process x 2 devices (one XLA program over
both) vs 1 process x 1 device, the same model and global batch (issue 27's figures).

Each layout trains ``--steps`` steps from scratch on the embedded corpus in fresh processes (the 2-process one with
the README's variables: ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``,
``JAX_NUM_CPU_DEVICES``); the figure is the run's ``steady_tokens_per_second`` (all_results.json: the steps after
the first call) and ms/step = global batch x sequence length / tokens per second. The 1-minute load average at the
start and end of each layout is printed beside it: on a shared machine the figures move with the load, so run it
alone for a headline.

Usage (from the repository root, in the current-releases venv, KERAS_BACKEND=jax):
    python -m benchmarks.collectives --preset tiny --steps 20
    python -m benchmarks.collectives --preset small --steps 30 --json benchmarks/results/collectives.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO_ROOT = Path(__file__).resolve().parent.parent
#: (name, processes, devices per process)
LAYOUTS = (("1 process x 1 device", 1, 1), ("1 process x 2 devices", 1, 2), ("2 processes x 1 device", 2, 1))
#: model and batch shapes: small = benchmarks.common's small preset, tiny = the tests' tiny model
PRESETS = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
             "vocab_size": 500, "max_seq_length": 32, "global_batch_size": 16},
    "small": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
              "vocab_size": 8000, "max_seq_length": 128, "global_batch_size": 16},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_argv(preset: Dict[str, int], out: Path, steps: int, devices_total: int) -> List[str]:
    """`hf-tpu train` arguments of one layout: the same global batch whatever the device count."""
    shapes = {k: v for k, v in preset.items() if k != "global_batch_size"}
    per_device = preset["global_batch_size"] // devices_total
    argv = ["--backend", "keras", "--output_dir", str(out), "--max_steps", str(steps), "--logging_steps",
            str(steps), "--save_steps", str(10 * steps), "--eval_strategy", "no", "--disable_tqdm", "true",
            "--per_device_train_batch_size", str(per_device), "--max_train_samples", str(4 * preset["global_batch_size"]),
            "--seed", "7"]
    for key, value in shapes.items():
        argv += [f"--{key}", str(value)]
    return argv


def run_layout(python: str, preset: Dict[str, int], processes: int, devices: int, steps: int, workdir: Path) -> dict:
    """Train one layout; returns its figures (``tokens_per_second``, ``ms_per_step``, ``wall_seconds``, load)."""
    out = workdir / f"{processes}x{devices}"
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "XLA_FLAGS"):
        env.pop(key, None)
    address = f"127.0.0.1:{_free_port()}"
    load_start, t0 = os.getloadavg()[0], time.perf_counter()
    procs = []
    for i in range(processes):
        penv = dict(env, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(processes),
                    JAX_PROCESS_ID=str(i)) if processes > 1 else env
        procs.append(subprocess.Popen([python, "-m", "hf_tpu_ext", "train",
                                       *train_argv(preset, out, steps, processes * devices)],
                                      env=penv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate()[1] for p in procs]
    wall = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        return {"error": next(e for p, e in zip(procs, errors) if p.returncode)[-2000:]}
    results = json.loads((out / "all_results.json").read_text())
    rate = float(results["steady_tokens_per_second"])
    tokens_per_step = preset["global_batch_size"] * preset["max_seq_length"]
    return {"tokens_per_second": round(rate, 1), "ms_per_step": round(1e3 * tokens_per_step / rate, 2),
            "wall_seconds": round(wall, 1), "load_1min_start": round(load_start, 2),
            "load_1min_end": round(os.getloadavg()[0], 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--python", default=sys.executable, help="the current-releases venv's Python")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    figures = {"preset": args.preset, "steps": args.steps, "cpu_cores": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "layouts": {}}
    with tempfile.TemporaryDirectory(prefix="hf-tpu-collectives-") as tmp:
        for name, processes, devices in LAYOUTS:
            figures["layouts"][name] = fig = run_layout(args.python, preset, processes, devices, args.steps, Path(tmp))
            shown = (f"{fig['tokens_per_second']:>10.1f} tokens/s {fig['ms_per_step']:>9.2f} ms/step "
                     f"(load {fig['load_1min_start']} -> {fig['load_1min_end']}, {fig['wall_seconds']} s)"
                     if "error" not in fig else f"failed: {fig['error'].strip().splitlines()[-1]}")
            print(f"{name:<24} {shown}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all("error" not in f for f in figures["layouts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
