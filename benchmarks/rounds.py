"""The parent side of :mod:`benchmarks.train_throughput`: the machine, the load around each round, one child
process per round (:func:`child`), the median over rounds (:func:`median_run`), the loopback Hub of the callback
runs and the order of the rounds (:func:`run_parts`).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from benchmarks.common import (ALL_RECIPES, BENCH_USER_TOKEN, HUB_LATENCY_SECONDS, KERAS_RECIPES, PREPARE_PROCS,
                               QUIET_FOREIGN_CPU_SHARE, REPO_ROOT, Preset)


def machine_description() -> Dict[str, Any]:
    """What the numbers were measured on: CPU model, cores, memory, OS, versions, load at the start."""
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    versions = {}
    for pkg in ("tensorflow", "tf-keras", "transformers", "datasets"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:
            pass
    return {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2 ** 30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def keras_python() -> str:
    """The Python of the Keras recipes: ``$HF_TPU_KERAS_PYTHON``, else the current-releases venv of
    ``scripts/test_env_current.sh`` (``.venv-current``) when it exists, else this Python."""
    given = os.environ.get("HF_TPU_KERAS_PYTHON")
    if given:
        return given
    venv = REPO_ROOT / ".venv-current" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _cpu_busy_seconds() -> Optional[float]:
    """CPU seconds all processes of the machine used so far (``/proc/stat``: user, nice, system, irq, softirq and
    steal, the last being time the hypervisor gave to other guests); None where unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]] + [0] * 8
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    """CPU seconds this process's finished children (and theirs) used: the benchmark's own work."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class RoundLoad:
    """The load around one round: 1- and 5-minute load averages at start and end, and the cores other processes
    kept busy meanwhile (machine CPU time minus this benchmark's children's, per wall second)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.loadavg_start = [round(x, 2) for x in os.getloadavg()[:2]]
        self.busy_start, self.own_start = _cpu_busy_seconds(), _children_cpu_seconds()

    def finish(self) -> Dict[str, Any]:
        wall = max(time.perf_counter() - self.start, 1e-9)
        busy, own = _cpu_busy_seconds(), _children_cpu_seconds()
        foreign = None
        if busy is not None and self.busy_start is not None:
            foreign = max(0.0, (busy - self.busy_start) - (own - self.own_start)) / wall
        return round_load_fields(self.loadavg_start, [round(x, 2) for x in os.getloadavg()[:2]], foreign)


def round_load_fields(loadavg_start: List[float], loadavg_end: List[float], foreign_cores: Optional[float],
                      cores: Optional[int] = None) -> Dict[str, Any]:
    """``load``: ``loadavg_start``/``loadavg_end`` ([1 min, 5 min]), ``foreign_cpu_cores`` (cores other processes
    kept busy on average) and ``quiet`` (``foreign_cpu_cores <= QUIET_FOREIGN_CPU_SHARE x cores``; False when it
    could not be measured)."""
    cores = cores or os.cpu_count() or 1
    quiet = foreign_cores is not None and foreign_cores <= QUIET_FOREIGN_CPU_SHARE * cores
    return {"loadavg_start": loadavg_start, "loadavg_end": loadavg_end,
            "foreign_cpu_cores": None if foreign_cores is None else round(foreign_cores, 3), "quiet": quiet}


def child(name: str, preset: Preset, workdir: Path, env_extra: Optional[Dict[str, str]] = None,
          timeout: float = 1800) -> Dict[str, Any]:
    """Run job ``name`` in a new ``python -m benchmarks.train_throughput --job`` process (timeout in s) and return
    its JSON with ``wall_seconds`` and the round's ``load``; ``{"error": <its last stderr line>, ...}`` when it
    failed. The Keras recipes run in :func:`keras_python`'s environment."""
    env = dict(os.environ)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_DATASETS_CACHE": str(workdir / "datasets-cache"), "HF_HOME": str(workdir / "hf-home"),
                "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)})
    env.update(env_extra or {})
    result_path = workdir / f"{name}.json"
    python = sys.executable
    if name in KERAS_RECIPES:  # Keras 3 + JAX + transformers 5 live in another environment than TensorFlow's
        python = keras_python()
        env.setdefault("KERAS_BACKEND", "jax")
        if preset.cpu_devices > 1:
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={preset.cpu_devices}"
    cmd = [python, "-m", "benchmarks.train_throughput", "--preset", preset.name, "--job", name,
           "--workdir", str(workdir), "--steps", str(preset.steps),
           "--global_batch_size", str(preset.global_batch_size)]
    print(f"[bench] {name} ...", flush=True)
    start = time.perf_counter()
    round_load = RoundLoad()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    load = round_load.finish()
    (workdir / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not result_path.is_file():
        tail = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()][-1:] or ["no output"]
        print(f"[bench] {name} failed after {seconds:.0f}s: {tail[0][:300]}", flush=True)
        return {"error": tail[0][:500], "wall_seconds": seconds, "load": load}
    result = json.loads(result_path.read_text())
    result["wall_seconds"] = seconds
    result["load"] = load
    print(f"[bench] {name} done in {seconds:.0f}s (load {load['loadavg_start'][0]:.2f} -> {load['loadavg_end'][0]:.2f}, "
          f"others {load['foreign_cpu_cores'] if load['foreign_cpu_cores'] is not None else '?'} cores"
          f"{'' if load['quiet'] else ': NOT QUIET'})", flush=True)
    return result


