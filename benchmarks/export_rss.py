"""Peak host memory of the Keras backend's transformers export: tensor by tensor vs the whole state gathered.

One fresh process per way (``ru_maxrss`` is a process's peak): a RoBERTa masked LM of the given size, random, its
train state (weights, dropout seeds, AdamW's two moments) as ``jax.Array``s on ``--devices`` CPU devices, the
weights sharded on their first dimension where the device count divides it; then the export into a folder:

* ``gathered`` (before issue 50 item 3): the whole state copied to the host at once (``jax.device_get``: weights
  and both moments), assigned to the variables, the state dict made whole, ``safetensors.numpy.save_file``;
* ``by_tensor``: as ``KerasBackend.export``: the variables bound to the state's arrays
  (:func:`hf_tpu_ext.backends.keras.tensor_files.bound_variables`, no copy) and
  :func:`hf_tpu_ext.backends.keras.export.export_masked_lm` (a lazy state dict: each tensor gathered, written and
  dropped in turn).

Printed (JSON): the model's float32 bytes and, per way, the peak RSS above the RSS just before the export (MiB).
A benchmark, not a test (``tests/current/test_keras_export_sharded.py`` checks a small size); run it alone.
Measured (round 18, 2 shared CPU cores with AVX-512/AMX, load 12-15, 4 simulated devices): the default base size
(475.7 MiB of weights): gathered 1,837 MiB above the RSS before the export, by tensor 156 MiB (the 147 MiB
embedding); hidden 256 x 4 layers, vocab 16384 (28.9 MiB): 150.4 MiB vs 16.8 MiB.

Usage (from the repository root, in the [jax] venv):
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.export_rss [--hidden 768 --layers 12 --vocab 50265]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _state(model, optimizer, devices: int):
    """The train state as the trainer holds it: jax.Arrays, weights sharded on dimension 0 where ``devices``
    divides it (what --fsdp gives; replicated otherwise)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))

    def put(values):
        out = []
        for v in values:
            value = np.asarray(v.value)
            spec = P("x") if value.ndim and value.shape[0] % devices == 0 else P()
            out.append(jax.device_put(value, NamedSharding(mesh, spec)))
        return out

    return put(model.trainable_variables), put(model.non_trainable_variables), put(optimizer.variables)


def measure(way: str, hidden: int, layers: int, vocab: int, devices: int) -> dict:
    """One export, this process: ``{"model_mib", "peak_above_mib", "seconds"}``."""
    import time

    import keras
    import numpy as np
    from transformers import RobertaConfig

    import jax
    from safetensors.numpy import save_file

    from hf_tpu_ext.backends.keras.architectures import architecture_for
    from hf_tpu_ext.backends.keras.export import export_masked_lm
    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.tensor_files import bound_variables

    config = RobertaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                           max_position_embeddings=514)
    model = build_masked_lm(config, seed=0)
    optimizer = keras.optimizers.AdamW(1e-4)
    optimizer.build(model.trainable_variables)
    state = _state(model, optimizer, devices)
    model_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    variables = [*model.trainable_variables, *model.non_trainable_variables]
    folder = tempfile.mkdtemp(prefix="export-rss-")
    # both ways' code imported first (transformers' config classes, safetensors): modules are not the export's
    small = RobertaConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                          intermediate_size=16, max_position_embeddings=20)
    export_masked_lm(build_masked_lm(small, seed=0), tempfile.mkdtemp(prefix="export-rss-warm-"), config=small,
                     keras_preset=False)
    rss_now = _reset_peak()
    start = time.perf_counter()
    if way == "gathered":
        host = [[np.asarray(x) for x in jax.device_get(part)] for part in state]  # the whole state, at once
        for var, value in zip(variables, [*host[0], *host[1]]):
            var.assign(value)
        whole = dict(architecture_for(config).state_dict(model, config))
        save_file(whole, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    else:  # what KerasBackend.export does
        with bound_variables(variables, [*state[0], *state[1]]):
            export_masked_lm(model, folder, config=config, keras_preset=False)
    seconds = time.perf_counter() - start
    return {"model_mib": round(model_bytes / 2**20, 1), "peak_above_mib": round((_status_kib("VmHWM") - rss_now) / 1024, 1),
            "seconds": round(seconds, 2)}


def _status_kib(field: str) -> int:
    """``VmRSS``/``VmHWM`` of this process (KiB, /proc/self/status; ``ru_maxrss`` where /proc is absent)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak() -> int:
    """The peak RSS reset to the RSS now (Linux: ``5`` into /proc/self/clear_refs), which is returned (KiB): the
    model's build and the state's placement before the export do not count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kib("VmRSS")


def run(hidden: int, layers: int, vocab: int, devices: int) -> dict:
    """Both ways, one fresh process each: ``{"gathered": {...}, "by_tensor": {...}}``."""
    out = {}
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)
    for way in ("gathered", "by_tensor"):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.export_rss", "--way", way, "--hidden", str(hidden),
                               "--layers", str(layers), "--vocab", str(vocab), "--devices", str(devices)],
                              env=env, capture_output=True, text=True, cwd=str(REPO_ROOT), timeout=1200)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        out[way] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50265)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--way", choices=("gathered", "by_tensor"), default=None, help="one way, this process")
    args = parser.parse_args(argv)
    if args.way:
        print(json.dumps(measure(args.way, args.hidden, args.layers, args.vocab, args.devices)))
    else:
        print(json.dumps(run(args.hidden, args.layers, args.vocab, args.devices), indent=2))


if __name__ == "__main__":
    main()
