"""A bad data file, model reference, resume source or Hub token is refused right after parsing, before any
framework is imported (issue 30 leftovers)."""

import os
import subprocess
import sys
import time

import pytest

from conftest import REPO_ROOT

FRAMEWORKS = ("transformers", "tensorflow", "tf_keras", "keras", "jax", "torch", "datasets", "pyarrow")
_CODE = ("import sys; from hf_tpu_ext import cli; rc = cli.main(['train', '--output_dir', 'out', *sys.argv[1:]]); "
         "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in %r))" % (FRAMEWORKS,))


def _train(tmp_path, *args, **env):
    return subprocess.run([sys.executable, "-c", _CODE, *args], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), **env))


def test_missing_train_file_is_refused_before_the_frameworks_load(tmp_path):
    proc = _train(tmp_path, "--train_file", "missing.txt")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == ("hf-tpu train: error: --train_file missing.txt does not exist; check the path (relative "
                           "paths start at the current folder).\n")
    assert not (tmp_path / "out").exists()  # nothing written: not even the run's lock


def test_compressed_validation_file_is_refused_before_the_frameworks_load(tmp_path):
    (tmp_path / "train.txt").write_text("one line of text\n")
    (tmp_path / "valid.txt").write_bytes(b"\x1f\x8b\x08\x00" + bytes(60))
    proc = _train(tmp_path, "--train_file", "train.txt", "--validation_file", "valid.txt")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == ("hf-tpu train: error: --validation_file valid.txt is gzip-compressed, not text: unpack it "
                           "first (e.g. `gunzip -c IN > OUT`) and pass the text file.\n")


def test_resume_source_that_does_not_exist_is_refused_before_the_frameworks_load(tmp_path):
    (tmp_path / "train.txt").write_text("one line of text\n")
    proc = _train(tmp_path, "--train_file", "train.txt", "--resume_from_checkpoint", "/nope/checkpoint-5")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == ("hf-tpu train: error: --resume_from_checkpoint '/nope/checkpoint-5' is neither a local "
                           "checkpoint/folder, 'true', nor a Hub repo id 'user/name[@revision]'.\n")
    assert not (tmp_path / "out").exists()


def test_an_unknown_resume_revision_is_named_with_its_repo_before_the_frameworks_load(loopback_hub, tmp_path):
    from huggingface_hub import HfApi

    from hf_tpu_ext.errors import HubRepoError
    from hf_tpu_ext.hub.resume import download_last_checkpoint

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/m")
    proc = _train(tmp_path, "--resume_from_checkpoint", "alice/m@nope", HF_TOKEN=loopback_hub.token)
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == (f"hf-tpu train: error: --resume_from_checkpoint 'alice/m': revision 'nope' does not exist "
                           f"at {loopback_hub.endpoint}.\n")
    assert not (tmp_path / "out").exists()
    # the download itself (a library caller of the run): the repo and the revision, not "404 Client Error."
    with pytest.raises(HubRepoError) as err:
        download_last_checkpoint("alice/m@nope", loopback_hub.token, str(tmp_path / "download"))
    assert str(err.value) == (f"Could not download last-checkpoint/ of alice/m@nope: alice/m has no revision 'nope' at "
                              f"{loopback_hub.endpoint}; check the branch, tag or commit name.")


def test_a_truncated_model_safetensors_is_one_line_before_the_frameworks_load(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "roberta"}')
    save_file({"w": np.zeros((64, 64), np.float32)}, str(model / "model.safetensors"))
    from hf_tpu_ext.backends.model_files import safetensors_problem

    assert safetensors_problem(str(model / "model.safetensors")) is None  # a whole file passes
    whole = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(whole[:1000])  # a copy cut short
    proc = _train(tmp_path, "--model_name_or_path", "model")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == (f"hf-tpu train: error: --model_name_or_path model: model.safetensors cannot be read (it is "
                           f"truncated: its tensors need {len(whole):,} bytes, the file holds 1,000); copy or export "
                           "the model folder again.\n")
    (model / "model.safetensors").write_bytes(b"\xff" * 16)  # not safetensors at all
    proc = _train(tmp_path, "--model_name_or_path", "model")
    assert proc.stderr.startswith("hf-tpu train: error: --model_name_or_path model: model.safetensors cannot be read "
                                  "(its header claims ")
    assert not (tmp_path / "out").exists()


