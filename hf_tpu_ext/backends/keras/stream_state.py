"""``--streaming`` in the Keras backend: the stream's batch source and its position in each checkpoint.

The stream itself is :mod:`hf_tpu_ext.data.streaming`; here, the three points where the backend meets it: the batch
source of :meth:`~hf_tpu_ext.backends.keras.backend.KerasBackend.build` (this process's slice, its rows of each
global batch), the ``data_state-<i>.json`` texts a save writes (every process's, gathered to process 0 so they go
into the checkpoint folder before its atomic rename) and the position a restore continues from.
"""

from __future__ import annotations

import os
from typing import Dict

from hf_tpu_ext.data.streaming import STATE_FILE, StreamTrainBatches, StreamedBlocks
from hf_tpu_ext.distributed import process_index
from hf_tpu_ext.errors import CheckpointError, DataError


def stream_batches(backend, source, rows):
    """The :class:`~hf_tpu_ext.data.streaming.StreamTrainBatches` of a built backend (tokenizer, plan, masker
    set): this process's ``split_dataset_by_node`` slice of ``source``, ``rows`` (int ``[R]``) per step.
    """
    import jax  # the backend's setup imported it (a framework: not at this module's top)

    blocks = StreamedBlocks(source, backend.tokenizer, backend.plan.seq_length, process_index(), jax.process_count())
    # the prefetcher is 2 device calls of --steps_per_execution steps ahead; states of a few more are kept
    n = int(getattr(backend.args, "steps_per_execution", 1) or 1)
    return StreamTrainBatches(blocks, backend.args.seed, backend.masker, rows, keep=4 * n + 8)


def _is_stream(batches) -> bool:
    return isinstance(batches, StreamTrainBatches)


def _streaming(backend) -> bool:
    return _is_stream(getattr(backend, "train_batches", None))


def data_state_files(batches, placement, step: int) -> Dict[str, str]:
    """Every process's ``data_state-<i>.json`` text after ``step`` steps of the batch source ``batches`` (a
    collective over ``placement``'s processes: all call it), for process 0 to write into the checkpoint; ``{}``
    without ``--streaming``."""
    if not _is_stream(batches):
        return {}
    texts = placement.gather_texts(batches.state_at(step))
    return {STATE_FILE.format(i): text for i, text in enumerate(texts)}


def restore_data_state(backend, path: str, step: int) -> None:
    """Continue this process's stream after ``step`` from the checkpoint ``path``'s ``data_state-<i>.json``
    (nothing without ``--streaming``).

    Raises:
        CheckpointError: the checkpoint has no position of this process (saved without ``--streaming``, or by
            fewer processes), or one of another step, process count or batch.
    """
    if not _streaming(backend):
        return
    file = os.path.join(path, STATE_FILE.format(process_index()))
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint {path} has no {os.path.basename(file)}: it was saved without "
                              "--streaming or by fewer processes; resume it as it was run.") from None
    try:
        backend.train_batches.restore(text, step, file)
    except DataError as err:
        raise CheckpointError(str(err)) from None


def stream_passes(backend, step: int):
    """The passes over this process's slice completed after ``step`` steps (its position's ``pass`` number: passes
    are counted from 0 and a new one starts when one ends), or ``None`` without ``--streaming`` or when that step's
    position is no longer kept."""
    import json

    if not _streaming(backend):
        return None
    try:
        return int(json.loads(backend.train_batches.state_at(step))["state"]["pass"])
    except (DataError, KeyError, TypeError, ValueError):
        return None
