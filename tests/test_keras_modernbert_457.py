"""The Keras backend's ModernBERT against transformers 4.57's ``ModernBertForMaskedLM`` (this main venv).

transformers 4.57 keeps ``global_attn_every_n_layers`` / ``global_rope_theta`` / ``local_rope_theta`` where 5 has
``layer_types`` / ``rope_parameters``, and builds its masks in ``_update_attention_mask``; the Keras model must read
both. The Keras 3 layers run here on Keras' TensorFlow backend (this venv has Keras 3 beside tf_keras, no JAX):
the same ``keras.ops`` computation the JAX step runs. Tiny models (tests/modernbert_support.py): logits at real
tokens of a right-padded batch equal transformers' (float32, max abs difference <= 1e-4) both ways, names equal
``state_dict()``'s minus the tied ``decoder.weight``.
"""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "ModernBertForMaskedLM"):
    pytest.skip("this transformers has no ModernBERT", allow_module_level=True)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")
if int(keras.__version__.split(".")[0]) < 3:
    pytest.skip("Keras 3 is needed", allow_module_level=True)

from hf_tpu_ext.backends.keras.architectures import get_architecture  # noqa: E402
from modernbert_support import (  # noqa: E402
    ALL_BIASES,
    keras_logits,
    padded_batch,
    random_torch_model,
    tiny_config,
    torch_logits,
    torch_state,
)

TOLERANCE = 1e-4


@pytest.mark.parametrize("flags", [{}, ALL_BIASES], ids=["defaults", "all_biases"])
def test_transformers_457_to_keras_and_back(flags):
    from transformers import ModernBertForMaskedLM

    arch = get_architecture("modernbert")
    config = tiny_config(**flags)
    assert not getattr(config, "layer_types", None)  # 4.57's fields, not 5's
    reference = random_torch_model(config)
    state = torch_state(reference)
    model = arch.build(config, "float32")
    arch.assign(model, state, config)
    pattern = [layer.attention_type for layer in model.backbone.encoder_layers]
    assert pattern == (["full_attention", "sliding_attention", "full_attention"] if flags
                       else ["full_attention", "sliding_attention", "sliding_attention"])
    batch = padded_batch()
    expected = torch_logits(reference, batch)
    assert np.abs(expected).max() > 1.0
    np.testing.assert_allclose(keras_logits(model, batch), expected, rtol=0, atol=TOLERANCE)
    exported = arch.state_dict(model, config)
    assert set(exported) == set(state) - {"decoder.weight"}
    fresh = ModernBertForMaskedLM(config).eval()
    result = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=False)
    assert result.unexpected_keys == [] and result.missing_keys == ["decoder.weight"]
    np.testing.assert_allclose(torch_logits(fresh, batch), expected, rtol=0, atol=TOLERANCE)
