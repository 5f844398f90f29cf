"""Peak host memory of a checkpoint save and the transformers export of a state sharded over *processes*, on each
process: the whole state gathered by every process (before) vs the blocks written one at a time and process 0
reading each weight from them (now).

Two processes joined by ``jax.distributed`` on one machine (gloo), ``--devices`` CPU devices each; a RoBERTa masked
LM of the given size, random, its train state (weights, dropout seeds, AdamW's two moments) sharded on dimension 0
over all the devices where their count divides it (what ``--fsdp full_shard`` gives: no process holds a whole
weight). One fresh pair of processes per way (``ru_maxrss`` is a process's peak), each measuring above the RSS just
before the save:

* ``gathered`` (before this change): every process gathers the whole state (``process_allgather``: weights and both
  moments) into the model's variables, writes its blocks (all of them on the host at once, ``save_file``), and
  process 0 exports from the variables;
* ``by_tensor``: :func:`hf_tpu_ext.backends.keras.checkpoint.save_checkpoint` (each block copied, written and dropped
  in turn) and process 0's export through :func:`hf_tpu_ext.backends.keras.tensor_files.bound_to_checkpoint` (each
  weight read from the blocks of that checkpoint); then the best-weights file as ``keep_best`` writes it
  (:func:`~hf_tpu_ext.backends.keras.tensor_files.gathered_in_turn`: one collective gather per weight), checked
  against the export.

Printed (JSON): per way, per process, the peak above the RSS before (MiB), the model's and the state's float32 MiB;
``same_export``: the two ways' ``model.safetensors`` byte-equal. A benchmark; ``tests/current/
test_keras_export_processes.py`` runs it at a small size. Run it alone.

Measured (round 19, 2 shared CPU cores with AVX-512/AMX, load 12-13 from other runs, 2 processes x 2 CPU devices),
peak RSS above the level before the save, process 0 / process 1: base size (475.7 MiB of weights, 1,427 MiB of
state) gathered 1,718 / 1,337 MiB, by tensor 152 / 4.7 MiB (process 0: the 147 MiB embedding); hidden 256 x 4 layers,
vocab 16384 (28.9 MiB): 135.8 / 134.5 vs 6.5 / 2.8 MiB (freed heap reused: below the 16 MiB embedding). With
safetensors' mapped reads and ``convert_to_numpy``'s copy, process 0 held the embedding three times (447 MiB at base
size): the reader now reads each block straight into the array. Both ways export the same bytes.

Usage (from the repository root, in the [jax] venv):
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.export_rss_processes [--hidden 768 --layers 12]
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

from benchmarks.export_rss import REPO_ROOT, _reset_peak, _status_kib


def _sharded_state(model, optimizer):
    """The state as ``--fsdp`` over every process holds it: each array sharded on dimension 0 over all devices where
    their count divides it, else replicated (``make_array_from_callback``: each process puts its blocks only)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    count = len(jax.devices())

    def put(values):
        out = []
        for v in values:
            value = np.asarray(v.value)
            spec = P("x") if value.ndim and value.shape[0] % count == 0 else P()
            out.append(jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda i, a=value: a[i]))
        return out

    return put(model.trainable_variables), put(model.non_trainable_variables), put(optimizer.variables)


