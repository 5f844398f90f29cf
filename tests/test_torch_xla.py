"""`hf-tpu train --backend torch_xla` and the torch callbacks on the XLA CPU device (skipped without torch_xla).

Everything runs in this one process: XLA's compilation cache is per process, so the later runs (resume,
Hub pushes) reuse the graphs the first run compiled and take seconds.
"""

import importlib.util
import json
import math
import os
import shutil

import numpy as np
import pytest

if importlib.util.find_spec("torch_xla") is None:  # before touching the environment of the other tests
    pytest.skip("torch_xla is not installed (scripts/test_env_torch_xla.sh installs it)", allow_module_level=True)
# before torch_xla/transformers are imported: XLA on the CPU, cheap compiles, transformers without TensorFlow
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

torch_xla = pytest.importorskip("torch_xla")
import torch  # noqa: E402

from conftest import tiny_train_args  # noqa: E402

pytestmark = pytest.mark.torch_xla

TF_LAYOUT = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "training_args.json", "trainer_state.json", "all_results.json", "training_summary.json", "loss_curve.png",
             "README.md", "runs"}
STEPS = 20


def _cli(args):
    from hf_tpu_ext.cli import main

    return main(["train", *map(str, args)])


@pytest.fixture(scope="session")
def xla_run(tmp_path_factory):
    """One tiny `hf-tpu train --backend torch_xla` run: 20 steps, checkpoints and evaluations every 10."""
    out = tmp_path_factory.mktemp("xla") / "model"
    rc = _cli(tiny_train_args(out, "--backend", "torch_xla", "--max_steps", STEPS, "--save_strategy", "steps",
                              "--save_steps", 10, "--eval_strategy", "steps", "--eval_steps", 10,
                              "--callbacks", "throughput,xla_recompile_guard"))
    assert rc == 0
    with open(out / "all_results.json") as f:
        return out, json.load(f)


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_output_folder_layout(xla_run):
    out, results = xla_run
    names = set(os.listdir(out))
    assert TF_LAYOUT <= names
    assert {n for n in names if n.startswith("checkpoint-")} == {"checkpoint-10", "checkpoint-20"}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= set(
        os.listdir(out / "checkpoint-20"))
    assert os.listdir(out / "runs")  # TensorBoard events
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_weights_are_pytorch_format_and_load(xla_run):
    from safetensors import safe_open
    from transformers import AutoModelForMaskedLM

    out, _ = xla_run
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
    # tied weights once, under the names the TF export writes
    assert {"roberta.embeddings.word_embeddings.weight", "lm_head.bias", "lm_head.dense.weight"} <= keys
    assert not {k for k in keys if k.startswith("lm_head.decoder")}
    model, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert model.config.architectures == ["RobertaForMaskedLM"]
    assert model.lm_head.decoder.weight.data_ptr() == model.roberta.embeddings.word_embeddings.weight.data_ptr()
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.max_position_embeddings) == (64, 2, 34)


def test_summary_card_and_state(xla_run):
    out, results = xla_run
    summary = _read(out / "training_summary.json")
    assert summary["backend"] == "torch_xla"
    assert (summary["accelerator"], summary["num_devices"]) == ("CPU", 1)
    assert (summary["global_step"], summary["global_batch_size"], summary["max_seq_length"]) == (STEPS, 8, 32)
    assert summary["tokens_seen"] == STEPS * 8 * 32
    assert summary["framework_versions"]["torch-xla"].startswith("2.9")
    assert summary["eval_results"]["eval_loss"] == pytest.approx(results["eval_loss"])
    card = (out / "README.md").read_text()
    assert "| Backend | torch_xla |" in card and "| Accelerator | 1 x CPU |" in card
    assert "- torch_xla" in card and "- pytorch" in card and "PyTorch/XLA" in card

    state = _read(out / "trainer_state.json")
    assert state["global_step"] == STEPS and state["max_steps"] == STEPS
    train_logs = [e for e in state["log_history"] if "loss" in e]
    eval_logs = [e for e in state["log_history"] if "eval_loss" in e]
    assert [e["step"] for e in train_logs] == [5, 10, 15, 20]
    assert [e["step"] for e in eval_logs] == [10, 20]
    for e in eval_logs:
        assert e["perplexity"] == pytest.approx(math.exp(e["eval_loss"]))
        assert 0.0 <= e["eval_accuracy"] <= 1.0
    assert not [e for e in state["log_history"] if "train_runtime" in e]
    # the throughput callback's numbers are in the log entries after warm-up
    assert train_logs[-1]["tokens_per_second"] > 0 and train_logs[-1]["step_time_ms_median"] > 0
    args = _read(out / "training_args.json")
    assert args["backend"] == "torch_xla" and args["max_steps"] == STEPS


