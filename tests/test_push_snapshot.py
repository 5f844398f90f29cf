"""A backend's checkpoint is pushed as written: the push queue hard-links its files when the save is queued
(``Backend.checkpoint_files``; a copy where no link can be made), so deleting or rotating the checkpoint folder
(``save_total_limit``) before the upload changes nothing on the Hub, and the checkpoint is never copied; the model
folder's weights that the export replaces (``Backend.export_replaces``) are linked too, the rest copied."""

import errno
import json
import os
import shutil

import pytest

from hf_tpu_ext.hub import staging
from hf_tpu_ext.hub.push_session import PushConfig, PushSession


def _keras_checkpoint(folder, step, marker):
    """A ``checkpoint-<step>/`` as the Keras backend writes it, plus what a push leaves out."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model_state.safetensors", "optimizer_state.safetensors"):
        (folder / name).write_bytes(f"{name} {marker}".encode())
    (folder / "checkpoint.json").write_text(json.dumps({"global_step": step}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "data_state-0.json").write_text("{}")
    (folder / ".checkpoint.json.tmp").write_text("half a write")
    (folder / "notes.txt").write_text("not the backend's")
    return folder


def _snapshot_files(root, name):
    return [os.path.join(d, name) for d, _, names in os.walk(root) if name in names]


@pytest.mark.parametrize("strategy, where", [("checkpoint", "last-checkpoint"), ("all_checkpoints", "checkpoint-3")])
def test_a_backends_checkpoint_is_pushed_as_written(loopback_hub, tmp_path, monkeypatch, strategy, where):
    from hf_tpu_ext.backends.keras.checkpoint import checkpoint_files

    loopback_hub.server.latency(1.0, route="commit")  # the upload is still pending when the folder rotates
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "roberta"}')
    (out / "model.safetensors").write_bytes(b"weights")
    ckpt = _keras_checkpoint(out / "checkpoint-3", 3, "as saved at step 3")
    repo = f"alice/linked-{strategy.replace('_', '-')}"
    copied = []
    real_copy = staging.shutil.copy2
    monkeypatch.setattr(staging.shutil, "copy2", lambda src, dst: copied.append(os.path.relpath(src, out))
                        or real_copy(src, dst))
    session = PushSession(PushConfig(output_dir=str(out), hub_model_id=repo, hub_token=loopback_hub.token,
                                     hub_strategy=strategy, save_strategy="no"), is_chief=True)
    try:
        plan = session.admit(3)
        session.save(plan, str(out), checkpoint_files=checkpoint_files(str(ckpt)), replaced=("model.safetensors",))
        [linked] = _snapshot_files(session.staging_root, "model_state.safetensors")
        assert os.stat(linked).st_ino == os.stat(ckpt / "model_state.safetensors").st_ino  # one inode, no copy
        [weights] = _snapshot_files(session.staging_root, "model.safetensors")
        assert os.stat(weights).st_ino == os.stat(out / "model.safetensors").st_ino
        assert copied == ["config.json"]  # nothing else written: the weights are on disk once per folder
        shutil.rmtree(ckpt)  # save_total_limit rotates it away; the next save writes the same name anew
        _keras_checkpoint(out / "checkpoint-3", 3, "rewritten later")
        (out / "model.safetensors.tmp").write_bytes(b"weights of the next save")  # the next export: renamed in
        os.replace(out / "model.safetensors.tmp", out / "model.safetensors")
        report = session.finish(60)
    finally:
        session.close()
    assert report.ok and report.counts["pushed"] == (1 if where == "last-checkpoint" else 2)
    files = loopback_hub.server.files(repo)
    assert files["model.safetensors"] == b"weights" and files["config.json"] == b'{"model_type": "roberta"}'
    assert files[f"{where}/model_state.safetensors"] == b"model_state.safetensors as saved at step 3"
    assert sorted(n for n in files if n.startswith(f"{where}/")) == [
        f"{where}/{n}" for n in ("checkpoint.json", "data_state-0.json", "model_state.safetensors",
                                 "optimizer_state.safetensors", "trainer_state.json")]


def test_link_files_copies_across_file_systems_and_writes_small_files(tmp_path, monkeypatch):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "ckpt-3.index").write_bytes(b"index")
    files = {"ckpt-3.index": str(src / "ckpt-3.index"), "checkpoint": b'model_checkpoint_path: "ckpt-3"\n'}

    def cross_device(a, b):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(staging.os, "link", cross_device)
    assert staging.link_files(files, str(tmp_path / "snap" / "last-checkpoint")) == 2
    copy = tmp_path / "snap" / "last-checkpoint" / "ckpt-3.index"
    assert copy.read_bytes() == b"index" and os.stat(copy).st_ino != os.stat(src / "ckpt-3.index").st_ino
    assert (copy.parent / "checkpoint").read_bytes() == b'model_checkpoint_path: "ckpt-3"\n'
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError):
        staging.link_files({"gone": str(src / "gone")}, str(tmp_path / "snap2"))


def test_checkpoint_files_of_the_keras_and_torch_xla_backends(tmp_path):
    from hf_tpu_ext.backends.keras.checkpoint import checkpoint_files
    from hf_tpu_ext.backends.torch_xla.backend import TorchXLABackend
    from hf_tpu_ext.errors import CheckpointError

    ckpt = _keras_checkpoint(tmp_path / "checkpoint-3", 3, "x")
    assert checkpoint_files(str(ckpt)) == {n: str(ckpt / n) for n in (
        "model_state.safetensors", "optimizer_state.safetensors", "checkpoint.json", "trainer_state.json",
        "data_state-0.json")}
    torch_ckpt = tmp_path / "trainer" / "checkpoint-7"
    (torch_ckpt / "sub").mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "run_trainer_state.json", "sub/rng_state_1.pth"):
        (torch_ckpt / name).write_bytes(b"x")
    assert TorchXLABackend().checkpoint_files(str(torch_ckpt)) == {
        n: str(torch_ckpt / n) for n in ("model.safetensors", "optimizer.pt", "run_trainer_state.json",
                                         "sub/rng_state_1.pth")}
    for files in (checkpoint_files, TorchXLABackend().checkpoint_files):
        with pytest.raises(CheckpointError, match="it is not a folder"):
            files(str(tmp_path / "checkpoint-9"))


def test_a_save_hands_up_the_files_its_push_takes(tmp_path):
    """The Keras save lists what a push of it takes (``write_checkpoint``), the trainer state the run writes next
    included; once written, the listing of the checkpoint on disk is the same. torch_xla's hand-over lists its run
    state the same way."""
    import numpy as np

    from hf_tpu_ext.backends.keras.checkpoint import checkpoint_files, write_checkpoint
    from hf_tpu_ext.backends.torch_xla.backend import TorchXLABackend

    path, files = write_checkpoint(str(tmp_path / "out"), 3, {"w": np.ones((2, 3), np.float32)},
                                   {"00000/iteration": np.zeros((), np.int64)}, {"epoch": 1.0})
    assert path == str(tmp_path / "out" / "checkpoint-3")
    assert files == {n: os.path.join(path, n) for n in (
        "model_state.safetensors", "optimizer_state.safetensors", "checkpoint.json", "trainer_state.json")}
    assert not os.path.exists(files["trainer_state.json"])  # the run writes it before any push links the files
    assert "trainer_state.json" not in checkpoint_files(path)
    with open(files["trainer_state.json"], "w") as f:
        f.write('{"global_step": 3}')
    assert checkpoint_files(path) == files
    torch_ckpt = tmp_path / "trainer" / "checkpoint-7"
    torch_ckpt.mkdir(parents=True)
    (torch_ckpt / "optimizer.pt").write_bytes(b"x")
    assert TorchXLABackend().checkpoint_files(str(torch_ckpt), with_state=True) == {
        n: str(torch_ckpt / n) for n in ("optimizer.pt", "run_trainer_state.json")}


def test_the_run_pushes_the_files_a_save_handed_up(tmp_path):
    """``TrainingRun._push`` queues the files the save handed to ``on_save`` (the backend is not asked again); for
    a checkpoint found on disk (the final push, a signal's) it asks the backend's ``checkpoint_files``."""
    from types import SimpleNamespace

    from hf_tpu_ext.hub.push_policy import plan_save
    from hf_tpu_ext.run import TrainingRun

    asked, queued = [], []
    backend = SimpleNamespace(export_replaces=("model.safetensors",),
                              checkpoint_files=lambda p: asked.append(p) or {"checkpoint.json": f"{p}/checkpoint.json"})
    run = TrainingRun(None, None, SimpleNamespace(output_dir=str(tmp_path)), backend=backend)
    run.pusher = SimpleNamespace(save=lambda plan, folder, **kw: queued.append((plan.step, folder, kw)))
    handed = {"trainer_state.json": str(tmp_path / "checkpoint-4" / "trainer_state.json")}
    run._push(plan_save("checkpoint", 4, final=True), str(tmp_path / "checkpoint-4"), handed)
    run._push(plan_save("checkpoint", 8, final=True), str(tmp_path / "checkpoint-8"))
    assert asked == [str(tmp_path / "checkpoint-8")]
    on_disk = {"checkpoint.json": f"{tmp_path}/checkpoint-8/checkpoint.json"}
    assert queued == [(4, str(tmp_path), {"checkpoint_files": handed, "replaced": ("model.safetensors",)}),
                      (8, str(tmp_path), {"checkpoint_files": on_disk, "replaced": ("model.safetensors",)})]