def _old_save_tensors(path, tensors, metadata):
    """The writer before this change: every block of the process on the host at once, then ``save_file``."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({k: np.array(v, order="C") for k, v in tensors.items()}, path, metadata=metadata)


def _model(hidden: int, layers: int, vocab: int):
    import keras
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras.model import build_masked_lm

    config = RobertaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                           max_position_embeddings=514)
    keras.utils.set_random_seed(0)  # both processes build the same weights
    model = build_masked_lm(config, seed=0)
    optimizer = keras.optimizers.AdamW(1e-4)
    optimizer.build(model.trainable_variables)
    return config, model, optimizer


def measure(way: str, hidden: int, layers: int, vocab: int, folder: str) -> dict:
    """One way on this process (``jax.distributed`` already joined): its figures (module doc)."""
    import jax
    import numpy as np

    from hf_tpu_ext.backends.keras import checkpoint as ckpt
    from hf_tpu_ext.backends.keras.export import export_masked_lm
    from hf_tpu_ext.backends.keras.sharded_state import whole_reader
    from hf_tpu_ext.backends.keras.step import state_to_host
    from hf_tpu_ext.backends.keras.tensor_files import bound_to_checkpoint, drain, gathered_in_turn

    config, model, optimizer = _model(hidden, layers, vocab)
    state = _sharded_state(model, optimizer)
    variables = [*model.trainable_variables, *model.non_trainable_variables]
    model_vars = dict(zip([v.path for v in model.trainable_variables], state[0]))
    model_vars.update({f"non_trainable/{i:05d}": a for i, a in enumerate(state[1])})
    opt_vars = {f"{i:05d}/{v.path}": a for i, (v, a) in enumerate(zip(optimizer.variables, state[2]))}
    chief = jax.process_index() == 0
    export_masked_lm(model, tempfile.mkdtemp(prefix="export-rss-warm-"), config=config, keras_preset=False)
    rss_now = _reset_peak()
    start = time.perf_counter()
    out_dir = os.path.join(folder, way)
    if way == "gathered":
        host = state_to_host(state)  # the whole state on every process
        for var, value in zip(variables, [*host[0], *host[1]]):
            var.assign(value)
        ckpt._save_tensors = _old_save_tensors
        ckpt.save_checkpoint(out_dir, 1, model_vars, opt_vars, {})
        if chief:
            export_masked_lm(model, out_dir, config=config, keras_preset=False)
    else:
        path = ckpt.save_checkpoint(out_dir, 1, model_vars, opt_vars, {})
        if chief:
            with bound_to_checkpoint(variables, [*state[0], *state[1]], path, list(model_vars), ckpt.MODEL_STEM):
                export_masked_lm(model, out_dir, config=config, keras_preset=False)
    seconds = time.perf_counter() - start
    peak = (_status_kib("VmHWM") - rss_now) / 1024
    result = {"process": jax.process_index(), "peak_above_mib": round(peak, 1), "seconds": round(seconds, 2),
              "model_mib": round(sum(a.size for a in state[0]) * 4 / 2**20, 1),
              "state_mib": round(sum(a.size * a.dtype.itemsize for p in state for a in p) / 2**20, 1)}
    if way == "by_tensor":  # keep_best's write: one collective gather per weight, in the writer's order
        weights = gathered_in_turn({v.path: a for v, a in zip(model.trainable_variables, state[0])})
        if chief:
            ckpt.save_best(out_dir, 1, "eval_loss", 1.0, weights)
            best = ckpt.read_best(out_dir)["weights"]
            read = whole_reader(path, ckpt.MODEL_STEM)
            result["best_equal"] = all(np.array_equal(best[k], read(k)) for k in best)
        else:
            drain(weights)
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(hidden: int, layers: int, vocab: int, devices: int = 2, processes: int = 2) -> dict:
    """Both ways, a fresh pair of processes each: ``{"gathered": [per process], "by_tensor": [...],
    "same_export": bool}``."""
    out = {}
    folder = tempfile.mkdtemp(prefix="export-rss-processes-")
    for way in ("gathered", "by_tensor"):
        port = _free_port()
        procs = []
        for i in range(processes):
            env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices),
                       PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
            env.pop("XLA_FLAGS", None)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.export_rss_processes", "--way", way, "--hidden", str(hidden),
                 "--layers", str(layers), "--vocab", str(vocab), "--folder", folder, "--coordinator",
                 f"127.0.0.1:{port}", "--processes", str(processes), "--process_id", str(i)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO_ROOT)))
        results = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=1200)
            if p.returncode != 0:
                raise RuntimeError(stderr[-3000:])
            results.append(json.loads(stdout.split("RESULT", 1)[1].splitlines()[0]))
        out[way] = sorted(results, key=lambda r: r["process"])
    files = [os.path.join(folder, way, "model.safetensors") for way in ("gathered", "by_tensor")]
    with open(files[0], "rb") as a, open(files[1], "rb") as b:
        out["same_export"] = a.read() == b.read()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50265)
    parser.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    parser.add_argument("--way", choices=("gathered", "by_tensor"), default=None, help="one way, this process")
    parser.add_argument("--folder", default=None)
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--process_id", type=int, default=0)
    args = parser.parse_args(argv)
    if args.way:
        import jax

        jax.distributed.initialize(args.coordinator, num_processes=args.processes, process_id=args.process_id)
        result = measure(args.way, args.hidden, args.layers, args.vocab, args.folder)
        print("RESULT" + json.dumps(result), flush=True)
    else:
        print(json.dumps(run(args.hidden, args.layers, args.vocab, args.devices, args.processes), indent=2))


if __name__ == "__main__":
    main()
