"""bf16 against float32 on one matmul-heavy layer, alternating rounds in one process (run by hand).

The layer is a transformer feed-forward block at the small preset's token count: ``x[4096, 256] @ W1[256, 1024]
-> gelu -> @ W2[1024, 256]``, forward and backward (gradients of both weights), float32 weights, the matmuls in
the run's dtype as Keras mixed precision does. Rounds alternate float32 and bf16 (5 calls each), so a busy spell
of a shared machine hits both; the ratio per round and the median are printed as JSON with the CPU's bf16 flags
and the load. The XLA paths read ``XLA_FLAGS`` (set per process: e.g. ``--xla_cpu_use_onednn=true
--xla_cpu_experimental_onednn_custom_call=true`` to let XLA:CPU call oneDNN matmuls where the CPU has
AVX512-BF16/AMX).

Usage (from the repository root):
    python -m benchmarks.bf16_layer xla 7        # TensorFlow: whole step in one XLA program
    python -m benchmarks.bf16_layer kernels 7    # TensorFlow's own (oneDNN) kernels
    python -m benchmarks.bf16_layer jax 7        # JAX (the Keras backend's compiler): jax.jit of the same step
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

TOKENS, HIDDEN, FFN = 4096, 256, 1024
#: two matmuls forward, x3 with the backward pass
FLOPS = 3 * 2 * 2 * TOKENS * HIDDEN * FFN


def tensorflow_steps(mode: str):
    """``{"float32": step, "bfloat16": step}``: TensorFlow, XLA (``mode="xla"``) or its own kernels."""
    import tensorflow as tf

    x = tf.random.stateless_normal((TOKENS, HIDDEN), seed=(1, 2))
    w1 = tf.Variable(tf.random.stateless_normal((HIDDEN, FFN), seed=(3, 4)) * 0.05)
    w2 = tf.Variable(tf.random.stateless_normal((FFN, HIDDEN), seed=(5, 6)) * 0.05)

    def make(dtype):
        @tf.function(jit_compile=mode == "xla")
        def step(inputs):
            with tf.GradientTape() as tape:
                h = tf.nn.gelu(tf.matmul(tf.cast(inputs, dtype), tf.cast(w1, dtype)))
                y = tf.matmul(h, tf.cast(w2, dtype))
                loss = tf.reduce_mean(tf.cast(y, tf.float32) ** 2)
            g1, g2 = tape.gradient(loss, [w1, w2])
            return loss + tf.reduce_sum(g1[:1, :1]) + tf.reduce_sum(g2[:1, :1])  # one scalar: the host wait syncs
        return lambda: step(x).numpy()

    return {"float32": make(tf.float32), "bfloat16": make(tf.bfloat16)}


def jax_steps():
    """``{"float32": step, "bfloat16": step}``: the same layer as one ``jax.jit`` program each."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (TOKENS, HIDDEN))
    w1 = jax.random.normal(keys[1], (HIDDEN, FFN)) * 0.05
    w2 = jax.random.normal(keys[2], (FFN, HIDDEN)) * 0.05

    def make(dtype):
        def loss(weights, inputs):
            a, b = weights
            h = jax.nn.gelu(inputs.astype(dtype) @ a.astype(dtype), approximate=False)
            return jnp.mean((h @ b.astype(dtype)).astype(jnp.float32) ** 2)

        @jax.jit
        def step(weights, inputs):
            value, (g1, g2) = jax.value_and_grad(loss)(weights, inputs)
            return value + g1[0, 0] + g2[0, 0]
        return lambda: float(step((w1, w2), x))

    return {"float32": make(jnp.float32), "bfloat16": make(jnp.bfloat16)}


def alternate(steps, rounds: int, calls: int = 5):
    """Seconds per call of each step, per round (rounds alternate the steps)."""
    for step in steps.values():  # compile and warm up
        step()
        step()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(calls):
                step()
            times[name].append((time.perf_counter() - start) / calls)
    return times


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv[0] if argv else "xla"
    if mode not in ("xla", "kernels", "jax"):
        print("usage: python -m benchmarks.bf16_layer {xla|kernels|jax} [ROUNDS]", file=sys.stderr)
        return 2
    rounds = int(argv[1]) if len(argv) > 1 else 5
    from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags

    load_start = os.getloadavg()
    times = alternate(jax_steps() if mode == "jax" else tensorflow_steps(mode), rounds)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(json.dumps({
        "mode": mode, "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cpu_bf16_flags": sorted(cpu_flags() & NATIVE_BF16_CPU_FLAGS),
        "load_average_start": [round(v, 2) for v in load_start],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "ms": {name: round(v * 1e3, 1) for name, v in median.items()},
        "gflop_per_s": {name: round(FLOPS / v / 1e9, 1) for name, v in median.items()},
        "bf16_speedup_median": round(median["float32"] / median["bfloat16"], 3),
        "bf16_speedup_per_round": [round(a / b, 3) for a, b in zip(times["float32"], times["bfloat16"])],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