def test_keras_on_tensorflow_is_refused_before_the_frameworks_load(tmp_path):
    """--backend keras trains on JAX only: KERAS_BACKEND=tensorflow is one line naming --backend tensorflow, before
    the data checks (the train file is missing too) and any framework; another name gets the same line without it."""
    proc = _train(tmp_path, "--backend", "keras", "--train_file", "missing.txt", KERAS_BACKEND="tensorflow")
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == ("hf-tpu train: error: --backend keras trains on JAX, but KERAS_BACKEND=tensorflow: unset it "
                           "(or set KERAS_BACKEND=jax), or use --backend tensorflow for TensorFlow's strategies.\n")
    assert not (tmp_path / "out").exists()
    proc = _train(tmp_path, "--backend", "keras", KERAS_BACKEND="torch")
    assert proc.stderr == ("hf-tpu train: error: --backend keras trains on JAX, but KERAS_BACKEND=torch: unset it "
                           "(or set KERAS_BACKEND=jax).\n")
    proc = _train(tmp_path, "--backend", "tensorflow", "--train_file", "missing.txt", KERAS_BACKEND="tensorflow")
    assert proc.stderr.startswith("hf-tpu train: error: --train_file missing.txt does not exist"), proc.stderr


# ----------------------------------------------------------------------------- the Hub token (--push_to_hub true)
_STALE = "hf_staleEnvironmentToken_not_on_the_hub"


def _whoami_requests(hub):
    return [r["status"] for r in hub.server.requests if r["route"] == "whoami"]


def test_invalid_token_is_refused_before_the_frameworks_load(loopback_hub, tmp_path):
    """An invalid HF_TOKEN with --push_to_hub true: the push preflight's line, one whoami, seconds, nothing written."""
    (tmp_path / "train.txt").write_text("one line of text\n")
    started = time.perf_counter()
    proc = _train(tmp_path, "--train_file", "train.txt", "--push_to_hub", "true", HF_TOKEN=_STALE)
    seconds = time.perf_counter() - started
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == (
        "hf-tpu train: error: Hub token invalid: it comes from the HF_TOKEN environment variable, which takes "
        "precedence over a `hf auth login` (huggingface_hub's token order). Set HF_TOKEN to a valid token, or "
        "unset it (`unset HF_TOKEN`) to use your login, or pass --hub_token.\n")
    assert _whoami_requests(loopback_hub) == [401]
    assert _STALE not in proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]  # no output folder, no lock
    assert seconds < 30, seconds  # the parse and the whoami (58 s loaded when the backend started first)


@pytest.mark.parametrize("case", ["no token", "offline"])
def test_no_token_and_offline_keep_the_preflight_line(loopback_hub, tmp_path, case):
    """No token at all, or HF_HUB_OFFLINE: the line the run's push preflight gave, now before the frameworks."""
    from hf_tpu_ext.hub.preflight import endpoint

    (tmp_path / "train.txt").write_text("one line of text\n")
    env = {"HF_TOKEN": loopback_hub.token, "HF_HUB_OFFLINE": "1"} if case == "offline" else {}
    proc = _train(tmp_path, "--train_file", "train.txt", "--push_to_hub", "true", **env)
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    line = ("No Hub token found: run `hf auth login`, set HF_TOKEN, or pass --hub_token." if case == "no token"
            else f"Could not reach the Hub at {endpoint()}/api/whoami-v2 (OfflineModeIsEnabled). Check the network "
                 "connection or HF_ENDPOINT, then retry.")
    assert proc.stderr == f"hf-tpu train: error: {line}\n"
    assert _whoami_requests(loopback_hub) == [] and not (tmp_path / "out").exists()


def test_a_non_chief_process_leaves_the_token_to_the_chief(loopback_hub, tmp_path):
    """RANK=1 pushes nothing: no whoami (the run's push session is the chief's only), the next check refuses."""
    proc = _train(tmp_path, "--train_file", "missing.txt", "--push_to_hub", "true", HF_TOKEN=_STALE, RANK="1")
    assert proc.stderr.startswith("hf-tpu train: error: --train_file missing.txt does not exist"), proc.stderr
    assert _whoami_requests(loopback_hub) == []


