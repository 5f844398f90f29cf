"""``--fsdp full_shard`` killed and resumed at training level (issue 50 item 2's test): a 2-process x 2-device run
whose process 1 is SIGKILLed after a sharded checkpoint (each process wrote its own blocks) resumes with
``--resume_from_checkpoint true`` on 2 x 2, on 1 x 4 and on 1 x 2 devices (a copy of the output folder each) and
continues at the checkpoint's step with the per-step losses of one uninterrupted 1 x 4 run (to 1e-6, the log's
rounding, as ``test_keras_fsdp``), its weights too.

The survivor names the lost process within ``HF_TPU_JAX_HEARTBEAT_TIMEOUT`` (10 s here, 30 s by default) and exits
1; the 1 x 2 resume keeps the global batch (4 rows per device). Runs in the current-releases venv
(``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``).
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

from test_keras_multiprocess import _losses, _start, _weights, finish, mp_args, start_cluster  # noqa: E402

STEPS = 6
#: every process's arguments (the reference saves only at its end: saves do not change the training)
FSDP = ("--max_steps", str(STEPS), "--fsdp", "full_shard")
EVERY3 = (*FSDP, "--save_steps", "3")
RESUME = (*EVERY3, "--resume_from_checkpoint", "true")
#: the survivor's watch (and JAX's heartbeat, twice it) short, so the test does not wait the default 30 s
BEAT = {"HF_TPU_JAX_HEARTBEAT_TIMEOUT": "10"}
#: resumed shapes: name -> (processes, devices per process, extra arguments)
SHAPES = {"2x2": (2, 2, ()), "1x4": (1, 4, ()), "1x2": (1, 2, ("--per_device_train_batch_size", "4"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted 1 x 4 run and the killed 2 x 2 one side by side, then the three resumes side by side."""
    root = tmp_path_factory.mktemp("fsdp_resume")
    cut = root / "cut"
    ref = _start(mp_args(root / "ref", *FSDP), JAX_NUM_CPU_DEVICES=4)
    pair = start_cluster([cut, cut], extra=EVERY3,
                         extra_env=(BEAT, {**BEAT, "HF_TPU_EXT_TEST_KILL_AT": "train_step@5"}))
    ends = {"ref": finish([ref])[0]}
    ends["victim"] = finish(pair[1:])[0]
    ends["survivor"] = finish(pair[:1], timeout=120)[0]
    assert ends["ref"][0] == 0, ends["ref"][1][-3000:]
    killed = {"checkpoints": sorted(p.name for p in cut.glob("checkpoint-*")),
              "checkpoint-3": sorted(p.name for p in cut.glob("checkpoint-3/*"))}
    procs = {}
    for name, (processes, devices, extra) in SHAPES.items():
        shutil.copytree(cut, root / name)
        if processes == 1:
            procs[name] = [_start(mp_args(root / name, *RESUME, *extra), JAX_NUM_CPU_DEVICES=devices)]
        else:
            procs[name] = start_cluster([root / name] * 2, extra=RESUME, devices=devices)
    for name, group in procs.items():
        ends[name] = finish(group)
    return root, ends, killed


def test_the_killed_run_left_a_sharded_checkpoint_and_one_line(runs):
    root, ends, killed = runs
    (rc_victim, _), (rc_survivor, err) = ends["victim"], ends["survivor"]
    assert (rc_victim, rc_survivor) == (-9, 1), err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"hf-tpu train: error: process 1 of 2 was lost (no heartbeat for 10 s); the last checkpoint is checkpoint-3 "
        f"in {root / 'cut'}; rerun the same commands on every host (with --resume_from_checkpoint true) to resume.")
    # each process wrote the blocks its devices hold: process 1's own files beside process 0's
    assert killed["checkpoints"] == ["checkpoint-3"]
    assert {"model_state.safetensors", "model_state-00001.safetensors", "optimizer_state.safetensors",
            "optimizer_state-00001.safetensors"} <= set(killed["checkpoint-3"])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_resume_continues_at_the_step_with_the_uninterrupted_losses(runs, shape):
    root, ends, _ = runs
    for rc, err in ends[shape]:
        assert rc == 0, err[-3000:]
    err = ends[shape][0][1]
    processes, devices, _ = SHAPES[shape]
    assert f"{processes * devices} cpu device(s) in {processes} process(es)" in err
    assert "checkpoint-3 at global step 3" in err
    summary = json.loads((root / shape / "training_summary.json").read_text())
    assert (summary["fsdp"], summary["num_devices"]) == ("full_shard", processes * devices)
    ours, ref = _losses(root / shape), _losses(root / "ref")
    assert [s for s, _ in ours] == list(range(1, STEPS + 1)) == [s for s, _ in ref]
    # the log keeps 6 decimals: equal losses may differ by one unit there
    np.testing.assert_allclose([l for _, l in ours], [l for _, l in ref], atol=1e-6, rtol=1e-9)
    w_ours, w_ref = _weights(root / shape), _weights(root / "ref")
    assert sorted(w_ours) == sorted(w_ref)
    for key in w_ref:
        np.testing.assert_allclose(w_ours[key], w_ref[key], atol=1e-6, rtol=0, err_msg=key)
    assert sorted(p.name for p in (root / shape).glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
