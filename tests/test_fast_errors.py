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
    from hf_tpu_ext.data import run_data

    def no_data(*args, **kwargs):
        raise AssertionError("data loaded before the model reference was checked")

    # the training run imports the data path from hf_tpu_ext.data.run_data when it needs it
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
    from hf_tpu_ext.callbacks.push_to_hub import PushToHubCallback as TfKerasPushToHub
    from hf_tpu_ext.callbacks.torch.push_to_hub import PushToHubCallback as TorchPushToHub
    from hf_tpu_ext.hub.pusher import HubPusher

    for cls in (TfKerasPushToHub, TorchPushToHub):
        with pytest.raises(ArgumentError) as err:
            cls(output_dir=str(tmp_path), hub_model_id="bad repo//x")
        assert str(err.value) == f"hub_model_id 'bad repo//x' {BAD_REPO_REASON}"
    with pytest.raises(ArgumentError) as err:
        HubPusher("bad repo//x", output_dir=str(tmp_path))
    assert str(err.value) == f"repo_id 'bad repo//x' {BAD_REPO_REASON}"
    assert TorchPushToHub(output_dir=str(tmp_path), hub_model_id="user/name").hub_model_id == "user/name"
    assert os.listdir(tmp_path) == []