def median_run(runs: List[Dict[str, Any]], key: str = "ms_per_step") -> Dict[str, Any]:
    """The successful run with the median ``key`` (a job's error when all failed), with the spread of all runs.

    The rounds run round-robin, so a slow spell of the shared machine hits every recipe; the median keeps
    one slow (or lucky) round from deciding a ratio. The result holds ``key`` = the median of the runs,
    ``runs_<key>`` (every run, in order), ``fastest_<key>``, ``spread_<key>`` = ``max / median - 1`` (how
    much the slowest round lost) and the median ``first_step_latency_seconds``.
    """
    import statistics

    ok = [r for r in runs if "error" not in r and r.get(key) is not None]
    if not ok:
        return runs[-1]
    values = [r[key] for r in ok]
    median = statistics.median(values)
    chosen = dict(min(ok, key=lambda r: (abs(r[key] - median), r[key])))
    chosen[key] = median
    chosen[f"runs_{key}"] = [round(v, 2) for v in values]
    chosen[f"fastest_{key}"] = round(min(values), 2)
    chosen[f"spread_{key}"] = round(max(values) / median - 1.0, 4)
    loads = [r.get("load") or {} for r in ok]
    chosen["runs_load"] = loads
    # process CPU ms per steady step of every round (the steadier figure on a shared host; None: not recorded)
    chosen["runs_cpu_ms_per_step"] = [None if r.get("cpu_ms_per_step") is None else round(r["cpu_ms_per_step"], 1)
                                      for r in ok]
    chosen["quiet_rounds"] = sum(1 for load in loads if load.get("quiet"))
    chosen["rounds"] = len(ok)
    latencies = [r["first_step_latency_seconds"] for r in ok if r.get("first_step_latency_seconds") is not None]
    if latencies:
        chosen["first_step_latency_seconds"] = statistics.median(latencies)
        chosen["runs_first_step_latency_seconds"] = [round(v, 2) for v in latencies]
    return chosen


def loopback_hub():
    """Start the loopback Hub of the test suite (``tests/loopback_hub.py``) with 200 ms per request.

    It stands in for a remote server, so its request threads run at nice 19: its own work (receiving and
    hashing each upload) then uses CPU the training process leaves idle instead of being counted as the
    callbacks' cost. The client side of every push (hashing, reading, sending) runs in the training process
    and is counted.
    """
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from loopback_hub import LoopbackHubServer

    server = LoopbackHubServer({BENCH_USER_TOKEN: {"name": "bench", "orgs": []}}, niceness=19)
    server.latency(HUB_LATENCY_SECONDS)
    return server


def _callbacks_push_round(preset: Preset, workdir: Path) -> Dict[str, Any]:
    """One ``callbacks_push`` round against a fresh loopback Hub; ``hub_commits``: the commits it received."""
    server = loopback_hub()
    try:
        run = child("callbacks_push", preset, workdir, env_extra={
            "HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0",
            "HF_TOKEN": BENCH_USER_TOKEN})
        run["hub_commits"] = len([r for r in server.requests if r.get("route") == "commit"])
        return run
    finally:
        server.close()


def run_parts(preset: Preset, skip: Set[str], repeats: int, workdir: Path) -> Optional[Dict[str, Dict[str, Any]]]:
    """Every part of a preset but those in ``skip``, each round in its own child process (:func:`child`).

    ``prepare_data`` first (the recipes use its tokenizer), then the tokenizing processes 1 and N, the probe and
    the pipeline, then ``repeats`` rounds of every recipe and callback run, round-robin, so a slow spell of the
    machine hits every recipe; each part's rounds are reduced by :func:`median_run`.

    Returns:
        job name -> its (median) result, or None when ``prepare_data`` failed (it prints why).
    """
    parts: Dict[str, Dict[str, Any]] = {"prepare_data": child("prepare_data", preset, workdir)}
    if "error" in parts["prepare_data"]:
        print("[bench] prepare-data failed; nothing else can run (the recipes use its tokenizer).")
        return None
    prep_runs: Dict[str, List[Dict[str, Any]]] = {}
    for _ in range(max(1, repeats)):  # tokenizing processes 1 and N, alternating
        for n in PREPARE_PROCS:
            if "prepare_data_np" not in skip:
                prep_runs.setdefault(f"prepare_data_np{n}", []).append(child(f"prepare_data_np{n}", preset, workdir))
    for name, name_runs in prep_runs.items():
        parts[name] = median_run(name_runs, "tokenize_seconds")
    for name in ("probe", "pipeline"):
        if name not in skip:
            parts[name] = child(name, preset, workdir)
    runs: Dict[str, List[Dict[str, Any]]] = {}
    for _ in range(max(1, repeats)):  # round-robin, so a slow spell of the machine hits every recipe
        for name in ALL_RECIPES:
            if name not in skip:
                runs.setdefault(name, []).append(child(name, preset, workdir))
        if "callbacks_none" not in skip:
            runs.setdefault("callbacks_none", []).append(child("callbacks_none", preset, workdir))
        if "callbacks_push" not in skip:
            runs.setdefault("callbacks_push", []).append(_callbacks_push_round(preset, workdir))
    for name, name_runs in runs.items():
        parts[name] = median_run(name_runs, "ms_per_step_mean" if name.startswith("callbacks_") else "ms_per_step")
    return parts
