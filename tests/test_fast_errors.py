"""Fast, accurate errors: model references, unreachable Hub, demo port, TPU resolution, output folder, encoding."""

import os
import socket
import urllib.error

import pytest

from hf_tpu_ext.errors import ArgumentError, DataError, HubRepoError, OutputDirError
from hf_tpu_ext.hub.model_ref import check_model_ref, hub_url, is_hub_repo_id


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_paths_and_invalid_ids_fail_without_network(tmp_path):
    assert check_model_ref(str(tmp_path)) == "local"
    with pytest.raises(ArgumentError) as err:
        check_model_ref("./no/such/folder")
    assert str(err.value) == ("--model_name_or_path './no/such/folder': no such folder. Give an existing model folder "
                              "or a Hub repo id ('name' or 'user/name').")
    with pytest.raises(ArgumentError) as err:
        check_model_ref("bad repo!!", "MODEL")
    assert str(err.value) == ("MODEL 'bad repo!!' is neither an existing local folder nor a valid Hub repo id "
                              "('name' or 'user/name': letters, digits, '-', '_', '.').")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ArgumentError, match="is a file; give a model folder"):
        check_model_ref(str(tmp_path / "weights.bin"))
    assert is_hub_repo_id("user/name") and not is_hub_repo_id(str(tmp_path)) and not is_hub_repo_id("a b")


def test_missing_repo_is_named_with_the_endpoint(loopback_hub):
    with pytest.raises(HubRepoError) as err:
        check_model_ref("does-not-exist")
    assert str(err.value) == (
        f"--model_name_or_path 'does-not-exist' is neither an existing local folder nor a model repo on "
        f"{loopback_hub.endpoint} (or the repo is private and no valid token was given). Check the path or repo id, "
        "HF_ENDPOINT and HF_TOKEN.")
    assert hub_url("alice/m") == f"{loopback_hub.endpoint}/alice/m"
    assert hub_url("alice/d", "dataset") == f"{loopback_hub.endpoint}/datasets/alice/d"


def test_unreachable_endpoint_is_named(monkeypatch):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(HubRepoError) as err:
        check_model_ref("user/some-model", timeout=3)
    assert str(err.value) == (
        f"--model_name_or_path 'user/some-model' is not a local folder, and the Hub at {endpoint} could not be reached "
        "to look it up (connection failed within 3 s). Check the network and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to "
        "use the local cache.")


def test_train_refuses_a_missing_model_before_any_data_work(loopback_hub, tmp_path, monkeypatch):
    from hf_tpu_ext import run
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import data as run_data

    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the model reference was checked")

    # the training run's data job (hf_tpu_ext.run.data) loads the blocks through this name
    monkeypatch.setattr(run_data, "load_text_blocks", no_data)
    args = parse_args(["--output_dir", str(tmp_path / "o"), "--model_name_or_path", "does-not-exist"])
    with pytest.raises(HubRepoError, match=r"^--model_name_or_path 'does-not-exist' is neither an existing local folder "
                                           r"nor a model repo on http://127\.0\.0\.1"):
        run.train(*args)
    args = parse_args(["--output_dir", str(tmp_path / "o"), "--tokenizer_name", "./missing-tokenizer"])
    with pytest.raises(ArgumentError, match=r"^--tokenizer_name './missing-tokenizer': no such folder"):
        run.train(*args)


def test_demo_missing_model_and_busy_port(loopback_hub):
    from hf_tpu_ext.commands.demo import check_port_free, load_demo

    with pytest.raises(HubRepoError, match=r"^MODEL 'no-such-model' is neither an existing local folder nor a model "
                                           r"repo on http://127\.0\.0\.1"):
        load_demo("no-such-model")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ArgumentError) as err:
            check_port_free("127.0.0.1", port)
    assert str(err.value) == (f"Port {port} on 127.0.0.1 is already in use (another demo or server?); pass a free one "
                              f"with --port, e.g. --port {port + 1}.")
    check_port_free("127.0.0.1", _closed_port())  # a free port passes


