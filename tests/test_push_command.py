"""`hf-tpu push` pushes what resumes and never loses a card: checkpoint layouts -> `last-checkpoint/` and a resume
from the repo, a user's README.md kept (metadata merged), README.md never an LFS pointer (read back from the
Hub), and the card snippets of a tf_keras callback run as written."""

import json
import re
import shutil

import pytest
import yaml
from conftest import tiny_train_args

from hf_tpu_ext.cli import main
from hf_tpu_ext.hub.checkpoint_layouts import find_checkpoints, newest_checkpoint, push_later_command

USER_README = "---\nlanguage: en\nlicense: mit\ntags:\n- my-tag\n---\n\n# My model\n\nMy own notes, with a | pipe.\n"
CONFIG = {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "hidden_size": 64,
          "num_hidden_layers": 2, "vocab_size": 300}


def _model_folder(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(CONFIG))
    (path / "model.safetensors").write_bytes(b"\0" * 4096)
    (path / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<mask>"}))
    (path / "training_summary.json").write_text(json.dumps({
        "backend": "tensorflow", "global_step": 40, "hyperparameters": {"total_steps": 40},
        "eval_results": {"eval_loss": 2.0, "perplexity": 7.389056}, "mask_token": "<mask>"}))
    return path


def _metadata(text):
    return yaml.safe_load(text.split("---")[1])


def _push(hub, folder, *extra):
    return main(["push", str(folder), "--hub_token", hub.token, *extra])


def _lfs_files(hub, repo_id):
    return hub.server.commits(repo_id)[-1]["lfs_files"]


def _run_snippets(card, files, capsys):
    """Run every Python block of ``card`` as written (against the loopback repo it names); returns how many."""
    blocks = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    expected = (1 if "model.safetensors" in files else 0) + (1 if "tf_model.h5" in files else 0)
    assert expected >= 1 and len(blocks) == expected
    capsys.readouterr()
    for code in blocks:
        exec(compile(code, "<card snippet>", "exec"), {})
        printed = capsys.readouterr().out.strip().splitlines()[-1]
        assert printed.startswith("[") and printed.count(",") >= 4, printed  # five predictions
    return len(blocks)


# ---- layouts ----------------------------------------------------------------------------------
def test_every_checkpoint_layout_is_found_and_torn_saves_are_skipped(tmp_path):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    ckpts.mkdir(parents=True)
    for step in (10, 20):  # hf-tpu train --backend tensorflow
        for suffix in (".index", ".data-00000-of-00001", ".json", ".trainer_state.json"):
            (ckpts / f"ckpt-{step}{suffix}").write_text("x")
    for suffix in (".index", ".data-00000-of-00001"):  # a save killed before its trainer state
        (ckpts / f"ckpt-30{suffix}").write_text("x")
    (ckpts / "ckpt-40.index").write_text("x")  # an index without data: not a checkpoint
    for suffix in (".index", ".data-00000-of-00001"):  # its sidecar names a state file that never came
        (ckpts / f"ckpt-50{suffix}").write_text("x")
    (ckpts / "ckpt-50.json").write_text(json.dumps({"global_step": 50, "trainer_state": "ckpt-50.trainer_state.json"}))
    found = find_checkpoints(str(run))
    assert [(c.layout, c.step, c.has_state) for c in found] == [
        ("tensorflow", 30, False), ("tensorflow", 20, True), ("tensorflow", 10, True)]
    newest = newest_checkpoint(str(run))
    assert (newest.step, newest.path) == (20, str(ckpts / "ckpt-20"))

    trainer = tmp_path / "trainer"  # --backend torch_xla / Trainer / --backend keras
    for step in (5, 15):
        (trainer / f"checkpoint-{step}").mkdir(parents=True)
        (trainer / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (trainer / ".checkpoint-25.tmp-123").mkdir()  # the Keras backend's save in progress
    assert [(c.layout, c.step) for c in find_checkpoints(str(trainer))] == [("checkpoint-N", 15), ("checkpoint-N", 5)]

    keras3 = tmp_path / "keras3" / "checkpoints" / "checkpoint-7"  # the Keras 3 callback
    keras3.mkdir(parents=True)
    (keras3 / "checkpoint.weights.h5").write_bytes(b"h5")
    (keras3 / "trainer_state.json").write_text(json.dumps({"global_step": 7, "epoch": 1}))
    assert [(c.layout, c.step, c.has_state) for c in find_checkpoints(str(tmp_path / "keras3"))] == [
        ("keras-callback", 7, True)]

    assert push_later_command(str(tmp_path / "my run"), "alice/m", "dev") == (
        f"hf-tpu push '{tmp_path / 'my run'}' --hub_model_id alice/m --revision dev")


def test_push_train_folder_with_checkpoint_then_resume_from_the_repo(loopback_hub, trained_model_dir, tmp_path,
                                                                     capsys):
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    run = tmp_path / "run"
    shutil.copytree(trained_model_dir, run)  # the session's run stays as it is
    for suffix in (".index", ".data-00000-of-00001"):  # a torn save after the last complete one
        (run / "checkpoints" / f"ckpt-40{suffix}").write_bytes(b"torn")
    assert _push(loopback_hub, run, "--hub_model_id", "alice/resume-me", "--include_checkpoint") == 0

    files = loopback_hub.server.files("alice/resume-me")
    assert sorted(p for p in files if p.startswith("last-checkpoint/")) == [
        "last-checkpoint/checkpoint", "last-checkpoint/ckpt-30.data-00000-of-00001", "last-checkpoint/ckpt-30.index",
        "last-checkpoint/ckpt-30.json", "last-checkpoint/trainer_state.json"]
    assert files["last-checkpoint/ckpt-30.index"] == (run / "checkpoints" / "ckpt-30.index").read_bytes()
    state = json.loads(files["last-checkpoint/trainer_state.json"])
    assert state["global_step"] == 30
    assert files["model.safetensors"] == (run / "model.safetensors").read_bytes()
    assert not [p for p in files if p.startswith("checkpoints/") or "ckpt-40" in p]
    assert "README.md" not in _lfs_files(loopback_hub, "alice/resume-me")
    commit = loopback_hub.server.commits("alice/resume-me")[-1]
    assert commit["message"] == "Upload model (step 30) and last-checkpoint/ (step 30) with hf-tpu-ext"
    # the card's snippets (PyTorch pipeline on model.safetensors, TensorFlow on tf_model.h5) run as written
    assert _run_snippets(files["README.md"].decode(), files, capsys) == 2

    resumed = tmp_path / "resumed"
    results = train(*parse_args(tiny_train_args(
        resumed, "--max_steps", "32", "--eval_strategy", "no", "--save_strategy", "no", "--callbacks", "",
        "--resume_from_checkpoint", "alice/resume-me", "--hub_token", loopback_hub.token)))
    assert results["global_step"] == 32
    history = json.loads((resumed / "trainer_state.json").read_text())["log_history"]
    # the history up to step 30 is the pushed checkpoint's: the resume started at 30, not at 0
    assert [e for e in history if e["step"] <= 30] == state["log_history"]
    assert [e["step"] for e in history if "loss" in e and e["step"] > 30] == [32]


# ---- the user's README.md -----------------------------------------------------------------------
def test_push_keeps_the_users_readme_and_merges_the_metadata(loopback_hub, tmp_path):
    from huggingface_hub import HfApi

    out = _model_folder(tmp_path / "mine")
    (out / "README.md").write_text(USER_README)
    assert _push(loopback_hub, out, "--hub_model_id", "alice/mine") == 0
    local = (out / "README.md").read_text()
    assert local.endswith("---\n\n# My model\n\nMy own notes, with a | pipe.\n")  # the text, byte for byte
    meta = _metadata(local)
    assert meta["language"] == "en" and meta["license"] == "mit"  # the user's metadata wins
    assert meta["tags"][0] == "my-tag" and {"hf-tpu-ext", "fill-mask"} <= set(meta["tags"])
    assert (meta["pipeline_tag"], meta["library_name"]) == ("fill-mask", "transformers")
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 7.389056
    assert list(meta)[:3] == ["language", "license", "tags"]  # the user's order first
    assert "hf-tpu-ext generated this card" not in local
    assert loopback_hub.server.files("alice/mine")["README.md"].decode() == local
    info = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token).model_info("alice/mine")
    assert info.card_data.language == "en" and "fill-mask" in info.card_data.tags

    # again: nothing duplicated; an explicit --license wins over the user's
    assert _push(loopback_hub, out, "--hub_model_id", "alice/mine", "--license", "apache-2.0") == 0
    again = (out / "README.md").read_text()
    assert _metadata(again)["tags"] == meta["tags"] and _metadata(again)["license"] == "apache-2.0"
    assert again.endswith("# My model\n\nMy own notes, with a | pipe.\n")

    # --card keep: pushed unchanged; --card overwrite: the generated card replaces it
    (out / "README.md").write_text(USER_README)
    assert _push(loopback_hub, out, "--hub_model_id", "alice/mine", "--card", "keep") == 0
    assert loopback_hub.server.files("alice/mine")["README.md"].decode() == USER_README
    assert _push(loopback_hub, out, "--hub_model_id", "alice/mine", "--card", "overwrite") == 0
    generated = (out / "README.md").read_text()
    assert "hf-tpu-ext generated this card" in generated and "My own notes" not in generated
    assert "language" not in _metadata(generated)


def test_generated_card_is_replaced_an_edited_one_kept(loopback_hub, tmp_path):
    from hf_tpu_ext.hub.model_card import card_origin

    out = _model_folder(tmp_path / "gen")
    assert _push(loopback_hub, out, "--hub_model_id", "alice/gen", "--include_checkpoint", "false") == 0
    first = (out / "README.md").read_text()
    assert card_origin(first) == "generated"
    summary = json.loads((out / "training_summary.json").read_text())
    summary["eval_results"]["perplexity"] = 6.5
    (out / "training_summary.json").write_text(json.dumps(summary))
    assert _push(loopback_hub, out, "--hub_model_id", "alice/gen") == 0
    second = (out / "README.md").read_text()
    assert "| Perplexity | 6.5 |" in second and card_origin(second) == "generated"  # refreshed
    edited = second.replace("## Limitations", "## Limitations\n\nOnly for my experiments.")
    (out / "README.md").write_text(edited)
    assert card_origin(edited) == "edited"
    assert _push(loopback_hub, out, "--hub_model_id", "alice/gen") == 0
    assert "Only for my experiments." in (out / "README.md").read_text()


def test_unparsable_user_metadata_fails_before_any_upload(loopback_hub, tmp_path, capsys):
    out = _model_folder(tmp_path / "bad")
    (out / "README.md").write_text("---\nlanguage: [en\n---\n\n# Mine\n")
    assert _push(loopback_hub, out, "--hub_model_id", "alice/bad") == 1
    err = capsys.readouterr().err
    assert "README.md's metadata block does not parse" in err and loopback_hub.token not in err
    assert (out / "README.md").read_text() == "---\nlanguage: [en\n---\n\n# Mine\n"
    assert [c["message"] for c in loopback_hub.server.commits("alice/bad")] == ["initial commit"]


# ---- a repo whose .gitattributes routes *.md through LFS -----------------------------------------
def test_card_in_an_lfs_md_repo_lands_as_a_regular_file(loopback_hub, tmp_path):
    from huggingface_hub import HfApi

    from hf_tpu_ext.hub.model_card import check_card_on_hub, lfs_rule_for

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/lfs-md")
    rule = "*.md filter=lfs diff=lfs merge=lfs -text"
    api.upload_file(path_or_fileobj=f"*.safetensors filter=lfs diff=lfs merge=lfs -text\n{rule}\n".encode(),
                    path_in_repo=".gitattributes", repo_id="alice/lfs-md")
    # what went wrong before: a plain upload stores README.md as an LFS pointer, and the Hub shows no metadata
    api.upload_file(path_or_fileobj=b"---\npipeline_tag: fill-mask\ntags:\n- fill-mask\n---\n# x\n",
                    path_in_repo="README.md", repo_id="alice/lfs-md")
    assert "README.md" in _lfs_files(loopback_hub, "alice/lfs-md")
    assert check_card_on_hub(api, "alice/lfs-md") == [
        "README.md is stored as a Git LFS pointer (see the repo's .gitattributes), so the Hub reads no card metadata"]

    out = _model_folder(tmp_path / "lfs-md")
    assert _push(loopback_hub, out, "--hub_model_id", "alice/lfs-md") == 0
    commits = loopback_hub.server.commits("alice/lfs-md")
    assert [c["message"] for c in commits[-2:]] == [
        "Store README.md as a regular file (the Hub reads card metadata only from one)",
        "Upload model (step 40) with hf-tpu-ext"]
    attributes = commits[-1]["files"][".gitattributes"].decode()
    assert rule in attributes and lfs_rule_for(attributes) is None and attributes.endswith(
        "README.md -filter -diff -merge text\n")
    assert "README.md" not in commits[-1]["lfs_files"] and "model.safetensors" in commits[-1]["lfs_files"]
    assert check_card_on_hub(api, "alice/lfs-md", commits[-1]["sha"]) == []
    assert "fill-mask" in api.model_info("alice/lfs-md").card_data.tags


def test_lfs_rules_follow_git():
    from hf_tpu_ext.hub.model_card import lfs_rule_for

    assert lfs_rule_for("*.md filter=lfs diff=lfs merge=lfs -text") == "*.md filter=lfs diff=lfs merge=lfs -text"
    assert lfs_rule_for("README.md filter=lfs\n*.md -filter") is None  # the last matching line decides
    assert lfs_rule_for("/README.* filter=lfs") == "/README.* filter=lfs"
    assert lfs_rule_for("docs/*.md filter=lfs\n# README.md filter=lfs\n*.safetensors filter=lfs") is None
    assert lfs_rule_for("") is None


# ---- the tf_keras callback's card: its snippets run as written -------------------------------------
def test_tf_keras_callback_card_snippets_run(loopback_hub, trained_model_dir, tmp_path, capsys):
    pytest.importorskip("tensorflow")
    import tf_keras
    from transformers import AutoTokenizer

    from hf_tpu_ext.backends.tensorflow.export import load_tf_model
    from hf_tpu_ext.callbacks.tf_keras.push_to_hub import PushToHubCallback

    model = load_tf_model(str(trained_model_dir))  # what a plain Keras script continuing from our folder has
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-4))
    tokenizer = AutoTokenizer.from_pretrained(str(trained_model_dir))
    cb = PushToHubCallback(output_dir=str(tmp_path / "script-out"), tokenizer=tokenizer, hub_model_id="alice/cb-card",
                           hub_token=loopback_hub.token, hub_strategy="every_save", save_strategy="epoch")
    cb.set_model(model)
    cb.set_params({"epochs": 2, "steps": 4})
    cb.on_train_begin()
    model.optimizer.iterations.assign(4)  # as after the first epoch of model.fit
    cb.on_epoch_end(0, {"loss": 6.1})
    model.optimizer.iterations.assign(8)
    cb.on_epoch_end(1, {"loss": 6.0})
    cb.on_train_end({"loss": 6.0})
    cards = {c["message"]: c["files"]["README.md"].decode() for c in loopback_hub.server.commits("alice/cb-card")
             if "README.md" in c["added"]}
    # the save at step 8 of 8 coalesces into the final push that follows with the same state (one commit, not two)
    assert list(cards) == ["Training in progress, step 4", "End of training"]
    assert cb.session.coalesced_steps == [8] and cb.report.counts["pushed"] == 2
    assert "**Training in progress, step 4 of 8: these weights are a snapshot" in cards["Training in progress, step 4"]
    card = cards["End of training"]
    assert "Training in progress" not in card
    files = loopback_hub.server.files("alice/cb-card")
    assert "README.md" not in _lfs_files(loopback_hub, "alice/cb-card")
    assert 'framework="tf"' not in card and "from_tf=True)" not in card  # both fail with transformers 4.57.6
    assert _run_snippets(card, files, capsys) >= 1


