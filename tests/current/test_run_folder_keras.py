"""One run owns its folder, on the Keras backend: a TensorFlow backend's folder resumed with ``--backend keras``
names the backend that wrote it (it has a checkpoint, of the other backend), before anything is written."""

import json
import os

import pytest


def test_a_tensorflow_folder_resumed_with_the_keras_backend_names_the_backend(tmp_path):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import CheckpointError
    from hf_tpu_ext.run import train

    run = tmp_path / "tf_run"
    ckpts = run / "checkpoints"
    ckpts.mkdir(parents=True)
    for suffix in (".index", ".data-00000-of-00001"):
        (ckpts / f"ckpt-10{suffix}").write_bytes(b"\0" * 16)
    (ckpts / "ckpt-10.json").write_text(json.dumps({"global_step": 10}))
    before = sorted(os.listdir(run))
    with pytest.raises(CheckpointError) as err:
        train(*parse_args(["--backend", "keras", "--output_dir", str(run), "--max_steps", "20",
                           "--resume_from_checkpoint", "true"]))
    assert str(err.value) == (f"--resume_from_checkpoint: {run} holds a tensorflow backend checkpoint (step 10), "
                              "not a keras one: rerun with --backend tensorflow.")
    assert sorted(os.listdir(run)) == before  # the lock came and went, nothing else
