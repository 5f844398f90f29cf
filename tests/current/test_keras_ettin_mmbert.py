"""Ettin- and mmBERT-shaped models (``model_type: modernbert``) on the Keras backend, with their tokenizers.

Each config has the published models' field values (jhu-clsp's ``config.json``s: global and local RoPE theta
160,000, a 128-token window with every third layer global, no biases but the decoder's, ``norm_eps`` 1e-5, the
tokenizer's special ids) but tiny sizes (hidden 32, 3 layers, 2 heads, GeGLU 48); the vocabularies are the
published sizes (Ettin: ModernBERT's 50,368; mmBERT: Gemma's 256,000) with the special tokens at their ids
(tests/family_tokenizers.py). A random transformers model and the Keras model holding its weights give the same
logits (float32, <= 1e-4) on a right-padded batch of tokenized text; the export loads with ``AutoModelForMaskedLM``
and ``AutoTokenizer``, and ``pipeline("fill-mask")`` answers a sentence written with the model's own mask token.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_keras_ettin_mmbert.py``.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("jax")

from family_tokenizers import ETTIN_SPECIALS, ETTIN_VOCAB, MMBERT_SPECIALS, MMBERT_VOCAB  # noqa: E402
from family_tokenizers import ettin_tokenizer, mmbert_tokenizer  # noqa: E402
from hf_tpu_ext.backends.keras.architectures import get_architecture  # noqa: E402
from modernbert_support import keras_logits, random_torch_model, torch_logits  # noqa: E402

TOLERANCE = 1e-4
SIZES = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2)
#: the published configs' fields shared by Ettin and mmBERT (sizes and token ids aside)
SHARED = dict(global_rope_theta=160000.0, local_rope_theta=160000.0, local_attention=128, global_attn_every_n_layers=3,
              max_position_embeddings=8192, norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False,
              decoder_bias=True, classifier_bias=False, hidden_activation="gelu", classifier_activation="gelu",
              attn_implementation="eager")
FAMILIES = {
    "ettin": (ettin_tokenizer, dict(vocab_size=ETTIN_VOCAB, pad_token_id=50283, bos_token_id=50281,
                                    cls_token_id=50281, eos_token_id=50282, sep_token_id=50282), "[MASK]"),
    "mmbert": (mmbert_tokenizer, dict(vocab_size=MMBERT_VOCAB, pad_token_id=0, bos_token_id=2, cls_token_id=2,
                                      eos_token_id=1, sep_token_id=1), "<mask>"),
}
TEXTS = ["The river ran past the old mill and into the town.", "A short one.", "Paris is the capital of France."]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, tokenizer, config, transformers model, Keras model, padded batch, export folder)."""
    make_tokenizer, ids, mask_token = FAMILIES[request.param]
    tokenizer = make_tokenizer()
    config = transformers.ModernBertConfig(**SIZES, **SHARED, **ids)
    reference = random_torch_model(config)
    arch = get_architecture("modernbert")
    model = arch.build(config, "float32")
    arch.assign(model, {k: v.detach().numpy() for k, v in reference.state_dict().items()}, config)
    encoded = tokenizer(TEXTS, padding=True, return_tensors="np")
    lengths = encoded["attention_mask"].sum(axis=1)
    positions = np.stack([np.linspace(0, n - 1, 4).astype(int) for n in lengths])
    batch = (encoded["input_ids"], encoded["attention_mask"], positions)
    from hf_tpu_ext.backends.keras.export import export_masked_lm

    folder = tmp_path_factory.mktemp(request.param)
    export_masked_lm(model, str(folder), tokenizer=tokenizer, config=config)
    return request.param, tokenizer, config, reference, model, batch, folder, mask_token


def test_tokenizer_has_the_published_vocabulary_and_specials(family):
    name, tokenizer, _, _, _, batch, _, mask_token = family
    specials, rows = (ETTIN_SPECIALS, ETTIN_VOCAB) if name == "ettin" else (MMBERT_SPECIALS, MMBERT_VOCAB)
    assert len(tokenizer) == rows and tokenizer.mask_token == mask_token
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in specials} == specials
    ids, mask, _ = batch
    assert ids[0, 0] == tokenizer.cls_token_id if name == "ettin" else tokenizer.bos_token_id
    assert mask.sum(axis=1).min() < ids.shape[1]  # a padded row


def test_keras_logits_equal_transformers_on_a_padded_batch(family):
    _, _, config, reference, model, batch, _, _ = family
    expected = torch_logits(reference, batch)
    got = keras_logits(model, batch)
    assert got.shape == (3, 4, config.vocab_size) and np.abs(expected).max() > 1.0
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)


def test_export_loads_with_auto_classes_and_equal_logits(family):
    name, _, config, _, model, batch, folder, mask_token = family
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "modernbert" and written["vocab_size"] == config.vocab_size
    thetas = {kind: params["rope_theta"] for kind, params in written["rope_parameters"].items()}  # transformers 5
    assert thetas == {"full_attention": 160000.0, "sliding_attention": 160000.0}
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager").eval()
    np.testing.assert_allclose(torch_logits(loaded, batch), keras_logits(model, batch), rtol=0, atol=TOLERANCE)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == config.vocab_size and tokenizer.mask_token == mask_token


def test_fill_mask_pipeline_answers_the_models_own_mask_token(family):
    _, tokenizer, _, _, _, _, folder, mask_token = family
    fill = transformers.pipeline("fill-mask", model=str(folder), tokenizer=str(folder), top_k=3)
    answers = fill(f"Paris is the {mask_token} of France.")
    assert len(answers) == 3 and [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    for answer in answers:
        assert mask_token not in answer["sequence"] and answer["sequence"].startswith("Paris is the")
        assert 0 <= answer["token"] < len(tokenizer)
