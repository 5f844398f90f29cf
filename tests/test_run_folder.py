"""One run owns its folder (TensorFlow backend): a second `hf-tpu train` on a busy folder is refused in one line
and a killed run's lock is taken over; `--overwrite_output_dir` leaves nothing a resume or `hf-tpu push` would
take; a disk-full save is one line naming the intact checkpoint, which still resumes; bad resume inputs are one
true line each."""

import errno
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, tiny_train_args

from hf_tpu_ext.cli import main
from hf_tpu_ext.run_lock import LOCK_NAME

QUIET = ("--eval_strategy", "no", "--callbacks", "")


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args([str(a) for a in args]))


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))


def _killed_lock_holder(folder):
    """A process that takes ``folder``'s lock and SIGKILLs itself (what a killed run leaves); returns its pid."""
    code = ("import os, sys; from hf_tpu_ext.run_lock import lock_output_dir; lock_output_dir(sys.argv[1]); "
            "print(os.getpid(), flush=True); os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9, proc.stderr
    return int(proc.stdout.split()[0])


def test_a_second_run_on_a_busy_folder_is_refused_and_a_killed_runs_lock_taken_over(tmp_path, hf_log,
                                                                                      monkeypatch, capsys):
    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer

    out = tmp_path / "run"
    dead = _killed_lock_holder(out)
    args = tiny_train_args(out, "--max_steps", "4", "--save_steps", "2", *QUIET)
    second = {}
    commit = TrainingCheckpointer.commit

    def commit_then_start_a_second_run(self, path):  # while the first run trains: the same command again
        commit(self, path)
        if not second:
            before = sorted(os.listdir(out))
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "hf_tpu_ext", "train", *args], env=_env(),
                                  capture_output=True, text=True, timeout=120)
            second.update(rc=proc.returncode, err=proc.stderr, seconds=time.perf_counter() - t0,
                          wrote=sorted(os.listdir(out)) != before)

    monkeypatch.setattr(TrainingCheckpointer, "commit", commit_then_start_a_second_run)
    assert main(["train", *args]) == 0  # the first run finishes
    host = socket.gethostname()
    assert (f"--output_dir {out}: took over the lock of an ended run (pid {dead} on host {host}, since "
            in hf_log.text)
    assert second["rc"] == 1 and second["seconds"] < 10 and not second["wrote"], second
    lines = [line for line in second["err"].splitlines() if line.strip()]
    assert len(lines) == 1, second["err"]
    assert lines[0].startswith(f"hf-tpu train: error: --output_dir {str(out)!r} is in use by another hf-tpu train "
                               f"(pid {os.getpid()} on host {host}, since 20")
    assert lines[0].endswith("): wait for it to end or stop it, or choose another --output_dir. Nothing was written.")
    assert not (out / LOCK_NAME).exists()  # released by the run that ended
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


def test_overwrite_leaves_nothing_a_resume_or_push_takes(tmp_path, trained_model_dir, hf_log, loopback_hub):
    run = tmp_path / "run"
    shutil.copytree(trained_model_dir, run)  # a 30-step run: checkpoints at 20 and 30 (the newest two)
    _train(tiny_train_args(run, "--max_steps", "6", "--save_steps", "3", "--overwrite_output_dir", "true", *QUIET))
    assert ("--overwrite_output_dir: removed the earlier run's checkpoints of step 30, 20; all_results.json, "
            "checkpoints, loss_curve.png, model.safetensors, run_state.json, tf_model.h5, trainer_state.json, "
            f"training_summary.json from {run} (a resume or hf-tpu push would have taken them).") in hf_log.text
    assert sorted(n for n in os.listdir(run / "checkpoints") if n.endswith(".index")) == ["ckpt-3.index",
                                                                                         "ckpt-6.index"]
    assert main(["push", str(run), "--hub_model_id", "alice/overwritten", "--hub_token", loopback_hub.token]) == 0
    commit = loopback_hub.server.commits("alice/overwritten")[-1]
    assert commit["message"] == "Upload model (step 6) and last-checkpoint/ (step 6) with hf-tpu-ext"
    files = loopback_hub.server.files("alice/overwritten")
    assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 6
    results = _train(tiny_train_args(run, "--max_steps", "8", "--save_steps", "3", "--resume_from_checkpoint", "true",
                                     *QUIET))
    assert "resuming from" in hf_log.text and "ckpt-6 at global step 6" in hf_log.text
    assert results["global_step"] == 8


