"""`hf-tpu train --backend keras` (Keras 3 on JAX): the run, exact resume, data parallel, accumulation, one compile.

One uninterrupted tiny run (session fixture, in this process) is the reference: 12 steps, dropout on, constant
learning rate (so a run extended from a shorter one follows the same curve), checkpoints every 4 steps. Resumed
runs -- after a SIGKILL right after a checkpoint off a logging boundary, after a SIGKILL right after the final
checkpoint, and from the loopback Hub's ``last-checkpoint/`` into a new folder -- must end with its weights (1e-5),
its log history (timing keys aside) and its all_results.json keys; ``--steps_per_execution 4`` trains the same
weights with its entries at call boundaries. The step itself is checked in a subprocess with 4 simulated CPU devices (``XLA_FLAGS``): 4 devices, 1
device and 4 accumulated micro-batches of 8 give the same losses and weights for a 32-sequence batch.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TIMING_KEYS = ("tokens_per_second", "mfu")
STEPS = 12


def keras_args(output_dir, *extra, steps=STEPS):
    """A tiny `--backend keras` run on the embedded corpus, dropout on (keyed by step: resumable)."""
    return ["--backend", "keras", "--output_dir", str(output_dir),
            "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2",
            "--intermediate_size", "64", "--vocab_size", "300", "--max_seq_length", "32",
            "--hidden_dropout_prob", "0.1", "--attention_probs_dropout_prob", "0.1",
            "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
            "--max_train_samples", "256", "--max_eval_samples", "32", "--logging_steps", "2",
            "--learning_rate", "1e-3", "--lr_scheduler_type", "constant", "--weight_decay", "0.01",
            "--max_steps", str(steps), "--save_steps", "4", "--eval_steps", "6", "--seed", "7",
            "--disable_tqdm", "true", *extra]


def _train_here(args):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    return train(*parse_args(list(map(str, args))))


def _train_process(args, kill_at=None, timeout=600, signal_at=None):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("HF_TPU_EXT_TEST_KILL_AT", None)
    env.pop("HF_TPU_EXT_TEST_SIGNAL_AT", None)
    if kill_at:
        env["HF_TPU_EXT_TEST_KILL_AT"] = kill_at
    if signal_at:  # SIGTERM (once) at that phase: a preemption
        env["HF_TPU_EXT_TEST_SIGNAL_AT"] = signal_at
    return subprocess.run([sys.executable, "-m", "hf_tpu_ext", "train", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _weights(folder):
    from safetensors.numpy import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def _history(folder):
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return [{k: v for k, v in e.items() if k not in TIMING_KEYS} for e in state["log_history"]]


def _assert_same_run(folder, reference, final_eval_of_shorter_run=None):
    ours, ref = _weights(folder), _weights(reference)
    assert sorted(ours) == sorted(ref)
    for name in ref:
        np.testing.assert_allclose(ours[name], ref[name], atol=1e-5, rtol=0, err_msg=name)
    got, want = _history(folder), _history(reference)
    if final_eval_of_shorter_run is not None:  # the shorter run's end-of-training evaluation, kept in its history
        extra = [e for e in got if e.get("step") == final_eval_of_shorter_run and "eval_loss" in e]
        assert len(extra) == 1
        got.remove(extra[0])
    assert [sorted(e) for e in got] == [sorted(e) for e in want]
    for a, b in zip(got, want):
        for k in b:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a, b)


@pytest.fixture(scope="session")
def keras_run(tmp_path_factory):
    """The uninterrupted reference run: (output_dir, results)."""
    out = tmp_path_factory.mktemp("keras") / "run"
    results = _train_here(keras_args(out))
    return out, results


def test_run_outputs(keras_run):
    out, results = keras_run
    for name in ("config.json", "tokenizer.json", "model.safetensors", "trainer_state.json", "all_results.json",
                 "training_summary.json", "run_state.json", "loss_curve.png", "README.md"):
        assert (out / name).is_file(), name
    # save_steps 4: checkpoints 4, 8, 12, the newest two kept (--save_total_limit's default 2), each with the
    # run's trainer state of its step
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-8"]
    for step in (8, 12):
        state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert state["global_step"] == step
    assert not list(out.glob(".checkpoint-*")), "a temporary checkpoint folder was left behind"
    history = _history(out)
    assert [e["step"] for e in history if "loss" in e] == [2, 4, 6, 8, 10, 12]
    assert [e["step"] for e in history if "eval_loss" in e] == [6, 12]
    assert all(np.isfinite(e["loss"]) for e in history if "loss" in e)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["backend"] == "keras"
    assert json.loads((out / "run_state.json").read_text())["phases"]["export"] == "done"
    assert results["global_step"] == STEPS
    # one XLA compilation of the train step over the whole run, counted from JAX's compile events
    assert results["xla_step_compilations"] == 1


def test_transformers_loads_the_export(keras_run):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForMaskedLM

    out, _ = keras_run
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[0, 5, 6, 4, 2]])).logits
    assert tuple(logits.shape) == (1, 5, model.config.vocab_size) and torch.isfinite(logits).all()


def test_resume_from_hub_into_new_folder(keras_run, loopback_hub, tmp_path):
    reference, _ = keras_run
    repo = "alice/tiny-keras-backend"
    pushed = tmp_path / "pushed"
    _train_here(keras_args(pushed, "--push_to_hub", "true", "--hub_model_id", repo, "--hub_strategy", "checkpoint",
                           "--hub_token", loopback_hub.token, steps=8))
    from huggingface_hub import HfApi

    files = HfApi(token=loopback_hub.token).list_repo_files(repo)
    assert "last-checkpoint/model_state.safetensors" in files and "model.safetensors" in files
    resumed = tmp_path / "resumed"
    _train_here(keras_args(resumed, "--resume_from_checkpoint", repo, "--hub_token", loopback_hub.token))
    assert json.loads((resumed / "trainer_state.json").read_text())["global_step"] == STEPS
    # the 8-step run evaluated at its end (step 8); otherwise the history is the uninterrupted run's
    _assert_same_run(resumed, reference, final_eval_of_shorter_run=8)


def test_sigterm_after_an_epoch_save_with_accumulation_resumes_to_the_same_losses(tmp_path):
    """Gradient accumulation 2, a save at each epoch's end (4 steps), logging every 3: SIGTERM while saving step 8
    (steps 7 and 8 in the open window), resume: every logged loss and ``train_loss`` are the uninterrupted run's."""
    def args(out, *extra):
        base = keras_args(out, "--max_train_samples", "64", "--gradient_accumulation_steps", "2", "--save_strategy",
                          "epoch", "--logging_steps", "3", *extra)
        i = base.index("--save_steps")
        return base[:i] + base[i + 2:]

    reference = tmp_path / "uninterrupted"
    ref_results = _train_here(args(reference))
    out = tmp_path / "sigterm"
    proc = _train_process(args(out), signal_at="checkpoint_weights@8")
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]  # stopped at 8
    proc = _train_process(args(out, "--resume_from_checkpoint", "true"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = _history(out), _history(reference)
    assert [e["step"] for e in want if "loss" in e] == [3, 6, 9, 12]
    assert [sorted(e) for e in got] == [sorted(e) for e in want]
    for a, b in zip(got, want):
        assert a == pytest.approx(b, abs=1e-6), (a, b)
    ours = json.loads((out / "all_results.json").read_text())
    assert ours["train_loss"] == pytest.approx(ref_results["train_loss"], abs=1e-6)


def test_a_sigterm_after_the_results_ends_the_console_process_with_0_and_one_line(tmp_path):
    """The console script after a complete run (results printed, interpreter teardown ahead): a SIGTERM there is
    no failure (issue 31: it ended a complete run with 143 and no word); the process says so and exits 0."""
    out = tmp_path / "late"
    proc = _train_process(keras_args(out, steps=4), signal_at="after_results")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.rstrip().splitlines()[-1] == (
        f"SIGTERM received after the run finished: nothing left to save; the run is complete in {out}.")
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["global_step"] == 4
    assert json.loads((out / "run_state.json").read_text())["phases"]["card"] == "done"


DEVICES_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, jax
    from types import SimpleNamespace
    from transformers import RobertaConfig
    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.backends.keras.optimization import make_optimizer
    from hf_tpu_ext.backends.keras.placement import Placement
    from hf_tpu_ext.backends.keras.step import make_train_step, split_micro_batches, state_to_host
    from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches

    args = SimpleNamespace(lr_scheduler_type="linear", learning_rate=1e-3, num_warmup_steps=lambda total: 2,
                           max_grad_norm=1.0, optim="adamw_torch", weight_decay=0.01, adam_beta1=0.9,
                           adam_beta2=0.999, adam_epsilon=1e-8)
    config = RobertaConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=34)
    blocks = np.random.default_rng(0).integers(5, 120, size=(96, 32)).astype(np.int32)
    batches = TrainBatches(blocks, 32, 3, NumpyMasker(4, 120, [0, 1, 2, 3, 4], 5, 1))
    out = {"devices": jax.device_count()}
    for name, devices, accumulation in (("one", jax.devices()[:1], 1), ("four", jax.devices(), 1),
                                        ("accumulated", jax.devices()[:1], 4)):
        model = build_masked_lm(config, seed=0)  # dropout 0.1 on: the masks must not depend on the split
        optimizer, _ = make_optimizer(args, 10)
        optimizer.build(model.trainable_variables)
        place = Placement(devices)
        step = jax.jit(make_train_step(model, optimizer, 3, accumulation, bf16_dots=True), donate_argnums=(0,))
        state = tuple(place.put_replicated([v.value for v in vs]) for vs in
                      (model.trainable_variables, model.non_trainable_variables, optimizer.variables))
        losses = []
        for s in range(5):
            batch = place.put_batch(split_micro_batches(batches(s), accumulation), axis=1)
            state, loss_sum, count = step(state, batch, np.int32(s))
            losses.append(float(loss_sum) / float(count))
        out[name] = {"losses": losses, "weights": [w.ravel()[:64].tolist() for w in state_to_host(state)[0]],
                     "shards": len(batch["input_ids"].sharding.device_set), "compiled": step._cache_size()}
    print("RESULT" + json.dumps(out))
""")


def test_four_devices_and_accumulation_match_one_device():
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", DEVICES_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["devices"] == 4
    assert (result["one"]["shards"], result["four"]["shards"]) == (1, 4)
    for name in ("four", "accumulated"):
        np.testing.assert_allclose(result[name]["losses"], result["one"]["losses"], atol=1e-5, rtol=0)
        for a, b in zip(result[name]["weights"], result["one"]["weights"]):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
        assert result[name]["compiled"] == 1
    assert result["one"]["losses"][-1] < result["one"]["losses"][0]


def test_numpy_masking_follows_the_batch_contract():
    from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches

    rng = np.random.default_rng(1)
    blocks = rng.integers(5, 60, size=(40, 16)).astype(np.int32)
    blocks[:, 0], blocks[:, -1] = 0, 2  # <s> ... </s>: special, never chosen
    blocks[3, 1:12] = 1  # a mostly padded row: fewer maskable tokens (3) than P
    masker = NumpyMasker(mask_token_id=4, vocab_size=60, special_token_ids=[0, 1, 2, 3, 4], max_predictions=5,
                         pad_token_id=1)
    batch = masker(blocks, (7, 0, 3))
    assert {k: (v.dtype.name, v.shape) for k, v in batch.items()} == {
        "input_ids": ("int32", (40, 16)), "attention_mask": ("int32", (40, 16)),
        "masked_lm_positions": ("int32", (40, 5)), "masked_lm_ids": ("int32", (40, 5)),
        "masked_lm_weights": ("float32", (40, 5))}
    weights, positions = batch["masked_lm_weights"], batch["masked_lm_positions"]
    assert weights.sum(axis=1).tolist() == [5.0] * 3 + [3.0] + [5.0] * 36
    for row in range(40):
        real = positions[row][weights[row] == 1]
        assert (np.diff(real) > 0).all() and not np.isin(blocks[row, real], [0, 1, 2, 3, 4]).any()
        assert (positions[row][weights[row] == 0] == 0).all()
        np.testing.assert_array_equal(batch["masked_lm_ids"][row][weights[row] == 1], blocks[row, real])
    unchanged = np.ones_like(blocks, bool)
    unchanged[np.repeat(np.arange(40), 5)[weights.ravel() == 1], positions.ravel()[weights.ravel() == 1]] = False
    np.testing.assert_array_equal(batch["input_ids"][unchanged], blocks[unchanged])  # only chosen positions change
    assert (batch["attention_mask"][3, 1:12] == 0).all() and batch["attention_mask"][0].all()
    # seeded by (seed, step): the same step gives the same batch in any order; another step other masks
    train = TrainBatches(blocks, 8, 7, masker)
    later = train(6)
    for k, v in TrainBatches(blocks, 8, 7, masker)(6).items():
        np.testing.assert_array_equal(v, later[k])
    assert not np.array_equal(train(0)["masked_lm_positions"], train(1)["masked_lm_positions"])
    # an epoch (5 steps of 8) is a permutation of the 40 blocks, each epoch another one; step 5 opens epoch 1
    assert sorted(train.order(0).tolist()) == list(range(40))
    assert not np.array_equal(train.order(0), train.order(1))
    rows = blocks[train.order(1)[:8]]
    step5 = train(5)
    np.testing.assert_array_equal(step5["masked_lm_ids"] * step5["masked_lm_weights"].astype(np.int32),
                                  np.take_along_axis(rows, step5["masked_lm_positions"], 1)
                                  * step5["masked_lm_weights"].astype(np.int32))


def test_checkpoint_leftovers_are_removed_and_never_resumed(tmp_path):
    from hf_tpu_ext.backends.keras import checkpoint as ckpt

    host = ckpt._owner_tag().rsplit("-", 1)[0]
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f".checkpoint-12.tmp-{host}-{int(ended.stdout)}"  # a save killed before its rename
    meta = {"model_config": {"hidden_size": 8}}
    first = ckpt.save_checkpoint(str(tmp_path), 4, {"w": np.ones((2, 3), np.float32)}, {"00000/it": np.zeros((), np.int64)},
                                 meta)
    (Path(first) / ckpt.STATE_NAME).write_text(json.dumps({"global_step": 4, "log_history": []}))
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        running = f".checkpoint-16.tmp-{host}-{live.pid}"  # another process of this host saving right now
        other_host = f".checkpoint-16.tmp-{host}x-other-{live.pid}"  # a shared folder's other host: not checkable
        for name in (dead, running, other_host):
            (tmp_path / name).mkdir()
        ckpt.save_checkpoint(str(tmp_path), 8, {"w": np.zeros((2, 3), np.float32)}, {"00000/it": np.ones((), np.int64)},
                             meta)
        assert not (tmp_path / dead).exists() and (tmp_path / running).is_dir() and (tmp_path / other_host).is_dir()
        (tmp_path / dead).mkdir()
        assert [Path(p).name for p in ckpt.find_checkpoints(str(tmp_path))] == ["checkpoint-8", "checkpoint-4"]
        assert ckpt.is_checkpoint_folder(first) and not ckpt.is_checkpoint_folder(str(tmp_path / dead))
        # checkpoint-8 has no trainer state (killed between the weights and the run's state): incomplete
        assert ckpt.remove_incomplete(str(tmp_path)) == [dead, "checkpoint-8"]
    finally:
        live.kill()
        live.wait()
    assert ckpt.remove_incomplete(str(tmp_path)) == [running]  # its process ended
    assert (tmp_path / other_host).is_dir()
    assert [Path(p).name for p in ckpt.find_checkpoints(str(tmp_path))] == ["checkpoint-4"]
    np.testing.assert_array_equal(ckpt.load_tensors(first, ckpt.MODEL_NAME)["w"], np.ones((2, 3)))
    data = Path(first) / ckpt.OPTIMIZER_NAME
    data.write_bytes(data.read_bytes()[:20])  # truncated
    with pytest.raises(Exception) as err:
        ckpt.load_tensors(first, ckpt.OPTIMIZER_NAME)
    assert type(err.value).__name__ == "CheckpointError" and "optimizer_state.safetensors" in str(err.value)


def test_resume_with_another_optim_names_the_checkpoints(keras_run, tmp_path):
    """--optim adafactor on an adamw_torch checkpoint: the message names both optimizers (checkpoint.json ``optim``);
    a checkpoint written before ``optim`` was kept falls back to the variable counts."""
    import shutil

    reference, _ = keras_run
    ckpt = tmp_path / "checkpoint-12"
    shutil.copytree(reference / "checkpoint-12", ckpt)
    assert json.loads((ckpt / "checkpoint.json").read_text())["optim"] == "adamw_torch"
    args = keras_args(tmp_path / "run", "--optim", "adafactor", "--resume_from_checkpoint", str(ckpt))
    with pytest.raises(Exception) as err:
        _train_here(args)
    assert type(err.value).__name__ == "CheckpointError"
    assert str(err.value) == (f"--optim adafactor contradicts the checkpoint {ckpt} (trained with --optim adamw_torch): "
                              "drop --optim or start a new run in another --output_dir.")
    meta_file = ckpt / "checkpoint.json"
    meta = json.loads(meta_file.read_text())
    del meta["optim"]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(Exception) as err:
        _train_here(args)
    assert "(its optimizer state has " in str(err.value) and "variables, --optim adafactor " in str(err.value)


def test_backend_registry():
    from hf_tpu_ext.backends import BACKEND_REGISTRY, backend_entry, make_backend
    from hf_tpu_ext.errors import BackendError

    assert backend_entry("keras").callback_kind == "keras" and backend_entry("keras").extra == "jax"
    assert backend_entry(None) is BACKEND_REGISTRY["keras"]  # Keras 3 + JAX here: the default (console.default_backend)
    backend = make_backend("keras")
    assert (backend.name, backend.callback_kind, backend.checks_interrupts, backend.processes_to_spawn) == (
        "keras", "keras", True, 0)
    with pytest.raises(BackendError, match="Unknown --backend 'jaxx': use one of tensorflow, torch_xla, keras"):
        make_backend("jaxx")


def test_flags_of_the_tensorflow_loop_are_refused():
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError) as err:
        parse_args(["--backend", "keras", "--output_dir", "x", "--tpu_name", "local"])
    assert str(err.value) == ("--tpu_name only applies to --backend tensorflow (--backend keras compiles every step "
                              "with XLA and uses every device JAX sees); drop it.")
    assert parse_args(["--backend", "keras", "--output_dir", "x", "--steps_per_execution", "4"])[2] \
        .steps_per_execution == 4
    with pytest.raises(ArgumentError) as err:
        parse_args(["--backend", "keras", "--output_dir", "x", "--steps_per_execution", "0"])
    assert str(err.value) == "--steps_per_execution must be >= 1, got 0."
    # transformers' Adafactor is not a flag of the TensorFlow loop: tests/current/test_keras_parity.py
    assert parse_args(["--backend", "keras", "--output_dir", "x", "--optim", "adafactor"])[2].optim == "adafactor"


def test_steps_per_execution_4_equals_1(keras_run, tmp_path):
    """4 optimizer steps per device call train the reference's weights; logs, evaluations and saves happen at call
    boundaries, a cadence 4 does not divide (evaluation every 6) at the first boundary past each multiple."""
    reference, ref_results = keras_run
    out = tmp_path / "spe4"
    results = _train_here(keras_args(out, "--steps_per_execution", "4"))
    ours, ref = _weights(out), _weights(reference)
    for name in ref:
        np.testing.assert_allclose(ours[name], ref[name], atol=1e-5, rtol=0, err_msg=name)
    got, want = _history(out), _history(reference)
    ref_loss = {e["step"]: e["loss"] for e in want if "loss" in e}
    # logging every 2 steps: one entry per call (steps 4, 8, 12), the mean of the reference's two windows
    assert [e["step"] for e in got if "loss" in e] == [4, 8, 12]
    for e in got:
        if "loss" in e:
            assert e["loss"] == pytest.approx((ref_loss[e["step"] - 2] + ref_loss[e["step"]]) / 2, abs=1e-6)
    assert [e["step"] for e in got if "eval_loss" in e] == [8, 12]
    assert [e for e in got if "eval_loss" in e][-1] == pytest.approx([e for e in want if "eval_loss" in e][-1])
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-8"]
    assert results["train_loss"] == pytest.approx(ref_results["train_loss"], abs=1e-6)
    assert results["xla_step_compilations"] == 1
    assert json.loads((out / "training_summary.json").read_text())["steps_per_execution"] == 4


def test_resume_off_a_logging_boundary_and_after_the_final_checkpoint(keras_run, tmp_path):
    """SIGKILL right after checkpoint-5 (logging every 2: step 5 is in the window of step 6), resume, SIGKILL right
    after the final checkpoint (before the process recorded its figures), resume (export only): every logged loss,
    ``train_loss`` and the weights are the uninterrupted run's, and all_results.json has every key the uninterrupted
    run's has (what only the training process measured); the card reports the MFU."""
    reference, _ = keras_run
    out = tmp_path / "off-boundary"
    proc = _train_process(keras_args(out, "--save_steps", "5"), kill_at="train")  # the first save: step 5
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-5"]
    assert not (out / "model.safetensors").exists()
    window = json.loads((out / "checkpoint-5" / "checkpoint.json").read_text())["loss_window"]
    assert window["steps"] == 1 and 0 < window["loss_sum"] < 20  # step 5's loss; the entry at 6 checks its value
    proc = _train_process(keras_args(out, "--save_steps", "12", "--resume_from_checkpoint", "true"), kill_at="train")
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert "resuming from" in proc.stderr and "checkpoint-5" in proc.stderr
    assert (out / "checkpoint-12").is_dir() and not (out / "all_results.json").exists()
    proc = _train_process(keras_args(out, "--save_steps", "12", "--resume_from_checkpoint", "true"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same_run(out, reference)
    ours, ref = (json.loads((d / "all_results.json").read_text()) for d in (out, reference))
    assert ours["train_loss"] == pytest.approx(ref["train_loss"], abs=1e-6)
    assert sorted(set(ref) - set(ours)) == []
    assert ours["steady_tokens_per_second"] > 0 and 0 < ours["mfu"] <= 1
    assert "MFU | n/a" not in (out / "README.md").read_text()


def test_best_model_survives_a_kill_and_is_exported(tmp_path):
    """--load_best_model_at_end keeps the best evaluation's weights on disk (checkpoints/best/): a run killed while
    saving step 6 and resumed from checkpoint-4 exports exactly the weights of its best evaluation's checkpoint."""
    from safetensors.numpy import load_file

    out = tmp_path / "best"
    args = keras_args(out, "--max_steps", "8", "--save_steps", "2", "--eval_steps", "2", "--load_best_model_at_end",
                      "true", "--metric_for_best_model", "accuracy", "--greater_is_better", "true",
                      "--save_total_limit", "10", steps=8)  # every checkpoint kept: the test compares with them
    proc = _train_process(args, kill_at="checkpoint_weights@6")
    assert proc.returncode == -9, proc.stderr[-3000:]
    # "saved" is said of a complete checkpoint only (its trainer state written): 4 was, 6 was cut short
    assert f"saved checkpoint {out / 'checkpoint-4'}" in proc.stderr
    assert "checkpoint-6" not in proc.stderr
    assert (out / "checkpoints" / "best" / "model_state.safetensors").is_file()
    proc = _train_process(args + ["--resume_from_checkpoint", "true"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoint-4" in proc.stderr and "loaded the best model of step" in proc.stderr

    state = json.loads((out / "trainer_state.json").read_text())
    evals = [(e["step"], e["eval_accuracy"]) for e in state["log_history"] if "eval_accuracy" in e and e["step"] > 0]
    assert [s for s, _ in evals] == [2, 4, 6, 8]
    best_step = max(evals, key=lambda e: (e[1], -e[0]))[0]  # highest accuracy, the earliest of ties
    assert state["best_global_step"] == best_step
    kept = load_file(str(out / "checkpoints" / "best" / "model_state.safetensors"))
    at_best = load_file(str(out / f"checkpoint-{best_step}" / "model_state.safetensors"))
    assert set(kept) <= set(at_best) and len(kept) > 10
    for name, value in kept.items():
        np.testing.assert_allclose(value, at_best[name], atol=1e-6, err_msg=name)
    exported = _weights(out)["roberta.embeddings.word_embeddings.weight"]
    token_embedding = next(k for k in at_best if k.endswith("word_embeddings/embeddings"))  # the model's own path
    np.testing.assert_allclose(exported, at_best[token_embedding], atol=1e-6)
    if best_step != 8:  # the export is the best, not the last step's weights
        last = load_file(str(out / "checkpoint-8" / "model_state.safetensors"))[token_embedding]
        assert not np.allclose(exported, last, atol=1e-6)


def test_the_jax_gpu_bf16_check_reads_the_devices_compute_capability():
    """`--bf16 auto` on a JAX GPU: bf16 tensor cores from compute capability 8.0 (A100 8.0, H100 9.0, V100 7.0 not);
    a device without the attribute (ROCm) counts as native."""
    from types import SimpleNamespace

    from hf_tpu_ext.backends.keras.backend import _jax_gpu_has_bf16

    assert [_jax_gpu_has_bf16(SimpleNamespace(compute_capability=c)) for c in ("7.0", "7.5", "8.0", "9.0", "10.0")] \
        == [False, False, True, True, True]
    assert _jax_gpu_has_bf16(SimpleNamespace()) is True
