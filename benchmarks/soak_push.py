"""Soak benchmark: does a long ``hf-tpu train`` run (TensorFlow backend) keep its memory flat?

``--mode train`` (the default) runs a tiny-model ``hf-tpu train`` (``--backend``, default tensorflow; 2 layers, hidden 64, 32-token blocks,
``--push_to_hub true --hub_strategy checkpoint``, a save and a push every ``--push_every`` steps, the commit
budget's pacing as in any run) against a loopback Hub served by a *separate* process (its in-memory repos are not
counted) for ``--minutes`` (default 8), then stops it with SIGINT. The RSS of the training process (psutil) is
sampled every ``--sample_seconds``; the figure is the least-squares slope of RSS over wall time after the first
minute (``--warmup_seconds``), in MB/min (target < 0.5), with the steps, saves and pushes seen, the load average
and the CPU's flags. ``--no_push``: the same saves without pushes, to tell the push path from the rest.

``--mode inprocess`` runs the same tiny ``hf-tpu train`` (no push) for ``--steps`` steps inside this process and
reads RSS after every save (the TensorFlow checkpointer's write, the Keras backend's save): the figure is KB per
save and MB per 1,000 steps after ``--skip_steps`` (default 11,000: the step windows of 10,000 entries are full),
load-independent (it counts saves and steps, not minutes), and the same slope of glibc's heap bytes in use
(``mallinfo2``: a leak grows it, memory freed and kept for reuse does not). ``--trace_from S``: ``tracemalloc`` starts at save S and
the Python allocations grown between saves ``--snapshots A B`` are listed (file:line, KB, blocks).

``--mode pusher`` measures the push path alone: no model compute, every "step" sleeps ``--step_ms``, every
``--push_every`` steps a model folder and checkpoint are rewritten and pushed with
:class:`~hf_tpu_ext.hub.push_session.PushSession` (:func:`~hf_tpu_ext.hub.push_session.push_save`); RSS of this process over steps.

A benchmark, not a test: it prints figures (JSON) and asserts nothing.

Usage (from the repository root; ``tests/`` holds the loopback Hub):
    python -m benchmarks.soak_push [--minutes 8] [--push_every 20] [--no_push] [--backend keras]
    python -m benchmarks.soak_push --mode inprocess [--backend keras] [--steps 14000] [--trace_from 250]
    python -m benchmarks.soak_push --mode pusher [--minutes 5] [--step_ms 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "hf_alice_loopback_secret_token_0123"  # a loopback-only test token (tests/hub_fixtures.py)

_SERVER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from hub_fixtures import USERS
from loopback_hub import LoopbackHubServer
server = LoopbackHubServer(USERS)
print(server.endpoint, flush=True)
while True:
    time.sleep(3600)
"""


def start_hub() -> Tuple[subprocess.Popen, str]:
    """A loopback Hub in its own process; returns (process, endpoint)."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, os.path.join(REPO_ROOT, "tests")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, proc.stdout.readline().strip()


def slope_per_1000(points: List[Tuple[int, float]]) -> float:
    """Least-squares slope of (step, MB) points, in MB per 1,000 steps."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 1000.0 * sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else float("nan")


def write_model_folder(folder: str, step: int, weights_kb: int) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(os.urandom(weights_kb * 1024))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "roberta", "step": step}, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"mask_token": "<mask>"}, f)


def write_checkpoint(folder: str, step: int, weights_kb: int) -> None:
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    with open(os.path.join(folder, f"ckpt-{step}.data-00000-of-00001"), "wb") as f:
        f.write(os.urandom(2 * weights_kb * 1024))
    with open(os.path.join(folder, f"ckpt-{step}.index"), "wb") as f:
        f.write(os.urandom(512))
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)


class _Pusher:
    """A script's :class:`~hf_tpu_ext.hub.push_session.PushSession` pushing a model folder and its checkpoint."""

    def __init__(self, repo_id: str, output_dir: str):
        from hf_tpu_ext.hub.push_session import PushSession, push_save

        self.pusher = PushSession.for_script(repo_id, token=TOKEN, hub_strategy="checkpoint", output_dir=output_dir,
                                             backoff_seconds=0.05)
        self.pusher.preflight()
        self._push_save = push_save

    def push(self, folder: str, checkpoint: str, step: int) -> None:
        self._push_save(self.pusher, folder, step=step, checkpoint_folder=checkpoint)

    def finish(self):
        report = self.pusher.finish(600)
        return report.counts["pushed"], report.counts["superseded"], report.counts["failed"]


