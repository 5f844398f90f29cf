"""A RoBERTa checkpoint written before RoBERTa moved onto the shared post-LN encoder still resumes.

The fixture (``tests/fixtures/roberta_keras_checkpoint``, its README says how it was made) holds a 3-step run's
checkpoint under the old variable paths (``roberta_backbone/transformer_layer_0/...``) and the logits its model
gave then. Today's model reads it through the model's ``legacy_paths``: every weight lands in its variable (the same
logits), the optimizer state lines up with the same variables, and ``--resume_from_checkpoint`` continues to step 5.
"""

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "roberta_keras_checkpoint"
sys.path.insert(0, str(FIXTURE))
from make_fixture import ARGS, INPUT_IDS  # noqa: E402

CHECKPOINT = FIXTURE / "run" / "checkpoint-3"


def _model_and_state():
    from transformers import AutoConfig

    from hf_tpu_ext.backends.keras import checkpoint as ckpt
    from hf_tpu_ext.backends.keras.architectures import architecture_for
    from hf_tpu_ext.backends.keras.architectures.name_table import renamed_paths

    config = AutoConfig.from_pretrained(FIXTURE / "run")
    model = architecture_for(config).build(config)
    stored = ckpt.load_tensors(str(CHECKPOINT), ckpt.MODEL_NAME)
    return model, stored, renamed_paths(stored, model.legacy_paths)


def test_old_variable_paths_land_in_their_variables():
    model, stored, state = _model_and_state()
    assert "roberta_backbone/transformer_layer_1/self_attention/attention_output/kernel" in stored
    assert state["encoder_layer_1/attention/output_dense/kernel"] is \
        stored["roberta_backbone/transformer_layer_1/self_attention/attention_output/kernel"]
    paths = [var.path for var in model.trainable_variables]
    assert sorted(paths) == sorted(k for k in state if not k.startswith("non_trainable/"))
    for var in model.trainable_variables:
        var.assign(state[var.path])
    ids = np.asarray(INPUT_IDS, np.int32)
    logits = np.asarray(model({"token_ids": ids, "padding_mask": np.ones_like(ids),
                               "mask_positions": np.arange(ids.shape[1], dtype=np.int32)[None]}))
    reference = np.load(FIXTURE / "reference_logits.npz")
    assert logits.shape == reference["logits"].shape == (1, 8, 300)
    np.testing.assert_allclose(logits, reference["logits"], rtol=0, atol=1e-5)


def test_old_optimizer_state_lines_up_with_the_same_variables():
    # the optimizer state is restored by position: its order must name the same variables as today's model
    from hf_tpu_ext.backends.keras import checkpoint as ckpt

    model, stored, state = _model_and_state()
    new_of_old = {old.replace("/", "_"): new.replace("/", "_") for old, new in zip(stored, state)}
    optimizer = sorted(ckpt.load_tensors(str(CHECKPOINT), ckpt.OPTIMIZER_NAME))
    slots = [key.split("/", 2)[2].rsplit("_", 1) for key in optimizer[1:]]  # [0] is the iteration count
    assert len(slots) == 2 * len(model.trainable_variables) == 2 * 41
    expected = [(var.path.replace("/", "_"), slot) for var in model.trainable_variables
                for slot in ("momentum", "velocity")]
    assert [(new_of_old[name], slot) for name, slot in slots] == expected


def test_old_checkpoint_resumes_and_continues_training(tmp_path):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", out)
    train(*parse_args(["--output_dir", str(out), *ARGS, "--max_steps", "5", "--resume_from_checkpoint", "true"]))
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 5
    losses = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
    assert sorted(losses) == [1, 2, 3, 4, 5]  # steps 1-3 carried over from the checkpoint
    assert losses[3] == pytest.approx(5.6529, abs=1e-4) and all(math.isfinite(losses[s]) for s in (4, 5))
    assert (out / "checkpoint-5" / "model_state.safetensors").is_file()