def test_pusher_of_training_runs_keeps_card_out_of_lfs_and_reads_it_back(loopback_hub, tmp_path, monkeypatch,
                                                                         caplog):
    """`hf-tpu train --push_to_hub` and the callbacks push through the push session: the same guard."""
    from huggingface_hub import HfApi

    from hf_tpu_ext.hub import card_guard
    from hf_tpu_ext.hub.model_card import save_model_card
    from hf_tpu_ext.hub.push_session import PushSession, push_save

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    for name in ("alice/run-lfs", "alice/run-lost"):
        api.create_repo(name)
        api.upload_file(path_or_fileobj=b"*.md filter=lfs diff=lfs merge=lfs -text\n", path_in_repo=".gitattributes",
                        repo_id=name)
    out = _model_folder(tmp_path / "run")
    save_model_card(str(out), repo_id="alice/run-lfs")
    with PushSession.for_script("alice/run-lfs", token=loopback_hub.token, hub_strategy="end", output_dir=str(out)) as pusher:
        push_save(pusher, str(out), step=40, final=True)
    assert pusher.card_problems == []
    assert "README.md" not in _lfs_files(loopback_hub, "alice/run-lfs")

    # without the guard the card becomes an LFS pointer: the read-back says so
    monkeypatch.setattr(card_guard, "keep_card_out_of_lfs", lambda *a, **k: None)
    with PushSession.for_script("alice/run-lost", token=loopback_hub.token, hub_strategy="end", output_dir=str(out)) as pusher:
        push_save(pusher, str(out), step=40, final=True)
    assert "README.md" in _lfs_files(loopback_hub, "alice/run-lost")
    assert pusher.card_problems == [
        "README.md is stored as a Git LFS pointer (see the repo's .gitattributes), so the Hub reads no card metadata"]
    assert "The Hub does not show the model card pushed to alice/run-lost: README.md is stored as a Git LFS" in caplog.text


