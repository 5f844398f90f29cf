"""``benchmarks/compiled_memory.py``'s ``fsdp`` mode is the trainer's ``--fsdp full_shard`` state: for a tiny BERT
on 4 CPU devices each state variable's sharding equals what ``Placement.put_state`` (the backend's rules table,
``sharding.plan_state``) gives a real built model, and the compiled step's state per device is the bytes those
placed arrays hold. A fresh process: the CPU device count is read once, when XLA starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("transformers")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import json
from benchmarks.compiled_memory import compiled_memory, model_config, set_cpu_devices, step_state
set_cpu_devices(4)
import keras
from hf_tpu_ext.backends.keras.model import build_masked_lm
from hf_tpu_ext.backends.keras.placement import Placement
from hf_tpu_ext.backends.keras.sharding import held_bytes

config = model_config("bert", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=32)
_, _, bench_placement, bench = step_state(config, "fsdp")
model = build_masked_lm(config, dtype="mixed_bfloat16", seed=0)
optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01, global_clipnorm=1.0)
optimizer.build(model.trainable_variables)
placement = Placement(fsdp="full_shard")
placed = placement.put_state(model.trainable_variables, model.non_trainable_variables, optimizer.variables,
                             config=config)
figures = compiled_memory(config, "fsdp", per_device_batch=2, seq=16)
print(json.dumps({
    "bench": [[[list(s.shape), str(s.dtype), list(s.sharding.spec)] for s in part] for part in bench],
    "backend": [[[list(a.shape), str(a.dtype), list(a.sharding.spec)] for a in part] for part in placed],
    "mesh": [dict(bench_placement.mesh.shape), dict(placement.mesh.shape)],
    "plans": [bench_placement.plan.trainable == placement.plan.trainable,
              bench_placement.plan.optimizer == placement.plan.optimizer],
    "state_bytes": [figures["state_bytes"], held_bytes([a for part in placed for a in part]),
                    sum(a.size * a.dtype.itemsize for part in placed for a in part)],
    "devices": figures["devices"]}))
"""


def test_fsdp_mode_is_the_backends_full_shard_plan():
    env = dict(os.environ, PYTHONPATH=str(REPO), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["bench"] == got["backend"]
    trainable = got["backend"][0]
    assert len(trainable) > 20
    word_embeddings = max(trainable, key=lambda t: t[0][0] * (t[0][1] if len(t[0]) > 1 else 1))
    assert word_embeddings[:2] == [[100, 32], "float32"]
    assert word_embeddings[2] == ["fsdp", None]  # vocab 100 = 4 x 25, the larger dimension
    assert all("fsdp" in spec for _, _, spec in trainable)  # full_shard: every weight (32, 64, 100, 2 x 16)
    assert got["mesh"] == [{"data": 1, "fsdp": 4}, {"data": 1, "fsdp": 4}] and got["plans"] == [True, True]
    bench_bytes, held, whole = got["state_bytes"]
    assert got["devices"] == 4 and bench_bytes == held
    assert whole / 4 <= held < whole / 4 + 64  # a quarter of the state; the step count and learning rate whole
