"""``hf-tpu prepare-data``: tokenize a corpus once into block shards (a local folder, ``gs://`` or an fsspec URL).

Takes the data and tokenizer arguments of ``hf-tpu train`` (``--train_file``, ``--dataset_name``,
``--tokenizer_name``, ``--vocab_size``, ``--max_seq_length``, ...) plus ``--output_path``. Writes::

    {output_path}/manifest.json, train-*.tfrecord, validation-*.tfrecord, tokenizer/      (--shard_format tfrecord)
    {output_path}/manifest.json, train-*.arrow, validation-*.arrow, tokenizer/            (--shard_format arrow)

TFRecord shards feed the TensorFlow backend's tf.data pipeline (they need TensorFlow). Arrow shards
(:mod:`hf_tpu_ext.data.block_shards`) are read row by row without TensorFlow by the Keras backend, each process
reading only its rows; their manifest names the tokenizer's fingerprint and the sequence length, so a run with
another of either is refused before any compute.

The training blocks are written in a seeded random order, so the pipeline's windowed shuffle draws
from the whole corpus. ``--num_proc N`` tokenizes in N processes, one core each (default: every core this
process may use, at most one per 10,000 texts); the Apache Beam pipeline
(:mod:`hf_tpu_ext.data.beam_prepare`) writes the same shards on Dataflow, Spark or Flink. Train on them with ``hf-tpu train --train_file {output_path}``.

Example:
    hf-tpu prepare-data --train_file corpus.txt --max_seq_length 128 --output_path gs://bucket/corpus-128
    hf-tpu prepare-data --train_file corpus.txt --shard_format arrow --output_path corpus-128   # --backend keras
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional

from hf_tpu_ext.args import DataTrainingArguments, HelpFormatter, hf_argument_parser_class
from hf_tpu_ext.data.tokenizer import prepare_tokenizer
from hf_tpu_ext.errors import ArgumentError, DataError, OutputDirError
from hf_tpu_ext.extras import require_extra
from hf_tpu_ext.fileio import check_writable_dir, remote_files

# hf_tpu_ext.data's block, shard and record modules: imported inside the functions that use them, so numpy stays out of
# `hf-tpu prepare-data --help` (+0.15 s measured)


@dataclass
class TokenizerArguments:
    """The tokenizer of the shards (the model-shape flags of ``hf-tpu train`` do not apply here)."""

    tokenizer_name: Optional[str] = field(
        default=None,
        metadata={"help": "A tokenizer folder or repo id. Unset: the model's (--model_name_or_path), or a byte-level BPE "
                          "trained on the training split."},
    )
    model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "A model folder or Hub repo id whose tokenizer to use (unless --tokenizer_name)."}
    )
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of model_name_or_path."})
    vocab_size: int = field(default=8000, metadata={"help": "Vocabulary size of the tokenizer trained when none is given."})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "Where Hub downloads are cached."})

    def __post_init__(self):
        if self.vocab_size < 300:
            raise ArgumentError(f"--vocab_size {self.vocab_size} is too small for a byte-level BPE (256 bytes + specials); "
                                "use >= 300.")


@dataclass
class PrepareDataArguments:
    """Where and how ``hf-tpu prepare-data`` writes the shards."""

    output_path: str = field(metadata={"help": "Folder or gs:// URL for the shards, manifest.json and tokenizer/."})
    num_shards: int = field(default=8, metadata={"help": "TFRecord files per split (fewer when a split has fewer blocks)."})
    tokenizer_output_dir: Optional[str] = field(
        default=None, metadata={"help": "Where to save the tokenizer (default: {output_path}/tokenizer)."}
    )
    seed: int = field(default=42, metadata={"help": "Seed of the validation hold-out and of the training blocks' order."})
    num_proc: Optional[int] = field(
        default=None,
        metadata={"help": "Processes that tokenize on this machine, one core each (this one and N-1 spawned; default: the "
                          "CPU cores this process may use, at most one per 10,000 texts); for corpora beyond one machine see "
                          "hf_tpu_ext.data.beam_prepare (Apache Beam)."},
    )
    overwrite_output_path: bool = field(default=False, metadata={"help": "Replace shards already in --output_path."})
    shard_format: str = field(
        default="tfrecord",
        metadata={"help": "tfrecord (the TensorFlow backend's tf.data) or arrow (the Keras backend: read row by row "
                          "without TensorFlow, each process only its rows; any fsspec URL).",
                  "choices": ["tfrecord", "arrow"]},
    )

    def __post_init__(self):
        if self.shard_format not in ("tfrecord", "arrow"):
            raise ArgumentError(f"--shard_format must be tfrecord or arrow, got {self.shard_format!r}.")
        if self.num_shards < 1:
            raise ArgumentError(f"--num_shards must be >= 1, got {self.num_shards}.")
        if self.num_proc is not None and self.num_proc < 1:
            raise ArgumentError(f"--num_proc must be >= 1, got {self.num_proc}.")


def _save_tokenizer(tokenizer, destination: str) -> None:
    """``save_pretrained`` to a local folder, or to a temp folder copied to a URL
    (:func:`hf_tpu_ext.fileio.remote_files`)."""
    if "://" not in destination or destination.startswith("file://"):
        tokenizer.save_pretrained(destination.replace("file://", "", 1))
        return
    local = tempfile.mkdtemp(prefix="hf-tpu-tokenizer-")
    try:
        tokenizer.save_pretrained(local)
        files = remote_files(destination)
        files.makedirs(destination)
        for name in os.listdir(local):
            files.put(os.path.join(local, name), destination.rstrip("/") + "/" + name)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _tokenizer_record(output_path: str, tokenizer_dir: str) -> str:
    """The manifest's tokenizer entry: relative to ``output_path`` when inside it."""
    base = output_path.rstrip("/") + "/"
    if tokenizer_dir.startswith(base):
        return tokenizer_dir[len(base):]
    if "://" not in output_path and "://" not in tokenizer_dir:
        rel = os.path.relpath(os.path.abspath(tokenizer_dir), os.path.abspath(output_path))
        return rel.replace(os.sep, "/")
    return tokenizer_dir


