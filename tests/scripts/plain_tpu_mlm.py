"""A plain Keras masked-LM training script, the way users write one (no hf-tpu-ext inside).

Modelled on the shape of transformers' TPU language-modeling example
(``examples/tensorflow/language-modeling-tpu/run_mlm.py``): a tokenizer, fixed-length blocks in a
``tf.data`` pipeline, masking done in the pipeline with ``DataCollatorForLanguageModeling``'s TF masking
(``labels`` = -100 where no prediction is made), a ``TFAutoModelForMaskedLM`` built from a config,
``model.compile(optimizer=...)`` with the model's internal loss, and ``model.fit``. Sizes are tiny so it
runs in seconds on a CPU. Tests import it and only add hf-tpu-ext callbacks to ``train(...)``.

Run: ``python plain_tpu_mlm.py --epochs 2``.
"""

from __future__ import annotations

import argparse
import random
from typing import List, Optional

WORDS = (
    "river stone cloud paper lamp window garden music table bridge forest candle winter summer "
    "orange silver quiet bright small large quickly slowly under over beside the a an of and runs "
    "sings reads builds opens closes carries finds keeps moves"
).split()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tiny masked-LM training with Keras.")
    parser.add_argument("--max_length", type=int, default=32, help="Tokens per block.")
    parser.add_argument("--batch_size", type=int, default=8, help="Global batch size.")
    parser.add_argument("--train_blocks", type=int, default=48)
    parser.add_argument("--eval_blocks", type=int, default=16)
    parser.add_argument("--vocab_size", type=int, default=400)
    parser.add_argument("--mlm_probability", type=float, default=0.15)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps_per_execution", type=int, default=1)
    parser.add_argument("--jit_compile", action="store_true", help="XLA-compile the train step (as on TPU).")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_corpus(num_lines: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "." for _ in range(num_lines)]


def train_tokenizer(texts: List[str], vocab_size: int):
    """A byte-level BPE tokenizer with RoBERTa's special tokens, trained on ``texts``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")


def group_into_blocks(tokenizer, texts: List[str], max_length: int, num_blocks: int):
    """Concatenate ``<s> text </s>`` sequences and cut them into ``num_blocks`` blocks of ``max_length``."""
    import numpy as np

    ids: List[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"] + [tokenizer.eos_token_id])
        if len(ids) >= max_length * num_blocks:
            break
    if len(ids) < max_length * num_blocks:
        raise ValueError("Corpus too small for the blocks asked for.")
    return np.asarray(ids[: max_length * num_blocks], dtype="int32").reshape(num_blocks, max_length)


def make_dataset(tokenizer, blocks, batch_size: int, mlm_probability: float, shuffle: bool, seed: int):
    import tensorflow as tf
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, return_tensors="tf")
    special_ids = tf.constant([tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id], tf.int32)

    def mask(batch):
        is_special = tf.reduce_any(tf.equal(batch["input_ids"][..., None], special_ids), axis=-1)
        is_special |= ~tf.cast(batch["attention_mask"], tf.bool)
        batch["input_ids"], batch["labels"] = collator.tf_mask_tokens(
            batch["input_ids"], vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
            special_tokens_mask=is_special,
        )
        return batch

    ds = tf.data.Dataset.from_tensor_slices({"input_ids": blocks, "attention_mask": tf.ones_like(blocks)})
    if shuffle:
        ds = ds.shuffle(len(blocks), seed=seed)
    # static batch shapes, as TPUs need
    ds = ds.batch(batch_size, drop_remainder=True).map(mask, num_parallel_calls=tf.data.AUTOTUNE)
    if not shuffle:
        ds = ds.cache()  # evaluation: the masks of the first pass are kept, numbers stay comparable
    return ds.prefetch(tf.data.AUTOTUNE)


def build(args: argparse.Namespace):
    """Returns ``(tokenizer, model, train_dataset, eval_dataset)``."""
    import tensorflow as tf
    import tf_keras
    from transformers import RobertaConfig, TFAutoModelForMaskedLM

    tf.random.set_seed(args.seed)
    tf_keras.utils.set_random_seed(args.seed)
    texts = make_corpus(400, args.seed)
    tokenizer = train_tokenizer(texts, args.vocab_size)
    train_blocks = group_into_blocks(tokenizer, texts[:300], args.max_length, args.train_blocks)
    eval_blocks = group_into_blocks(tokenizer, texts[300:] * 3, args.max_length, args.eval_blocks)
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=args.max_length + 2, type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = TFAutoModelForMaskedLM.from_config(config)
    train_ds = make_dataset(tokenizer, train_blocks, args.batch_size, args.mlm_probability, True, args.seed)
    eval_ds = make_dataset(tokenizer, eval_blocks, args.batch_size, args.mlm_probability, False, args.seed)
    return tokenizer, model, train_ds, eval_ds


def train(model, train_ds, eval_ds, args: argparse.Namespace, callbacks=()):
    """Compile with AdamW + warmup (transformers' ``create_optimizer``) and fit; returns the History."""
    from transformers import create_optimizer

    steps = (args.train_blocks // args.batch_size) * args.epochs
    optimizer, _ = create_optimizer(init_lr=args.learning_rate, num_train_steps=steps,
                                    num_warmup_steps=max(1, steps // 10), weight_decay_rate=0.01)
    model.compile(optimizer=optimizer, jit_compile=args.jit_compile, steps_per_execution=args.steps_per_execution)
    return model.fit(train_ds, epochs=args.epochs, callbacks=list(callbacks), verbose=0)


def main(argv: Optional[List[str]] = None):
    args = parse_args(argv)
    _, model, train_ds, eval_ds = build(args)
    history = train(model, train_ds, eval_ds, args)
    print({k: [round(float(x), 4) for x in v] for k, v in history.history.items()})
    return history


if __name__ == "__main__":
    main()
