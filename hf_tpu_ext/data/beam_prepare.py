"""``hf-tpu prepare-data`` as an Apache Beam pipeline, for corpora that outgrow one machine.

It writes the same shards and ``manifest.json`` as the local command, byte for byte, for the same text
files, tokenizer, ``--max_seq_length``, ``--num_shards``, ``--seed`` and hold-out settings (a test checks it
on the DirectRunner). Apache Beam is what TensorFlow Datasets builds large datasets with; the same
pipeline runs on Dataflow, Spark or Flink by its pipeline options. Install it in its own environment
(``pip install "hf-tpu-ext[beam]"``; its pins may not sit with TensorFlow's); the workers need no
TensorFlow: examples are encoded by :func:`hf_tpu_ext.data.tfrecord.serialize_blocks` and framed by Beam's
TFRecord coder.

Steps (each a parallel stage, the only shuffles are Beam's ``GroupByKey``)::

    files -> non-empty lines, numbered (file, line) -> hold-out split (seeded, as load_text_datasets)
      -> tokenize in batches (tokenizers, the tokenizer.json of --tokenizer_name)
      -> chunks of 4096 documents in order -> token offsets (prefix sums of chunk sizes, a side input)
      -> pieces per block -> blocks of L tokens (the last partial block dropped)
      -> position (training blocks: the seeded permutation of hf_tpu_ext.data.sharding) -> shard
      -> one file per shard, records in position order -> manifest.json

The tokenizer must exist already (train it with the local command on a sample, or use a Hub tokenizer
saved with ``save_pretrained``); it is copied to ``{output_path}/tokenizer``. Without ``--validation_file``
the hold-out needs the number of non-empty lines and keeps one 8-byte position per line in each worker's
memory (fine to ~10^8 lines; give a ``--validation_file`` beyond that).

Commands (after ``pip install "hf-tpu-ext[beam]"``)::

    # this machine, several processes
    python -m hf_tpu_ext.data.beam_prepare --train_file 'corpus/*.txt' --tokenizer_name tok/ \\
        --output_path out/ --max_seq_length 128 -- --runner DirectRunner --direct_num_workers 8 \\
        --direct_running_mode multi_processing
    # Google Cloud Dataflow (workers install the package from a wheel or setup.py)
    python -m hf_tpu_ext.data.beam_prepare --train_file 'gs://b/corpus/*.txt' --tokenizer_name gs://b/tok \\
        --output_path gs://b/corpus-128 --max_seq_length 128 --num_shards 256 -- --runner DataflowRunner \\
        --project P --region us-central1 --temp_location gs://b/tmp --setup_file ./setup.py
    # Spark / Flink: --runner SparkRunner --spark_master_url spark://host:7077
    #                --runner FlinkRunner --flink_master host:8081 --environment_type LOOPBACK
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from hf_tpu_ext.args import DataTrainingArguments
from hf_tpu_ext.data.loading import describe_data_source
from hf_tpu_ext.data.sharding import permute, shard_of, shard_ranges
from hf_tpu_ext.data.tfrecord import FEATURE, FORMAT, MANIFEST_NAME, manifest_text, serialize_blocks, shard_file_name
from hf_tpu_ext.errors import DataError, DataFileNotFoundError, OutputDirError, TokenizerError

CHUNK_DOCS = 4096  # documents per ordered chunk (one group per chunk when computing token offsets)
TOKENIZE_BATCH = 1000  # documents per encode_batch call, as the local path's datasets.map batches


def read_lines(path: str) -> List[str]:
    """The lines of a UTF-8 text file as ``datasets``' ``text`` builder reads them.

    Universal newlines (``\\r\\n`` and ``\\r`` become ``\\n``), split on ``\\n``, line breaks dropped.
    """
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as f:
        text = f.read().decode("utf-8")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _expand(patterns: Sequence[str]) -> List[str]:
    from apache_beam.io.filesystems import FileSystems

    files: List[str] = []
    for pattern in patterns:
        matches = sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)
        if not matches:
            raise DataFileNotFoundError(f"{pattern} matches no file.")
        files += matches
    return files


def _blocks_of_chunk(element, offsets, seq_length: int):
    """Cut one ordered chunk of token ids into ``((split, block), (offset_in_block, ids))`` pieces."""
    (split, chunk), ids = element
    start = offsets[(split, chunk)]
    total = offsets[(split, "total")]
    n_blocks = total // seq_length
    pos = 0
    while pos < len(ids):
        block, within = divmod(start + pos, seq_length)
        if block >= n_blocks:
            return
        take = min(seq_length - within, len(ids) - pos)
        yield (split, block), (within, ids[pos:pos + take])
        pos += take


def _chunk_offsets(sizes: Dict[Tuple[str, int], int]) -> Dict:
    """Token offset of each ``(split, chunk)`` in its split, plus ``(split, "total")``."""
    out: Dict = {}
    for split in sorted({s for s, _ in sizes}):
        running = 0
        for chunk in sorted(c for s, c in sizes if s == split):
            out[(split, chunk)] = running
            running += sizes[(split, chunk)]
        out[(split, "total")] = running
    return out


def build_pipeline(pipeline, *, train_files: Sequence[str], validation_files: Optional[Sequence[str]],
                   tokenizer_json: str, output_path: str, max_seq_length: int, num_shards: int, seed: int,
                   validation_split_percentage: float, limits: Dict[str, Optional[int]], metadata: dict,
                   tokenizer_record: str = "tokenizer"):
    """Add the prepare-data stages to ``pipeline`` (see the module docstring); returns the manifest PCollection.

    Args:
        pipeline: an ``apache_beam.Pipeline``.
        train_files, validation_files: expanded file paths (local or any Beam filesystem, e.g. ``gs://``).
        tokenizer_json: the ``tokenizer.json`` text of a fast tokenizer.
        output_path: folder of the shards and ``manifest.json``.
        max_seq_length: ``L``. num_shards: files per split (fewer for small splits). seed: ``--seed``.
        validation_split_percentage: hold-out share when ``validation_files`` is empty.
        limits: ``{"train": max_train_samples, "validation": max_eval_samples}`` (None: all).
        metadata: the manifest's ``source``/``seed``/``vocab_size`` fields.
        tokenizer_record: the manifest's ``tokenizer`` entry.
    """
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems

    L = int(max_seq_length)
    files = [("train", i, f) for i, f in enumerate(train_files)]
    files += [("validation", i, f) for i, f in enumerate(validation_files or [])]
    hold_out = not validation_files and validation_split_percentage > 0
    numbered = _numbered_documents(pipeline, files, hold_out, seed, validation_split_percentage)
    blocks, offsets = _token_blocks(numbered, tokenizer_json, L)
    written, counts_side = _written_shards(blocks, offsets, L, limits, seed, num_shards, output_path)

    def write_manifest(names, counts):
        manifest = {"splits": {}}
        for split in ("train", "validation"):
            c = counts[split]
            num_tokens = c["tokens"] if c["kept"] == c["blocks"] else c["kept"] * L
            manifest["splits"][split] = {"num_blocks": c["kept"], "num_tokens": int(num_tokens),
                                         "files": sorted(n for s, n in names if s == split)}
        manifest.update(format=FORMAT, feature=FEATURE, max_seq_length=L, tokenizer=tokenizer_record)
        reserved = {"splits", "format", "feature", "max_seq_length", "tokenizer"}
        manifest.update({k: v for k, v in metadata.items() if k not in reserved})
        with FileSystems.create(output_path.rstrip("/") + "/" + MANIFEST_NAME) as f:
            f.write(manifest_text(manifest).encode())
        return manifest

    return written | "Manifest" >> beam.Map(write_manifest, counts_side)


def _numbered_documents(pipeline, files, hold_out: bool, seed: int, validation_split_percentage: float):
    """Stage 1 of :func:`build_pipeline`: the non-empty lines of ``files`` (``(split, file index, path)``) as
    ``((split, position of the document in its split's order), text)``, the validation split held out as in
    ``load_text_datasets`` when ``hold_out``.

    Raises:
        DataError: holding out a validation split from fewer than 2 lines (when the pipeline runs).
    """
    import apache_beam as beam

    def lines(element):
        split, file_index, path = element
        kept = [t for t in read_lines(path) if t and t.strip()]  # load_text_datasets drops empty texts
        for i, text in enumerate(kept):
            yield (split, file_index, i), text

    docs = pipeline | "Files" >> beam.Create(files) | "Lines" >> beam.FlatMap(lines) | beam.Reshuffle()
    per_file = (docs | "FileKey" >> beam.Map(lambda kv: ((kv[0][0], kv[0][1]), 1))
                | "CountPerFile" >> beam.CombinePerKey(sum))

    class Number(beam.DoFn):
        """(split, file, line) -> (split, position of the document in its split's order)."""

        def __init__(self):
            self._cache = None

        def process(self, kv, counts):
            (split, file_index, line), text = kv
            if self._cache is None:
                offsets, totals = {}, {}
                for (s, f) in sorted(counts):
                    offsets[(s, f)] = totals.get(s, 0)
                    totals[s] = totals.get(s, 0) + counts[(s, f)]
                inverse = None
                if hold_out:
                    n = totals.get("train", 0)
                    order = np.random.default_rng(seed).permutation(n)  # as load_text_datasets
                    inverse = np.empty(n, dtype=np.int64)
                    inverse[order] = np.arange(n)
                    n_val = int(math.ceil(n * validation_split_percentage / 100.0))
                    if n < 2:
                        raise DataError("Holding out a validation split needs at least 2 non-empty lines.")
                else:
                    n_val = 0
                self._cache = (offsets, inverse, n_val)
            offsets, inverse, n_val = self._cache
            index = offsets[(split, file_index)] + line
            if inverse is not None:
                q = int(inverse[index])
                yield ("validation", q) if q < n_val else ("train", q - n_val), text
            else:
                yield (split, index), text

    numbered = docs | "Number" >> beam.ParDo(Number(), beam.pvalue.AsDict(per_file))
    return numbered


def _token_blocks(numbered, tokenizer_json: str, L: int):
    """Stage 2 of :func:`build_pipeline`: tokenized documents concatenated in order and cut into blocks of ``L``.

    Returns:
        ``(blocks, offsets)``: ``((split, block index), int32 [L] ids)`` and the singleton of chunk offsets
        (:func:`_chunk_offsets`, with each split's total tokens).
    """
    import apache_beam as beam

    class Tokenize(beam.DoFn):
        def setup(self):
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_str(tokenizer_json)

        def process(self, batch):
            encodings = self.tokenizer.encode_batch_fast([text for _, text in batch], add_special_tokens=True)
            for (key, _), enc in zip(batch, encodings):
                yield (key[0], key[1] // CHUNK_DOCS), (key[1], np.asarray(enc.ids, dtype=np.int32))

    def concat_chunk(kv):
        key, docs_of_chunk = kv
        parts = [ids for _, ids in sorted(docs_of_chunk, key=lambda d: d[0])]
        return key, (np.concatenate(parts) if parts else np.zeros([0], np.int32))

    chunks = (numbered | beam.BatchElements(min_batch_size=TOKENIZE_BATCH, max_batch_size=TOKENIZE_BATCH)
              | "Tokenize" >> beam.ParDo(Tokenize()) | "ByChunk" >> beam.GroupByKey()
              | "Concat" >> beam.Map(concat_chunk))
    sizes = chunks | "ChunkSize" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
    offsets = sizes | "AllSizes" >> beam.combiners.ToDict() | "Offsets" >> beam.Map(_chunk_offsets)

    def assemble(kv):
        key, pieces = kv
        return key, np.concatenate([ids for _, ids in sorted(pieces, key=lambda p: p[0])])

    blocks = (chunks | "Pieces" >> beam.FlatMap(_blocks_of_chunk, beam.pvalue.AsSingleton(offsets), L)
              | "ByBlock" >> beam.GroupByKey() | "Assemble" >> beam.Map(assemble))
    return blocks, offsets


def write_tfrecord(f, record: bytes) -> None:
    """Append one TFRecord to the open binary file ``f``: the length (uint64), its masked CRC32C, ``record``, its
    masked CRC32C.

    The one adapter over a private name (``apache_beam.io.tfrecordio._TFRecordUtil.write_record``). The public
    alternative: ``apache_beam.io.WriteToTFRecord``, which names and orders its shards itself (not the project's
    shard names and block order), or ``tf.io.TFRecordWriter``, which needs TensorFlow in every Beam worker.
    """
    from apache_beam.io.tfrecordio import _TFRecordUtil

    _TFRecordUtil.write_record(f, record)


def _written_shards(blocks, offsets, L: int, limits: Dict[str, Optional[int]], seed: int, num_shards: int,
                    output_path: str):
    """Stage 3 of :func:`build_pipeline`: the kept blocks (train permuted by ``seed``) written as TFRecord shards.

    Returns:
        ``(written, counts_side)``: the list of ``(split, shard file name)`` and the side input of each split's
        ``{"tokens", "blocks", "kept"}`` counts.
    """
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems

    def counts_of(all_offsets):
        out = {}
        for split in ("train", "validation"):
            total = all_offsets.get((split, "total"), 0)
            n = total // L
            kept = n if limits.get(split) is None else min(n, int(limits[split]))
            out[split] = {"tokens": total, "blocks": n, "kept": kept}
        return out

    split_counts = offsets | "Counts" >> beam.Map(counts_of)

    def place(kv, counts):
        (split, block), ids = kv
        c = counts[split]
        position = int(permute([block], c["blocks"], seed)[0]) if split == "train" else block
        if position < c["kept"]:
            yield (split, int(shard_of([position], c["kept"], num_shards)[0])), (position, ids)

    class WriteShard(beam.DoFn):
        def process(self, kv, counts):
            (split, shard), rows = kv
            rows = sorted(rows, key=lambda r: r[0])
            shards = len(shard_ranges(counts[split]["kept"], num_shards))
            name = shard_file_name(split, shard, shards)
            with FileSystems.create(output_path.rstrip("/") + "/" + name) as f:
                for record in serialize_blocks(np.stack([ids for _, ids in rows])):
                    write_tfrecord(f, record)
            yield split, name

    counts_side = beam.pvalue.AsSingleton(split_counts)
    written = (blocks | "Place" >> beam.FlatMap(place, counts_side) | "ByShard" >> beam.GroupByKey()
               | "WriteShards" >> beam.ParDo(WriteShard(), counts_side) | "AllFiles" >> beam.combiners.ToList())
    return written, counts_side


def _copy_tokenizer(tokenizer_dir: str, destination: str) -> str:
    """Copy the tokenizer's files to ``destination``; returns the ``tokenizer.json`` text."""
    from apache_beam.io.filesystems import FileSystems

    source = tokenizer_dir.rstrip("/")
    names = [m.path for r in FileSystems.match([source + "/*"]) for m in r.metadata_list]
    if not any(p.endswith("/tokenizer.json") for p in names):
        raise TokenizerError(f"{tokenizer_dir} has no tokenizer.json (a fast tokenizer saved with save_pretrained).")
    FileSystems.mkdirs(destination) if not FileSystems.exists(destination) else None
    for path in sorted(names):
        target = destination.rstrip("/") + "/" + path.rsplit("/", 1)[-1]
        with FileSystems.open(path) as src, FileSystems.create(target) as dst:
            dst.write(src.read())
    with FileSystems.open(source + "/tokenizer.json") as f:
        return f.read().decode("utf-8")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m hf_tpu_ext.data.beam_prepare [prepare-data flags] -- [Beam pipeline options]``.

    Flags: ``--train_file`` (a file or glob, repeatable via commas), ``--validation_file``, ``--tokenizer_name``
    (a local or remote folder with ``tokenizer.json``), ``--output_path``, ``--max_seq_length`` (128),
    ``--num_shards`` (8), ``--seed`` (42), ``--validation_split_percentage`` (5), ``--max_train_samples``,
    ``--max_eval_samples``. Everything after ``--`` goes to ``PipelineOptions`` (``--runner`` etc.).

    Returns:
        0 on success.

    Raises:
        OutputDirError: ``--output_path`` already holds a manifest.
        DataFileNotFoundError, TokenizerError: missing input.
    """
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    argv = list(sys.argv[1:] if argv is None else argv)
    beam_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m hf_tpu_ext.data.beam_prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--train_file", required=True)
    parser.add_argument("--validation_file")
    parser.add_argument("--tokenizer_name", required=True)
    parser.add_argument("--output_path", required=True)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--validation_split_percentage", type=float, default=5.0)
    parser.add_argument("--max_train_samples", type=int)
    parser.add_argument("--max_eval_samples", type=int)
    args = parser.parse_args(ours)
    for name in ("max_train_samples", "max_eval_samples", "num_shards"):  # hf-tpu prepare-data's ranges
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1 (unset: every block), got {getattr(args, name)}")

    output = args.output_path.rstrip("/")
    if FileSystems.exists(output + "/" + MANIFEST_NAME):
        raise OutputDirError(f"--output_path {args.output_path} already holds shards (manifest.json); choose another path.")
    train_files = _expand(args.train_file.split(","))
    validation_files = _expand(args.validation_file.split(",")) if args.validation_file else None
    tokenizer_json = _copy_tokenizer(args.tokenizer_name, output + "/tokenizer")
    from tokenizers import Tokenizer

    source = describe_data_source(DataTrainingArguments(train_file=args.train_file, validation_file=args.validation_file))
    metadata = {"source": source, "seed": args.seed,
                "vocab_size": Tokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True)}
    with beam.Pipeline(options=PipelineOptions(beam_argv)) as pipeline:
        build_pipeline(pipeline, train_files=train_files, validation_files=validation_files,
                       tokenizer_json=tokenizer_json, output_path=output, max_seq_length=args.max_seq_length,
                       num_shards=args.num_shards, seed=args.seed,
                       validation_split_percentage=args.validation_split_percentage,
                       limits={"train": args.max_train_samples, "validation": args.max_eval_samples},
                       metadata=metadata)
    manifest = json.loads(FileSystems.open(output + "/" + MANIFEST_NAME).read().decode())
    for split, entry in manifest["splits"].items():
        print(f"{split}: {entry['num_blocks']} blocks of {args.max_seq_length} tokens ({entry['num_tokens']} tokens) "
              f"in {len(entry['files'])} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