def test_tpu_resolution_errors_are_one_line():
    pytest.importorskip("tensorflow")
    from hf_tpu_ext.backends.tensorflow.strategy import tpu_error_message

    off_cloud = urllib.error.URLError(OSError(-2, "Name or service not known"))
    assert tpu_error_message("my-tpu", off_cloud) == (
        "--tpu_name my-tpu: the TPU name cannot be looked up because this machine is not on Google Cloud (the metadata "
        "server metadata.google.internal is unreachable: [Errno -2] Name or service not known). Run on a Google Cloud "
        "VM in the TPU's project (--gcp_project, --tpu_zone), give the TPU's address as --tpu_name grpc://IP:8470, or "
        "on a TPU VM use --tpu_name local.")
    no_client = RuntimeError("Missing runtime dependency on the Google API client. Run `pip install cloud-tpu-client` "
                             "to fix.")
    assert tpu_error_message("my-tpu", no_client) == (
        "--tpu_name my-tpu: looking up a TPU Node by name needs the Cloud TPU client, which is not installed: "
        "`pip install cloud-tpu-client`. On a TPU VM use --tpu_name local instead.")
    assert "\n" not in tpu_error_message("x", RuntimeError("line one\nline two"))


def test_unwritable_output_folder(tmp_path):
    from hf_tpu_ext.fileio import check_writable_dir

    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputDirError) as err:
        check_writable_dir(str(tmp_path / "afile" / "out"))
    assert str(err.value) == f"--output_dir {str(tmp_path / 'afile' / 'out')!r}: {str(tmp_path / 'afile')!r} is a file, not a folder; choose another path."
    check_writable_dir(str(tmp_path / "new" / "out"))  # creatable: fine, nothing created
    assert not (tmp_path / "new").exists()
    if os.path.isdir("/proc/self"):  # Linux: a folder nobody can create anything in, not even root
        with pytest.raises(OutputDirError, match=r"^--output_dir '/proc/hf-tpu-out' is not writable: creating a "
                                                 r"folder in its parent '/proc' failed \("):
            check_writable_dir("/proc/hf-tpu-out")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root writes everywhere: the permission case needs a normal user")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OutputDirError) as err:
        check_writable_dir(str(locked / "out"))
    assert str(err.value) == (f"--output_dir {str(locked / 'out')!r} is not writable: permission denied on its parent "
                              f"{str(locked)!r}. Choose a folder you can write to (or fix its permissions).")


def test_latin1_file_says_not_utf8(tmp_path):
    from hf_tpu_ext.data.loading import _load_file, first_non_utf8_offset

    path = tmp_path / "latin1.txt"
    path.write_bytes("Plain ASCII first line.\nCaf\u00e9 au lait.\n".encode("latin-1"))
    assert first_non_utf8_offset(str(path)) == 27
    assert first_non_utf8_offset(str(path), chunk_size=5) == 27
    with pytest.raises(DataError) as err:
        _load_file(str(path), "text", "--train_file", str(tmp_path / "cache"))
    assert str(err.value) == (f"--train_file {path} is not UTF-8 text: the bytes at offset 27 do not decode as UTF-8 "
                              "(a Latin-1 or Windows-1252 file?). Convert it, e.g. `iconv -f latin1 -t utf-8 IN > OUT`.")


