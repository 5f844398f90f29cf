"""``--fsdp`` on the Keras backend (issue 50 items 1 and 5): sharded state, same training.

On 4 CPU devices (``JAX_NUM_CPU_DEVICES=4``, each run a subprocess), 20 steps of a tiny RoBERTa with dropout on:
``--fsdp full_shard`` and ``--fsdp shard_grad_op`` log the replicated run's losses (to 1e-6, the log's rounding)
and end on its weights (to 1e-6); 2 processes x 2 devices with ``--fsdp full_shard`` train what 1 process x 4 does.
Each device holds 1/4 of the sharded state (the bytes from the arrays' shardings, in ``training_summary.json``)
plus the replicated scalars; the compiled step's memory per device is said before the first step and recorded.
A weight of 1 MiB or more that no dimension lets shard over 4 devices is refused by one line before any compute.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

from test_keras_multiprocess import _start, mp_args, start_cluster  # noqa: E402  (the same tiny run, launcher)

STEPS = 20
#: 1 layer, hidden 65 (5 heads of 13), intermediate 4097: the [65, 4097] kernel (1.02 MiB) has no even dimension
UNSHARDABLE = ("--hidden_size", "65", "--num_attention_heads", "5", "--intermediate_size", "4097",
               "--num_hidden_layers", "1")
REFUSAL = ("hf-tpu train: error: --fsdp cannot shard encoder_layer_0/intermediate_dense/kernel (65, 4097) (1.02 MiB): "
           "the fsdp mesh axis (4 devices) divides none of its dimensions, so every device would hold it whole; use a "
           "device count or --fsdp_config mesh whose fsdp size divides one of them, or resize the model.")


def _run_args(output_dir, *extra):
    return mp_args(output_dir, "--max_steps", str(STEPS), *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Replicated, full_shard and shard_grad_op on 1 x 4 devices, full_shard on 2 x 2, and the refused config."""
    root = tmp_path_factory.mktemp("fsdp")
    procs = {name: _start(_run_args(root / name, *extra), JAX_NUM_CPU_DEVICES=4)
             for name, extra in (("replicated", ()), ("full_shard", ("--fsdp", "full_shard")),
                                 ("shard_grad_op", ("--fsdp", "shard_grad_op auto_wrap")),
                                 ("refused", ("--fsdp", "full_shard", *UNSHARDABLE)))}
    # a save mid-run too: each process gathers the sharded state (process 0 exports from it alone)
    pair = start_cluster([root / "pair", root / "pair-1"],
                         extra=("--max_steps", str(STEPS), "--fsdp", "full_shard", "--save_steps", "10"))
    ends = {}
    for name, p in [*procs.items(), *((f"pair{i}", p) for i, p in enumerate(pair))]:
        out, err = p.communicate(timeout=600)
        ends[name] = (p.returncode, out, err)
    for name, (rc, _, err) in ends.items():
        assert rc == (1 if name == "refused" else 0), f"{name}: {err[-4000:]}"
    return root, ends


def _losses(folder):
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return [e["loss"] for e in state["log_history"] if "loss" in e]


def _summary(folder):
    return json.loads((Path(folder) / "training_summary.json").read_text())


def _assert_same_training(root, name, reference="replicated"):
    from safetensors.numpy import load_file

    ours, ref = _losses(root / name), _losses(root / reference)
    assert len(ours) == len(ref) == STEPS
    # the log keeps 6 decimals: equal losses may differ by one unit there (rtol: float64's representation of it)
    np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=1e-9)
    w_ours, w_ref = load_file(str(root / name / "model.safetensors")), load_file(str(root / reference / "model.safetensors"))
    assert sorted(w_ours) == sorted(w_ref)
    for key in w_ref:
        np.testing.assert_allclose(w_ours[key], w_ref[key], atol=1e-6, rtol=0, err_msg=key)


@pytest.mark.parametrize("strategy", ["full_shard", "shard_grad_op"])
def test_fsdp_trains_what_the_replicated_run_trains(runs, strategy):
    root, ends = runs
    _assert_same_training(root, strategy)
    summary = _summary(root / strategy)
    assert (summary["fsdp"], summary["mesh"], summary["num_devices"]) == (strategy, {"data": 1, "fsdp": 4}, 4)
    assert summary["strategy"] == f"jax.sharding FSDP {strategy} (Keras 3 on JAX)"
    results = json.loads((root / strategy / "all_results.json").read_text())
    assert results["xla_step_compilations"] == 1  # the memory figures came from the one compilation
    assert f"--fsdp {strategy} over the mesh data 1 x fsdp 4: " in ends[strategy][2]


def test_two_processes_of_two_devices_shard_as_one_process_of_four(runs):
    root, ends = runs
    _assert_same_training(root, "pair", reference="full_shard")
    summary = _summary(root / "pair")
    assert (summary["fsdp"], summary["num_devices"], summary["num_workers"]) == ("full_shard", 4, 2)
    assert summary["state_bytes_per_device"] == _summary(root / "full_shard")["state_bytes_per_device"]
    assert sorted(p.name for p in (root / "pair").glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-20"]


def test_each_device_holds_a_quarter_of_the_sharded_state(runs):
    """From the arrays' shardings: full_shard holds 1/4 of every weight and moment (every dimension of this config
    is even) plus the replicated scalars and non-trainable seeds; shard_grad_op the whole weights and 1/4 of the
    moments. The compiled step's figures are in the summary, the line said before the first step."""
    root, ends = runs
    whole = _summary(root / "replicated")["state_bytes_per_device"]
    full = _summary(root / "full_shard")
    replicated_part = full["replicated_state_bytes_per_device"]
    assert 0 < replicated_part < 100  # the optimizer's step count and learning rate, the dropout seed states
    assert full["state_bytes_per_device"] == (whole - replicated_part) // 4 + replicated_part
    assert full["state_bytes_per_device"] <= whole / 4 + replicated_part
    weights = _summary(root / "replicated")["num_parameters"] * 4
    grad_op = _summary(root / "shard_grad_op")["state_bytes_per_device"]
    assert grad_op == weights + (whole - weights - replicated_part) // 4 + replicated_part
    memory = full["step_memory_per_device"]
    assert memory["state_bytes"] == full["state_bytes_per_device"]
    assert memory["temp_bytes"] > 0 and memory["total_bytes"] == (memory["argument_bytes"] + memory["output_bytes"]
                                                                   - memory["alias_bytes"] + memory["temp_bytes"])
    assert _summary(root / "replicated")["step_memory_per_device"]["state_bytes"] == whole
    # what a device really holds as the step first runs (jax.live_arrays): its shards and the batch, not also the
    # whole copy the model was built with (the Keras variables are bound to the placed arrays); replicated: the
    # state on every device, and device 0 also the variables' copy
    assert full["state_bytes_per_device"] < memory["live_bytes"] < whole / 2
    assert _summary(root / "replicated")["step_memory_per_device"]["live_bytes"] >= 2 * whole
    line = next(l for l in ends["full_shard"][2].splitlines() if "Memory per device of the compiled" in l)
    assert f"state {memory['state_bytes'] / 2**20:.2f} MiB (--fsdp full_shard over 4 devices)" in line
    assert line.endswith("the device's limit is not known (none on a CPU).")


def test_a_large_weight_no_dimension_lets_shard_is_refused(runs):
    root, ends = runs
    rc, out, err = ends["refused"]
    assert REFUSAL in err.splitlines()
    assert not (root / "refused").exists()  # refused before any file or compute
