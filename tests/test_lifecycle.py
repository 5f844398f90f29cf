"""The training run's lifecycle: kill -9 at every phase and resume, truncated checkpoints, resume inputs, signals.

Kills use the test hook ``HF_TPU_EXT_TEST_KILL_AT=<phase>`` of :mod:`hf_tpu_ext.run` (the process
SIGKILLs itself there). Runs are tiny (2 layers, hidden 64, 20 steps) and run without XLA to keep them short.
"""

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from conftest import REPO_ROOT, TESTS_DIR, run_train_script, tiny_train_args

REPO = "alice/lifecycle"
TIMING_KEYS = ("tokens_per_second", "mfu", "train_runtime", "eval_runtime")
# 20 steps, a checkpoint and an evaluation every 10 (multiples of logging_steps=5), pushes with each save
COMMON = ["--max_steps", "20", "--save_strategy", "steps", "--save_steps", "10", "--eval_strategy", "steps",
          "--eval_steps", "10", "--callbacks", "", "--jit_compile", "false", "--push_to_hub", "true",
          "--hub_strategy", "checkpoint"]


def _weights(folder):
    from safetensors.numpy import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


def _state(folder):
    state = json.loads((folder / "trainer_state.json").read_text())
    history = [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in state["log_history"]]
    return state, history


def _assert_same_run(out, ref):
    """Same global step, log history (losses to 1e-5), best metric and step, and weights (1e-5) as ``ref``."""
    state, history = _state(out)
    ref_state, ref_history = _state(ref)
    assert state["global_step"] == ref_state["global_step"] == 20
    assert [sorted(e) for e in history] == [sorted(e) for e in ref_history]
    for a, b in zip(history, ref_history):
        for k, v in b.items():
            assert a[k] == pytest.approx(v, abs=1e-5), (k, a, b)
    assert state["best_metric"] == pytest.approx(ref_state["best_metric"], abs=1e-5)
    assert state["best_global_step"] == ref_state["best_global_step"] == 20
    assert state["epoch"] == ref_state["epoch"] and state["num_input_tokens_seen"] == ref_state["num_input_tokens_seen"]
    a, b = _weights(out), _weights(ref)
    assert a.keys() == b.keys()
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5
    results = json.loads((out / "all_results.json").read_text())
    ref_results = json.loads((ref / "all_results.json").read_text())
    assert results["train_loss"] == pytest.approx(ref_results["train_loss"], abs=1e-5)  # the whole run, all 20 steps


