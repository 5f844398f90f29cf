"""Pytest fixtures around the loopback Hub (``tests/loopback_hub.py``); imported by ``tests/conftest.py``.

``loopback_hub`` points huggingface_hub at a fresh in-memory Hub for one test: the server is started once
per session and reset per test; ``HF_ENDPOINT`` and the module-level copies huggingface_hub made of it at
import time are patched, the Hub cache and token file are redirected into the test's tmp dir.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loopback_hub import LoopbackHubServer

__all__ = ["ALICE_TOKEN", "ALICE_READ_TOKEN", "ALICE_SCOPED_TOKEN", "BOB_TOKEN", "LoopbackHub", "loopback_hub_server",
           "loopback_hub"]

ALICE_TOKEN = "hf_alice_loopback_secret_token_0123"
ALICE_READ_TOKEN = "hf_alice_loopback_readonly_token_4567"
ALICE_SCOPED_TOKEN = "hf_alice_loopback_scoped_token_8901"
BOB_TOKEN = "hf_bob_loopback_secret_token_9876"
_ALICE_ORGS = [{"name": "alice-org", "role": "write"}, {"name": "readers", "role": "read"}]
USERS = {
    ALICE_TOKEN: {"name": "alice", "orgs": _ALICE_ORGS},
    # the same user with a token of role "read": whoami works, every write is refused with 403
    ALICE_READ_TOKEN: {"name": "alice", "orgs": _ALICE_ORGS, "role": "read"},
    # a fine-grained token that may write to the model repo alice/scoped only
    ALICE_SCOPED_TOKEN: {"name": "alice", "orgs": _ALICE_ORGS, "role": "fineGrained", "fineGrained": {
        "global": ["discussion.write"],
        "scoped": [{"entity": {"type": "user", "name": "alice"}, "permissions": ["repo.content.read"]},
                   {"entity": {"type": "model", "name": "alice/scoped"}, "permissions": ["repo.content.read", "repo.write"]}]}},
    BOB_TOKEN: {"name": "bob", "orgs": []},
}


@dataclass
class LoopbackHub:
    """What the ``loopback_hub`` fixture yields.

    Attributes:
        endpoint: the server's base URL (``http://127.0.0.1:<port>``).
        token: a valid token of user ``alice`` (member of ``alice-org`` with write, ``readers`` with read).
        other_token: a valid token of user ``bob`` (no orgs).
        server: the :class:`loopback_hub.LoopbackHubServer` (inspection and fault injection).
        read_token: a token of ``alice`` with role ``read`` (cannot write anywhere).
        scoped_token: a fine-grained token of ``alice`` with ``repo.write`` on ``alice/scoped`` only.
    """

    endpoint: str
    token: str
    other_token: str
    server: LoopbackHubServer
    read_token: str = ALICE_READ_TOKEN
    scoped_token: str = ALICE_SCOPED_TOKEN


@pytest.fixture(scope="session")
def loopback_hub_server():
    server = LoopbackHubServer(USERS)
    yield server
    server.close()


@pytest.fixture
def loopback_hub(loopback_hub_server, monkeypatch, tmp_path_factory):
    """A reset loopback Hub that huggingface_hub (and everything built on it) talks to during one test."""
    from huggingface_hub import constants, file_download, hf_api

    server = loopback_hub_server
    server.reset()
    endpoint = server.endpoint
    home = tmp_path_factory.mktemp("hf_home")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    if hasattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):  # huggingface_hub < 1.0 keeps a module-level copy
        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)  # module-level HfApi() behind the function API
    from hf_tpu_ext.hub.push_session import reset_budgets

    reset_budgets()  # a fresh Hub: no commits spent against any repo's budget
    yield LoopbackHub(endpoint=endpoint, token=ALICE_TOKEN, other_token=BOB_TOKEN, server=server)
    server.reset()


class NoBuildBackend:
    """The TensorFlow backend's attributes without starting TensorFlow: a ``TrainingRun`` on it goes through the
    checks, the data and the push preflight, then ``build`` raises ``error`` (what the test expects to stop at)."""

    name, callback_kind, supports_tfrecord, needs_remote_data = "tensorflow", "tf_keras", True, False
    num_replicas, is_chief, processes_to_spawn = 1, True, 0

    def __init__(self, error: BaseException):
        self.error = error

    def setup(self, args):
        pass

    def build(self, *args):
        raise self.error
