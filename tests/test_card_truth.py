"""Model cards that tell the truth: base_model only for a Hub repo id, "continued from" when initialized from
weights (also from a Keras script's push callback, with a model-index from val_loss), links at HF_ENDPOINT."""

import math
import os

import pytest

from hf_tpu_ext.hub.model_card import eval_results_from_logs, initialization_fields, render_model_card


def _summary(**kw):
    base = {"model_config": {"model_type": "roberta", "hidden_size": 64, "num_hidden_layers": 2,
                             "architectures": ["RobertaForMaskedLM"]},
            "mask_token": "<mask>", "eval_results": {"eval_loss": 2.5}}
    base.update(kw)
    return base


def test_local_folder_is_named_not_linked_nor_base_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-fill-mask-model").mkdir()
    assert initialization_fields("my-fill-mask-model") == {"base_model": None, "initialized_from": "my-fill-mask-model"}
    assert initialization_fields(str(tmp_path / "my-fill-mask-model")) == {
        "base_model": None, "initialized_from": "my-fill-mask-model"}
    assert initialization_fields(None) == {"base_model": None, "initialized_from": None}
    # an older summary that recorded the local folder as base_model
    for summary in (_summary(base_model="my-fill-mask-model"),
                    _summary(**initialization_fields(str(tmp_path / "my-fill-mask-model")))):
        card = render_model_card(str(tmp_path), repo_id="alice/continued", summary=summary)
        text = str(card)
        assert card.data.base_model is None and "base_model" not in text.split("---")[1]
        assert ("continues the masked-language-model pre-training of a local model folder (`my-fill-mask-model`, not "
                "on the Hub) on a custom text corpus (fine-tuned from its weights).") in text
        assert "from scratch" not in text and "huggingface.co/my-fill-mask-model" not in text
        assert str(tmp_path) not in text


def test_hub_base_model_and_links_use_the_endpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org/")
    summary = _summary(**initialization_fields("FacebookAI/roberta-base"), dataset_name="wikitext")
    assert summary["base_model"] == "FacebookAI/roberta-base"
    card = render_model_card(str(tmp_path), repo_id="alice/continued", summary=summary)
    text = str(card)
    assert card.data.base_model == "FacebookAI/roberta-base"
    assert ("continues the masked-language-model pre-training of [FacebookAI/roberta-base]"
            "(https://hub.example.org/FacebookAI/roberta-base) on the Hub dataset wikitext (fine-tuned from its "
            "weights).") in text
    assert "[wikitext](https://hub.example.org/datasets/wikitext)" in text
    assert "huggingface.co" not in text.replace("huggingface.co/docs", "")
    scratch = str(render_model_card(str(tmp_path), summary=_summary()))
    assert "was pre-trained from scratch (randomly initialized weights)" in scratch


def test_eval_results_from_keras_logs():
    assert eval_results_from_logs({"loss": 3.0, "val_loss": 2.0}) == {"eval_loss": 2.0, "perplexity": math.exp(2.0)}
    assert eval_results_from_logs({"eval_loss": 1.0, "perplexity": 2.5, "eval_accuracy": 0.4}) == {
        "eval_loss": 1.0, "eval_accuracy": 0.4, "perplexity": 2.5}
    assert eval_results_from_logs({"loss": 3.0}) == {}
    # keras-hub masked LMs compile SparseCategoricalAccuracy weighted by mask_weights: fit's validation of it
    assert eval_results_from_logs({"val_loss": 2.0, "val_sparse_categorical_accuracy": 0.25}) == {
        "eval_loss": 2.0, "eval_accuracy": 0.25, "perplexity": math.exp(2.0)}
    assert eval_results_from_logs({"val_loss": float("nan")}) == {}


def _recording_session(repo_id, output_dir, **config):
    """A push callback's session whose Hub side is stood in for: the callback writes the model folder and card as in
    a run; preflight touches no Hub and the saves it would queue are recorded instead of uploaded."""
    from hf_tpu_ext.callbacks.push_cadence import CallbackSession, PushConfig

    class Recording(CallbackSession):
        saves = []

        def preflight(self):
            self.repo_id = repo_id
            return repo_id

        def _submit(self, plan, model_folder, checkpoint, replaced=()):  # what the session would queue: the save's one plan
            self.saves.append((model_folder, {"step": plan.step, "checkpoint_folder": checkpoint,
                                              "final": plan.final, "commit_message": plan.commit_message}))

    return Recording(PushConfig(output_dir, repo_id, **config), is_chief=True)


