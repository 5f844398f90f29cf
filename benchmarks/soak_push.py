"""Soak benchmark of the Hub push path: does memory grow with pushes?

A pusher-only training loop (no model compute, so the push path is all that can grow): every "step" sleeps
``--step_ms``; every ``--push_every`` steps the model folder is rewritten (a fresh ``--weights_kb`` KB
``model.safetensors``, config, tokenizer files) and pushed with ``hub_strategy="checkpoint"`` (model +
``last-checkpoint/``) to a loopback Hub served by a *separate* process (its in-memory repos are not
counted). The RSS of this process (psutil) is sampled every ``--sample_every`` steps; the figure is the
least-squares slope of RSS over steps after a warm-up, in MB per 1,000 steps, plus the staging folders and
threads left at the end. A benchmark, not a test: it prints figures and asserts nothing.

``--mode train`` measures a whole tiny-model ``hf-tpu train`` run instead (2 layers, hidden 64, 32-token
blocks, ``--push_to_hub true --hub_strategy checkpoint``, a save and push every ``--push_every`` steps): the
RSS of the training process is sampled every ``--sample_seconds`` against the global step its log shows,
and the run is stopped with SIGINT at the end of ``--minutes``.

Usage (from the repository root; ``tests/`` holds the loopback Hub):
    python -m benchmarks.soak_push [--minutes 5] [--push_every 20] [--step_ms 5]
    python -m benchmarks.soak_push --mode train [--minutes 5] [--push_every 50]

To measure another checkout (e.g. the code before a change), run the script with ``PYTHONPATH`` pointing
at that checkout; it uses :class:`~hf_tpu_ext.hub.pusher.HubPusher` when present, else the older
``hub.push_queue`` API.
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
    """The new HubPusher, or the older push_queue API of a checkout that predates it."""

    def __init__(self, repo_id: str, output_dir: str):
        try:
            from hf_tpu_ext.hub.pusher import HubPusher
        except ImportError:
            HubPusher = None
        self.new = HubPusher is not None
        if self.new:
            self.pusher = HubPusher(repo_id, token=TOKEN, hub_strategy="checkpoint", output_dir=output_dir,
                                    backoff_seconds=0.05)
            self.pusher.preflight()
        else:
            from hf_tpu_ext.hub.push_queue import open_push_queue

            self.repo_id, self.token, self.queue = open_push_queue(output_dir, repo_id, TOKEN, backoff_seconds=0.05)

    def push(self, folder: str, checkpoint: str, step: int) -> None:
        if self.new:
            self.pusher.push_save(folder, step=step, checkpoint_folder=checkpoint)
        else:
            from hf_tpu_ext.hub.push_queue import submit_model_folder

            submit_model_folder(self.queue, folder, f"Training in progress, step {step}", self.token,
                                ["checkpoints/*", "last-checkpoint/*", "*.index", "*.data-*"])
            self.queue.submit(checkpoint, path_in_repo="last-checkpoint", commit_message=f"Checkpoint at step {step}",
                              delete_patterns=["*"], key="last-checkpoint")

    def finish(self):
        if self.new:
            report = self.pusher.finish(600)
            return report.counts["pushed"], report.counts["superseded"], report.counts["failed"]
        report = self.queue.wait(600)
        self.queue.close(timeout=0)
        return len(report.pushed), len(report.superseded), len(report.failed)


TINY_TRAIN_ARGS = [
    "--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "128",
    "--vocab_size", "500", "--max_seq_length", "32", "--per_device_train_batch_size", "8",
    "--max_train_samples", "512", "--eval_strategy", "no", "--logging_steps", "50", "--disable_tqdm", "true",
]
_STEP = re.compile(rb"\bstep (\d+)\b")


def soak_train(args, tmp: str) -> dict:
    """The ``--mode train`` measurement: (step, RSS MB) of an ``hf-tpu train`` child process."""
    import psutil

    out = os.path.join(tmp, "train-out")
    log_path = os.path.join(tmp, "train.log")
    cmd = [sys.executable, "-m", "hf_tpu_ext", "train", "--output_dir", out, *TINY_TRAIN_ARGS,
           "--max_steps", "10000000", "--save_strategy", "steps", "--save_steps", str(args.push_every),
           "--save_total_limit", "2"]
    if not args.no_push:  # --no_push: the same saves without pushes, to tell the push path from the rest
        cmd += ["--push_to_hub", "true", "--hub_model_id", "alice/soak-train", "--hub_strategy", "checkpoint",
                "--hub_token", TOKEN]
        if args.hub_commit_budget:  # a budget high enough that every save is pushed (a leak shows per push)
            cmd += ["--hub_commit_budget", str(args.hub_commit_budget)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())
    child = psutil.Process(proc.pid)
    samples: List[Tuple[int, float]] = []
    deadline = time.monotonic() + args.minutes * 60
    t0 = time.monotonic()
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(args.sample_seconds)
        with open(log_path, "rb") as f:
            steps = _STEP.findall(f.read())
        step = int(steps[-1]) if steps else 0
        if step > 0:
            samples.append((step, child.memory_info().rss / 2 ** 20))
    elapsed = time.monotonic() - t0
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    kept = samples[int(len(samples) * args.warmup):]
    with open(log_path, "rb") as f:
        text = f.read()
    return {
        "mode": "train" + (" (saves, no pushes)" if args.no_push else ""), "minutes": round(elapsed / 60, 2), "steps": samples[-1][0] if samples else 0,
        "pushes_queued": text.count(b"Queued push"), "commits_landed": text.count(b"hf_tpu_ext.hub: Pushed"),
        "rss_mb_first_sample": round(samples[0][1], 1) if samples else None,
        "rss_mb_last_sample": round(samples[-1][1], 1) if samples else None,
        "rss_growth_mb_per_1000_steps": round(slope_per_1000(kept), 3),
        "exit_status_after_sigint": proc.returncode,
        "staging_folders_left": len([n for n in os.listdir(tmp) if n.startswith("hf-tpu-push-")]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="Length of the loop (default 5).")
    parser.add_argument("--push_every", type=int, default=20, help="Steps between pushes (default 20).")
    parser.add_argument("--step_ms", type=float, default=5.0, help="Sleep per simulated step, ms (default 5).")
    parser.add_argument("--weights_kb", type=int, default=400, help="Size of model.safetensors, KB (default 400).")
    parser.add_argument("--sample_every", type=int, default=500, help="Steps between RSS samples (default 500).")
    parser.add_argument("--warmup", type=float, default=0.2, help="Fraction of samples left out of the slope.")
    parser.add_argument("--mode", choices=("pusher", "train"), default="pusher",
                        help="pusher: a pusher-only loop (default); train: a tiny `hf-tpu train` run.")
    parser.add_argument("--sample_seconds", type=float, default=5.0, help="--mode train: seconds between samples.")
    parser.add_argument("--no_push", action="store_true", help="--mode train: save without pushing (a baseline).")
    parser.add_argument("--hub_commit_budget", type=int, default=None,
                        help="--mode train: passed to hf-tpu train (e.g. 100000: every save pushed, none coalesced).")
    args = parser.parse_args(argv)

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
    if args.mode == "train":
        try:
            print(json.dumps(soak_train(args, tmp), indent=2))
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
            "code": "HubPusher" if pusher.new else "push_queue (before HubPusher)",
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
