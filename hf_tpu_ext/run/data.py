"""The run's data phase: the blocks of the train/validation splits (text files, a dataset or TFRecord shards) and
the :class:`~hf_tpu_ext.backends.base.RunPlan` they give (batch sizes, steps per epoch, total steps), with the split
sizes checked before any model work."""

from __future__ import annotations

from hf_tpu_ext.backends.base import RunPlan
from hf_tpu_ext.data.block_shards import is_arrow_source
from hf_tpu_ext.data.loading import is_tfrecord_source
from hf_tpu_ext.data.run_data import check_split_size, load_text_blocks, load_tfrecord_blocks, num_blocks
from hf_tpu_ext.data.streaming import is_stream, load_stream_blocks
from hf_tpu_ext.data.tfrecord import check_tfrecord_location
from hf_tpu_ext.errors import DataError


def load_blocks(model_args, data_args, training_args, backend, tokenizer_source):
    """``(tokenizer, blocks, description)`` of the run's data (:mod:`hf_tpu_ext.data.run_data`): ``blocks`` is the
    :class:`hf_tpu_ext.data.blocks.Blocks` dict of "train" and "validation" (int32 ``[N, max_seq_length]``, or a
    TFRecord source), ``description`` a one-line name of the data for the card; the tokenizer comes from
    ``tokenizer_source`` (a resumed checkpoint's folder) when given.

    Raises:
        DataError: TFRecord or Arrow shards for a backend that does not read them (or with ``--streaming``), local
            data for a TPU Node, a ``--streaming`` source without a train split.
    """
    shards = data_args.train_file and is_arrow_source(data_args.train_file)
    if getattr(data_args, "streaming", False):
        if shards or (data_args.train_file and is_tfrecord_source(data_args.train_file)):
            raise DataError(f"--train_file {data_args.train_file} holds prepared block shards, which are read row by "
                            "row already; drop --streaming.")
        return load_stream_blocks(model_args, data_args, tokenizer_source)  # data/streaming.py
    if shards and not getattr(backend, "reads_block_shards", False):
        raise DataError(f"{data_args.train_file} holds Arrow block shards, which --backend {backend.name} does not "
                        "read; use --backend keras, or `hf-tpu prepare-data --shard_format tfrecord` for TensorFlow.")
    if data_args.train_file and is_tfrecord_source(data_args.train_file):
        if not backend.supports_tfrecord:
            raise DataError(
                f"{data_args.train_file} holds TFRecord shards, which --backend {backend.name} does not read; pass "
                "the text files (--train_file/--validation_file) or a --dataset_name, or use --backend tensorflow.")
        check_tfrecord_location(data_args.train_file, backend.needs_remote_data)
        return load_tfrecord_blocks(model_args, data_args, tokenizer_source)
    if backend.needs_remote_data:
        raise DataError("A TPU Node reads data from Cloud Storage: run `hf-tpu prepare-data --output_path gs://...` "
                        "and pass that gs:// path as --train_file.")
    return load_text_blocks(model_args, data_args, training_args.seed, tokenizer_source)


def plan_run(training_args, data_args, backend, blocks):
    """The :class:`~hf_tpu_ext.backends.base.RunPlan` of ``blocks`` on ``backend``: global batch (sequences per
    optimizer step: per-device batch x replicas x gradient accumulation), evaluation batch, steps per epoch, total
    steps, whether the run evaluates.

    Raises:
        CorpusTooSmallError: a split holds fewer blocks than one batch (a ``--streaming`` train split: checked as
            it is read).
    """
    args = training_args
    # sequences per optimizer step: gradient accumulation splits them into micro-batches inside the step
    global_batch = (args.per_device_train_batch_size * backend.num_replicas
                    * int(getattr(args, "gradient_accumulation_steps", 1) or 1))
    eval_batch = args.per_device_eval_batch_size * backend.num_replicas
    streaming = is_stream(blocks["train"])
    if not streaming:
        check_split_size(blocks, "train", global_batch, data_args)
    do_eval = getattr(args, "do_eval", args.eval_strategy != "no")
    has_eval = bool(do_eval) and num_blocks(blocks.get("validation")) > 0
    if has_eval:
        check_split_size(blocks, "validation", eval_batch, data_args)
    if streaming:  # no length: one "epoch" is the run (--max_steps, required), the blocks it reads
        spe = args.max_steps
        n = spe * global_batch
    else:
        n = num_blocks(blocks["train"])
        spe = n // global_batch
    return RunPlan(global_batch_size=global_batch, eval_batch_size=eval_batch,
                   seq_length=data_args.max_seq_length, steps_per_epoch=spe,
                   total_steps=args.total_steps(spe), num_train_blocks=n, has_eval=has_eval, streaming=streaming,
                   num_eval_blocks=num_blocks(blocks.get("validation")) if has_eval else 0,
                   # a resume at a new --max_seq_length (run/resume.py _apply_seq_length): where its phase starts
                   phase_start_step=int(getattr(data_args, "phase_start_step", 0) or 0),
                   tokens_before_phase=int(getattr(data_args, "tokens_before_phase", 0) or 0))
