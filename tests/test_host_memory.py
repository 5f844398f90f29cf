"""hf_tpu_ext.host_memory: a large block freed and allocated again by a worker thread stops page-faulting.

Each case runs in its own process (glibc's settings are process-wide and cannot be undone): a worker thread
allocates, touches and frees a 256 MiB block five times (what an XLA:CPU executor thread does with a step's
temporaries); the minor page faults of the last four rounds are counted.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BLOCK = 256 << 20

CHILD = textwrap.dedent("""
    import ctypes, json, resource, sys, threading
    from hf_tpu_ext.host_memory import keep_step_memory
    mode = sys.argv[1]
    tuned = None if mode == "default" else keep_step_memory(single_arena=(mode == "single_arena"))
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    faults = []

    def rounds():
        for i in range(5):
            if i == 1:
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
            block = libc.malloc(%d)
            ctypes.memset(block, 1, %d)
            libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)

    worker = threading.Thread(target=rounds)
    worker.start(); worker.join()
    print(json.dumps({"tuned": tuned, "faults_per_round": (faults[1] - faults[0]) / 4}))
""") % (BLOCK, BLOCK)


def _run(mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or "glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or ""),
                    reason="glibc's mallopt")
def test_a_worker_threads_block_stops_faulting_only_with_one_arena():
    pages = BLOCK // 4096
    default = _run("default")
    assert default["faults_per_round"] > 0.9 * pages  # mmap-ed and unmapped every round
    # without one arena the thread's own arena cannot hold 256 MiB: glibc mmaps it whatever M_MMAP_MAX says
    no_single = _run("mmap_off")
    assert no_single["tuned"] is True
    assert no_single["faults_per_round"] > 0.9 * pages
    single = _run("single_arena")
    assert single["tuned"] is True
    assert single["faults_per_round"] < 0.01 * pages  # the heap keeps the block between rounds


HEAP_CHILD = textwrap.dedent("""
    import ctypes, json
    from hf_tpu_ext.host_memory import heap_usage
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = heap_usage()
    blocks = [libc.malloc(1024) for _ in range(2048)]  # 2 MiB in blocks far below the mmap threshold
    during = heap_usage()
    for block in blocks:
        libc.free(block)
    print(json.dumps({"before": before, "during": during, "after": heap_usage()}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or "glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or ""),
                    reason="glibc's mallinfo2")
def test_heap_usage_counts_blocks_in_use_until_freed():
    # in a fresh process: mallinfo2 counts every thread's arena, and threads left by earlier tests in this one
    # (servers, pools) allocate and free while the blocks are counted
    proc = subprocess.run([sys.executable, "-c", HEAP_CHILD], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr
    usage = json.loads(proc.stdout)
    before, during, after = usage["before"], usage["during"], usage["after"]
    assert set(before) == {"in_use_bytes", "free_bytes", "mmapped_bytes"}
    grown = during["in_use_bytes"] - before["in_use_bytes"]
    assert 2048 * 1024 <= grown < 2048 * 1024 * 1.2  # each block and its 16-byte header, nothing hidden
    assert after["in_use_bytes"] - before["in_use_bytes"] < 0.1 * grown  # freed: no longer in use