def test_the_run_reuses_the_early_whoami(loopback_hub, tmp_path):
    """Early check, then the run's push session (check_push_access, then preflight creating the repo): one whoami."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.commands.early_checks import check_before_imports
    from hf_tpu_ext.hub.preflight import forget_whoami
    from hf_tpu_ext.run import TrainingRun
    from hub_fixtures import NoBuildBackend

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a corpus long enough for a few batches of blocks.\n" for i in range(400)))
    args = parse_args(["--output_dir", str(tmp_path / "out"), "--train_file", str(corpus), "--vocab_size", "300",
                       "--max_seq_length", "16", "--per_device_train_batch_size", "2", "--push_to_hub", "true",
                       "--hub_model_id", "alice/once", "--hub_token", loopback_hub.token, "--callbacks", ""])
    forget_whoami()
    try:
        check_before_imports(*args)
        assert _whoami_requests(loopback_hub) == [200]
        with pytest.raises(RuntimeError, match="stop after the push preflight"):
            TrainingRun(*args, backend=NoBuildBackend(RuntimeError("stop after the push preflight"))).run()
    finally:
        forget_whoami()
    routes = [r["route"] for r in loopback_hub.server.requests]
    assert routes.count("whoami") == 1 and "create_repo" in routes  # the repo made with the early answer


# ----------------------------------------------------------------------------- flags that would change nothing (issue 48)
_MODEL_TYPES = "choose from: roberta, bert, distilbert, modernbert, eurobert"


@pytest.mark.parametrize("args,line", [
    (("--model_type", "Bert"), "--model_type 'Bert' is not one this package trains from scratch; did you mean 'bert'? "
                               f"({_MODEL_TYPES})."),
    (("--model_type", "deberta-v2"), "--model_type 'deberta-v2' is not one this package trains from scratch "
                                     f"({_MODEL_TYPES}); a pretrained 'deberta-v2' model trains with "
                                     "--model_name_or_path <its folder or repo> --backend torch_xla (any "
                                     "AutoModelForMaskedLM)."),
    (("--model_type", "modernbert", "--do_lower_case", "true"),
     "--do_lower_case true: the tokenizer trained for --model_type modernbert is a cased byte-level BPE, as its "
     "checkpoints are; drop --do_lower_case, or pass --model_type bert for a lower-cased WordPiece."),
    (("--do_lower_case", "true"),  # roberta, the default --model_type
     "--do_lower_case true: the tokenizer trained for --model_type roberta is a cased byte-level BPE, as its "
     "checkpoints are; drop --do_lower_case, or pass --model_type bert for a lower-cased WordPiece."),
    (("--model_type", "bert", "--model_name_or_path", "model"),
     "--model_type bert contradicts --model_name_or_path model, a 'roberta' model (its config.json decides the "
     "architecture): drop --model_type."),
    (("--do_lower_case", "false", "--model_name_or_path", "model"),
     "--do_lower_case applies to a tokenizer trained here, but --model_name_or_path model brings its own (its casing "
     "is its own): drop --do_lower_case."),
])
def test_a_flag_that_would_change_nothing_is_refused_before_the_frameworks_load(tmp_path, args, line):
    import numpy as np
    from safetensors.numpy import save_file

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "roberta"}')
    save_file({"w": np.zeros((4, 4), np.float32)}, str(tmp_path / "model" / "model.safetensors"))
    proc = _train(tmp_path, *args)
    assert proc.stdout.strip() == "1 []", proc.stderr[-2000:]
    assert proc.stderr == f"hf-tpu train: error: {line}\n"
    assert not (tmp_path / "out").exists()


def test_the_flags_that_do_change_something_pass_the_parse(tmp_path):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run.checks import check_model_type

    out = str(tmp_path / "out")
    model_args, _, _ = parse_args(["--output_dir", out, "--model_type", "bert", "--do_lower_case", "false"])
    assert (model_args.model_type, model_args.do_lower_case) == ("bert", False)
    model_args, _, _ = parse_args(["--output_dir", out, "--model_type", "modernbert", "--do_lower_case", "false"])
    assert model_args.do_lower_case is False  # its byte-level BPE is cased: what was asked
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "bert"}')
    args = parse_args(["--output_dir", out, "--model_type", "bert", "--model_name_or_path", str(tmp_path / "model")])
    check_model_type(args[0], args[2])  # the same type: nothing contradicted
