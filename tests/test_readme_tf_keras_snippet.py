"""The README's "Callbacks in an existing Keras script" block (tf_keras) runs as written and pushes a complete card.

Run in a fresh process in a folder holding ``train.txt`` (160 lines of the embedded corpus) against the loopback Hub;
the one change to the block is a local tokenizer in place of the Hub's ``FacebookAI/roberta-base`` (no download).
"""

import math
import re
from importlib.metadata import version

from readme_snippets import card_rows, run_readme_block

HEADING = "### Callbacks in an existing Keras script"
HUB_TOKENIZER = 'AutoTokenizer.from_pretrained("FacebookAI/roberta-base")'


def test_readme_tf_keras_snippet_runs_as_written(loopback_hub, tmp_path):
    from huggingface_hub import ModelCard

    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer
    from hf_tpu_ext.hub.model_card import check_card_metadata

    train_bpe_tokenizer(default_corpus_texts()[:400], vocab_size=500, model_max_length=128).save_pretrained(
        str(tmp_path / "tok"))
    local = f"AutoTokenizer.from_pretrained({str(tmp_path / 'tok')!r})"
    # XLA_FLAGS: a cheaper compilation of the same step (the run's figures are not asserted on speed)
    proc = run_readme_block(HEADING, tmp_path, {HUB_TOKENIZER: local},
                            {"HF_TOKEN": loopback_hub.token, "XLA_FLAGS": "--xla_backend_optimization_level=0"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    # fit's last progress line: one XLA compilation (the guard did not raise) and masked_lm_metrics' evaluation
    last = proc.stdout.strip().splitlines()[-1]
    assert "- xla_compilations: 1.0000" in last, last
    printed_loss = float(re.search(r" - eval_loss: ([0-9.]+)", last).group(1))

    files = loopback_hub.server.files("alice/my-fill-mask-model")
    assert {"README.md", "config.json", "model.safetensors", "tf_model.h5", "tokenizer.json", "loss_curve.png"} <= set(files)
    assert files["loss_curve.png"].startswith(b"\x89PNG\r\n\x1a\n")
    card = ModelCard(files["README.md"].decode())
    assert check_card_metadata(card.data.to_dict()) == []
    assert card.data.pipeline_tag == "fill-mask"
    # model-index: the evaluation masked_lm_metrics printed at the end of the fit
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert set(results) == {"loss", "perplexity", "accuracy"}
    assert round(results["loss"], 4) == printed_loss and 0 <= results["accuracy"] <= 1
    assert math.isclose(results["perplexity"], math.exp(results["loss"]), rel_tol=1e-5)
    assert "It was trained with hf-tpu-ext using TensorFlow + XLA." in card.text  # compile(jit_compile=True)
    rows = card_rows(card.text)
    # 160 lines - 32 held out = 128 rows, batch 16: 8 steps of 16 x 128 tokens
    assert (rows["Optimizer steps"], rows["Epochs"], rows["Tokens seen"]) == ("8", "1", "16,384")
    assert (rows["Global batch size (sequences)"], rows["XLA compilation"]) == ("16", "yes")
    steady = rows["Throughput, steady (tokens/s of the median training step; compilation, evaluation and checkpoints "
                  "excluded)"]
    assert float(steady) > 0
    assert re.match(r"^\d+(\.\d)?% \(peak ", rows["MFU (steady rate x FLOPs per token / peak FLOP/s)"])
    assert abs(float(rows["Perplexity"]) - results["perplexity"]) <= 5e-4  # the table's 4 decimals
    assert "\n### Loss curve\n\n![Training and evaluation loss](loss_curve.png)\n" in card.text
    assert "\n## Framework versions\n\n" + "".join(f"- {n} {version(n)}\n" for n in (
        "transformers", "tensorflow", "tf-keras", "tokenizers", "huggingface_hub", "hf-tpu-ext")) in card.text
    assert loopback_hub.token not in proc.stdout + proc.stderr
    written = [path for path in (tmp_path / "out").rglob("*") if path.is_file()]
    assert written and not [path for path in written if loopback_hub.token.encode() in path.read_bytes()]
