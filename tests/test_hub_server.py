"""The loopback Hub behaves like the Hub for what huggingface_hub 0.36 calls."""

import hashlib
import os

import pytest
import requests
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.utils import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError


def _write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_upload_folder_lfs_and_download_round_trip(loopback_hub, tmp_path):
    api = HfApi(token=loopback_hub.token)
    url = api.create_repo("roundtrip")
    assert url.repo_id == "alice/roundtrip"
    weights = os.urandom(200_000)
    src = tmp_path / "src"
    _write(src / "model.safetensors", weights)
    _write(src / "config.json", b'{"a": 1}')
    _write(src / "sub" / "notes.txt", b"hello")
    info = api.upload_folder(repo_id="alice/roundtrip", folder_path=src, commit_message="first push")
    assert len(info.oid) == 40

    commits = loopback_hub.server.commits("alice/roundtrip")
    assert [c["message"] for c in commits] == ["initial commit", "first push"]
    assert commits[-1]["sha"] == info.oid
    assert commits[-1]["lfs_files"] == ["model.safetensors"]  # LFS by the preupload rule for *.safetensors
    assert hashlib.sha256(weights).hexdigest() in loopback_hub.server.lfs_objects

    path = hf_hub_download("alice/roundtrip", "model.safetensors", cache_dir=tmp_path / "cache")
    with open(path, "rb") as f:
        assert f.read() == weights
    local = snapshot_download("alice/roundtrip", local_dir=tmp_path / "snap", allow_patterns=["sub/*", "config.json"])
    assert sorted(p.relative_to(local).as_posix() for p in __import__("pathlib").Path(local).rglob("*") if p.is_file() and ".cache" not in p.parts) == ["config.json", "sub/notes.txt"]
    assert (tmp_path / "snap" / "sub" / "notes.txt").read_bytes() == b"hello"

    assert sorted(api.list_repo_files("alice/roundtrip")) == [".gitattributes", "config.json", "model.safetensors", "sub/notes.txt"]
    (entry,) = api.get_paths_info("alice/roundtrip", ["model.safetensors"])
    assert entry.size == len(weights) and entry.lfs.sha256 == hashlib.sha256(weights).hexdigest()

    # deletions through delete_patterns, and history kept
    _write(src / "config.json", b'{"a": 2}')
    api.upload_folder(repo_id="alice/roundtrip", folder_path=src, allow_patterns=["config.json"],
                      delete_patterns=["sub/*"], commit_message="second")
    files = loopback_hub.server.files("alice/roundtrip")
    assert files["config.json"] == b'{"a": 2}' and "sub/notes.txt" not in files
    assert loopback_hub.server.files("alice/roundtrip", revision=info.oid)["config.json"] == b'{"a": 1}'


def test_errors_map_to_huggingface_hub_exceptions(loopback_hub, tmp_path):
    api = HfApi(token=loopback_hub.token)
    api.create_repo("errs")
    with pytest.raises(requests.HTTPError, match="Invalid user token"):
        HfApi(token="hf_unknown").whoami()
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("alice/missing")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info("alice/errs", revision="nope")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("alice/errs", "nothing.txt", cache_dir=tmp_path, token=loopback_hub.token)
    with pytest.raises(HfHubHTTPError) as info:  # bob writes into alice's namespace
        HfApi(token=loopback_hub.other_token).upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="alice/errs")
    assert info.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as info:
        HfApi(token=loopback_hub.other_token).create_repo("alice/stolen")
    assert info.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as info:
        api.create_repo("errs")
    assert info.value.response.status_code == 409
    assert api.create_repo("errs", exist_ok=True).repo_id == "alice/errs"


def test_private_repo_branch_space_and_faults(loopback_hub):
    api = HfApi(token=loopback_hub.token)
    api.create_repo("alice-org/priv", private=True)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(token=loopback_hub.other_token).repo_info("alice-org/priv")
    api.create_branch("alice-org/priv", branch="dev")
    api.upload_file(path_or_fileobj=b"on dev", path_in_repo="a.txt", repo_id="alice-org/priv", revision="dev")
    assert "a.txt" not in loopback_hub.server.files("alice-org/priv")
    assert loopback_hub.server.files("alice-org/priv", revision="dev")["a.txt"] == b"on dev"

    api.create_repo("demo", repo_type="space", space_sdk="gradio")
    api.upload_file(path_or_fileobj=b"import gradio", path_in_repo="app.py", repo_id="alice/demo", repo_type="space")
    assert loopback_hub.server.repo("alice/demo", "space").sdk == "gradio"
    assert api.space_info("alice/demo").sdk == "gradio"

    loopback_hub.server.fail_next(2, status=503, route="commit")
    for _ in range(2):
        with pytest.raises(HfHubHTTPError) as info:
            api.upload_file(path_or_fileobj=b"1", path_in_repo="b.txt", repo_id="alice/demo", repo_type="space")
        assert info.value.response.status_code == 503
    api.upload_file(path_or_fileobj=b"1", path_in_repo="b.txt", repo_id="alice/demo", repo_type="space")
    statuses = [r["status"] for r in loopback_hub.server.requests if r["route"] == "commit"]
    assert statuses[-3:] == [503, 503, 200]
    assert all(loopback_hub.token not in str(r) for r in loopback_hub.server.requests)


def test_validate_yaml(loopback_hub):
    def post(text):
        return requests.post(f"{loopback_hub.endpoint}/api/validate-yaml", json={"repoType": "model", "content": text})

    good = ("---\nlicense: apache-2.0\ndatasets:\n- wikitext\nmodel-index:\n- name: m\n  results:\n  - task: {type: fill-mask, name: Masked LM}\n"
            "    dataset: {name: wikitext, type: wikitext}\n    metrics:\n    - {type: perplexity, value: 3.5, name: Perplexity}\n---\nbody\n")
    assert post(good).status_code == 200
    bad = post("---\ndatasets: null\nlicense: not-a-license\n---\n")
    assert bad.status_code == 400
    assert '"datasets" must be a string or an array of strings' in bad.json()["error"]
    assert "known license" in bad.json()["error"]
    bad = post(good.replace("value: 3.5", "value: '3.5'").replace("type: wikitext}", "type: 7}"))
    assert "metrics[0].value must be a number" in bad.json()["error"] and "dataset.type must be a non-empty string" in bad.json()["error"]
