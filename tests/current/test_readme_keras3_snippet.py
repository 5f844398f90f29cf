"""The README's "Callbacks in a Keras 3 / keras-hub script" block runs as written (JAX) and pushes a complete card.

Run in a fresh process in a folder holding ``train.txt`` (160 lines of the embedded corpus) against the loopback Hub;
the one change to the block is a local tokenizer preset in place of keras-hub's ``roberta_base_en`` (no download).
"""

import json
import math
import re

import pytest

from readme_snippets import card_rows, run_readme_block

keras_hub = pytest.importorskip("keras_hub")

HEADING = "### Callbacks in a Keras 3 / keras-hub script"
HUB_TOKENIZER = 'keras_hub.models.RobertaTokenizer.from_preset("roberta_base_en")'


def _local_tokenizer_preset(folder) -> str:
    """A keras-hub RobertaTokenizer preset from a byte-level BPE trained here (500 tokens): no download."""
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    bpe = json.loads(train_bpe_tokenizer(default_corpus_texts()[:400], vocab_size=500,
                                         model_max_length=128).backend_tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]]
    tokenizer = keras_hub.models.RobertaTokenizer(vocabulary=bpe["vocab"], merges=merges)
    tokenizer.save_to_preset(str(folder))
    # a preset is a backbone's (config.json) with its tokenizer, as roberta_base_en is; the snippet reads the tokenizer
    keras_hub.models.RobertaBackbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=1, hidden_dim=8,
                                     intermediate_dim=8, max_sequence_length=8).save_to_preset(str(folder))
    return str(folder)


def test_readme_keras3_snippet_runs_as_written(loopback_hub, tmp_path):
    from importlib.metadata import version

    from huggingface_hub import ModelCard

    from hf_tpu_ext.hub.model_card import check_card_metadata

    preset = _local_tokenizer_preset(tmp_path / "tok")
    local = f"keras_hub.models.RobertaTokenizer.from_preset({preset!r})"
    # XLA_FLAGS: a cheaper compilation of the same step (the run's figures are not asserted on speed)
    proc = run_readme_block(HEADING, tmp_path, {HUB_TOKENIZER: local},
                            {"HF_TOKEN": loopback_hub.token, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
                             "XLA_FLAGS": "--xla_backend_optimization_level=0"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    # fit's last progress line: one XLA compilation of the train step (the guard did not raise), the evaluation
    last = proc.stdout.strip().splitlines()[-1]
    assert "- xla_compilations: 1.0000" in last, last
    printed_loss = float(re.search(r" - eval_loss: ([0-9.]+)", last).group(1))

    files = loopback_hub.server.files("alice/my-fill-mask-model")
    preset_files = {"config.json", "task.json", "metadata.json", "model.weights.h5", "tokenizer.json",
                    "preprocessor.json", "README.md", "loss_curve.png", "last-checkpoint/checkpoint.weights.h5"}
    assert preset_files <= set(files), sorted(files)
    card = ModelCard(files["README.md"].decode())
    assert check_card_metadata(card.data.to_dict()) == []
    assert (card.data.library_name, card.data.pipeline_tag) == ("keras-hub", "fill-mask")
    # model-index: the evaluation masked_lm_metrics printed at the end of the fit
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert set(results) == {"loss", "perplexity", "accuracy"}
    assert round(results["loss"], 4) == printed_loss and 0 <= results["accuracy"] <= 1
    assert math.isclose(results["perplexity"], math.exp(results["loss"]), rel_tol=1e-5)
    # the framework line and versions: Keras 3 on JAX
    assert (f"A `RobertaMaskedLM` trained with Keras {version('keras')} on the jax backend "
            "(end of training: step 8, epoch 1).") in card.text
    assert f"\n- keras-hub {version('keras-hub')}\n- jax {version('jax')} (the Keras backend)\n" in card.text
    rows = card_rows(card.text)
    assert rows["Tokens seen"] == "16,384"  # 160 lines - 32 held out = 128, batch 16: 8 steps of 16 x 128 tokens
    steady = rows["Throughput, steady (tokens/s of the median training step; compilation, evaluation and checkpoints "
                  "excluded)"]
    assert float(steady) > 0
    assert re.match(r"^\d+(\.\d)?% \(peak ", rows["MFU (steady rate x FLOPs per token / peak FLOP/s)"])
    assert "\n### Loss curve\n\n![Training and evaluation loss](loss_curve.png)\n" in card.text
    # the checkpoint's trainer state says what ran
    state = json.loads(files["last-checkpoint/trainer_state.json"])
    assert ([state[k] for k in ("global_step", "max_steps", "num_train_epochs", "train_batch_size",
                                "num_input_tokens_seen")] == [8, 8, 1, 16, 16384])
    evaluations = [e for e in state["log_history"] if "eval_loss" in e]
    assert [(e["step"], e["eval_loss"]) for e in evaluations] == [(8, results["loss"])]
    assert loopback_hub.token not in proc.stdout + proc.stderr
    written = [path for path in (tmp_path / "out").rglob("*") if path.is_file()]
    assert written and not [path for path in written if loopback_hub.token.encode() in path.read_bytes()]
