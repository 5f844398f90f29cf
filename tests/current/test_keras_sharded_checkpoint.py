"""Sharded checkpoints of the Keras backend (issue 50 item 2): arrays of any sharding saved by the processes that
hold them (backends/keras/sharded_state.py, checkpoint.save_checkpoint) and restored onto another device count or
mesh, values exact.

Each case runs in subprocesses with simulated CPU devices (``JAX_NUM_CPU_DEVICES``): 4 devices sharded -> 2 devices
sharded, 1 x 4 replicated and a 2 x 2 mesh; 2 processes x 2 devices writing one checkpoint concurrently (each its own
file) -> 1 process; a process killed (SIGKILL) after its files of the next save leaves the previous checkpoint the
newest and its temporary folder removable. Runs in the current-releases venv (``tests/current``).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("safetensors")

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

#: the arrays every case saves: name -> (shape, dtype, partition spec over a 1-D mesh axis "x")
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import jax
    if os.environ.get("COORDINATOR"):
        jax.distributed.initialize(os.environ["COORDINATOR"], 2, int(os.environ["PROCESS"]))
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from hf_tpu_ext.backends.keras import checkpoint as ckpt

    SPECS = {"dense/kernel": ((8, 6), "float32", P("x")), "dense/bias": ((6,), "float32", P()),
             "embeddings": ((12, 4), "float32", P(None, "x")), "seed": ((2,), "uint32", P()),
             "iterations": ((), "int32", P())}

    def value(name):
        shape, dtype, _ = SPECS[name]
        return (np.arange(int(np.prod(shape)), dtype=np.float64) * 1.5 + len(name)).astype(dtype).reshape(shape)

    def arrays(mesh, replicated=False):
        out = {}
        for name, (shape, dtype, spec) in SPECS.items():
            sharding = NamedSharding(mesh, P() if replicated else spec)
            out[name] = jax.make_array_from_callback(shape, sharding, lambda i, n=name: value(n)[i])
        return out

    def restored(folder, mesh, replicated=False):
        targets = {n: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
                   for n, a in arrays(mesh, replicated).items()}
        out = ckpt.restore_state(folder, targets, "model_state")
        ok = all(np.array_equal(np.asarray(jax.device_get(out[n])) if out[n].is_fully_addressable else
                                np.concatenate([np.asarray(s.data).ravel() for s in out[n].addressable_shards]),
                                value(n) if out[n].is_fully_addressable else
                                np.concatenate([value(n)[s.index].ravel() for s in out[n].addressable_shards]))
                 and out[n].dtype == np.dtype(SPECS[n][1]) and out[n].sharding == targets[n].sharding for n in SPECS)
        return ok, [len(out[n].sharding.device_set) for n in SPECS]

    mode, folder = sys.argv[1], sys.argv[2]
    devices = np.array(jax.devices())
    flat = Mesh(devices, ("x",))
    result = {"devices": len(devices), "processes": jax.process_count()}
    if mode == "save":
        if sys.argv[3] == "2" and jax.process_index() == 1:  # the second save: this process dies after writing
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices = lambda name: os.kill(os.getpid(), 9)
        path = ckpt.save_checkpoint(folder, int(sys.argv[3]), arrays(flat), {}, {"note": "test"})
        result["path"] = path and os.path.basename(path)
    elif mode == "restore":
        path = os.path.join(folder, "checkpoint-1")
        result["sharded"] = restored(path, flat)
        result["replicated"] = restored(path, flat, replicated=True)
        if len(devices) == 4:
            result["grid"] = restored(path, Mesh(devices.reshape(2, 2), ("x", "y")))
        whole = ckpt.restore_state(path, {n: jax.ShapeDtypeStruct(SPECS[n][0], SPECS[n][1]) for n in SPECS},
                                   "model_state")  # no sharding: NumPy, read whole
        result["numpy"] = all(isinstance(whole[n], np.ndarray) and np.array_equal(whole[n], value(n)) for n in SPECS)
    print("RESULT" + json.dumps(result), flush=True)
""")


def _env(devices, **extra):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    for key in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(key, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(devices, *argv):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, argv)], env=_env(devices), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


def _cluster(folder, step):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [subprocess.Popen([sys.executable, "-c", SCRIPT, "save", str(folder), str(step)],
                             env=_env(2, COORDINATOR=f"127.0.0.1:{port}", PROCESS=i), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for i in range(2)]


def _pieces(file):
    from safetensors import safe_open

    with safe_open(str(file), framework="numpy") as f:
        return sorted(f.keys()), json.loads((f.metadata() or {}).get("pieces", "{}"))


def test_four_devices_sharded_restore_onto_two_devices_replicated_and_a_grid(tmp_path):
    assert _run(4, "save", tmp_path, 1)["path"] == "checkpoint-1"
    folder = tmp_path / "checkpoint-1"
    # one process: one model file (no optimizer state given: an empty file), each block of replica 0 once
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.json", "model_state.safetensors",
                                                       "optimizer_state.safetensors"]
    keys, pieces = _pieces(folder / "model_state.safetensors")
    assert keys == ["dense/bias", "dense/kernel@0:2,0:6", "dense/kernel@2:4,0:6", "dense/kernel@4:6,0:6",
                    "dense/kernel@6:8,0:6", "embeddings@0:12,0:1", "embeddings@0:12,1:2", "embeddings@0:12,2:3",
                    "embeddings@0:12,3:4", "iterations", "seed"]
    assert pieces["dense/kernel@2:4,0:6"] == {"name": "dense/kernel", "shape": [8, 6], "index": [[2, 4], [0, 6]]}
    assert json.loads((folder / "checkpoint.json").read_text())["state_files"] == ["model_state.safetensors",
                                                                              "optimizer_state.safetensors"]
    four = _run(4, "restore", tmp_path)
    assert four["sharded"] == [True, [4, 4, 4, 4, 4]]
    assert four["replicated"][0] is four["grid"][0] is four["numpy"] is True
    two = _run(2, "restore", tmp_path)
    assert (two["devices"], two["sharded"], two["replicated"][0], two["numpy"]) == (2, [True, [2, 2, 2, 2, 2]],
                                                                                    True, True)


