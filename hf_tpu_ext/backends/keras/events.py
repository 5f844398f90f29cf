"""TensorBoard event files from the Keras backend's log entries, without TensorFlow (``--report_to tensorboard``)."""

from __future__ import annotations

import time
from typing import Any, Dict


class EventWriter:
    """TensorBoard scalars without TensorFlow (the ``tensorboard`` package's event-file writer).

    The event file (and ``logdir``) is created at the first entry, so a run refused while it is built (e.g. a
    ``--fsdp`` plan) leaves no folder behind."""

    def __init__(self, logdir: str):
        self._logdir, self._writer = logdir, None

    def scalars(self, entry: Dict[str, Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._writer = EventFileWriter(self._logdir)

        values = [summary_pb2.Summary.Value(
            tag=("train/" if not k.startswith("eval") and k != "perplexity" else "eval/") + k, simple_value=float(v))
            for k, v in entry.items() if k not in ("step", "epoch", "stream_passes") and isinstance(v, (int, float))]
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(entry["step"]),
                                               summary=summary_pb2.Summary(value=values)))
        self._writer.flush()
