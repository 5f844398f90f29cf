"""Packing by document (``--pack_documents``, issue 51 item 3) on the Keras backend.

* segment and position ids of packed blocks (``data/numpy_batches.py``), and the masker's batches with and without;
* the kernels with segment ids (block-local, chunked, splash in Pallas interpret mode) equal the dense reference
  masked block-diagonally (float32, <= 1e-5), outputs at real queries and gradients; so does ``attend`` on its
  dense and local paths;
* a block holding two documents (and the head of a third) gives, at each document's tokens, the logits of that
  document alone (<= 1e-5): ModernBERT (a global layer and local layers with a window, dense and chunked global
  paths), BERT and RoBERTa (learned positions), EuroBERT (RoPE, grouped-query global attention);
* ``--pack_documents true`` is refused on another backend in one line; a tiny ``hf-tpu train --pack_documents true``
  run trains, and its summary records the flag.

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-current/bin/python -m pytest -q
tests/current/test_pack_documents.py``.
"""

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("transformers")
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402

from hf_tpu_ext.backends.keras.architectures import attention, attention_kernels as kernels  # noqa: E402
from hf_tpu_ext.backends.keras.architectures import get_architecture  # noqa: E402
from hf_tpu_ext.data.numpy_batches import NumpyMasker, document_segments  # noqa: E402
from hf_tpu_ext.model_types import record_for  # noqa: E402

TOLERANCE = 1e-5
SCALE = 0.25
SEP, CLS, PAD, VOCAB = 2, 1, 0, 100
#: a 40-token block: documents of 13 and 17 tokens (each [CLS] ... [SEP]), then the first 10 of a third
LENGTHS, BLOCK = (13, 17, 10), 40


def test_document_segments_start_after_each_separator():
    ids = np.array([[CLS, 7, SEP, CLS, 8, 9, SEP, CLS], [5, 6, 7, 8, 9, 5, 6, 7]])
    segments, positions = document_segments(ids, SEP)
    assert segments.dtype == positions.dtype == np.int32
    assert segments.tolist() == [[0, 0, 0, 1, 1, 1, 1, 2], [0] * 8]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], list(range(8))]


