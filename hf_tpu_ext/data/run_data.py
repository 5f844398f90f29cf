"""The data of one ``hf-tpu train`` run: tokenizer + blocks per split, from text or prepare-data shards
(TFRecord for the TensorFlow backend, Arrow read row by row: :mod:`hf_tpu_ext.data.block_shards`).

Backend-neutral (no backend import): the training run calls :func:`load_run_data` once, before any file
is written into ``output_dir``. Nothing here writes files.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

from hf_tpu_ext.data.block_shards import MANIFEST_NAME, check_shards, is_arrow_source, load_split, read_manifest
from hf_tpu_ext.data.blocks import check_blocks, column_texts, group_into_blocks
from hf_tpu_ext.data.loading import describe_data_source, load_text_datasets
from hf_tpu_ext.data.tfrecord import read_manifest, read_tfrecord_blocks
from hf_tpu_ext.data.tokenizer import (check_mlm_tokenizer, load_tokenizer, tokenizer_from_text, tokenizer_to_text,
                                       train_tokenizer)
from hf_tpu_ext.distributed import from_main_process
from hf_tpu_ext.errors import CorpusTooSmallError, DataError
from hf_tpu_ext.model_types import record_for

logger = logging.getLogger("hf_tpu_ext")


def load_or_train_tokenizer(model_args, data_args, raw_datasets, tokenizer_source: Optional[str] = None):
    """The run's tokenizer.

    Order: the checkpoint's tokenizer (``tokenizer_source``, set on every resume that has one -- a resumed run
    never trains a new tokenizer), ``--tokenizer_name``, the model's, else one trained on the training split for
    ``--model_type`` (:func:`hf_tpu_ext.data.tokenizer.train_tokenizer`).

    Raises:
        TokenizerError: it cannot be loaded or has no mask token.
    """
    if tokenizer_source:
        tok = load_tokenizer(tokenizer_source)
    elif model_args.tokenizer_name or model_args.model_name_or_path:
        tok = load_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path,
                             cache_dir=model_args.cache_dir)
    else:
        t0 = time.perf_counter()
        model_type = record_for(getattr(model_args, "model_type", None)).name  # unset: the default record's
        made = []

        def train() -> str:
            made.append(train_tokenizer(model_type, column_texts(raw_datasets["train"]),
                                        vocab_size=model_args.vocab_size, model_max_length=data_args.max_seq_length,
                                        do_lower_case=getattr(model_args, "do_lower_case", True)))
            return tokenizer_to_text(made[0])

        # several processes: process 0 trains it, the others read its files (one tokenizer, trained once)
        text = from_main_process("tokenizer", train)
        tok = made[0] if made else tokenizer_from_text(text)
        logger.info("trained a %s tokenizer (%s) of %d tokens in %.1fs", model_type, type(tok).__name__, len(tok),
                    time.perf_counter() - t0)
    check_mlm_tokenizer(tok)
    return tok


def load_text_blocks(model_args, data_args, seed: int, tokenizer_source: Optional[str] = None):
    """Text -> tokenizer -> int32 blocks ``[N, max_seq_length]`` per split (an Arrow shard folder as
    ``--train_file``: :func:`load_shard_blocks`, nothing tokenized).

    Returns:
        ``(tokenizer, blocks, description)``: blocks is a :class:`hf_tpu_ext.data.blocks.Blocks` dict with
        "train" and "validation" (cut to ``max_train_samples``/``max_eval_samples``), description a one-line
        name of the data for the model card.
    """
    if data_args.train_file and is_arrow_source(data_args.train_file):
        return load_shard_blocks(model_args, data_args, tokenizer_source)
    raw = load_text_datasets(data_args, seed=seed, cache_dir=model_args.cache_dir)
    tok = load_or_train_tokenizer(model_args, data_args, raw, tokenizer_source)
    blocks = group_into_blocks(raw, tok, data_args.max_seq_length, num_proc=data_args.preprocessing_num_workers)
    if data_args.max_train_samples:
        blocks["train"] = blocks["train"][: data_args.max_train_samples]
    if data_args.max_eval_samples and "validation" in blocks:
        blocks["validation"] = blocks["validation"][: data_args.max_eval_samples]
    return tok, blocks, describe_data_source(data_args)


def load_tfrecord_blocks(model_args, data_args, tokenizer_source: Optional[str] = None):
    """Tokenizer and ``(dataset, num_blocks, L)`` per split of a ``hf-tpu prepare-data`` folder.

    Returns:
        ``(tokenizer, {"train": (ds, n, L), "validation": (ds, n, L) or None}, description)``.

    Raises:
        DataError: no manifest/split, or blocks of another length than ``--max_seq_length``.
        TokenizerError: the tokenizer cannot be loaded or has no mask token.
    """
    name = (tokenizer_source or model_args.tokenizer_name or model_args.model_name_or_path
            or os.path.join(data_args.train_file, "tokenizer"))
    tok = load_tokenizer(name)
    check_mlm_tokenizer(tok)
    train = read_tfrecord_blocks(data_args.train_file, "train")
    try:
        validation = read_tfrecord_blocks(data_args.validation_file or data_args.train_file, "validation")
    except DataError:
        validation = None
    if train[2] != data_args.max_seq_length:
        raise DataError(
            f"The TFRecord shards in {data_args.train_file} hold blocks of {train[2]} tokens but "
            f"--max_seq_length is {data_args.max_seq_length}; pass --max_seq_length {train[2]}."
        )
    if validation is not None and validation[1] == 0:
        validation = None
    return tok, {"train": train, "validation": validation}, read_manifest(data_args.train_file).get("source")


def load_shard_blocks(model_args, data_args, tokenizer_source: Optional[str] = None):
    """Tokenizer and :class:`~hf_tpu_ext.data.block_shards.ShardBlocks` per split of an Arrow shard folder.

    The tokenizer: the checkpoint's (``tokenizer_source``), ``--tokenizer_name``, the model's, else the folder's
    own; it must be the one the shards were made with. Nothing is read but the manifest and the tokenizer.

    Returns:
        ``(tokenizer, {"train": ShardBlocks, "validation": ShardBlocks or None}, description)``.

    Raises:
        DataError: no manifest, no train split, a missing file, another tokenizer or ``--max_seq_length``.
        TokenizerError: the tokenizer cannot be loaded or has no mask token.
    """
    path = data_args.train_file
    manifest = read_manifest(path)
    if manifest is None:
        raise DataError(f"{path} has no {MANIFEST_NAME}; it is not a folder written by `hf-tpu prepare-data`. "
                        "Run it first.")
    own = str(path).rstrip("/") + "/" + (manifest.get("tokenizer") or "tokenizer")
    tok = load_tokenizer(tokenizer_source or model_args.tokenizer_name or model_args.model_name_or_path or own)
    check_mlm_tokenizer(tok)
    check_shards(path, manifest, tok, data_args.max_seq_length)
    train = load_split(path, "train", manifest)
    if train is None:
        raise DataError(f"{path} has no train blocks; run `hf-tpu prepare-data` for them.")
    other = data_args.validation_file
    eval_manifest = read_manifest(other) if other else manifest
    if other and eval_manifest is not None:
        check_shards(other, eval_manifest, tok, data_args.max_seq_length)
    validation = load_split(other or path, "validation", eval_manifest or {})
    train.limit(data_args.max_train_samples)
    if validation is not None:
        validation.limit(data_args.max_eval_samples)
    return tok, {"train": train, "validation": validation}, manifest.get("source")


def num_blocks(split) -> int:
    """Blocks of a split: an int32 ``[N, L]`` array or a TFRecord ``(dataset, N, L)`` tuple (0 for ``None``)."""
    if split is None:
        return 0
    if isinstance(split, tuple):
        return int(split[1])
    return int(split.shape[0])


def check_split_size(blocks, name: str, global_batch_size: int, data_args) -> None:
    """Raise ``CorpusTooSmallError`` when ``blocks[name]`` (array or TFRecord tuple) holds fewer blocks than one
    global batch; the message gives the sizes and what to change."""
    split = blocks.get(name)
    if not isinstance(split, tuple):
        check_blocks(blocks, global_batch_size, name)
        return
    n = num_blocks(split)
    if n < global_batch_size:
        source = data_args.validation_file if name != "train" and data_args.validation_file else data_args.train_file
        flag = "--per_device_train_batch_size" if name == "train" else "--per_device_eval_batch_size"
        raise CorpusTooSmallError(
            f"The TFRecord shards in {source} hold {n} {name} blocks of {data_args.max_seq_length} tokens, fewer "
            f"than one global batch of {global_batch_size}. Prepare more data or lower {flag}"
            + ("." if name == "train" else ", or pass --eval_strategy no.")
        )