def test_trains_evaluates_and_compiles_only_in_warmup(xla_run):
    _, results = xla_run
    assert results["global_step"] == STEPS
    assert results["train_loss"] < math.log(500)  # below a uniform guess over the vocabulary
    assert math.isfinite(results["eval_loss"]) and results["perplexity"] == pytest.approx(math.exp(results["eval_loss"]))
    assert results["xla_compilations"] >= 2  # at least the first and the steady train step
    assert results["xla_compilations_after_warmup"] == 0  # xla_recompile_guard saw no new graph after warm-up
    assert results["train_tokens_per_second"] > 0


def test_static_masking_collator():
    from hf_tpu_ext.backends.torch_xla.data import BlocksDataset, StaticMaskingCollator

    rng = np.random.default_rng(0)
    blocks = rng.integers(5, 300, size=(16, 32)).astype(np.int32)
    blocks[:, 0], blocks[:, 31] = 0, 2  # <s> ... </s>
    blocks[3, 1:] = 1  # only special tokens: nothing to predict
    blocks[4, 1:29] = 1  # two maskable tokens: both chosen, fewer than P
    ds = BlocksDataset(blocks)
    collator = StaticMaskingCollator(mask_token_id=4, vocab_size=300, special_token_ids=[0, 1, 2, 3, 4],
                                     max_predictions=5, seed=7)
    batch = collator([ds[i] for i in range(8)])
    ids, labels = batch["input_ids"], batch["labels"]
    assert set(batch) == {"input_ids", "labels"}
    assert ids.shape == labels.shape == (8, 32) and ids.dtype == labels.dtype == torch.int64
    counts = (labels != -100).sum(1).tolist()
    assert counts == [5, 5, 5, 0, 2, 5, 5, 5]
    chosen = labels != -100
    original = torch.from_numpy(blocks[:8].astype(np.int64))
    assert torch.equal(labels[chosen], original[chosen])  # labels hold the original ids
    assert torch.equal(ids[~chosen], original[~chosen])  # nothing else changed
    assert not torch.isin(original[chosen], torch.tensor([0, 1, 2, 3, 4])).any()  # specials never chosen
    # deterministic per (seed, epoch, index); a new epoch gives new masks; eval masks do not depend on the epoch
    again = collator([ds[i] for i in range(8)])
    assert torch.equal(again["labels"], labels) and torch.equal(again["input_ids"], ids)
    collator.epoch = 1
    assert not torch.equal(collator([ds[i] for i in range(8)])["labels"], labels)
    ev = StaticMaskingCollator(4, 300, [0, 1, 2, 3, 4], 5, seed=7, train=False)
    first = ev([ds[i] for i in range(8)])["labels"]
    ev.epoch = 3
    assert torch.equal(ev([ds[i] for i in range(8)])["labels"], first)
    # 80/10/10 over many positions
    big = StaticMaskingCollator(4, 300, [0, 1, 2, 3, 4], 16, seed=1)
    many = big([{"input_ids": rng.integers(5, 300, size=64), "idx": i} for i in range(400)])
    sel = many["labels"] != -100
    share_mask = (many["input_ids"][sel] == 4).float().mean().item()
    assert 0.76 < share_mask < 0.84