def _parse(argv):
    """``(TokenizerArguments, DataTrainingArguments, PrepareDataArguments)``, before transformers is imported."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = hf_argument_parser_class()((TokenizerArguments, DataTrainingArguments, PrepareDataArguments),
                                        formatter_class=HelpFormatter)
    parser.prog = "hf-tpu prepare-data"
    parser.usage = "%(prog)s --output_path PATH [--name value ...]   (every argument: %(prog)s --help)"
    return parser.parse_args_into_dataclasses(args=argv)


def _holds_shards(path: str) -> bool:
    from hf_tpu_ext.data.block_shards import is_arrow_source
    from hf_tpu_ext.data.loading import is_tfrecord_source

    try:
        return is_arrow_source(path) or is_tfrecord_source(path)
    except ImportError:  # gs:// without TensorFlow: not TFRecord shards this command could have written
        return False


def _is_arrow(path: str) -> bool:
    from hf_tpu_ext.data.block_shards import is_arrow_source

    return is_arrow_source(path)


def _prepare_output(data_args, prep_args) -> str:
    """The absolute output path, checked (one line each, nothing written), its old manifest removed on overwrite.

    Raises:
        MissingExtraError: the format's packages are not installed. DataError: ``--train_file`` is shards.
        OutputDirError: the path holds shards and ``--overwrite_output_path`` is not set.
    """
    for option, path in (("--output_path", prep_args.output_path),
                         ("--tokenizer_output_dir", prep_args.tokenizer_output_dir)):
        if path and "://" not in path:  # a file in the way: one line now, not a NotADirectoryError at the end
            check_writable_dir(path, option)
    # before the data modules import datasets/TensorFlow: the install command, not a ModuleNotFoundError
    if prep_args.shard_format == "arrow":
        require_extra("jax", "hf-tpu prepare-data --shard_format arrow", ("datasets", "transformers", "tokenizers"))
    else:
        require_extra("tensorflow", "hf-tpu prepare-data", ("tensorflow", "datasets", "transformers"))
    output_path = prep_args.output_path
    if "://" not in output_path:
        output_path = os.path.abspath(output_path)
    if data_args.train_file and _holds_shards(data_args.train_file):
        kind = "Arrow block" if _is_arrow(data_args.train_file) else "TFRecord"
        raise DataError(f"--train_file {data_args.train_file} already holds {kind} shards; give text data to prepare.")
    if _holds_shards(output_path):
        if not prep_args.overwrite_output_path:
            raise OutputDirError(
                f"--output_path {prep_args.output_path} already holds shards (manifest.json); pass "
                "--overwrite_output_path to replace them or choose another path.")
        # start from a fresh manifest (old shards go per split)
        if output_path.startswith("gs://") and not _is_arrow(output_path):
            import tensorflow as tf

            tf.io.gfile.remove(output_path.rstrip("/") + "/manifest.json")
        else:
            from hf_tpu_ext.data.block_shards import remove_manifest

            remove_manifest(output_path)
    return output_path


def _split_blocks(blocks, split: str, limit: Optional[int], seed: int):
    """``(blocks, num_tokens or None)`` of a split as written: training blocks in their seeded order, then cut."""
    from hf_tpu_ext.data.sharding import permutation_order

    array = blocks[split]
    if split == "train" and len(array):
        # shuffled on disk, so the training pipeline's windowed shuffle sees the whole corpus; a permutation
        # computable block by block, so the Beam pipeline writes the same order (data/sharding.py)
        array = array[permutation_order(len(array), seed)]
    if limit is not None:
        array = array[:limit]
    return array, (blocks.num_tokens[split] if len(array) == len(blocks[split]) else None)


def _write_splits(blocks, data_args, prep_args, output_path: str, tokenizer, record: str) -> None:
    """Write both splits in ``--shard_format`` and print one line per split."""
    from hf_tpu_ext.data.loading import describe_data_source

    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    metadata = {"source": describe_data_source(data_args), "seed": prep_args.seed, "vocab_size": len(tokenizer)}
    arrow = prep_args.shard_format == "arrow"
    manifest = dict(metadata)
    for split in ("train", "validation"):
        array, num_tokens = _split_blocks(blocks, split, limits[split], prep_args.seed)
        if arrow:
            from hf_tpu_ext.data.block_shards import write_split

            entry = write_split(array, output_path, split, prep_args.num_shards, manifest, num_tokens)
        else:
            from hf_tpu_ext.data.tfrecord import write_tfrecord_shards

            entry = write_tfrecord_shards(array, output_path, split, prep_args.num_shards, tokenizer=record,
                                          num_tokens=num_tokens, metadata=metadata)
        print(f"{split}: {entry['num_blocks']} blocks of {data_args.max_seq_length} tokens "
              f"({entry['num_tokens']} tokens) in {len(entry['files'])} file(s)")
    if arrow:  # last: a folder is a shard set only once every split is written
        from hf_tpu_ext.data.block_shards import write_manifest

        write_manifest(output_path, manifest, tokenizer, record)


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``hf-tpu prepare-data``.

    Args:
        argv: command-line arguments without the program and command names (default ``sys.argv[2:]``
            style: whatever :mod:`hf_tpu_ext.cli` passes).

    Returns:
        int: 0 on success.

    Raises:
        MissingExtraError: the format's packages are not installed (TensorFlow for tfrecord; datasets for both).
        DataError, TokenizerError, CorpusTooSmallError: bad data or tokenizer (the CLI prints them).
        OutputDirError: ``--output_path`` already holds shards and ``--overwrite_output_path`` is not set.
        SystemExit: unknown flags or ``--help`` (argparse).
    """
    model_args, data_args, prep_args = _parse(argv)
    output_path = _prepare_output(data_args, prep_args)
    from hf_tpu_ext.data.blocks import column_texts, default_num_proc, tokenize_into_blocks
    from hf_tpu_ext.data.loading import describe_data_source, load_text_datasets
    start = time.perf_counter()
    raw = load_text_datasets(data_args, seed=prep_args.seed, cache_dir=model_args.cache_dir)
    print(f"Loaded {describe_data_source(data_args)}: " + ", ".join(f"{k} {len(v)} texts" for k, v in raw.items()))

    tokenizer = prepare_tokenizer(model_args, column_texts(raw["train"]), data_args.max_seq_length)
    tokenizer_dir = prep_args.tokenizer_output_dir or (output_path.rstrip("/") + "/tokenizer")
    _save_tokenizer(tokenizer, tokenizer_dir)
    print(f"Tokenizer ({len(tokenizer)} tokens) saved to {tokenizer_dir}")

    num_proc = (prep_args.num_proc or data_args.preprocessing_num_workers
                or default_num_proc(sum(len(ds) for ds in raw.values())))
    tok_start = time.perf_counter()
    blocks = tokenize_into_blocks(raw, tokenizer, data_args.max_seq_length, num_proc=num_proc)
    tok_seconds = time.perf_counter() - tok_start
    total_tokens = sum(blocks.num_tokens.values())
    _write_splits(blocks, data_args, prep_args, output_path, tokenizer, _tokenizer_record(output_path, tokenizer_dir))
    print(
        f"Tokenized {total_tokens} tokens in {tok_seconds:.2f} s with {num_proc} process(es) "
        f"({total_tokens / max(tok_seconds, 1e-9):,.0f} tokens/s); "
        f"total {time.perf_counter() - start:.2f} s. Train with: hf-tpu train --train_file {output_path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