def _run(out, hub, repo, *extra, kill_at=None):
    env = {"HF_TPU_EXT_TEST_KILL_AT": kill_at} if kill_at else {"HF_TPU_EXT_TEST_KILL_AT": ""}
    args = tiny_train_args(out, *COMMON, "--hub_model_id", repo, "--hub_token", hub.token, *extra)
    proc = run_train_script(args, env=env, check=False)
    if kill_at:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_kill_after_the_final_checkpoint_before_its_evaluation_then_resume(tmp_path):
    """Evaluation only after the last step (none in the loop): a kill -9 once the final checkpoint is written and
    before that evaluation, then a resume: the evaluation is run and its results equal an uninterrupted run's."""
    args = ["--max_steps", "10", "--save_strategy", "steps", "--save_steps", "5", "--eval_strategy", "no",
            "--do_eval", "true", "--callbacks", "", "--jit_compile", "false"]
    ref, out = tmp_path / "straight", tmp_path / "killed"
    run_train_script(tiny_train_args(ref, *args), env={"HF_TPU_EXT_TEST_KILL_AT": ""})
    proc = run_train_script(tiny_train_args(out, *args), env={"HF_TPU_EXT_TEST_KILL_AT": "saved@10"}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert "eval_loss" not in json.dumps(json.loads((out / "trainer_state.json").read_text())["log_history"])
    run_train_script(tiny_train_args(out, *args, "--resume_from_checkpoint", "true"), env={"HF_TPU_EXT_TEST_KILL_AT": ""})
    results, ref_results = (json.loads((f / "all_results.json").read_text()) for f in (out, ref))
    assert ref_results["eval_loss"] > 0
    for key in ("eval_loss", "perplexity", "eval_accuracy"):
        assert results[key] == pytest.approx(ref_results[key], abs=1e-5), key
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [e["step"] for e in history if "eval_loss" in e] == [10]


def test_kill_at_every_phase_then_resume_ends_like_an_uninterrupted_run(loopback_hub, tmp_path):
    """kill -9 at each phase boundary in turn (each resume is killed at the next one), then a last resume:
    the folder is complete, the Hub holds the final state and trainer_state/weights equal a straight run's."""
    hub = loopback_hub
    ref, out = tmp_path / "straight", tmp_path / "killed"
    _run(ref, hub, "alice/straight")
    resume = ["--resume_from_checkpoint", "true"]

    _run(out, hub, REPO, kill_at="train")  # right after the first checkpoint (step 10)
    assert (out / "checkpoints" / "ckpt-10.index").is_file() and not (out / "checkpoints" / "ckpt-20.index").exists()
    saved = json.loads((out / "checkpoints" / "ckpt-10.trainer_state.json").read_text())
    assert saved["global_step"] == 10 and [e["step"] for e in saved["log_history"]] == [5, 10, 10]
    assert saved["best_global_step"] == 10

    _run(out, hub, REPO, *resume, kill_at="checkpoint")  # trained to 20, killed before the export
    assert (out / "checkpoints" / "ckpt-20.index").is_file()
    assert json.loads((out / "run_state.json").read_text())["phases"] == {"train": "done"}

    _run(out, hub, REPO, *resume, kill_at="export")  # model written, run files not
    assert (out / "model.safetensors").is_file()
    assert "export" not in json.loads((out / "run_state.json").read_text())["phases"]

    _run(out, hub, REPO, *resume, kill_at="card")
    _run(out, hub, REPO, *resume, kill_at="push")  # the final push is queued, the process dies
    phases = json.loads((out / "run_state.json").read_text())["phases"]
    assert phases == {"train": "done", "export": "done", "card": "done"}

    proc = _run(out, hub, REPO, *resume)
    assert "at global step 20" in proc.stderr
    assert "nothing to do" not in proc.stderr
    files_of = lambda folder: sorted(p.name for p in folder.iterdir() if p.is_file())  # noqa: E731
    assert files_of(out) == files_of(ref) and {"model.safetensors", "README.md", "run_state.json"} <= set(files_of(out))
    assert json.loads((out / "run_state.json").read_text())["phases"]["push"] == "pushed"
    _assert_same_run(out, ref)

    files = hub.server.files(REPO)
    assert hub.server.commits(REPO)[-1]["message"] == "End of training"  # the newest commit
    assert files["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 20
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["hub_pushes"]["final_pushed"] is True
    # the process killed during the final push is in the report too (its push is pending there, landed now)
    assert summary["hub_pushes"]["processes"] == 2 and summary["hub_pushes"]["pending"] == []
    # killed before the export: the export done by the resume writes every result and the whole card
    results, ref_results = (json.loads((f / "all_results.json").read_text()) for f in (out, ref))
    assert sorted(results) == sorted(ref_results)
    # the same card but for its figures (and the comment holding the card's hash); a duration is one figure
    # whatever its unit (card_render: "12.3 s", "1m 05s", "1h 02m 05s": a loaded machine crosses a minute)
    figures = lambda f: re.sub(r"(#h )?(#m )?#s\b|# s\b", "#s", re.sub(r"\d[\d,.]*(e[-+]?\d+)?", "#", re.sub(  # noqa: E731
        r"<!--.*?-->", "", (f / "README.md").read_text()))).replace("alice/straight", REPO).replace(
        "straight", REPO.split("/")[1])
    assert figures(out) == figures(ref)

    # a resume of the finished run changes nothing
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    proc = _run(out, hub, REPO, *resume)
    assert "nothing to do" in proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

    # resuming from the Hub repo, whose checkpoint is at max_steps, into a new folder: export, card, no training
    fresh = tmp_path / "from-hub"
    args = tiny_train_args(fresh, *COMMON[:-4], "--resume_from_checkpoint", REPO, "--hub_token", hub.token)
    proc = run_train_script(args, env={"HF_TPU_EXT_TEST_KILL_AT": ""})
    assert "finishing: export, card" in proc.stderr
    vocab = lambda folder: json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]  # noqa: E731
    assert vocab(fresh) == vocab(out)  # the checkpoint's tokenizer, not a new one
    _assert_same_run(fresh, ref)


def _copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


def _train(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(args))


def test_truncated_newest_checkpoint_falls_back_to_the_older_one(tmp_path, trained_model_dir, hf_log):
    from hf_tpu_ext.errors import CheckpointError

    run = _copy_run(trained_model_dir, tmp_path / "run")
    data = run / "checkpoints" / "ckpt-30.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    # named explicitly: a typed error that names the checkpoint and its files, no traceback of TF's
    with pytest.raises(CheckpointError, match=r"ckpt-30 cannot be read .*ckpt-30\.data-00000-of-00001, ckpt-30\.index\. Name an older checkpoint"):
        _train(tiny_train_args(tmp_path / "o", "--max_steps", "30",
                               "--resume_from_checkpoint", str(run / "checkpoints" / "ckpt-30")))
    assert not (tmp_path / "o").exists()
    # --resume_from_checkpoint true: a warning, then the intact ckpt-20 and 10 more steps
    results = _train(tiny_train_args(run, "--max_steps", "30", "--save_strategy", "steps", "--save_steps", "10",
                                     "--eval_strategy", "steps", "--eval_steps", "15", "--jit_compile", "true",
                                     "--callbacks", "", "--resume_from_checkpoint", "true"))
    assert "ckpt-30 cannot be read" in hf_log.text
    assert "Resuming from the next older checkpoint instead." in hf_log.text and "Delete" not in hf_log.text
    assert "ckpt-20 at global step 20" in hf_log.text
    assert results["global_step"] == 30
    state = json.loads((run / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [5, 10, 15, 20, 25, 30]
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == [15, 30]


def test_resume_into_a_new_folder_with_another_train_file_keeps_the_tokenizer(tmp_path, trained_model_dir):
    text = tmp_path / "other.txt"
    text.write_text("\n".join(f"Completely different words number {i} about gardens and rivers." for i in range(600)))
    out = tmp_path / "new"
    results = _train(tiny_train_args(out, "--max_steps", "32", "--eval_strategy", "no", "--save_strategy", "no",
                                     "--callbacks", "", "--train_file", str(text),
                                     "--resume_from_checkpoint", str(trained_model_dir / "checkpoints")))
    assert results["global_step"] == 32
    assert (out / "tokenizer.json").read_bytes() == (trained_model_dir / "tokenizer.json").read_bytes()
    state = json.loads((out / "trainer_state.json").read_text())
    assert min(e["step"] for e in state["log_history"] if "loss" in e) <= 30  # the history of the checkpoint


def _checksums(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tfrecord_validation_smaller_than_a_batch_changes_nothing(tmp_path, trained_model_dir):
    from hf_tpu_ext.commands.prepare_data import main as prepare
    from hf_tpu_ext.errors import CorpusTooSmallError

    shards = tmp_path / "shards"
    assert prepare(["--vocab_size", "400", "--max_seq_length", "32", "--num_shards", "1", "--output_path",
                    str(shards), "--max_train_samples", "64", "--max_eval_samples", "4"]) == 0
    existing = _copy_run(trained_model_dir, tmp_path / "existing")
    before = _checksums(existing)
    args = tiny_train_args(existing, "--train_file", str(shards), "--max_steps", "4", "--eval_strategy", "steps",
                           "--eval_steps", "2", "--overwrite_output_dir", "true")
    for flag in ("--max_train_samples", "--max_eval_samples", "--vocab_size"):
        i = args.index(flag)
        del args[i:i + 2]
    with pytest.raises(CorpusTooSmallError, match="hold 4 validation blocks .* fewer than one global batch of 8"):
        _train(args)
    assert _checksums(existing) == before
    new = tmp_path / "new"
    args[args.index(str(existing))] = str(new)
    with pytest.raises(CorpusTooSmallError):
        _train(args)
    assert not new.exists()  # the corrected rerun is not refused for a non-empty folder


def test_bad_numbers_and_unwritable_folder_fail_before_any_work(tmp_path):
    from hf_tpu_ext.errors import ArgumentError, OutputDirError

    with pytest.raises(ArgumentError, match="learning_rate"):
        _train(tiny_train_args(tmp_path / "o", "--learning_rate", "nan"))
    assert not (tmp_path / "o").exists()
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        start = time.perf_counter()
        with pytest.raises(OutputDirError, match="not writable"):
            _train(tiny_train_args(locked / "o", "--max_steps", "2"))
        assert time.perf_counter() - start < 5
    finally:
        locked.chmod(0o700)


def test_training_that_raises_reports_pending_pushes_and_cleans_staging(loopback_hub, tmp_path, hf_log, monkeypatch):
    import tf_keras

    from hf_tpu_ext.callbacks import register_callback

    @register_callback("test_raise_at_step_7", "Test only: raise FloatingPointError at step 7.")
    class RaiseAtStep(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) >= 7:
                raise FloatingPointError("Training loss became nan at global step 7")

    loopback_hub.server.latency(3.0, route="commit")  # the step-5 push is still uploading at step 7
    # a temp folder of this test's own: other processes on the machine stage their pushes in the shared one
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = set(os.listdir(tempfile.gettempdir()))
    with pytest.raises(FloatingPointError, match="global step 7"):
        _train(tiny_train_args(tmp_path / "o", "--max_steps", "20", "--save_strategy", "steps", "--save_steps", "5",
                               "--eval_strategy", "no", "--callbacks", "test_raise_at_step_7", "--push_to_hub", "true",
                               "--hub_model_id", REPO, "--hub_token", loopback_hub.token))
    assert "Training in progress, step 5" in hf_log.text and "not uploaded" in hf_log.text
    left = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith(("hf-tpu-push", "hf-tpu-ckpt"))}
    assert not left


@pytest.mark.parametrize("sig, token_flag", [(signal.SIGINT, ["--hub-token", None]), (signal.SIGTERM, ["--hub_token=*"])])
def test_a_signal_during_a_pushing_run_stops_with_the_resume_line(loopback_hub, tmp_path, sig, token_flag):
    """The console script (stderr filter, whole-process exit) stops at a step boundary mid-epoch, saves that step and
    pushes it as last-checkpoint/ (3 s per commit, 10 s grace): one line, exit 128+signum, the process gone within
    the grace budget, no spelling of the token flag in any output."""
    loopback_hub.server.latency(3.0, route="commit")  # an upload is still in flight when the signal comes
    out = tmp_path / "o"
    token = [loopback_hub.token if a is None else a.replace("*", loopback_hub.token) for a in token_flag]
    args = tiny_train_args(out, "--num_train_epochs", "1000", "--save_strategy", "epoch", "--eval_strategy", "no",
                           "--callbacks", "", "--jit_compile", "false", "--push_to_hub", "true", "--hub_model_id",
                           REPO, "--hub_strategy", "checkpoint", *token, "--save_on_signal_timeout", "10")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "hf_tpu_ext", "train", *args], env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = []
        for line in proc.stderr:  # wait until training runs
            lines.append(line)
            if "step 10 (epoch" in line:
                break
        start = time.monotonic()
        proc.send_signal(sig)
        _, rest = proc.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, "".join(lines[-20:]) + rest[-3000:]
    assert elapsed < 15, elapsed  # the process has exited, not only printed its line (10 s grace budget)
    last = rest.strip().splitlines()[-1]
    step = int(last.split(";")[0].rsplit(" ", 1)[1])
    assert last.startswith(f"interrupted at step {step}; ") and 10 <= step < 64  # mid-epoch
    assert [line for line in rest.splitlines() if line.startswith("interrupted")] == [last]
    hint = ("; resume with: hf-tpu train " + " ".join(
        shlex.quote(a) for a in args if a not in token) + " --resume_from_checkpoint true")
    assert last.endswith(hint), last
    assert "Traceback" not in rest and "RuntimeError" not in rest and "Interrupted again" not in rest
    _secret_free(out, loopback_hub.token, rest, "".join(lines))
    # a signal is a save: the step reached is checkpointed (with its state) and on the Hub as last-checkpoint/
    from hf_tpu_ext.backends.tensorflow.backend import TensorFlowBackend

    backend = TensorFlowBackend()
    newest = backend.find_checkpoints(str(out))[0]
    assert newest.endswith(f"ckpt-{step}") and backend.checkpoint_info(newest).trainer_state["global_step"] == step
    assert json.loads(loopback_hub.server.files(REPO)["last-checkpoint/trainer_state.json"])["global_step"] == step
    assert json.loads((out / "training_summary.json").read_text())["interrupted"]["not_pushed"] == []


def test_a_final_push_that_fails_is_an_error_and_a_resume_pushes_it(loopback_hub, tmp_path):
    from hf_tpu_ext.errors import HubPushError

    out = tmp_path / "o"
    args = tiny_train_args(out, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no", "--callbacks", "",
                           "--jit_compile", "false", "--push_to_hub", "true", "--hub_model_id", REPO,
                           "--hub_token", loopback_hub.token)
    loopback_hub.server.fail_next(1, status=403, route="commit")  # not retried
    with pytest.raises(HubPushError, match=r"final model \(step 4\) could not be pushed to alice/lifecycle"):
        _train(args)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["hub_pushes"]["final_pushed"] is False and summary["hub_pushes"]["failed"] == 1
    assert (out / "model.safetensors").is_file()  # the local folder is complete
    assert json.loads((out / "run_state.json").read_text())["phases"] == {"train": "done", "export": "done",
                                                                          "card": "done"}
    _train(args + ["--resume_from_checkpoint", "true"])  # only the push is left: it lands now
    assert loopback_hub.server.files(REPO)["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert json.loads((out / "run_state.json").read_text())["phases"]["push"] == "pushed"


# ---------------------------------------------------------------------------------------------- a signal is a save
# 20 steps without checkpoints but the final one (an epoch is 64 steps): only the signal saves in between
SIGNAL_RUN = ["--max_steps", "20", "--save_strategy", "epoch", "--eval_strategy", "steps", "--eval_steps", "10",
              "--jit_compile", "false"]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """The uninterrupted 20-step run the interrupted ones are compared with (log history, train_loss, weights)."""
    out = tmp_path_factory.mktemp("straight") / "o"
    _train(tiny_train_args(out, *SIGNAL_RUN, "--callbacks", ""))
    return out


SIGNALLED = []  # time.monotonic() of each signal sent by a _signal_at callback


def _signal_at(step, sig):
    """A registered tf_keras callback name that sends ``sig`` to this process after global step ``step``."""
    import tf_keras

    from hf_tpu_ext.callbacks import register_callback

    name = f"test_signal_{int(sig)}_at_{step}"

    @register_callback(name, "Test only: send a signal to this process after a global step.")
    class SignalAt(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == step:
                SIGNALLED.append(time.monotonic())
                os.kill(os.getpid(), sig)  # the run's handler records it; the loop stops at the step boundary

    return name


def _train_argv(args):
    """``train`` as the console runs it (``argv`` given: the resume line is built from it)."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(args), argv=["train", *args])


def _secret_free(folder, secret, *texts):
    """Neither ``texts`` nor any file under ``folder`` holds ``secret``."""
    for text in texts:
        assert secret not in text
    leaks = [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks, leaks


@pytest.mark.parametrize("sig, push", [(signal.SIGTERM, True), (signal.SIGINT, False)])
def test_a_signal_saves_the_step_reached_and_the_resume_ends_like_an_uninterrupted_run(
        loopback_hub, tmp_path, straight_run, hf_log, sig, push):
    """SIGTERM/SIGINT at step 13 (mid-epoch, between two logging steps): checkpoint of step 13 with its trainer
    state and logging window; with pushes (3 s Hub latency, 10 s grace budget) the Hub's last-checkpoint/ is
    at step 13; the resume starts there and ends with the log history, train_loss and weights of a straight run."""
    from hf_tpu_ext.errors import TrainingInterrupted

    out = tmp_path / "o"
    hub = ["--push_to_hub", "true", "--hub_strategy", "checkpoint", "--hub_model_id", REPO, "--hub-token",
           loopback_hub.token, "--save_on_signal_timeout", "10"] if push else []
    loopback_hub.server.latency(3.0, route="commit")
    args = tiny_train_args(out, *SIGNAL_RUN, *hub)
    with pytest.raises(TrainingInterrupted) as stop:
        _train_argv(args + ["--callbacks", _signal_at(13, sig)])
    assert stop.value.signum == sig and stop.value.step == 13
    assert str(stop.value).startswith("interrupted at step 13; resume with: hf-tpu train --output_dir ")
    ckpt = out / "checkpoints"
    state = json.loads((ckpt / "ckpt-13.trainer_state.json").read_text())
    assert state["global_step"] == 13 and [e["step"] for e in state["log_history"]] == [5, 10, 10]
    sidecar = json.loads((ckpt / "ckpt-13.json").read_text())
    assert sidecar["loss_window"]["steps"] == 3 and sidecar["trainer_state"] == "ckpt-13.trainer_state.json"
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"] == {"signal": signal.Signals(sig).name, "global_step": 13,
                                      "checkpoint": os.path.join("checkpoints", "ckpt-13"),
                                      "save_on_signal_timeout": 10.0 if push else 25.0, "not_pushed": []}
    if push:
        files = loopback_hub.server.files(REPO)
        assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 13
        assert "last-checkpoint/ckpt-13.index" in files
        assert summary["hub_pushes"]["pushed"] == 1 and summary["hub_pushes"]["pending"] == []
        _secret_free(out, loopback_hub.token, str(stop.value), hf_log.text)

    loopback_hub.server.latency(0.0, route="commit")
    _train_argv(args + ["--callbacks", "", "--resume_from_checkpoint", "true"])
    assert "ckpt-13 at global step 13" in hf_log.text
    _assert_same_run(out, straight_run)  # log history (the step-15 mean over steps 11-15), train_loss, weights
    if push:
        summary = json.loads((out / "training_summary.json").read_text())
        assert summary["hub_pushes"]["processes"] == 2 and summary["hub_pushes"]["pushed"] == 2  # both processes
        assert summary["hub_pushes"]["final_pushed"] is True and "interrupted" not in summary
        _secret_free(out, loopback_hub.token, hf_log.text)


def test_a_signal_whose_push_outlasts_the_grace_budget_reports_it(loopback_hub, tmp_path, hf_log):
    """3 s per commit, 1 s of grace: the run exits about 1 s after the signal (0.9 s of waiting); the push that did not land is
    in the log and in training_summary.json; the token from a JSON config is in no output."""
    from hf_tpu_ext.errors import TrainingInterrupted

    loopback_hub.server.latency(3.0, route="commit")
    out = tmp_path / "o"
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"hub_token": loopback_hub.token, "push_to_hub": True, "hub_model_id": REPO,
                                  "hub_strategy": "checkpoint", "save_on_signal_timeout": 1}))
    args = [str(config)] + tiny_train_args(out, *SIGNAL_RUN, "--callbacks", _signal_at(7, signal.SIGTERM))
    with pytest.raises(TrainingInterrupted) as stop:
        _train_argv(args)
    stopped = time.monotonic() - SIGNALLED[-1]  # the save of step 7, 1 s of waiting, the report
    assert stop.value.signum == signal.SIGTERM and stop.value.step == 7
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["interrupted"]["not_pushed"] == ["Training in progress, step 7"]
    assert ("SIGTERM: not on the Hub within the 1s grace budget (--save_on_signal_timeout): Training in progress, "
            "step 7; the local folder has it.") in hf_log.text
    assert (out / "checkpoints" / "ckpt-7.trainer_state.json").is_file()
    # waited out the grace budget less its exit reserve (a tenth: 0.1 s), not the 3 s the commit takes, nor the
    # pusher's 600 s timeout
    assert 0.9 <= stopped < 8.0, stopped
    assert str(stop.value).endswith(f"resume with: hf-tpu train {config} " + " ".join(
        shlex.quote(a) for a in args[1:]) + " --resume_from_checkpoint true")
    _secret_free(out, loopback_hub.token, str(stop.value), hf_log.text)


def test_a_kill_between_the_weights_and_the_state_of_a_checkpoint_resumes_from_the_one_before(
        tmp_path, straight_run, hf_log):
    """kill -9 after ckpt-20's weight files, before its trainer state: the resume skips the incomplete ckpt-20,
    removes its files, continues from ckpt-10 and ends like a straight run; nothing temporary is left."""
    out = tmp_path / "o"
    args = tiny_train_args(out, *SIGNAL_RUN, "--callbacks", "", "--save_strategy", "steps", "--save_steps", "10")
    proc = run_train_script(args, env={"HF_TPU_EXT_TEST_KILL_AT": "checkpoint_weights@20"}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckpt = out / "checkpoints"
    assert (ckpt / "ckpt-20.index").is_file() and not (ckpt / "ckpt-20.trainer_state.json").exists()
    assert (ckpt / "checkpoint").read_text().splitlines()[0] == 'model_checkpoint_path: "ckpt-10"'
    (out / ".tf_model.h5.x1y2.tmp").write_bytes(b"half an export")  # what a kill inside an export leaves
    (ckpt / "ckpt-20_temp").mkdir()  # and one inside TensorFlow's own save
    (ckpt / "ckpt-20_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")

    _train(args + ["--resume_from_checkpoint", "true"])
    assert "ckpt-20 is incomplete" in hf_log.text and "ckpt-10 at global step 10" in hf_log.text
    _assert_same_run(out, straight_run)
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["checkpoint", "ckpt-10.data-00000-of-00001", "ckpt-10.index", "ckpt-10.json",
                     "ckpt-10.trainer_state.json", "ckpt-20.data-00000-of-00001", "ckpt-20.index", "ckpt-20.json",
                     "ckpt-20.trainer_state.json"]
    assert not [p for p in out.rglob("*") if p.name.endswith((".tmp", "_temp"))]


def test_one_sigint_during_the_final_push_lets_it_land(loopback_hub, tmp_path, hf_log, monkeypatch):
    """A first Ctrl-C while the final push uploads (3 s per commit) is no "Interrupted again": the push gets the
    grace budget, lands, and the run ends complete."""
    import threading

    from hf_tpu_ext import interrupts

    real_wait = interrupts.wait_until

    def wait_and_signal(done, timeout, poll=0.1):  # Ctrl-C half a second into the wait for the final push
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        return real_wait(done, timeout, poll)

    monkeypatch.setattr(interrupts, "wait_until", wait_and_signal)
    loopback_hub.server.latency(3.0, route="commit")
    out = tmp_path / "o"
    results = _train_argv(tiny_train_args(out, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no",
                                          "--callbacks", "", "--jit_compile", "false", "--push_to_hub", "true",
                                          "--hub_model_id", REPO, "--hub_token", loopback_hub.token))
    assert results["global_step"] == 4
    assert "Interrupted again" not in hf_log.text and "not uploaded" not in hf_log.text
    assert loopback_hub.server.commits(REPO)[-1]["message"] == "End of training"
    assert json.loads((out / "run_state.json").read_text())["phases"]["push"] == "pushed"


def test_a_sigterm_before_the_first_checkpoint_says_to_rerun_the_same_command(tmp_path):
    """SIGTERM once the data are ready, before the model exists: exit 143, no checkpoint, and the last line is
    the same command (no --resume_from_checkpoint, which would find nothing); that command then trains."""
    out = tmp_path / "early"
    args = tiny_train_args(out, "--max_steps", "4", "--eval_strategy", "no", "--save_strategy", "no",
                           "--callbacks", "")
    stopped = run_train_script(args, env={"HF_TPU_EXT_TEST_SIGNAL_AT": "data"}, check=False)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert not (out / "checkpoints").exists()
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted at step 0; no checkpoint was saved yet; rerun: hf-tpu train ")
    hinted = shlex.split(last.split("; rerun: ", 1)[1])[2:]
    assert "--resume_from_checkpoint" not in hinted
    assert hinted[:len(args)] == [str(a) for a in args]
    run_train_script(hinted)
    assert json.loads((out / "training_summary.json").read_text())["global_step"] == 4