def test_resume_continues_at_the_same_global_step(xla_run, tmp_path):
    out, results = xla_run
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed, ignore=shutil.ignore_patterns("checkpoint-20"))
    rc = _cli(tiny_train_args(resumed, "--backend", "torch_xla", "--max_steps", STEPS, "--save_strategy", "steps",
                              "--save_steps", 10, "--eval_strategy", "steps", "--eval_steps", 10,
                              "--resume_from_checkpoint", "true", "--callbacks", "xla_recompile_guard"))
    assert rc == 0
    state = _read(resumed / "trainer_state.json")
    assert state["global_step"] == STEPS
    steps = [e["step"] for e in state["log_history"] if "loss" in e]
    assert steps == [5, 10, 15, 20]  # the first half comes from checkpoint-10, nothing twice
    first = {e["step"]: e for e in _read(out / "trainer_state.json")["log_history"] if "loss" in e}
    for e in state["log_history"]:
        if "loss" in e:  # same data order, masks, RNG and optimizer state: the same losses
            assert e["loss"] == pytest.approx(first[e["step"]]["loss"], rel=1e-3), e["step"]
    new = _read(resumed / "all_results.json")
    assert new["global_step"] == STEPS
    assert new["eval_loss"] == pytest.approx(results["eval_loss"], rel=1e-3)
    assert new["xla_compilations_after_warmup"] == 0

    # resuming a finished run is a no-op that leaves its files as they are
    before = {n: (resumed / n).read_bytes() for n in ("all_results.json", "trainer_state.json", "README.md",
                                                     "model.safetensors", "tokenizer.json")}
    assert _cli(tiny_train_args(resumed, "--backend", "torch_xla", "--max_steps", STEPS,
                                "--resume_from_checkpoint", "true")) == 0
    assert {n: (resumed / n).read_bytes() for n in before} == before

    # nothing to resume from: the training run says so before any data work
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import CheckpointError
    from hf_tpu_ext.run import train

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="found no checkpoint"):
        train(*parse_args(["--output_dir", str(empty), "--backend", "torch_xla", "--resume_from_checkpoint", "true"]))


# ------------------------------------------------------------------------------ callbacks in a Trainer + Hub
def _tiny_trainer(out, callbacks, steps=8, save_steps=3, config_dir=None, logging_steps=4):
    """Our MaskedLMTrainer on random blocks, with the shapes of the session run (its graphs are cached)."""
    from transformers import AutoConfig, RobertaForMaskedLM

    from hf_tpu_ext.args import TrainingArguments
    from hf_tpu_ext.backends.torch_xla.data import BlocksDataset, StaticMaskingCollator
    from hf_tpu_ext.backends.torch_xla.trainer import trainer_class, hf_training_arguments

    config = AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(0)
    model = RobertaForMaskedLM(config)
    rng = np.random.default_rng(0)
    blocks = rng.integers(5, config.vocab_size, size=(32, 32)).astype(np.int32)
    ours = TrainingArguments(output_dir=str(out), max_steps=steps, logging_steps=logging_steps, eval_strategy="no",
                             save_strategy="steps", save_steps=save_steps, disable_tqdm=True, learning_rate=1e-3,
                             save_total_limit=2)
    hf_args = hf_training_arguments(ours, steps, report_to=[])
    collator = StaticMaskingCollator(4, config.vocab_size, [0, 1, 2, 3, 4], 5, seed=1)
    return trainer_class()(model=model, args=hf_args, train_dataset=BlocksDataset(blocks), data_collator=collator,
                            callbacks=callbacks, max_predictions=5)


def _weights_equal(hub_file, model):
    from safetensors.numpy import load_file

    from hf_tpu_ext.backends.torch_xla.model import cpu_state_dict

    hub = load_file(hub_file)
    local = {k: v.numpy() for k, v in cpu_state_dict(model).items()}
    assert set(hub) == set(local)
    for name, value in local.items():
        np.testing.assert_array_equal(hub[name], value, err_msg=name)


