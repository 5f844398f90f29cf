"""`hf-tpu train --backend torch_xla` on BERT and ModernBERT from scratch (XLA on the CPU; skipped without torch_xla)."""

import importlib.util
import json
import os

import numpy as np
import pytest

if importlib.util.find_spec("torch_xla") is None:  # before touching the environment of the other tests
    pytest.skip("torch_xla is not installed (scripts/test_env_torch_xla.sh installs it)", allow_module_level=True)
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

from conftest import tiny_train_args  # noqa: E402

pytestmark = pytest.mark.torch_xla

# ModernBERT: an odd layer count (global, local, global) and a window shorter than the 32-token blocks
OVERRIDES = {"bert": "num_hidden_layers=2",
             "modernbert": "num_hidden_layers=3,global_attn_every_n_layers=2,local_attention=16,intermediate_size=96"}
CLASSES = {"bert": "BertForMaskedLM", "modernbert": "ModernBertForMaskedLM"}


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_torch_xla_trains_any_masked_lm(tmp_path, model_type):
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    from hf_tpu_ext.cli import main

    out = tmp_path / "model"
    rc = main(["train", *map(str, tiny_train_args(out, "--backend", "torch_xla", "--model_type", model_type,
                                                  "--config_overrides", OVERRIDES[model_type], "--max_steps", 5,
                                                  "--save_strategy", "no", "--eval_strategy", "no"))])
    assert rc == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 5
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (model_type, [CLASSES[model_type]])
    assert config["num_hidden_layers"] == (3 if model_type == "modernbert" else 2)
    model, info = AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.mask_token == "[MASK]"
    batch = tokenizer(["The module defines a class.", "Return the value of the"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], config["vocab_size"])
    assert np.isfinite(logits.numpy()).all()
    answers = pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")("The module defines a [MASK].")
    assert len(answers) == 5 and all(0.0 <= a["score"] <= 1.0 for a in answers)