def test_masker_adds_segments_only_when_packing():
    ids = np.array([[CLS, 7, 8, SEP, CLS, 9, 10, 11, SEP, CLS]])
    plain = NumpyMasker(4, VOCAB, [PAD, CLS, SEP, 4], 3, PAD)(ids, (0,))
    packed = NumpyMasker(4, VOCAB, [PAD, CLS, SEP, 4], 3, PAD, separator_token_id=SEP)(ids, (0,))
    assert sorted(plain) == ["attention_mask", "input_ids", "masked_lm_ids", "masked_lm_positions",
                             "masked_lm_weights"]
    for key in plain:  # the same masks either way
        np.testing.assert_array_equal(plain[key], packed[key])
    assert packed["segment_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 1, 2]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]]


def _segmented_inputs(length, heads=2, dim=16, seed=0):
    """q, k, v ``[2, L, heads, dim]``, key_padding ``[2, L]`` (row 1 right-padded), segment ids ``[2, L]``."""
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(2, length, heads, dim)).astype("float32")) for _ in range(3))
    padding = np.arange(length)[None, :] < np.array([[length], [length - length // 4]])
    cuts = [np.sort(rng.choice(np.arange(1, length), size=3, replace=False)) for _ in range(2)]
    segments = np.stack([np.searchsorted(c, np.arange(length), side="right") for c in cuts]).astype(np.int32)
    return q, k, v, padding, segments


def _reference_mask(padding, segments, half_window):
    position = np.arange(padding.shape[1])
    mask = padding[:, None, None, :] & (segments[:, None, :, None] == segments[:, None, None, :])
    if half_window is not None:
        mask = mask & (np.abs(position[:, None] - position[None, :]) <= half_window)[None, None]
    return mask


def _grads(fn, q, k, v, padding):
    weight = np.random.default_rng(9).normal(size=q.shape).astype("float32") * padding[:, :, None, None]
    return jax.jit(jax.grad(lambda *qkv: jnp.sum(fn(*qkv) * weight), argnums=(0, 1, 2)))(q, k, v)


def _assert_equals_reference(fn, q, k, v, padding, segments, half_window):
    mask = _reference_mask(padding, segments, half_window)
    reference = lambda *qkv: kernels.dense_attention(*qkv, mask, SCALE)  # noqa: E731
    got, expected = np.asarray(jax.jit(fn)(q, k, v)), np.asarray(reference(q, k, v))
    assert got.shape == q.shape
    assert np.abs(got - expected)[padding].max() <= TOLERANCE
    for mine, theirs in zip(_grads(fn, q, k, v, padding), _grads(reference, q, k, v, padding)):
        assert np.abs(np.asarray(mine) - np.asarray(theirs)).max() <= TOLERANCE


@pytest.mark.parametrize("length,half_window,block", [(37, 8, 0), (100, 20, 8)])
def test_local_with_segments_equals_dense(length, half_window, block):
    q, k, v, padding, segments = _segmented_inputs(length)
    fn = lambda *qkv: kernels.local_attention(*qkv, jnp.asarray(padding), half_window, SCALE, block,  # noqa: E731
                                              segment_ids=jnp.asarray(segments))
    _assert_equals_reference(fn, q, k, v, padding, segments, half_window)


@pytest.mark.parametrize("length,chunk", [(37, 8), (64, 64)])
def test_chunked_with_segments_equals_dense(length, chunk):
    q, k, v, padding, segments = _segmented_inputs(length)
    fn = lambda *qkv: kernels.chunked_attention(*qkv, jnp.asarray(padding), SCALE, chunk,  # noqa: E731
                                                segment_ids=jnp.asarray(segments))
    _assert_equals_reference(fn, q, k, v, padding, segments, None)


def test_splash_with_segments_in_pallas_interpret_mode_equals_dense():
    pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
    from hf_tpu_ext.backends.keras.architectures.attention_splash import splash_attention

    q, k, v, padding, segments = _segmented_inputs(200, heads=1)
    for half_window in (None, 8):
        fn = lambda *qkv: splash_attention(*qkv, jnp.asarray(padding), SCALE, half_window,  # noqa: E731
                                           interpret=True, segment_ids=jnp.asarray(segments))
        _assert_equals_reference(fn, q, k, v, padding, segments, half_window)


@pytest.mark.parametrize("length,half_window,path", [(20, 25, "dense"), (20, None, "dense"), (20, 3, "local")])
def test_attend_with_segments_equals_dense(length, half_window, path):
    """:func:`attend` with ``segment_ids``: the dense path (a window covering the sequence, or global) builds the
    block-diagonal mask, the local one passes the ids to the kernel."""
    q, k, v, padding, segments = _segmented_inputs(length)
    assert attention.attention_path(length, half_window)[0] == path
    dropout = keras.layers.Dropout(0.0)
    fn = lambda *qkv: attention.attend(*qkv, None, dropout, False, SCALE, key_padding=jnp.asarray(padding),  # noqa: E731
                                       half_window=half_window, segment_ids=jnp.asarray(segments))
    _assert_equals_reference(fn, q, k, v, padding, segments, half_window)


def _documents(seed=3):
    """``[CLS] ... [SEP]`` documents of :data:`LENGTHS` (the last one cut: no [SEP]) and their packed block."""
    rng = np.random.default_rng(seed)
    docs = []
    for n in LENGTHS:
        doc = rng.integers(5, VOCAB, size=n)
        doc[0] = CLS
        if n != LENGTHS[-1]:
            doc[-1] = SEP
        docs.append(doc)
    return docs, np.concatenate(docs)[None].astype(np.int32)


def _logits(model, ids, padding, **packed):
    inputs = {"token_ids": ids, "padding_mask": padding.astype(np.int32),
              "mask_positions": np.arange(BLOCK, dtype=np.int32)[None], **packed}
    return np.asarray(model(inputs, training=False), np.float32)[0]


def _assert_packed_equals_alone(model):
    docs, block = _documents()
    segments, positions = document_segments(block, SEP)
    packed = _logits(model, block, np.ones_like(block), segment_ids=segments, position_ids=positions)
    start = 0
    for doc in docs:  # each document alone, right-padded to the block
        alone_ids = np.full((1, BLOCK), PAD, np.int32)
        alone_ids[0, :len(doc)] = doc
        alone = _logits(model, alone_ids, alone_ids != PAD)
        np.testing.assert_allclose(packed[start:start + len(doc)], alone[:len(doc)], rtol=0, atol=TOLERANCE)
        start += len(doc)
    unpacked = _logits(model, block, np.ones_like(block))  # attention across documents: other logits
    assert np.abs(unpacked[LENGTHS[0]:] - packed[LENGTHS[0]:]).max() > 1e-2


def _randomize(model, seed=0):
    """Every weight redrawn (gammas around 1) so a position or a mask error shows in the logits."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape = tuple(variable.shape)
        gamma = "gamma" in variable.path or variable.path.endswith("norm/scale")
        variable.assign((1.0 if gamma else 0.0) + 0.2 * rng.normal(size=shape).astype("float32"))


@pytest.mark.parametrize("chunked_from", [None, 16])
def test_modernbert_packed_block_equals_each_document_alone(chunked_from, monkeypatch):
    """3 layers: global, local (+-4), local; the global layer dense, or chunked (8-key chunks) from 16 tokens."""
    from transformers import ModernBertConfig

    if chunked_from:
        monkeypatch.setattr(attention, "CHUNKED_MIN_LENGTH", chunked_from)
        monkeypatch.setattr(attention, "GLOBAL_CHUNK", 8)
    config = ModernBertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                              num_attention_heads=2, local_attention=8, max_position_embeddings=64,
                              pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP, bos_token_id=CLS,
                              eos_token_id=SEP)
    keras.utils.set_random_seed(0)
    model = get_architecture("modernbert").build(config, "float32")
    _randomize(model)
    _assert_packed_equals_alone(model)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_learned_positions_packed_block_equals_each_document_alone(model_type):
    from transformers import AutoConfig

    arch = get_architecture(model_type)
    sizes = dict(record_for(model_type).small_preset, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=66, pad_token_id=PAD)
    keras.utils.set_random_seed(0)
    model = arch.build(AutoConfig.for_model(model_type, **sizes), "float32")
    _randomize(model)
    _assert_packed_equals_alone(model)


@pytest.mark.parametrize("backend", ["tensorflow", "torch_xla"])
def test_refused_on_other_backends_in_one_line(backend):
    from types import SimpleNamespace

    from hf_tpu_ext.args.checks import check_arguments
    from hf_tpu_ext.errors import ArgumentError

    data = SimpleNamespace(pack_documents=True, streaming=False)
    with pytest.raises(ArgumentError) as error:
        check_arguments(SimpleNamespace(), data, SimpleNamespace(backend=backend))
    assert str(error.value) == (
        "--pack_documents true is implemented by --backend keras only (segment ids through its attention kernels); "
        f"pass --backend keras, or drop --pack_documents with --backend {backend}.")


def test_tiny_train_run_with_pack_documents(tmp_path, hf_log):
    """ModernBERT from scratch, 4 steps on the embedded corpus: finite losses, the flag in the summary, the args and
    the card; the trained tokenizer ends each document with its separator, which the log names."""
    from transformers import AutoTokenizer

    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.run import train

    out = tmp_path / "run"
    args = ["--backend", "keras", "--output_dir", str(out), "--model_type", "modernbert",
            "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2",
            "--intermediate_size", "64", "--vocab_size", "300", "--max_seq_length", "64",
            "--per_device_train_batch_size", "4", "--max_train_samples", "64", "--max_steps", "4",
            "--logging_steps", "2", "--learning_rate", "1e-3", "--seed", "3", "--do_eval", "false",
            "--save_steps", "100", "--disable_tqdm", "true", "--pack_documents", "true"]
    results = train(*parse_args(args))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("the cat")["input_ids"][-1] == tokenizer.sep_token_id
    assert (f"Packed documents: attention and positions restart after each token id {tokenizer.sep_token_id} "
            "(the tokenizer's separator ending every document).") in hf_log.text  # caplog: earlier runs in this
    # process may have left the console handler on another stream
    assert results["global_step"] == 4
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [e["loss"] for e in history if "loss" in e]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert json.loads((out / "training_summary.json").read_text())["hyperparameters"]["pack_documents"] is True
    assert json.loads((out / "training_args.json").read_text())["pack_documents"] is True
    assert "| pack_documents | yes |" in (out / "README.md").read_text()


def test_eurobert_packed_block_equals_each_document_alone():
    from eurobert_support import tiny_config

    config = tiny_config(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=CLS, eos_token_id=SEP, mask_token_id=3)
    keras.utils.set_random_seed(0)
    model = get_architecture("eurobert").build(config, "float32")
    _randomize(model)
    _assert_packed_equals_alone(model)