def test_script_push_callback_card_says_continued_with_model_index(trained_model_dir, tmp_path):
    pytest.importorskip("tensorflow")
    from hf_tpu_ext.backends.tensorflow.export import load_tf_model, save_model_folder
    from hf_tpu_ext.callbacks.tf_keras.push_to_hub import PushToHubCallback

    model = load_tf_model(str(trained_model_dir))  # what a script continuing from our folder does
    assert model.name_or_path == str(trained_model_dir)
    out = tmp_path / "script-out"
    import tf_keras

    model.compile(optimizer=tf_keras.optimizers.Adam(1e-4))  # a script's compile: model.optimizer.iterations
    pusher = _recording_session("alice/card-truth-script", str(out), hub_strategy="end", save_strategy="no")
    cb = PushToHubCallback(output_dir=str(out), save_fn=save_model_folder, hub_strategy="end", save_strategy="no",
                           session=pusher)
    cb.set_model(model)
    cb.on_epoch_end(0, {"loss": 6.3, "val_loss": 6.0})
    cb.on_train_end()  # the final save: model folder and card written, then handed to the pusher
    assert pusher.saves == [(str(out), {"step": 0, "checkpoint_folder": None, "final": True,
                                        "commit_message": "End of training"})]
    text = (out / "README.md").read_text()
    assert "from scratch" not in text
    assert f"a local model folder (`{os.path.basename(str(trained_model_dir))}`, not on the Hub)" in text
    assert "model-index" in text and "value: 6.0" in text and f"value: {round(math.exp(6.0), 6)}" in text


def _card_text(folder, files, **summary_kw):
    folder.mkdir(exist_ok=True)
    for name in files:
        (folder / name).write_bytes(b"x")
    return str(render_model_card(str(folder), repo_id="alice/m", summary=_summary(**summary_kw)))


def test_tf_only_folder_card_shows_tensorflow_loaders_only(tmp_path):
    text = _card_text(tmp_path / "tf", ["tf_model.h5", "config.json"], backend="tensorflow")
    assert ("The weights are stored in TensorFlow format only (`tf_model.h5`), so load them with TensorFlow "
            "(transformers 4.x). transformers 4.57's fill-mask pipeline does not run on TensorFlow") in text
    assert 'model = TFAutoModelForMaskedLM.from_pretrained("alice/m")\n' in text
    # the two loaders that fail with transformers 4.57.6 are not offered
    assert 'framework="tf"' not in text and "from_tf=True)" not in text and "pipeline(" not in text
    assert "The repo holds no PyTorch weights (`model.safetensors`)" in text
    assert "use_safetensors=False" not in text


def test_both_formats_card_shows_both_and_pytorch_only_claims_no_h5(tmp_path):
    both = _card_text(tmp_path / "both", ["model.safetensors", "tf_model.h5"], backend="tensorflow")
    assert "The weights are stored as PyTorch-format `model.safetensors`" in both
    assert 'fill_mask = pipeline("fill-mask", model="alice/m")' in both
    assert "With TensorFlow (transformers 4.x), the repo also holds the same weights as `tf_model.h5`." in both
    assert 'TFAutoModelForMaskedLM.from_pretrained("alice/m", use_safetensors=False)' in both
    pt = _card_text(tmp_path / "pt", ["model.safetensors"], backend="pytorch", accelerator="cpu")
    assert "The weights are stored as PyTorch-format `model.safetensors`" in pt
    assert "tf_model.h5" not in pt and "TFAutoModelForMaskedLM" not in pt


def test_card_says_training_in_progress_until_the_last_step(tmp_path):
    hyper = {"total_steps": 1000}
    text = _card_text(tmp_path / "mid", ["model.safetensors"], global_step=625, hyperparameters=hyper)
    assert ("**Training in progress, step 625 of 1000: these weights are a snapshot of an unfinished run (later "
            "pushes update them and this card).**") in text
    final = _card_text(tmp_path / "end", ["model.safetensors"], global_step=1000, hyperparameters=hyper)
    assert "Training in progress" not in final
    # a callback's card: max_steps from its measurements; an explicit flag wins over the comparison
    assert "step 3 of 8" in _card_text(tmp_path / "cb", ["model.safetensors"], global_step=3, max_steps=8)
    assert "Training in progress" not in _card_text(tmp_path / "cb2", ["model.safetensors"], global_step=3,
                                                    max_steps=8, training_in_progress=False)


def test_trainer_card_names_the_real_framework_and_fills_progress(tmp_path):
    text = _card_text(tmp_path / "pt", ["model.safetensors"], backend="pytorch", accelerator="cpu",
                      global_step=12, epoch=2.0, global_batch_size=8)
    assert "It was trained with hf-tpu-ext using PyTorch (transformers Trainer) on CPU." in text
    assert "PyTorch/XLA" not in text
    for row in ("| Backend | pytorch |", "| Accelerator | CPU |", "| Optimizer steps | 12 |", "| Epochs | 2 |",
                "| Global batch size (sequences) | 8 |"):
        assert row in text
    xla = _card_text(tmp_path / "xla", ["model.safetensors"], backend="torch_xla")
    assert "It was trained with hf-tpu-ext using PyTorch/XLA." in xla