def test_disk_full_during_a_save_is_one_line_and_the_intact_checkpoint_resumes(tmp_path, monkeypatch, capsys):
    from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer

    out = tmp_path / "run"
    args = tiny_train_args(out, "--max_steps", "6", "--save_steps", "3", *QUIET)
    write = TrainingCheckpointer._write_weights  # the weights' write (tf.train.Checkpoint.write, traced once)

    def full_at_step_6(self, prefix):  # the sidecar of ckpt-6 is written, its weights are not
        if str(prefix).endswith("ckpt-6"):
            raise OSError(errno.ENOSPC, "No space left on device", str(prefix) + "_temp")
        return write(self, prefix)

    monkeypatch.setattr(TrainingCheckpointer, "_write_weights", full_at_step_6)
    capsys.readouterr()
    rc = main(["train", *args])
    err = capsys.readouterr().err
    assert rc == 1
    line = [e for e in err.splitlines() if e.startswith("hf-tpu train: error:")]
    assert line == [f"hf-tpu train: error: Writing to --output_dir {out} failed: No space left on device; the newest "
                    f"intact checkpoint is {os.path.join('checkpoints', 'ckpt-3')} (step 3). Free some space, then "
                    f"resume with: hf-tpu train {shlex.join(args)} --resume_from_checkpoint true"]
    assert "Traceback" not in err
    monkeypatch.setattr(TrainingCheckpointer, "_write_weights", write)  # space again
    assert main(["train", *args, "--resume_from_checkpoint", "true"]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [5, 6]
    # a full disk elsewhere (the datasets cache): that file named, the run folder's checkpoint too
    from hf_tpu_ext.hub.checkpoint_layouts import save_failure_message

    cache_full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cache" / "train.arrow"))
    assert save_failure_message(cache_full, str(out), "hf-tpu train ...") == (
        f"Writing {tmp_path / 'cache' / 'train.arrow'} failed: No space left on device (--output_dir {out}: the "
        f"newest intact checkpoint is {os.path.join('checkpoints', 'ckpt-6')} (step 6)). Free some space there, "
        "then resume with: hf-tpu train ...")
    assert save_failure_message(ConnectionError("reset by peer"), str(out), "") is None  # not a write


def _keras_checkpoint(folder, step):
    """The files of a Keras backend checkpoint (contents do not matter: the backend is told by the names)."""
    folder.mkdir(parents=True)
    for name in ("model_state.safetensors", "optimizer_state.safetensors"):
        (folder / name).write_bytes(b"\0" * 16)
    (folder / "checkpoint.json").write_text(json.dumps({"global_step": step}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def test_bad_resume_inputs_are_one_true_line_each(tmp_path, trained_model_dir, hf_log, loopback_hub):
    from huggingface_hub import HfApi

    from hf_tpu_ext.errors import ArgumentError, CheckpointError

    with pytest.raises(ArgumentError, match=r"^--max_steps must be > 0 \(or -1: train --num_train_epochs\), got -5\.$"):
        _train(tiny_train_args(tmp_path / "o", "--max_steps", "-5"))
    # a Keras backend folder or Hub repo resumed with the TensorFlow backend: it has a checkpoint, of the other one
    keras_run = tmp_path / "keras_run"
    _keras_checkpoint(keras_run / "checkpoint-20", 20)
    with pytest.raises(CheckpointError) as err:
        _train(tiny_train_args(keras_run, "--max_steps", "30", "--resume_from_checkpoint", "true"))
    assert str(err.value) == (f"--resume_from_checkpoint: {keras_run} holds a keras backend checkpoint (step 20), "
                              "not a tensorflow one: rerun with --backend keras.")
    _keras_checkpoint(tmp_path / "upload" / "last-checkpoint", 20)
    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/keras-run")
    api.upload_folder(repo_id="alice/keras-run", folder_path=str(tmp_path / "upload"))
    with pytest.raises(CheckpointError) as err:
        _train(tiny_train_args(tmp_path / "from_hub", "--max_steps", "30", "--resume_from_checkpoint",
                               "alice/keras-run", "--hub_token", loopback_hub.token))
    assert str(err.value) == ("--resume_from_checkpoint: the Hub repo alice/keras-run holds a keras backend "
                              "checkpoint (step 20), not a tensorflow one: rerun with --backend keras.")
    assert not (tmp_path / "from_hub").exists()
    # another --max_seq_length than the checkpoint's: the flag named, before the model or TensorBoard exist
    run = tmp_path / "run"
    shutil.copytree(trained_model_dir, run)
    events = sorted(p.name for p in (run / "runs").rglob("*"))
    with pytest.raises(CheckpointError) as err:
        _train(tiny_train_args(run, "--max_steps", "40", "--resume_from_checkpoint", "true")
               + ["--max_seq_length", "64"])
    assert "--max_seq_length 64 (the checkpoint trained at 32; a new length is a new run" in str(err.value)
    assert sorted(p.name for p in (run / "runs").rglob("*")) == events
    # the only checkpoint unreadable: said once, not "resuming from the next older one" first
    for step in (10, 20):
        for path in (run / "checkpoints").glob(f"ckpt-{step}.*"):
            path.unlink()
    data = run / "checkpoints" / "ckpt-30.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])
    hf_log.clear()
    with pytest.raises(CheckpointError, match=r"^No readable checkpoint to resume from: .*ckpt-30 cannot be read"):
        _train(tiny_train_args(run, "--max_steps", "40", "--resume_from_checkpoint", "true"))
    assert "next older checkpoint" not in hf_log.text


def test_a_lock_of_another_host_is_refused_and_a_damaged_one_taken_over(tmp_path, hf_log):
    from hf_tpu_ext.run_lock import RunLockedError, lock_output_dir

    out = tmp_path / "shared"
    out.mkdir()
    lock = out / LOCK_NAME
    lock.write_text(json.dumps({"pid": 1, "host": "tpu-vm-7", "since": "2026-12-01T20:00:00Z"}))
    with pytest.raises(RunLockedError) as err:
        lock_output_dir(str(out))  # its process cannot be checked from here: never taken over
    assert str(err.value) == (f"--output_dir {str(out)!r} is in use by another hf-tpu train (pid 1 on host tpu-vm-7, "
                              f"since 2026-12-01T20:00:00Z): wait for it to end, or, if it has ended, delete {lock}, "
                              "or choose another --output_dir. Nothing was written.")
    lock.write_text("{half a record")  # a lock file cut short: nobody's
    held = lock_output_dir(str(out))
    assert json.loads(lock.read_text())["pid"] == os.getpid() and held.taken_over == {"pid": 0, "host": None}
    assert lock_output_dir(str(out)) is held  # the training run shares the lock `hf-tpu train` took
    held.release()
    assert lock.exists()  # one holder left
    held.release()
    assert sorted(os.listdir(out)) == []
