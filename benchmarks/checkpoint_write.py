"""Seconds to write and restore a Keras-backend checkpoint of a RoBERTa train state (weights, dropout seeds, AdamW's
two moments), sharded on dimension 0 over ``--devices`` CPU devices where the count divides it, or replicated.

``save_checkpoint`` (each block written once by the process holding its first replica) and ``restore_state`` onto
the other layout (sharded -> replicated, replicated -> sharded); the folder's bytes beside. One process; printed
as JSON. A benchmark, not a test; run it alone (the figures follow the disk and the load).

Usage (from the repository root, in the [jax] venv):
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=4 python -m benchmarks.checkpoint_write [--hidden 768]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=16384)
    args = parser.parse_args(argv)
    import jax
    import keras
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from transformers import RobertaConfig

    from hf_tpu_ext.backends.keras import checkpoint as ckpt
    from hf_tpu_ext.backends.keras.model import build_masked_lm

    config = RobertaConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                           num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
                           max_position_embeddings=514)
    model = build_masked_lm(config, seed=0)
    optimizer = keras.optimizers.AdamW(1e-4)
    optimizer.build(model.trainable_variables)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = len(jax.devices())
    out = {"devices": n}
    for layout in ("sharded", "replicated"):
        def spec(shape):
            return P("x") if layout == "sharded" and shape and shape[0] % n == 0 else P()

        named = {f"{i:05d}/{v.path}": jax.device_put(np.asarray(v.value), NamedSharding(mesh, spec(tuple(v.shape))))
                 for i, v in enumerate([*model.trainable_variables, *optimizer.variables])}
        folder = tempfile.mkdtemp(prefix="checkpoint-write-")
        start = time.perf_counter()
        path = ckpt.save_checkpoint(folder, 1, named, {}, {})
        write = time.perf_counter() - start
        other = {k: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(
            mesh, P() if layout == "sharded" else spec(tuple(a.shape)))) for k, a in named.items()}
        start = time.perf_counter()
        restored = ckpt.restore_state(path, other, ckpt.MODEL_STEM)
        jax.block_until_ready(list(restored.values()))
        read = time.perf_counter() - start
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        out[layout] = {"write_seconds": round(write, 3), "restore_other_layout_seconds": round(read, 3),
                       "mib": round(size / 2**20, 1)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
