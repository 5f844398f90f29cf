"""The Keras backend's export of a sharded train state (issue 50 item 3): the weights moved to the model one at a time
(tensor_files.variables_from_arrays), the state dict made lazily (architectures/lazy_state.py) and
``model.safetensors`` written one tensor at a time (tensor_files.write_safetensors): transformers' logits equal the
Keras model's, the file's bytes equal safetensors' own writer's, and the export's peak RSS stays below gathering the
whole state by more than the model's size (benchmarks/export_rss.py at a small size; its default is base-sized).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax, torch, transformers
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from safetensors.numpy import save_file
    from hf_tpu_ext.backends.keras.architectures import architecture_for
    from hf_tpu_ext.backends.keras.export import export_masked_lm
    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.tensor_files import bound_variables

    folder, model_type = sys.argv[1], sys.argv[2]
    config = transformers.AutoConfig.for_model(model_type, vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=64,
                                               max_position_embeddings=40, hidden_dropout_prob=0.0,
                                               attention_probs_dropout_prob=0.0,
                                               **({"pad_token_id": 0} if model_type == "modernbert" else {}))
    model = build_masked_lm(config, seed=0)
    rng = np.random.default_rng(1)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    arrays, sharded = [], 0
    for v in model.trainable_variables:  # random weights, sharded on dimension 0 where 4 divides it
        value = rng.normal(0, 0.2, size=tuple(v.shape)).astype("float32") + (1.0 if v.path.endswith(("gamma", "scale")) else 0.0)
        spec = P("x") if value.ndim and value.shape[0] % 4 == 0 else P()
        sharded += spec != P()
        arrays.append(jax.device_put(value, NamedSharding(mesh, spec)))
        v.assign(value)
    ids = rng.integers(5, 128, size=(2, 16)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    positions = np.tile(np.arange(16, dtype="int32"), (2, 1))
    keras_logits = np.asarray(model({"token_ids": ids, "padding_mask": mask, "mask_positions": positions},
                                    training=False), dtype="float32")
    for v in model.trainable_variables:  # the export must read the state's arrays, not what the variables hold
        v.assign(np.zeros(v.shape, "float32"))
    with bound_variables(model.trainable_variables, arrays):
        export_masked_lm(model, folder, config=config, keras_preset=False)
        state = architecture_for(config).state_dict(model, config)
        save_file(dict(state), folder + "/whole.safetensors", metadata={"format": "pt"})
    zeros_again = all(not np.asarray(v.value).any() for v in model.trainable_variables)
    same = open(folder + "/whole.safetensors", "rb").read() == open(folder + "/model.safetensors", "rb").read()
    hf = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        torch_logits = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    diff = float(np.abs(torch_logits - keras_logits)[mask.astype(bool)].max())
    print("RESULT" + json.dumps({"diff": diff, "same_bytes": same, "sharded": int(sharded),
                                 "lazy": type(state).__name__, "devices": jax.device_count(),
                                 "zeros_again": zeros_again}))
""")


def _env(devices):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)
    return env


@pytest.mark.parametrize("model_type", ["roberta", "modernbert"])
def test_export_of_a_sharded_state_gives_transformers_the_keras_logits(tmp_path, model_type):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "model"), model_type], env=_env(4),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert (result["devices"], result["lazy"], result["same_bytes"], result["zeros_again"]) == (4, "LazyState", True,
                                                                                               True)
    assert result["sharded"] >= 8  # embeddings and kernels really sharded over the 4 devices
    assert result["diff"] <= 1e-4, result


def test_export_peak_rss_is_below_gathering_the_whole_state_by_the_model(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from benchmarks.export_rss import run

    figures = run(hidden=256, layers=4, vocab=16384, devices=4)
    model, gathered, by_tensor = (figures["gathered"]["model_mib"], figures["gathered"]["peak_above_mib"],
                                  figures["by_tensor"]["peak_above_mib"])
    assert 25 < model < 35, figures
    assert by_tensor + model < gathered, figures
    assert by_tensor < model, figures  # below one copy of the model: a tensor at a time (the embedding: 16 MiB)


SLICES_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from safetensors import safe_open
    from safetensors.numpy import save_file
    from hf_tpu_ext.backends.keras.architectures import layouts
    from hf_tpu_ext.backends.keras.hf_convert import sharded_weight

    # Keras shapes of each layout kind: hidden 8, 4 heads of 2 features
    SHAPES = {layouts.SAME: (12, 8), layouts.LINEAR: (8, 16), layouts.QKV_KERNEL: (8, 4, 2),
              layouts.QKV_BIAS: (4, 2), layouts.OUT_KERNEL: (4, 2, 8)}
    rng = np.random.default_rng(0)
    keras_values = {k: rng.normal(size=s).astype("float32") for k, s in SHAPES.items()}
    file = sys.argv[1]
    save_file({k: np.ascontiguousarray(layouts.to_hf(k, v)) for k, v in keras_values.items()}, file)
    devices = np.array(jax.devices())
    meshes = {"flat": Mesh(devices, ("x",)), "grid": Mesh(devices.reshape(2, 2), ("x", "y"))}
    checked = []
    with safe_open(file, framework="numpy") as f:
        for kind, shape in SHAPES.items():
            specs = [("flat", P()), ("flat", P("x"))] + [("grid", P(*(["x", "y", None][: len(shape)])))]
            if len(shape) == 3:
                specs += [("flat", P(None, "x")), ("grid", P(None, "y", "x")), ("grid", P("y", None, "x"))]
            for mesh, spec in specs:
                if any(a is not None and shape[i] % meshes[mesh].shape[a] for i, a in enumerate(spec)):
                    continue
                out = sharded_weight(f.get_slice(kind), kind, shape, NamedSharding(meshes[mesh], spec))
                checked.append([kind, mesh, str(spec), bool(np.array_equal(np.asarray(out), keras_values[kind])),
                                len({tuple((s.start, s.stop) for s in sh.index) for sh in out.addressable_shards})])
    print("RESULT" + json.dumps(checked))
""")


def test_a_hub_weight_is_read_by_slices_into_any_sharding(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SLICES_SCRIPT, str(tmp_path / "model.safetensors")], env=_env(4),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checked = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert len(checked) == 20 and all(row[3] for row in checked), checked
    # really cut: 4 distinct blocks where one axis of 4 or two of 2 x 2 shard the variable
    assert {(row[0], row[2]): row[4] for row in checked}[("qkv_kernel", "P(None, 'y', 'x')")] == 4
