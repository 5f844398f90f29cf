"""``hf-tpu deploy-space`` / :func:`hf_tpu_ext.hub.space.deploy_space` against the loopback Hub."""

from __future__ import annotations

import importlib.util
import os
import sys

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
    from hf_tpu_ext.fill_mask import space_modules

    modules = space_modules()
    assert set(files) - {".gitattributes"} == {"app.py", "requirements.txt", "README.md", "model_id.txt", *modules}
    with open(os.path.join(DEMO_DIR, "app.py"), "rb") as f:
        assert files["app.py"] == f.read()
    library = sorted(f"hf_tpu_ext/fill_mask/{n}" for n in os.listdir(os.path.join(REPO_ROOT, "hf_tpu_ext", "fill_mask"))
                     if n.endswith(".py"))
    assert sorted(p for p in modules if p.startswith("hf_tpu_ext/fill_mask/")) == library  # none forgotten
    assert {"hf_tpu_ext/__init__.py", "hf_tpu_ext/probes/__init__.py", "hf_tpu_ext/probes/scoring.py"} <= set(modules)
    for path in modules:
        with open(os.path.join(REPO_ROOT, *path.split("/")), "rb") as f:
            assert files[path] == f.read(), path
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
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    monkeypatch.delenv("MODEL_ID", raising=False)
    monkeypatch.setattr("sys.path", list(sys.path))  # app.py puts its own folder first
    spec = importlib.util.spec_from_file_location("space_app", str(tmp_path / "app.py"))
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    assert app.default_model_id() == MODEL_ID
    assert sys.path[0] == str(tmp_path)  # the uploaded hf_tpu_ext/ next to app.py comes first
    predictor = app.FillMaskPredictor(app.default_model_id(), backend="torch")
    r = predictor.predict("the cat sat on the [MASK] .", 3)
    assert r["ok"] and len(r["masks"][0]) == 3 and "<mask>" not in r["filled"]


SPACE_RUN = """
import json, sys
import app  # the Space's app.py, from this folder
import hf_tpu_ext, numpy
demo = app.build_demo(backend="torch")
listing = demo.bench.revisions()
answer = demo.bench.fill_mask_many([("the cat sat on the <mask> .", 3, "", "", "")])[0]
probe = demo.bench.probe("the cat sat on the <mask> . => mat | rug", "main")
print(json.dumps({"package": hf_tpu_ext.__file__, "ok": answer["ok"], "masks": len(answer["masks"][0]),
                  "offered": [[r["kind"], r["title"]] for r in demo.bench.offered()],
                  "not_offered": [r["title"] for r in demo.bench.not_offered()], "probe_ok": probe["ok"],
                  "frameworks": sorted(m for m in ("tensorflow", "tf_keras", "keras", "jax", "scipy")
                                       if m in sys.modules)}))
"""


def test_space_files_alone_run_in_a_fresh_venv(loopback_hub, pushed_model, tmp_path):
    """The uploaded files in a new venv that sees the installed third-party packages but not this repo's package
    (no editable install, no PYTHONPATH): the page builds, lists the repo, answers and scores a probe."""
    import json
    import subprocess
    import sysconfig
    import venv

    from hf_tpu_ext.hub.space import space_files

    space = tmp_path / "space"
    for name, data in space_files(pushed_model, SPACE_ID).items():
        (space / name).parent.mkdir(parents=True, exist_ok=True)
        (space / name).write_bytes(data)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = next(env_dir.glob("lib/python*/site-packages"))
    # a plain path line: the packages of the test environment, without processing its .pth files (the editable
    # hf_tpu_ext finder is one), so only the uploaded hf_tpu_ext/ can be imported
    (site / "test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MODEL_ID", "PYTHONHOME")}
    env.update(HF_ENDPOINT=loopback_hub.endpoint, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_XET="1",
               USE_TF="0")  # as in the Space, where TensorFlow is not installed (transformers imports it when it is)
    proc = subprocess.run([str(env_dir / "bin" / "python"), "-c", SPACE_RUN], cwd=space, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["package"] == str(space / "hf_tpu_ext" / "__init__.py")
    assert out["ok"] is True and out["masks"] == 3 and out["probe_ok"] is True
    # one entry per commit: the commit main points to is offered once, as main
    assert out["offered"] == [["branch", "model"]] and out["not_offered"] == ["initial commit"]
    assert out["frameworks"] == []  # torch only: nothing the requirements do not list


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