def test_a_missing_block_is_named_before_any_read(tmp_path):
    from hf_tpu_ext.backends.keras import sharded_state
    from hf_tpu_ext.errors import CheckpointError
    from safetensors.numpy import save_file

    piece = {"name": "w", "shape": [4, 2], "index": [[0, 2], [0, 2]]}
    save_file({"w@0:2,0:2": np.ones((2, 2), np.float32)}, str(tmp_path / "model_state.safetensors"),
              metadata={"pieces": json.dumps({"w@0:2,0:2": piece})})
    with pytest.raises(CheckpointError) as err:
        sharded_state.state_shapes(str(tmp_path), "model_state")
    assert str(err.value) == (f"Checkpoint {tmp_path} holds 4 of the 8 values of w in 1 model_state file(s): a "
                              "process's file is missing (a state sharded over processes needs one --output_dir "
                              "every process sees).")


def test_two_processes_write_their_blocks_and_a_kill_leaves_the_last_checkpoint(tmp_path):
    from hf_tpu_ext.backends.keras.checkpoint import find_checkpoints, remove_incomplete

    procs = _cluster(tmp_path, 1)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    assert [json.loads(o.split("RESULT", 1)[1])["path"] for o, _ in outs] == ["checkpoint-1", None]
    folder = tmp_path / "checkpoint-1"
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.json", "model_state-00001.safetensors",
                                                       "model_state.safetensors", "optimizer_state.safetensors"]
    # each process wrote the blocks of its own devices (0, 1 | 2, 3); replicated arrays: process 0 whole
    assert _pieces(folder / "model_state-00001.safetensors")[0] == [
        "dense/kernel@4:6,0:6", "dense/kernel@6:8,0:6", "embeddings@0:12,2:3", "embeddings@0:12,3:4"]
    # the next save: process 1 dies (SIGKILL) right after writing its files, before the barrier; process 0's
    # barrier fails (its torn folder removed) or waits (killed here: the lost-process watch's job in a run)
    procs = _cluster(tmp_path, 2)
    assert procs[1].wait(timeout=300) == -signal.SIGKILL
    try:
        assert procs[0].wait(timeout=30) != 0
    except subprocess.TimeoutExpired:
        procs[0].kill()
        procs[0].wait(timeout=60)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if not n.startswith(".checkpoint-2.tmp-")] == ["checkpoint-1"], names
    assert find_checkpoints(str(tmp_path)) == [str(folder)]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 1}))  # the run writes it after the save
    remove_incomplete(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    restored = _run(1, "restore", tmp_path)
    assert (restored["sharded"], restored["numpy"]) == ([True, [1, 1, 1, 1, 1]], True)


def test_a_run_killed_on_four_devices_resumes_on_two_with_the_same_losses(tmp_path):
    """hf-tpu train on 1 x 4 devices, SIGKILLed at step 5 after checkpoint-3, resumed on 1 x 2 devices (the same
    global batch: 4 rows per device): the losses of the uninterrupted 1 x 4 run (the data position and dropout
    follow the global step, not the devices)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_keras_multiprocess import STEPS, _losses, _start, finish, mp_args

    every3 = ("--save_steps", "3")
    one = _start(mp_args(tmp_path / "one"), JAX_NUM_CPU_DEVICES=4)
    killed = _start(mp_args(tmp_path / "cut", *every3), JAX_NUM_CPU_DEVICES=4, HF_TPU_EXT_TEST_KILL_AT="train_step@5")
    (rc_one, err_one), (rc_cut, _) = finish([one, killed])
    assert (rc_one, rc_cut) == (0, -9), err_one[-3000:]
    assert sorted(p.name for p in (tmp_path / "cut").glob("checkpoint-*")) == ["checkpoint-3"]
    [(rc, err)] = finish([_start(mp_args(tmp_path / "cut", *every3, "--per_device_train_batch_size", "4",
                                         "--resume_from_checkpoint", "true"), JAX_NUM_CPU_DEVICES=2)])
    assert rc == 0, err[-3000:]
    assert "2 cpu device(s) in 1 process(es)" in err and "checkpoint-3 at global step 3" in err
    ours, ref = _losses(tmp_path / "cut"), _losses(tmp_path / "one")
    assert [s for s, _ in ours] == list(range(1, STEPS + 1)) == [s for s, _ in ref]
    np.testing.assert_allclose([l for _, l in ours], [l for _, l in ref], atol=1e-5, rtol=0)
