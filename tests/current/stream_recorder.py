"""``python stream_recorder.py OUT_PREFIX train ...``: ``hf-tpu train`` that also records, for the streaming tests,
the token ids each ``--streaming`` step was given, one JSON line ``{"step", "process", "ids"}`` per produced step
in ``OUT_PREFIX-<process>.jsonl`` (a produced step may be one the prefetcher read ahead and a kill cut off)."""

import json
import sys


def main():
    prefix = sys.argv.pop(1)
    from hf_tpu_ext.data import streaming

    produce = streaming.StreamTrainBatches.__call__

    def recorded(self, step):
        read = self.blocks.next_blocks
        got = {}

        def next_blocks(count):
            got["ids"] = read(count)
            return got["ids"]

        self.blocks.next_blocks = next_blocks
        try:
            return produce(self, step)
        finally:
            del self.blocks.next_blocks
            if "ids" in got:
                with open(f"{prefix}-{self.blocks.rank}.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": int(step), "process": self.blocks.rank,
                                        "ids": got["ids"].tolist()}) + "\n")

    streaming.StreamTrainBatches.__call__ = recorded
    from hf_tpu_ext.cli import main as cli

    return cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