def test_hub_final_weights_pushed_and_global_steps(loopback_hub, tmp_path, xla_run):
    from huggingface_hub import hf_hub_download

    from hf_tpu_ext.callbacks import get_callback

    loopback_hub.server.latency(0.5, route="commit")
    cb = get_callback("push_to_hub", backend="torch", hub_model_id="xla", hub_token=loopback_hub.token,
                      license="apache-2.0", backoff_seconds=0.01)
    trainer = _tiny_trainer(tmp_path / "out", [cb], config_dir=xla_run[0])
    trainer.train()
    # the Trainer saves at global steps 3, 6 and at the last step 8; then the final push, always
    assert cb.pushed_steps == [3, 6, 8, 8]
    report = cb.report
    assert not report.failed and not report.pending
    assert [m for m, _ in report.pushed][-1] == "End of training"
    messages = [c["message"] for c in loopback_hub.server.commits("alice/xla")]
    assert messages[-1] == "End of training"
    assert set(messages[1:-1]) <= {"Training in progress, step 3", "Training in progress, step 6",
                                   "Training in progress, step 8"}
    _weights_equal(hf_hub_download("alice/xla", "model.safetensors", cache_dir=tmp_path / "dl"), trainer.model)
    files = loopback_hub.server.files("alice/xla")
    assert not [p for p in files if "optimizer" in p or "checkpoint" in p or p.endswith(".bin")]
    assert "| Backend | torch_xla |" in files["README.md"].decode()


def test_hub_strategy_end_and_checkpoint(loopback_hub, tmp_path, xla_run):
    from hf_tpu_ext.backends.torch_xla.trainer import download_last_checkpoint
    from hf_tpu_ext.callbacks import get_callback

    end = get_callback("push_to_hub", backend="torch", hub_model_id="at-end", hub_token=loopback_hub.token,
                       hub_strategy="end")
    _tiny_trainer(tmp_path / "end", [end], config_dir=xla_run[0]).train()
    assert [c["message"] for c in loopback_hub.server.commits("alice/at-end")][1:] == ["End of training"]

    ckpt = get_callback("push_to_hub", backend="torch", hub_model_id="alice-org/resumable", hub_token=loopback_hub.token,
                        hub_strategy="checkpoint", hub_revision="dev", dataset_name="wikitext")
    _tiny_trainer(tmp_path / "ckpt", [ckpt], config_dir=xla_run[0]).train()
    files = loopback_hub.server.files("alice-org/resumable", revision="dev")
    last = sorted(p for p in files if p.startswith("last-checkpoint/"))
    assert {"last-checkpoint/optimizer.pt", "last-checkpoint/scheduler.pt", "last-checkpoint/trainer_state.json",
            "last-checkpoint/model.safetensors"} <= set(last)
    assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 8
    assert "datasets:\n- wikitext" in files["README.md"].decode()
    folder = download_last_checkpoint("alice-org/resumable@dev", loopback_hub.token, str(tmp_path / "dl"))
    assert _read(os.path.join(folder, "trainer_state.json"))["global_step"] == 8
    token = loopback_hub.token
    assert all(token.encode() not in content for content in files.values())
    for root, _, names in os.walk(tmp_path / "ckpt"):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                assert token.encode() not in f.read(), name


@pytest.mark.parametrize("token_attr,message", [(None, "token invalid"),
                                                ("other_token", "User 'bob' cannot write to namespace 'alice'")])
def test_hub_preflight_fails_before_the_first_step(loopback_hub, tmp_path, caplog, xla_run, token_attr, message):
    from transformers import TrainerCallback

    from hf_tpu_ext.callbacks import get_callback
    from hf_tpu_ext.errors import HubAuthError

    class Probe(TrainerCallback):
        steps = 0

        def on_step_begin(self, args, state, control, **kwargs):
            Probe.steps += 1

    token = getattr(loopback_hub, token_attr) if token_attr else "hf_badTokenThatIsSecret123"
    repo = "alice/theirs" if token_attr else "mine"
    cb = get_callback("push_to_hub", backend="torch", hub_model_id=repo, hub_token=token)
    trainer = _tiny_trainer(tmp_path / "out", [cb, Probe()], config_dir=xla_run[0])
    with pytest.raises(HubAuthError, match=message) as info:
        trainer.train()
    assert trainer.state.global_step == 0 and Probe.steps == 0
    assert token not in str(info.value) and token not in repr(cb)
    assert all(token not in r.getMessage() for r in caplog.records)
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")