def slope_per_minute(points: List[Tuple[float, float]], skip_seconds: float) -> float:
    """Least-squares slope of (seconds, MB) points after ``skip_seconds``, in MB/min (nan with < 2 points)."""
    kept = [(t, mb) for t, mb in points if t >= skip_seconds]
    return slope_per_1000(kept) * 60.0 / 1000.0


def machine_facts() -> dict:
    """Load average, cores and the CPU's SIMD flags: the conditions a figure was measured under."""
    flags = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = sorted(x for x in line.split(":", 1)[1].split()
                                   if x.startswith(("avx", "amx", "fma", "sse4")))
                    break
    except OSError:
        pass
    return {"load_average_1_5_15": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count(),
            "cpu_flags": " ".join(flags)}


TINY_TRAIN_ARGS = [
    "--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "128",
    "--vocab_size", "500", "--max_seq_length", "32", "--per_device_train_batch_size", "8",
    "--max_train_samples", "512", "--eval_strategy", "no", "--logging_steps", "50", "--disable_tqdm", "true",
]
_STEP = re.compile(rb"\bstep (\d+)\b")


def soak_train(args, tmp: str) -> dict:
    """The ``--mode train`` measurement: (seconds, RSS MB) of an ``hf-tpu train`` child process."""
    import psutil

    out = os.path.join(tmp, "train-out")
    log_path = os.path.join(tmp, "train.log")
    cmd = [sys.executable, "-m", "hf_tpu_ext", "train", "--backend", args.backend, "--output_dir", out, *TINY_TRAIN_ARGS,
           "--max_steps", "10000000", "--save_strategy", "steps", "--save_steps", str(args.push_every),
           "--save_total_limit", "2"]
    if not args.no_push:
        cmd += ["--push_to_hub", "true", "--hub_model_id", "alice/soak-train", "--hub_strategy", "checkpoint",
                "--hub_token", TOKEN]
        if args.hub_commit_budget:  # a budget high enough that every save is pushed (a leak shows per push)
            cmd += ["--hub_commit_budget", str(args.hub_commit_budget)]
    before = machine_facts()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())
    child = psutil.Process(proc.pid)
    samples: List[Tuple[float, float]] = []  # (seconds since the first training step, RSS MB)
    steps: List[int] = []
    deadline = time.monotonic() + args.minutes * 60
    t0 = None
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(args.sample_seconds)
        with open(log_path, "rb") as f:
            found = _STEP.findall(f.read())
        if found:  # the clock starts at the first logged step (start-up and compilation left out)
            t0 = time.monotonic() if t0 is None else t0
            samples.append((time.monotonic() - t0, child.memory_info().rss / 2 ** 20))
            steps.append(int(found[-1]))
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with open(log_path, "rb") as f:
        text = f.read()
    kept = [s for s in samples if s[0] >= args.warmup_seconds]
    return {
        "mode": "train" + (" (saves, no pushes)" if args.no_push else ""), "backend": args.backend,
        "minutes_measured": round(samples[-1][0] / 60, 2) if samples else 0, "steps": steps[-1] if steps else 0,
        "saves": text.count(b"saved checkpoint"), "pushes_queued": text.count(b"Queued push"),
        "commits_landed": text.count(b"hf_tpu_ext.hub: Pushed"),
        "rss_mb_after_first_minute": round(kept[0][1], 1) if kept else None,
        "rss_mb_last_sample": round(samples[-1][1], 1) if samples else None,
        "rss_slope_mb_per_min": round(slope_per_minute(samples, args.warmup_seconds), 3),
        # one slope hides a step (a release, a late allocation): the last sample of each minute shows it
        "rss_mb_per_minute": [round(mb, 1) for i, (t, mb) in enumerate(samples)
                              if i + 1 == len(samples) or int(samples[i + 1][0] // 60) > int(t // 60)],
        "rss_growth_mb_per_1000_steps": round(slope_per_1000(
            [(st, mb) for st, (t, mb) in zip(steps, samples) if t >= args.warmup_seconds]), 3),
        "target_mb_per_min": 0.5, "exit_status_after_sigint": proc.returncode,
        "machine_at_start": before, "load_average_at_end": machine_facts()["load_average_1_5_15"],
    }


def hook_saves(backend: str, after_save):
    """Call ``after_save(step)`` after each checkpoint write of ``backend`` in this process; returns the undo."""
    if backend == "tensorflow":
        from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer as owner
        name = "write"
    else:
        from hf_tpu_ext.backends.keras.trainer import JaxTrainer as owner
        name = "save"
    original = getattr(owner, name)

    def hooked(self, step, *a, **k):
        out = original(self, step, *a, **k)
        after_save(int(step))
        return out

    setattr(owner, name, hooked)
    return lambda: setattr(owner, name, original)


def soak_inprocess(args, tmp: str) -> dict:
    """The ``--mode inprocess`` measurement: RSS after each save of an in-process ``hf-tpu train``."""
    import psutil
    import tracemalloc

    from hf_tpu_ext.cli import main as hf_tpu
    from hf_tpu_ext.host_memory import heap_usage

    process, samples, snapshots, heap = psutil.Process(), [], {}, []

    def after_save(step):
        n = len(samples) + 1
        if n == args.trace_from:
            tracemalloc.start(8)
        if tracemalloc.is_tracing() and n in args.snapshots:
            gc.collect()
            snapshots[n] = tracemalloc.take_snapshot()
        samples.append((step, process.memory_info().rss / 2 ** 20))
        heap.append((step, (heap_usage() or {"in_use_bytes": float("nan")})["in_use_bytes"] / 2 ** 20))

    hook_saves(args.backend, after_save)
    before = machine_facts()
    rc = hf_tpu(["train", "--backend", args.backend, "--output_dir", os.path.join(tmp, "train-out"), *TINY_TRAIN_ARGS,
                 "--max_steps", str(args.steps), "--save_strategy", "steps", "--save_steps", str(args.push_every),
                 "--save_total_limit", "2", "--report_to", "none"])
    kept = [(st, mb) for st, mb in samples if st >= args.skip_steps]
    per_1000 = slope_per_1000(kept)
    heap_per_1000 = slope_per_1000([(st, mb) for st, mb in heap if st >= args.skip_steps])
    grown = []
    if len(snapshots) == 2:
        a, b = (snapshots[n] for n in sorted(snapshots))
        for stat in b.compare_to(a, "lineno")[:args.top]:
            frame = stat.traceback[0]
            grown.append({"where": f"{os.path.relpath(frame.filename, REPO_ROOT)}:{frame.lineno}",
                          "kb": round(stat.size_diff / 1024, 1), "blocks": stat.count_diff})
    return {"mode": "inprocess (saves, no pushes)", "backend": args.backend, "exit_status": rc, "steps": args.steps,
            "saves": len(samples), "save_every": args.push_every, "slope_from_step": args.skip_steps,
            "rss_mb_at_slope_start": round(kept[0][1], 1) if kept else None,
            "rss_mb_last_save": round(samples[-1][1], 1) if samples else None,
            "rss_growth_mb_per_1000_steps": round(per_1000, 3),
            "rss_growth_kb_per_save": round(per_1000 * args.push_every / 1000 * 1024, 2),
            # glibc's bytes in use (mallinfo2): grows with a leak; memory freed and kept for reuse grows RSS only
            "heap_in_use_growth_mb_per_1000_steps": round(heap_per_1000, 3),
            "python_heap_grown_between_saves": {"saves": sorted(snapshots), "top": grown},
            "machine_at_start": before, "load_average_at_end": machine_facts()["load_average_1_5_15"]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0, help="Length of the run (default 8).")
    parser.add_argument("--push_every", type=int, default=20, help="Steps between pushes (default 20).")
    parser.add_argument("--step_ms", type=float, default=5.0, help="Sleep per simulated step, ms (default 5).")
    parser.add_argument("--weights_kb", type=int, default=400, help="Size of model.safetensors, KB (default 400).")
    parser.add_argument("--sample_every", type=int, default=500, help="Steps between RSS samples (default 500).")
    parser.add_argument("--warmup", type=float, default=0.2, help="--mode pusher: fraction of samples left out.")
    parser.add_argument("--mode", choices=("pusher", "train", "inprocess"), default="train",
                        help="train: a tiny `hf-tpu train` run (default); inprocess: the same run in this process, "
                             "RSS per save; pusher: a pusher-only loop.")
    parser.add_argument("--steps", type=int, default=14000, help="--mode inprocess: steps (default 14,000).")
    parser.add_argument("--skip_steps", type=int, default=11000,
                        help="--mode inprocess: the slope starts at this step (default 11,000: the windows are full).")
    parser.add_argument("--trace_from", type=int, default=0,
                        help="--mode inprocess: start tracemalloc at this save (0: never; it slows every step).")
    parser.add_argument("--snapshots", type=int, nargs=2, default=(600, 690),
                        help="--mode inprocess: the two saves whose Python heaps are compared (default 600 690).")
    parser.add_argument("--top", type=int, default=8, help="--mode inprocess: lines of the heap diff shown.")
    parser.add_argument("--warmup_seconds", type=float, default=60.0,
                        help="--mode train: seconds after the first step left out of the slope (default 60).")
    parser.add_argument("--sample_seconds", type=float, default=5.0, help="--mode train: seconds between samples.")
    parser.add_argument("--no_push", action="store_true", help="--mode train: save without pushing (a baseline).")
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "keras"),
                        help="--mode train: the hf-tpu train backend (default tensorflow; keras: run it in a [jax] venv).")
    parser.add_argument("--hub_commit_budget", type=int, default=None,
                        help="--mode train: passed to hf-tpu train (e.g. 100000: every save pushed, none coalesced).")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    import psutil

    server, endpoint = start_hub()
    tmp = tempfile.mkdtemp(prefix="soak-push-")
    os.environ.update(HF_ENDPOINT=endpoint, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
                      HF_HOME=os.path.join(tmp, "hf-home"))
    os.environ["TMPDIR"] = tmp  # the staging folders land here, so the leftovers can be counted
    tempfile.tempdir = None
    work = tempfile.mkdtemp(prefix="run-", dir=tmp)
    folder, checkpoint = os.path.join(work, "out"), os.path.join(work, "out", "last-checkpoint")
    process = psutil.Process()
    if args.mode in ("train", "inprocess"):
        try:
            print(json.dumps((soak_train if args.mode == "train" else soak_inprocess)(args, tmp), indent=2))
            return 0
        finally:
            server.terminate()
            server.wait(timeout=10)
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        pusher = _Pusher("alice/soak", folder)
        threads_before = threading.active_count()
        samples: List[Tuple[int, float]] = []
        deadline = time.monotonic() + args.minutes * 60
        step, pushes = 0, 0
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            step += 1
            time.sleep(args.step_ms / 1000.0)
            if step % args.push_every == 0:
                write_model_folder(folder, step, args.weights_kb)
                write_checkpoint(checkpoint, step, args.weights_kb)
                pusher.push(folder, checkpoint, step)
                pushes += 1
            if step % args.sample_every == 0:
                samples.append((step, process.memory_info().rss / 2 ** 20))
        elapsed = time.monotonic() - t0
        landed, superseded, failed = pusher.finish()
        gc.collect()
        rss_end = process.memory_info().rss / 2 ** 20
        kept = samples[int(len(samples) * args.warmup):]
        staging = [n for n in os.listdir(tmp) if n.startswith("hf-tpu-push-")]
        result = {
            "minutes": round(elapsed / 60, 2), "steps": step, "pushes_submitted": pushes, "commits_landed": landed,
            "superseded": superseded, "failed": failed,
            "rss_mb_first_sample": round(samples[0][1], 1) if samples else None,
            "rss_mb_last_sample": round(samples[-1][1], 1) if samples else None,
            "rss_mb_after_finish": round(rss_end, 1),
            "rss_growth_mb_per_1000_steps": round(slope_per_1000(kept), 3),
            "rss_growth_mb_per_1000_pushes": round(slope_per_1000(kept) * args.push_every, 2),
            "staging_folders_left": len(staging), "extra_threads_left": threading.active_count() - threads_before,
        }
        print(json.dumps(result, indent=2))
        return 0
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