def test_push_command_fails_loudly_when_the_hub_shows_no_card(loopback_hub, tmp_path, monkeypatch, capsys):
    from huggingface_hub import HfApi

    from hf_tpu_ext.hub import card_guard

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/lost")
    api.upload_file(path_or_fileobj=b"*.md filter=lfs\n", path_in_repo=".gitattributes", repo_id="alice/lost")
    monkeypatch.setattr(card_guard, "keep_card_out_of_lfs", lambda *a, **k: None)  # as before the guard
    assert _push(loopback_hub, _model_folder(tmp_path / "lost"), "--hub_model_id", "alice/lost") == 1
    err = capsys.readouterr().err
    sha = loopback_hub.server.commits("alice/lost")[-1]["sha"]
    assert (f"Pushed {loopback_hub.endpoint}/alice/lost/commit/{sha}, but the Hub does not show the model card's "
            "metadata: README.md is stored as a Git LFS pointer") in err


def test_push_trainer_and_keras_callback_folders_resume_from_last_checkpoint(loopback_hub, tmp_path):
    import os

    from hf_tpu_ext.hub.resume import download_last_checkpoint

    # --backend torch_xla / a Trainer: checkpoint-N/ folders next to the model
    pt = _model_folder(tmp_path / "pt-run")
    for step in (20, 40):
        ckpt = pt / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "optimizer.pt").write_bytes(b"adam %d" % step)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    assert _push(loopback_hub, pt, "--hub_model_id", "alice/pt-run") == 0
    folder = download_last_checkpoint("alice/pt-run", loopback_hub.token, str(tmp_path / "dl-pt"),
                                      is_checkpoint=lambda f: os.path.isfile(os.path.join(f, "optimizer.pt")))
    assert json.loads(open(os.path.join(folder, "trainer_state.json")).read())["global_step"] == 40
    assert open(os.path.join(folder, "optimizer.pt"), "rb").read() == b"adam 40"

    # a run stopped before its first export: last-checkpoint/ and the tokenizer a resume needs, no model, no card
    early = tmp_path / "early"
    shutil.copytree(pt / "checkpoint-20", early / "checkpoint-20")
    (early / "tokenizer.json").write_text("{}")
    assert _push(loopback_hub, early, "--hub_model_id", "alice/early") == 0
    assert sorted(loopback_hub.server.files("alice/early")) == [
        ".gitattributes", "last-checkpoint/optimizer.pt", "last-checkpoint/trainer_state.json", "tokenizer.json"]
    assert loopback_hub.server.commits("alice/early")[-1]["message"] == (
        "Upload last-checkpoint/ (step 20) with hf-tpu-ext")

    # the Keras 3 callback: a keras-hub preset with the callback's own card, checkpoints/checkpoint-N/
    k3 = tmp_path / "k3-run"
    (k3 / "checkpoints" / "checkpoint-7").mkdir(parents=True)
    (k3 / "model.weights.h5").write_bytes(b"preset weights")
    (k3 / "config.json").write_text(json.dumps({"module": "keras_hub.src.models.roberta.roberta_backbone"}))
    card = "---\nlibrary_name: keras-hub\npipeline_tag: fill-mask\ntags:\n- keras-hub\n---\n\n# k3-run\n"
    (k3 / "README.md").write_text(card)
    (k3 / "checkpoints" / "checkpoint-7" / "checkpoint.weights.h5").write_bytes(b"model+optimizer")
    (k3 / "checkpoints" / "checkpoint-7" / "trainer_state.json").write_text(json.dumps({"global_step": 7, "epoch": 1}))
    assert _push(loopback_hub, k3, "--hub_model_id", "alice/k3-run") == 0
    files = loopback_hub.server.files("alice/k3-run")
    assert files["README.md"].decode() == card and files["model.weights.h5"] == b"preset weights"
    assert files["last-checkpoint/checkpoint.weights.h5"] == b"model+optimizer"
    assert not [p for p in files if p.startswith("checkpoints/")]
    assert loopback_hub.server.commits("alice/k3-run")[-1]["message"] == (
        "Upload model and last-checkpoint/ (step 7) with hf-tpu-ext")


def test_user_metadata_the_hub_rejects_leaves_the_readme_as_it_was(loopback_hub, tmp_path, capsys):
    out = _model_folder(tmp_path / "badlicense")
    text = "---\nlicense: my-own-license\n---\n\n# Mine\n"
    (out / "README.md").write_text(text)
    assert _push(loopback_hub, out, "--hub_model_id", "alice/badlicense") == 1
    err = capsys.readouterr().err
    assert "'license' 'my-own-license' is not a known license identifier" in err
    assert (out / "README.md").read_text() == text
    assert [c["message"] for c in loopback_hub.server.commits("alice/badlicense")] == ["initial commit"]