def test_train_names_a_missing_model_before_importing_transformers(tmp_path):
    import subprocess
    import sys

    from conftest import REPO_ROOT

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    code = ("import sys; from hf_tpu_ext import cli; "
            "rc = cli.main(['train', '--output_dir', 'o', '--model-name-or-path=user/some-model']); "
            "print(rc, 'transformers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_ENDPOINT=endpoint))
    assert proc.stdout.split() == ["1", "False"], proc.stderr[-2000:]
    assert proc.stderr == (
        f"hf-tpu train: error: --model_name_or_path 'user/some-model' is not a local folder, and the Hub at {endpoint} "
        "could not be reached to look it up (connection failed within 10 s). Check the network and HF_ENDPOINT, or set "
        "HF_HUB_OFFLINE=1 to use the local cache.\n")


BAD_REPO_REASON = ("is not a valid Hub repo id: repo id must be in the form 'repo_name' or 'namespace/repo_name'. "
                   "Use the form 'user/name'.")


def test_malformed_hub_model_id_fails_in_the_argument_checks(tmp_path, capsys):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.cli import main

    with pytest.raises(ArgumentError) as err:
        parse_args(["--output_dir", str(tmp_path / "o"), "--push_to_hub", "true", "--hub_model_id", "bad repo//x"])
    assert str(err.value) == f"--hub_model_id 'bad repo//x' {BAD_REPO_REASON}"
    with pytest.raises(ArgumentError) as err:
        parse_args(["--output_dir", str(tmp_path / "o"), "--push_to_hub", "true", "--hub_model_id", "a--b/c"])
    assert str(err.value) == "--hub_model_id 'a--b/c' is not a valid Hub repo id: cannot have -- or .. in repo_id. " \
                             "Use the form 'user/name'."
    assert not (tmp_path / "o").exists()

    # hf-tpu push: before the output folder is read or the Hub is asked
    assert main(["push", str(tmp_path / "missing"), "--hub_model_id", "bad repo//x"]) == 1
    assert capsys.readouterr().err.strip() == f"hf-tpu push: error: --hub_model_id 'bad repo//x' {BAD_REPO_REASON}"


def test_push_callbacks_refuse_a_malformed_repo_id_at_construction(tmp_path):
    from hf_tpu_ext.callbacks.tf_keras.push_to_hub import PushToHubCallback as TfKerasPushToHub
    from hf_tpu_ext.callbacks.torch.push_to_hub import PushToHubCallback as TorchPushToHub
    from hf_tpu_ext.hub.push_session import PushSession

    for cls in (TfKerasPushToHub, TorchPushToHub):
        with pytest.raises(ArgumentError) as err:
            cls(output_dir=str(tmp_path), hub_model_id="bad repo//x")
        assert str(err.value) == f"hub_model_id 'bad repo//x' {BAD_REPO_REASON}"
    with pytest.raises(ArgumentError) as err:
        PushSession.for_script("bad repo//x", output_dir=str(tmp_path))
    assert str(err.value) == f"repo_id 'bad repo//x' {BAD_REPO_REASON}"
    assert TorchPushToHub(output_dir=str(tmp_path), hub_model_id="user/name").hub_model_id == "user/name"
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- messages that name the user's input
def test_invalid_token_names_its_source(loopback_hub, monkeypatch):
    """HF_TOKEN overrides a fresh `hf auth login` (huggingface_hub's get_token order): say where it came from."""
    from huggingface_hub import constants

    from hf_tpu_ext.errors import HubAuthError
    from hf_tpu_ext.hub.preflight import preflight, resolve_token

    with open(constants.HF_TOKEN_PATH, "w") as f:
        f.write(loopback_hub.token)  # a valid login...
    monkeypatch.setenv("HF_TOKEN", "hf_staleEnvironmentToken")  # ...overridden by a stale variable
    with pytest.raises(HubAuthError) as err:
        preflight("alice/x", resolve_token(None))
    assert str(err.value) == (
        "Hub token invalid: it comes from the HF_TOKEN environment variable, which takes precedence over a "
        "`hf auth login` (huggingface_hub's token order). Set HF_TOKEN to a valid token, or unset it "
        "(`unset HF_TOKEN`) to use your login, or pass --hub_token.")
    monkeypatch.delenv("HF_TOKEN")
    with open(constants.HF_TOKEN_PATH, "w") as f:
        f.write("hf_expiredLoginToken\n")
    with pytest.raises(HubAuthError) as err:
        preflight("alice/x", resolve_token(None))
    assert str(err.value) == (f"Hub token invalid: it is the one saved by `hf auth login` "
                              f"({constants.HF_TOKEN_PATH}). Log in again with a valid token, set HF_TOKEN, or pass "
                              "--hub_token.")
    with pytest.raises(HubAuthError) as err:
        preflight("alice/x", "hf_typedOnTheCommandLine")
    assert str(err.value) == ("Hub token invalid: the Hub rejected the token passed as --hub_token (hub_token= in "
                              "Python). Pass a valid one, or drop it to use HF_TOKEN or your `hf auth login`.")
    assert not loopback_hub.server.repos  # nothing created


def test_hub_error_on_a_download_names_status_and_file(loopback_hub, tmp_path):
    """huggingface_hub reports a 403 on one file of a snapshot as LocalEntryNotFoundError "check your connection"."""
    from huggingface_hub import HfApi

    from hf_tpu_ext.errors import HubAuthError
    from hf_tpu_ext.hub.resume import download_last_checkpoint

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/m")
    (tmp_path / "src" / "last-checkpoint").mkdir(parents=True)
    (tmp_path / "src" / "last-checkpoint" / "model.weights.h5").write_bytes(b"w" * 10)
    api.upload_folder(repo_id="alice/m", folder_path=str(tmp_path / "src"))
    loopback_hub.server.fail_next(1, 403, route="resolve")
    with pytest.raises(HubAuthError) as err:
        download_last_checkpoint("alice/m", loopback_hub.token, str(tmp_path / "a"), is_checkpoint=lambda f: True)
    assert str(err.value) == (
        "Could not download last-checkpoint/ of alice/m: the Hub answered HTTP 403 for last-checkpoint/model.weights.h5 "
        "(injected failure 403). The token may not read it: for a gated or private repo, request access or use a token "
        "of an account that has it.")
    loopback_hub.server.fail_next(1, 404, route="resolve")
    with pytest.raises(HubRepoError) as err:
        download_last_checkpoint("alice/m@main", loopback_hub.token, str(tmp_path / "b"), is_checkpoint=lambda f: True)
    assert str(err.value) == (
        "Could not download last-checkpoint/ of alice/m@main: the Hub answered HTTP 404 for "
        "last-checkpoint/model.weights.h5 (injected failure 404). Check the repo id, the revision and that the file "
        "was pushed.")
    assert download_last_checkpoint("alice/m", loopback_hub.token, str(tmp_path / "c"), is_checkpoint=lambda f: True)


def _resume_run(tmp_path, *argv):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import TrainingRun

    return TrainingRun(*parse_args(["--output_dir", str(tmp_path / "out"), *argv]))


def test_resume_names_the_repo_and_only_passed_flags(tmp_path):
    from hf_tpu_ext.backends.base import CheckpointInfo
    from hf_tpu_ext.errors import CheckpointError

    download = tmp_path / "hf-tpu-resume-abc"  # the temp folder a Hub resume downloads into
    info = CheckpointInfo(path=str(download / "last-checkpoint" / "ckpt-40"), global_step=40,
                          model_config={"hidden_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 66},
                          trainer_state={"global_step": 40, "train_batch_size": 8, "num_input_tokens_seen": 40 * 8 * 64})
    # --max_seq_length left at its default (128): the checkpoint's 64 is used, max_predictions_per_seq follows
    run = _resume_run(tmp_path, "--resume_from_checkpoint", "alice/m")
    run._resume_download = (str(download), "alice/m")
    run._apply_checkpoint_shape(info)
    assert (run.data_args.max_seq_length, run.data_args.max_predictions_per_seq) == (64, 10)
    assert (run.model_args.hidden_size, run.model_args.num_hidden_layers) == (64, 2)
    # passed flags that contradict it are named, the checkpoint by the repo id given
    run = _resume_run(tmp_path, "--resume_from_checkpoint", "alice/m", "--max_seq_length", "128", "--hidden_size", "32")
    run._resume_download = (str(download), "alice/m")
    with pytest.raises(CheckpointError) as err:
        run._apply_checkpoint_shape(info)
    assert str(err.value) == (
        "These flags contradict the checkpoint hf://alice/m/last-checkpoint/ckpt-40 being resumed: --hidden_size 32 "
        "(the checkpoint has 64); --max_seq_length 128 (the checkpoint trained at 64; a new length is a new run: "
        "--model_name_or_path on its exported model). Drop them (the checkpoint's values are used) or start a new run "
        "in another --output_dir.")
    # a passed shorter length is another run's shape (tokens, epoch and data position count blocks of one length)
    run = _resume_run(tmp_path, "--resume_from_checkpoint", "alice/m", "--max_seq_length", "32")
    run._resume_download = (str(download), "alice/m")
    with pytest.raises(CheckpointError) as err:
        run._apply_checkpoint_shape(info)
    assert str(err.value) == (
        "These flags contradict the checkpoint hf://alice/m/last-checkpoint/ckpt-40 being resumed: --max_seq_length 32 "
        "(the checkpoint trained at 64; a new length is a new run: --model_name_or_path on its exported model). Drop "
        "them (the checkpoint's values are used) or start a new run in another --output_dir.")


def test_resume_position_limit_follows_the_model_type(tmp_path):
    """BERT's table has no reserved rows (RoBERTa's reserves pad_token_id + 1 = 2): a BERT checkpoint of 512
    positions resumes at 512 tokens, and 513 is refused naming 512."""
    from hf_tpu_ext.backends.base import CheckpointInfo
    from hf_tpu_ext.errors import CheckpointError

    folder = tmp_path / "ckpt"
    info = CheckpointInfo(path=str(folder), global_step=4, trainer_state=None,
                          model_config={"model_type": "bert", "hidden_size": 64, "max_position_embeddings": 512})
    run = _resume_run(tmp_path, "--resume_from_checkpoint", str(folder), "--max_seq_length", "512")
    run._apply_checkpoint_shape(info)
    assert run.data_args.max_seq_length == 512
    roberta = CheckpointInfo(path=str(folder), global_step=4, trainer_state=None,
                             model_config={"hidden_size": 64, "max_position_embeddings": 514})  # RoBERTa's: 512 + 2
    for checkpoint in (info, roberta):
        run = _resume_run(tmp_path, "--resume_from_checkpoint", str(folder), "--max_seq_length", "513")
        with pytest.raises(CheckpointError, match=r"--max_seq_length 513 \(the checkpoint's model holds 512 tokens"):
            run._apply_checkpoint_shape(checkpoint)


def test_tpu_name_local_off_a_tpu():
    pytest.importorskip("tensorflow")
    from hf_tpu_ext.backends.tensorflow.strategy import tpu_error_message

    class NotFoundError(Exception):  # what TensorFlow raises on a machine without a TPU (tf.errors.NotFoundError)
        pass

    error = NotFoundError("TPUs not found in the cluster. Failed in initialization: No OpKernel was registered to "
                          "support Op 'ConfigureDistributedTPU'")
    assert tpu_error_message("local", error) == (
        "--tpu_name local: this machine has no TPU that TensorFlow can use (NotFoundError: TPUs not found in the "
        "cluster). 'local' is the TPU of the Cloud TPU VM the run is on, with TensorFlow's TPU runtime (libtpu). To "
        "train on this machine's CPU or GPUs, drop --tpu_name; for a TPU Node, give its name (with --tpu_zone and "
        "--gcp_project) or its address grpc://IP:8470.")


def test_binary_file_is_not_given_encoding_advice(tmp_path):
    import gzip
    import random

    from hf_tpu_ext.data.loading import check_data_file

    rng = random.Random(0)
    noise = tmp_path / "noise.txt"
    noise.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    first_nul = noise.read_bytes().index(0)
    with pytest.raises(DataError) as err:
        check_data_file(str(noise))
    assert str(err.value) == (
        f"--train_file {noise} is not text: it looks like a binary file (a NUL byte at offset {first_nul:,}), not text "
        "in another encoding. Give a text file (UTF-8: .txt with one text per line, .jsonl, .csv), or check the path.")
    short = tmp_path / "short.txt"  # too short to hold a NUL: told by its control bytes
    short.write_bytes(bytes([1, 2, 3, 4, 5, 6, 7]) + b"abc" * 10)
    with pytest.raises(DataError, match=r"is not text: it looks like a binary file \(7 control bytes in its first 37\)"):
        check_data_file(str(short), "--validation_file")
    packed = tmp_path / "corpus.txt"
    packed.write_bytes(gzip.compress(b"some text\n" * 100))
    with pytest.raises(DataError) as err:
        check_data_file(str(packed))
    assert str(err.value) == (f"--train_file {packed} is gzip-compressed, not text: unpack it first (e.g. "
                              "`gunzip -c IN > OUT`) and pass the text file.")
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("Caf\u00e9 au lait.\n".encode("utf-16"))
    with pytest.raises(DataError) as err:
        check_data_file(str(utf16))
    assert str(err.value) == (f"--train_file {utf16} is UTF-16 text, not UTF-8: convert it, e.g. `iconv -f utf-16 -t "
                              "utf-8 IN > OUT` (Windows editors save \"Unicode\" as UTF-16).")
    latin1 = tmp_path / "latin1.txt"  # text in another 8-bit encoding passes here; the loader names the offset
    latin1.write_bytes("Caf\u00e9 au lait.\n".encode("latin-1") * 50)
    assert check_data_file(str(latin1)) == "text"


def test_prepare_data_output_path_that_is_a_file(tmp_path, capsys):
    from hf_tpu_ext.cli import main

    taken = tmp_path / "shards"
    taken.write_text("not a folder")
    corpus = tmp_path / "c.txt"
    corpus.write_text("a line of text\n" * 50)
    for path in (taken, taken / "sub"):
        assert main(["prepare-data", "--train_file", str(corpus), "--output_path", str(path)]) == 1
        assert capsys.readouterr().err == (f"hf-tpu prepare-data: error: --output_path {str(path)!r}: {str(taken)!r} "
                                           "is a file, not a folder; choose another path.\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "shards"]


def test_hub_repo_is_created_only_after_the_data_checks(loopback_hub, tmp_path):
    """A run refused for its data (too few blocks for one batch) has checked the token, created no repo."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.errors import CorpusTooSmallError
    from hf_tpu_ext.run import TrainingRun
    from hub_fixtures import NoBuildBackend

    corpus = tmp_path / "tiny.txt"
    corpus.write_text("A short corpus: far fewer blocks than one batch of 64.\n" * 20)
    out = tmp_path / "out"
    args = parse_args(["--output_dir", str(out), "--train_file", str(corpus), "--vocab_size", "300",
                       "--max_seq_length", "16", "--per_device_train_batch_size", "64", "--push_to_hub", "true",
                       "--hub_model_id", "alice/never-created", "--hub_token", loopback_hub.token,
                       "--callbacks", ""])  # no tf_keras callback classes: TensorFlow is not imported
    with pytest.raises(CorpusTooSmallError):
        TrainingRun(*args, backend=NoBuildBackend(AssertionError("built a model although the data checks failed"))).run()
    routes = [r["route"] for r in loopback_hub.server.requests]
    assert "whoami" in routes and "create_repo" not in routes  # the token was checked before the data work
    assert not loopback_hub.server.repos and not out.exists()


def test_model_refs_are_checked_once_per_run(loopback_hub, tmp_path):
    """The command line's early check finds a model repo: the run's check_run does not look it up again; a library
    caller's check_run (and the next run of the same process) still does."""
    from huggingface_hub import HfApi

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run.checks import check_model_refs, check_run

    HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token).create_repo("alice/ref")
    (tmp_path / "train.txt").write_text("one line of text\n")
    args = parse_args(["--output_dir", str(tmp_path / "o"), "--model_name_or_path", "alice/ref", "--train_file",
                       str(tmp_path / "train.txt"), "--callbacks", ""])

    def lookups():
        return sum(r["route"] == "repo_info" and "alice/ref" in r["path"] for r in loopback_hub.server.requests)

    check_model_refs(args[0], remember=True)  # what hf-tpu train's early checks do
    assert lookups() == 1
    check_run(*args)
    assert lookups() == 1  # not again
    check_run(*args)
    assert lookups() == 2  # a second run (a library caller) is checked
