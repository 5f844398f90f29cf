"""TrainingCheckpointer: save/restore of model + optimizer state, shape validation, exported folders."""

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hf_tpu_ext.backends.tensorflow.checkpoint import (  # noqa: E402
    TrainingCheckpointer,
    find_latest,
    validate_compatible,
)
from hf_tpu_ext.errors import ArgumentError, CheckpointError  # noqa: E402

SEQ = 32
VOCAB = 300


def _model(hidden=64, seed=0):
    from transformers import RobertaConfig, TFRobertaForMaskedLM

    tf.keras.utils.set_random_seed(seed)
    config = RobertaConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=SEQ + 2, type_vocab_size=1, pad_token_id=1,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    model = TFRobertaForMaskedLM(config)
    model(model.dummy_inputs, training=False)
    return model


def _optimizer():
    from transformers import create_optimizer

    opt, _ = create_optimizer(1e-3, num_train_steps=20, num_warmup_steps=2, weight_decay_rate=0.01)
    return opt


def _batch(step):
    rng = np.random.RandomState(step)
    return tf.constant(rng.randint(5, VOCAB, size=(2, SEQ)).astype(np.int32))


def _train_step(model, opt, step):
    ids = _batch(step)
    with tf.GradientTape() as tape:
        logits = model(input_ids=ids, training=False).logits
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def _slots(opt, model):
    return {
        (i, s): opt.get_slot(v, s).numpy() for i, v in enumerate(model.trainable_variables) for s in ("m", "v")
    }


@pytest.fixture(scope="module")
def ckpt_run(tmp_path_factory):
    """A run of 3 steps with a checkpoint after steps 1, 2 and 3 (save_total_limit=2), then one more step."""
    out = str(tmp_path_factory.mktemp("run"))
    model, opt = _model(), _optimizer()
    ckpt = TrainingCheckpointer(model, opt, output_dir=out, save_total_limit=2)
    paths = []
    for step in (1, 2, 3):
        _train_step(model, opt, step)
        paths.append(ckpt.save(step, epoch=step / 2))
    saved_weights = [w.numpy() for w in model.trainable_variables]
    saved_slots = _slots(opt, model)
    _train_step(model, opt, 4)  # what the restored run must reproduce
    after = dict(
        weights=[w.numpy() for w in model.trainable_variables], slots=_slots(opt, model), iterations=int(opt.iterations.numpy())
    )
    return dict(out=out, paths=paths, saved_weights=saved_weights, saved_slots=saved_slots, after=after, ckpt=ckpt)


def test_save_writes_numbered_files_sidecar_and_prunes(ckpt_run):
    out, paths, ckpt = ckpt_run["out"], ckpt_run["paths"], ckpt_run["ckpt"]
    folder = os.path.join(out, "checkpoints")
    assert paths == [os.path.join(folder, f"ckpt-{n}") for n in (1, 2, 3)]
    assert ckpt.latest == paths[-1]
    names = sorted(os.listdir(folder))
    # save_total_limit=2: ckpt-1 and its sidecar are gone.
    assert not [n for n in names if n.startswith("ckpt-1.")]
    assert {"checkpoint", "ckpt-2.index", "ckpt-3.index", "ckpt-2.json", "ckpt-3.json"} <= set(names)
    assert any(n.startswith("ckpt-3.data-") for n in names)
    with open(os.path.join(folder, "ckpt-3.json")) as f:
        sidecar = json.load(f)
    assert sidecar == {
        "global_step": 3,
        "epoch": 1.5,
        "model_config": {
            "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
            "vocab_size": VOCAB, "max_position_embeddings": SEQ + 2,
        },
    }
    assert find_latest(out) == paths[-1]