def test_torch_push_callback_card_fills_trainer_progress(tmp_path):
    pytest.importorskip("torch")
    from types import SimpleNamespace

    import torch

    from hf_tpu_ext.callbacks.torch.push_to_hub import PushToHubCallback

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"x")
    trainer_dir = tmp_path / "trainer"
    (trainer_dir / "checkpoint-30").mkdir(parents=True)  # what the Trainer saved before calling on_save
    (trainer_dir / "checkpoint-30" / "model.safetensors").write_bytes(b"x")
    pusher = _recording_session("alice/card-truth-torch", str(out))
    cb = PushToHubCallback(output_dir=str(out), session=pusher)
    args = SimpleNamespace(train_batch_size=4, gradient_accumulation_steps=2, world_size=1, device=torch.device("cpu"),
                           output_dir=str(trainer_dir))
    cb.on_save(args, SimpleNamespace(global_step=30, epoch=3.0), None)
    assert [(folder, kw["step"], kw["final"]) for folder, kw in pusher.saves] == [(str(out), 30, False)]
    text = (out / "README.md").read_text()
    assert "It was trained with hf-tpu-ext using PyTorch (transformers Trainer) on CPU." in text
    for row in ("| Optimizer steps | 30 |", "| Epochs | 3 |", "| Global batch size (sequences) | 8 |",
                "| Accelerator | CPU |"):
        assert row in text
    assert "tf_model.h5" not in text


def test_card_says_xla_only_where_the_run_compiled_with_it(tmp_path):
    """A tf_keras fit compiled without jit_compile=True ran TensorFlow's kernels: the card does not claim XLA."""
    import tf_keras

    from hf_tpu_ext.tf_model_folder import model_facts

    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    model.compile("sgd", "mse")  # tf_keras' default: no XLA (jit_compile None)
    facts = model_facts(model)
    assert facts["jit_compile"] is None
    plain = _card_text(tmp_path / "plain", ["tf_model.h5"], **facts)
    assert "It was trained with hf-tpu-ext using TensorFlow." in plain and "XLA" not in plain.split("## ")[1]
    assert "| XLA compilation | n/a |" in plain and "- xla\n" not in plain
    model.compile("sgd", "mse", jit_compile=True)
    xla = _card_text(tmp_path / "xla", ["tf_model.h5"], **model_facts(model))
    assert "It was trained with hf-tpu-ext using TensorFlow + XLA." in xla and "- xla\n" in xla
    said = {(backend, keras_backend, jit): _card_text(tmp_path / f"{backend}{keras_backend}{jit}", ["model.safetensors"],
                                                      backend=backend, keras_backend=keras_backend, jit_compile=jit)
            .split("It was trained with hf-tpu-ext using ")[1].split("\n")[0]
            for backend, keras_backend, jit in (("tensorflow", None, False), ("keras", "jax", None),
                                                ("keras", "tensorflow", None), ("keras", "tensorflow", True),
                                                ("keras", "torch", True))}
    assert said == {("tensorflow", None, False): "TensorFlow.", ("keras", "jax", None): "Keras 3 on JAX + XLA.",
                    ("keras", "tensorflow", None): "Keras 3 on TensorFlow.",
                    ("keras", "tensorflow", True): "Keras 3 on TensorFlow + XLA.",
                    ("keras", "torch", True): "Keras 3 on PyTorch."}


def test_a_card_claims_no_license_or_language_nobody_gave(trained_model_dir):
    """The session's run passed neither --license nor --language: its card's metadata has neither."""
    import yaml

    text = (trained_model_dir / "README.md").read_text()
    meta = yaml.safe_load(text.split("---\n")[1])
    assert "license" not in meta and "language" not in meta
    assert meta["pipeline_tag"] == "fill-mask"


def test_continuing_a_hub_model_takes_its_license_and_says_so(loopback_hub, tmp_path, hf_log):
    from huggingface_hub import HfApi

    from hf_tpu_ext.hub.model_card import base_model_license

    api = HfApi(endpoint=loopback_hub.endpoint, token=loopback_hub.token)
    api.create_repo("alice/base-mit")
    api.upload_file(path_or_fileobj=b"---\nlicense: mit\n---\n\n# Base\n", path_in_repo="README.md",
                    repo_id="alice/base-mit")
    api.create_repo("alice/base-none")
    base_model_license.cache_clear()
    assert base_model_license("alice/base-mit") == "mit"
    assert ("model card license: mit, the license of the base model alice/base-mit (--license to choose another)."
            in hf_log.messages)
    assert base_model_license("alice/base-none") is None  # no card: no license claimed
    (tmp_path / "local").mkdir()
    assert base_model_license(str(tmp_path / "local")) is None and base_model_license(None) is None
