"""``hf-tpu deploy-space`` / :func:`hf_tpu_ext.hub.space.deploy_space` against the loopback Hub."""

from __future__ import annotations

import importlib.util
import os

import pytest




REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_DIR = os.path.join(REPO_ROOT, "spaces_demo")
MODEL_ID = "alice/tiny-fill-mask"
SPACE_ID = "alice/tiny-fill-mask-demo"


@pytest.fixture
def pushed_model(loopback_hub, trained_model_dir):
    from huggingface_hub import HfApi

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo(MODEL_ID)
    api.upload_folder(repo_id=MODEL_ID, folder_path=trained_model_dir, commit_message="model")
    return MODEL_ID


def _metadata(readme: bytes) -> dict:
    from huggingface_hub import SpaceCard

    return SpaceCard(readme.decode("utf-8")).data.to_dict()


def test_deploy_space_uploads_demo(loopback_hub, pushed_model, monkeypatch, tmp_path):
    import gradio

    from hf_tpu_ext.hub.space import deploy_space

    url = deploy_space(pushed_model, SPACE_ID, token=loopback_hub.token)
    assert url == f"{loopback_hub.endpoint}/spaces/{SPACE_ID}"
    repo = loopback_hub.server.repo(SPACE_ID, "space")
    assert repo.sdk == "gradio"
    files = loopback_hub.server.files(SPACE_ID, "space")
    assert {"app.py", "probes.py", "requirements.txt", "README.md", "model_id.txt"} <= set(files)
    with open(os.path.join(DEMO_DIR, "app.py"), "rb") as f:
        assert files["app.py"] == f.read()
    with open(os.path.join(REPO_ROOT, "hf_tpu_ext", "probes.py"), "rb") as f:
        assert files["probes.py"] == f.read()
    with open(os.path.join(DEMO_DIR, "requirements.txt"), "rb") as f:
        assert files["requirements.txt"] == f.read()
    assert files["model_id.txt"].decode().strip() == MODEL_ID
    meta = _metadata(files["README.md"])
    assert meta["models"] == [MODEL_ID]
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == gradio.__version__ and meta["app_file"] == "app.py"
    body = files["README.md"].decode()
    assert "your-username" not in body and f'Client("{SPACE_ID}")' in body
    # the model is linked on the Hub the Space was deployed to, not on huggingface.co
    assert f"[{MODEL_ID}]({loopback_hub.endpoint}/{MODEL_ID})" in body and "huggingface.co" not in body
    assert loopback_hub.token not in body
    # one commit holds the demo; a second deploy updates the same Space
    assert len(loopback_hub.server.commits(SPACE_ID, "space")) == 2  # initial commit + demo
    assert deploy_space(pushed_model, SPACE_ID, token=loopback_hub.token) == url

    # the Space's app.py, run from its own folder, shows the model named in model_id.txt
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.delenv("MODEL_ID", raising=False)
    spec = importlib.util.spec_from_file_location("space_app", str(tmp_path / "app.py"))
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    assert app.default_model_id() == MODEL_ID
    assert app.probes.__name__ == "fill_mask_probes"  # the uploaded probes.py, not hf_tpu_ext's
    predictor = app.FillMaskPredictor(app.default_model_id(), backend="torch")
    r = predictor.predict("the cat sat on the [MASK] .", 3)
    assert r["ok"] and len(r["masks"][0]) == 3 and "<mask>" not in r["filled"]


def test_deploy_space_cli_prints_url(loopback_hub, pushed_model, capsys):
    from hf_tpu_ext import cli

    rc = cli.main(["deploy-space", "--model_id", pushed_model, "--space_id", "alice-org/demo", "--private",
                   "--hub_token", loopback_hub.token])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.strip() == f"{loopback_hub.endpoint}/spaces/alice-org/demo"
    assert loopback_hub.server.repo("alice-org/demo", "space").private is True
    assert loopback_hub.token not in out + err


@pytest.mark.parametrize("model_id, space_id, flag", [
    ("alice/bad name", SPACE_ID, "--model_id"),
    ("tiny-fill-mask", SPACE_ID, "--model_id"),
    (MODEL_ID, "alice/a/b", "--space_id"),
    (MODEL_ID, "", "--space_id"),
])
def test_deploy_space_bad_ids_fail_before_network(loopback_hub, model_id, space_id, flag):
    from hf_tpu_ext.errors import HubRepoError
    from hf_tpu_ext.hub.space import deploy_space

    with pytest.raises(HubRepoError, match=flag):
        deploy_space(model_id, space_id, token=loopback_hub.token)
    assert loopback_hub.server.requests == []


def test_deploy_space_bad_token(loopback_hub, pushed_model):
    from hf_tpu_ext.errors import HubAuthError
    from hf_tpu_ext.hub.space import deploy_space

    bad = "hf_notAValidTokenAtAll0000000000"
    with pytest.raises(HubAuthError) as info:
        deploy_space(pushed_model, SPACE_ID, token=bad)
    assert "--hub_token" in str(info.value) and bad not in str(info.value)
    assert ("space", SPACE_ID) not in loopback_hub.server.repos


def test_deploy_space_without_token(loopback_hub, pushed_model):
    from hf_tpu_ext.errors import HubAuthError
    from hf_tpu_ext.hub.space import deploy_space

    with pytest.raises(HubAuthError, match="No Hub token"):
        deploy_space(pushed_model, SPACE_ID)


def test_deploy_space_namespace_not_writable(loopback_hub, pushed_model):
    from hf_tpu_ext.errors import HubAuthError
    from hf_tpu_ext.hub.space import deploy_space

    with pytest.raises(HubAuthError, match="cannot write to namespace 'alice'") as info:
        deploy_space(pushed_model, SPACE_ID, token=loopback_hub.other_token)
    assert loopback_hub.other_token not in str(info.value)


def test_deploy_space_model_missing(loopback_hub):
    from hf_tpu_ext.errors import HubRepoError
    from hf_tpu_ext.hub.space import deploy_space

    with pytest.raises(HubRepoError, match="alice/nope"):
        deploy_space("alice/nope", SPACE_ID, token=loopback_hub.token)
    assert ("space", SPACE_ID) not in loopback_hub.server.repos


def test_space_readme_render():
    from hf_tpu_ext.errors import HubRepoError
    from hf_tpu_ext.hub.space import render_space_readme

    text = render_space_readme("bob/m", "bob/s")
    assert _metadata(text.encode())["models"] == ["bob/m"]
    assert "bob/m" in text.split("---", 2)[2] and 'Client("bob/s")' in text
    assert "[bob/m](https://huggingface.co/bob/m)" in text
    with pytest.raises(HubRepoError, match="sdk: gradio"):
        render_space_readme("bob/m", template="---\nsdk: docker\n---\nbody\n")
    with pytest.raises(HubRepoError, match="61 characters"):
        render_space_readme("bob/m", template="---\nsdk: gradio\nshort_description: " + "x" * 61 + "\n---\n")


def test_space_readme_links_the_model_at_the_configured_endpoint(monkeypatch):
    from hf_tpu_ext.hub.space import render_space_readme

    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org")
    text = render_space_readme("bob/m", "bob/s")
    assert "[bob/m](https://hub.example.org/bob/m)" in text and "huggingface.co/bob" not in text