def test_callbacks_in_a_plain_trainer_script(loopback_hub, tmp_path, xla_run):
    """A plain run_mlm-style script (stock collator, stock loss), with our callbacks appended."""
    from transformers import (AutoConfig, AutoTokenizer, DataCollatorForLanguageModeling, RobertaForMaskedLM, Trainer,
                              TrainingArguments)

    from hf_tpu_ext.callbacks import get_callback

    out_dir, _ = xla_run
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    rng = np.random.default_rng(1)
    blocks = rng.integers(5, len(tokenizer), size=(48, 32))
    train = [{"input_ids": b.tolist()} for b in blocks[:32]]
    evaluation = [{"input_ids": b.tolist()} for b in blocks[32:]]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    torch.manual_seed(0)
    model = RobertaForMaskedLM(AutoConfig.from_pretrained(out_dir))
    args = TrainingArguments(output_dir=str(tmp_path / "plain"), max_steps=12, per_device_train_batch_size=8,
                             logging_steps=4, save_strategy="steps", save_steps=6, optim="adamw_torch",
                             dataloader_drop_last=True, report_to=[], disable_tqdm=True, learning_rate=1e-3)
    callbacks = [
        get_callback("throughput", backend="torch", seq_length=32),
        get_callback("xla_recompile_guard", backend="torch", action="raise"),
        get_callback("masked_lm_metrics", backend="torch", eval_dataset=evaluation, data_collator=collator,
                     every_n_steps=6),
        get_callback("push_to_hub", backend="torch", hub_model_id="plain", hub_token=loopback_hub.token,
                     backoff_seconds=0.01),
    ]
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collator, processing_class=tokenizer,
                      callbacks=callbacks)
    trainer.train()  # the guard would raise RecompilationError on a graph compiled after warm-up

    history = trainer.state.log_history
    logs = [e for e in history if "loss" in e]
    assert [e["step"] for e in logs] == [4, 8, 12]
    assert logs[-1]["tokens_per_second"] == pytest.approx(logs[-1]["samples_per_second"] * 32)
    assert logs[-1]["xla_compilations"] >= 1
    evals = [e for e in history if "eval_masked_accuracy" in e]
    assert [e["step"] for e in evals] == [6, 12]
    assert all(e["eval_perplexity"] == pytest.approx(math.exp(e["eval_masked_loss"])) for e in evals)
    assert callbacks[0].summary["global_batch_size"] == 8 and callbacks[0].summary["steps_measured"] > 0
    assert callbacks[1].compilations_after_warmup == 0 and callbacks[1].events == []
    push = callbacks[3]
    assert push.pushed_steps == [6, 12, 12] and not push.report.failed
    files = loopback_hub.server.files("alice/plain")
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= set(files)


def test_a_signal_saves_the_step_reached_and_the_resume_starts_there(tmp_path, xla_run):
    """SIGTERM during step 7 of 20 with --save_strategy epoch: checkpoint-7/ (the Trainer's files and the run's
    state), TrainingInterrupted(signum 15) naming step 7; the resume starts at 7 and finishes at 20."""
    import signal

    from transformers import TrainerCallback

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.callbacks import register_callback
    from hf_tpu_ext.errors import TrainingInterrupted
    from hf_tpu_ext.run import train

    @register_callback("test_sigterm_at_7", "Test only: SIGTERM to this process after step 7.", "torch")
    class SigtermAt7(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 7:
                os.kill(os.getpid(), signal.SIGTERM)  # recorded by the run's handler, saved at the step's end

    out = tmp_path / "o"
    args = tiny_train_args(out, "--backend", "torch_xla", "--max_steps", str(STEPS), "--save_strategy", "epoch",
                           "--eval_strategy", "no")
    with pytest.raises(TrainingInterrupted) as stop:
        train(*parse_args(args + ["--callbacks", "test_sigterm_at_7"]), argv=["train", *map(str, args)])
    assert stop.value.signum == signal.SIGTERM and stop.value.step == 7
    assert str(stop.value).startswith("interrupted at step 7; resume with: hf-tpu train ")
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-7"]
    assert _read(out / "checkpoint-7" / "run_trainer_state.json")["global_step"] == 7
    assert _read(out / "training_summary.json")["interrupted"]["checkpoint"] == "checkpoint-7"
    assert _cli(args + ["--callbacks", "", "--resume_from_checkpoint", "true"]) == 0
    state = _read(out / "trainer_state.json")
    assert state["global_step"] == STEPS and [e["step"] for e in state["log_history"] if "loss" in e] == [5, 10, 15, 20]