def test_restore_brings_back_weights_step_and_optimizer_slots(ckpt_run):
    model, opt = _model(seed=123), _optimizer()  # different init: restore must overwrite it
    ckpt = TrainingCheckpointer(model, opt, os.path.join(ckpt_run["out"], "checkpoints"), max_to_keep=2)
    step = ckpt.restore()
    assert step == 3 and int(ckpt.epoch.numpy()) == 1 and ckpt.restored_epoch == 1.5
    for w, saved in zip(model.trainable_variables, ckpt_run["saved_weights"]):
        np.testing.assert_array_equal(w.numpy(), saved)
    # Deferred restoration: iterations exists on first access with the saved value.
    assert int(opt.iterations.numpy()) == 3
    # Adam slots are created in the first apply_gradients and get the saved values before the update, so the
    # resumed step equals the uninterrupted one exactly.
    _train_step(model, opt, 4)
    after = ckpt_run["after"]
    assert int(opt.iterations.numpy()) == after["iterations"] == 4
    slots = _slots(opt, model)
    assert slots.keys() == after["slots"].keys() and len(slots) == 2 * len(model.trainable_variables)
    for key, value in after["slots"].items():
        np.testing.assert_allclose(slots[key], value, rtol=0, atol=1e-7, err_msg=str(key))
    for w, expected in zip(model.trainable_variables, after["weights"]):
        np.testing.assert_allclose(w.numpy(), expected, rtol=0, atol=1e-6)
    # Without the restore the slots would be different (fresh zeros before the update).
    key = next(iter(after["slots"]))
    assert not np.allclose(ckpt_run["saved_slots"][key], 0)


def test_validate_compatible_names_mismatching_fields(ckpt_run):
    path = ckpt_run["paths"][-1]
    small = _model(hidden=32)
    with pytest.raises(CheckpointError) as err:
        validate_compatible(path, small.config)
    assert "checkpoint has hidden_size=64, model has hidden_size=32" in str(err.value)
    assert "num_hidden_layers" not in str(err.value)
    validate_compatible(path, {"hidden_size": 64, "vocab_size": VOCAB})  # matching fields pass
    # restore() validates before touching any variable.
    ckpt = TrainingCheckpointer(small, None, os.path.dirname(path))
    with pytest.raises(CheckpointError, match="checkpoint has hidden_size=64, model has hidden_size=32"):
        ckpt.validate_compatible(path)  # method form: against the checkpointer's model
    before = [w.numpy() for w in small.trainable_variables]
    with pytest.raises(CheckpointError, match="hidden_size=64, model has hidden_size=32"):
        ckpt.restore(path)
    for w, b in zip(small.trainable_variables, before):
        np.testing.assert_array_equal(w.numpy(), b)


def test_checkpoint_files_restore_on_their_own_once_linked(ckpt_run, tmp_path):
    """What a push takes of a TensorFlow checkpoint (``checkpoint_files``): its own files, its trainer state as
    trainer_state.json and a state file naming it alone; linked into a folder as the push queue does, it restores."""
    from hf_tpu_ext.backends.tensorflow.checkpoint import checkpoint_files
    from hf_tpu_ext.hub.staging import link_files

    files = checkpoint_files(ckpt_run["paths"][-1])
    assert files["checkpoint"] == b'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n'
    assert files["ckpt-3.index"] == ckpt_run["paths"][-1] + ".index" and "ckpt-3.json" in files
    assert [n for n in files if n.startswith("ckpt-3.data-")] and not [n for n in files if n.startswith("ckpt-2")]
    dest = tmp_path / "last-checkpoint"
    link_files(files, str(dest))
    assert os.stat(dest / "ckpt-3.index").st_ino == os.stat(ckpt_run["paths"][-1] + ".index").st_ino
    model, opt = _model(seed=7), _optimizer()
    assert TrainingCheckpointer(str(tmp_path / "new_run"), model, opt, 1).restore(str(dest)) == 3
    for w, saved in zip(model.trainable_variables, ckpt_run["saved_weights"]):
        np.testing.assert_array_equal(w.numpy(), saved)


def test_find_latest_and_missing_checkpoints(tmp_path):
    with pytest.raises(CheckpointError) as err:
        find_latest(str(tmp_path))
    assert os.path.join(str(tmp_path), "checkpoints") in str(err.value)
    assert find_latest(str(tmp_path), required=False) is None
    model = _model()
    with pytest.raises(ArgumentError, match="directory or an output_dir"):
        TrainingCheckpointer(model)
    ckpt = TrainingCheckpointer(model, output_dir=str(tmp_path))
    assert ckpt.latest is None
    with pytest.raises(CheckpointError, match="No checkpoint to restore"):
        ckpt.restore()
    with pytest.raises(CheckpointError, match="No checkpoint found"):
        ckpt.restore(str(tmp_path / "elsewhere"))
