"""A stock keras-hub masked-LM training script (Keras 3, any backend), the way users write one.

A byte-level BPE ``RobertaTokenizer`` from a tiny vocabulary and merges made here (no download), a
``RobertaMaskedLMPreprocessor`` doing the masking in ``tf.data``, a ``RobertaMaskedLM`` built from a tiny
``RobertaBackbone`` config (2 layers, hidden 64), ``compile`` and ``fit``, then ``save_to_preset``. Sizes are
tiny so it runs in a minute on a CPU.

hf-tpu-ext adds the block marked ``>>> hf-tpu-ext`` ... ``<<< hf-tpu-ext``: the import and the callbacks
list; nothing else in this file knows about hf-tpu-ext (tests/current/test_keras3_callbacks.py checks it).

Run: ``KERAS_BACKEND=jax python keras_hub_mlm.py --output_dir out --hub_model_id user/name``.
"""

from __future__ import annotations

import argparse
import random
from typing import List, Optional

WORDS = (
    "river stone cloud paper lamp window garden music table bridge forest candle winter summer "
    "orange silver quiet bright small large the a of and runs sings reads builds opens keeps"
).split()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tiny keras-hub RoBERTa masked-LM training.")
    parser.add_argument("--output_dir", required=True, help="Where the final preset is saved.")
    parser.add_argument("--hub_model_id", default=None, help="Hub repo for the model ('user/name').")
    parser.add_argument("--sequence_length", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--train_samples", type=int, default=64)
    parser.add_argument("--eval_samples", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def tiny_tokenizer():
    """A byte-level BPE RoBERTa tokenizer over WORDS: every word is one token (with and without a space)."""
    import keras_hub

    vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    merges: List[str] = []
    for word in WORDS:
        for token in (word, "\u0120" + word):  # \u0120 marks a leading space in byte-level BPE
            for ch in token:
                vocabulary.setdefault(ch, len(vocabulary))
            merged = token[0]
            for ch in token[1:]:
                if f"{merged} {ch}" not in merges:
                    merges.append(f"{merged} {ch}")
                merged += ch
                vocabulary.setdefault(merged, len(vocabulary))
    vocabulary["<mask>"] = len(vocabulary)
    return keras_hub.models.RobertaTokenizer(vocabulary=vocabulary, merges=merges)


def sentences(n: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))) for _ in range(n)]


def main(argv: Optional[List[str]] = None):
    args = parse_args(argv)
    import keras
    import keras_hub
    import tensorflow as tf

    keras.utils.set_random_seed(args.seed)
    tokenizer = tiny_tokenizer()
    preprocessor = keras_hub.models.RobertaMaskedLMPreprocessor(
        tokenizer, sequence_length=args.sequence_length, mask_selection_length=6)
    backbone = keras_hub.models.RobertaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=2, num_heads=2, hidden_dim=64,
        intermediate_dim=128, max_sequence_length=args.sequence_length, dropout=0.0)
    model = keras_hub.models.RobertaMaskedLM(backbone=backbone, preprocessor=preprocessor)
    # XLA on every backend, as on a TPU ("auto" leaves it off on TensorFlow for keras-hub tasks)
    model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()], jit_compile=True)

    # raw text; fit runs the model's preprocessor (masking) in tf.data. Static batch shapes
    # (drop_remainder): one XLA compilation of the train step
    train_ds = (tf.data.Dataset.from_tensor_slices(sentences(args.train_samples, args.seed))
                .batch(args.batch_size, drop_remainder=True))
    # preprocessed once and cached: the same masks at every evaluation
    eval_ds = (tf.data.Dataset.from_tensor_slices(sentences(args.eval_samples, args.seed + 1))
               .batch(args.batch_size, drop_remainder=True).map(preprocessor).cache())
    callbacks = [keras.callbacks.TerminateOnNaN()]

    # >>> hf-tpu-ext
    from hf_tpu_ext.callbacks import get_callback
    callbacks += [
        get_callback("push_to_hub", framework="keras", output_dir=args.output_dir, hub_model_id=args.hub_model_id,
                     hub_strategy="checkpoint"),
        get_callback("throughput", framework="keras", global_batch_size=args.batch_size,
                     seq_length=args.sequence_length),
        get_callback("xla_recompile_guard", framework="keras", action="raise"),
        get_callback("masked_lm_metrics", framework="keras", eval_dataset=eval_ds),
    ]
    # <<< hf-tpu-ext

    history = model.fit(train_ds, epochs=args.epochs, callbacks=callbacks, verbose=2)
    model.save_to_preset(args.output_dir)
    return model, history, callbacks


if __name__ == "__main__":
    main()
