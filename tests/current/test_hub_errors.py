"""Hub errors beside huggingface_hub 1.x/2.x (httpx): a failed download names its status and file.

huggingface_hub wraps an HTTP error on one file of a snapshot into ``LocalEntryNotFoundError`` ("check your
connection"); the Keras 3 callback's ``restore_from_hub`` must say what the Hub answered instead.
"""

import pytest

from hf_tpu_ext.errors import HubAuthError


def _repo_with_checkpoint(loopback_hub, tmp_path):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/m")
    (tmp_path / "src" / "last-checkpoint").mkdir(parents=True)
    (tmp_path / "src" / "last-checkpoint" / "model.weights.h5").write_bytes(b"w" * 10)
    (tmp_path / "src" / "last-checkpoint" / "trainer_state.json").write_text('{"global_step": 3, "epoch": 1}')
    api.upload_folder(repo_id="alice/m", folder_path=str(tmp_path / "src"))


def test_restore_from_hub_names_a_403_and_its_file(loopback_hub, tmp_path):
    from hf_tpu_ext.callbacks.keras.push_to_hub import PushToHubCallback

    _repo_with_checkpoint(loopback_hub, tmp_path)
    loopback_hub.server.fail_next(2, 403, route="resolve")  # both files: whichever is asked for first fails
    with pytest.raises(HubAuthError) as err:
        PushToHubCallback.restore_from_hub(None, "alice/m", token=loopback_hub.token)
    message = str(err.value)
    assert message.startswith("Could not download last-checkpoint/ of alice/m: the Hub answered HTTP 403 for "
                              "last-checkpoint/"), message
    assert message.endswith(" (injected failure 403). The token may not read it: for a gated or private repo, "
                            "request access or use a token of an account that has it."), message
    assert message.split(" for ")[1].split(" (")[0] in ("last-checkpoint/model.weights.h5",
                                                         "last-checkpoint/trainer_state.json")


def test_an_unreachable_hub_is_one_line_under_the_installed_http_stack(monkeypatch):
    """huggingface_hub 2.x talks through httpx2: a closed port at HF_ENDPOINT is the preflight's one HubError line
    naming the endpoint (a fresh user got an 88-line httpx2.ConnectError traceback), without the token."""
    import socket

    from hf_tpu_ext.errors import HubError
    from hf_tpu_ext.hub import preflight

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(preflight, "endpoint", lambda: endpoint)
    monkeypatch.setattr(preflight, "hub_api", lambda token: __import__("huggingface_hub").HfApi(endpoint=endpoint))
    token = "hf_unreachable_secret_0123456789"
    with pytest.raises(HubError) as err:
        preflight._ask_whoami(token)
    assert str(err.value).startswith(f"Could not reach the Hub at {endpoint}/api/whoami-v2 (")
    assert str(err.value).endswith("Check the network connection or HF_ENDPOINT, then retry.")
    assert token not in str(err.value)
