"""Peak RSS of ``hf-tpu train --backend keras`` from two Arrow shard sets 10x apart in size.

Writes two ``hf-tpu prepare-data --shard_format arrow`` folders of random token ids (``--blocks`` and
``--factor`` x ``--blocks`` blocks of ``--seq_length`` tokens, one tokenizer: a byte-level BPE of the embedded
corpus), then trains a tiny model for ``--steps`` steps from each, one fresh process per run, and prints each
run's peak RSS (``ru_maxrss`` of that process, read as it exits) beside the shard set's size on disk. A process
reads only its rows (memory-mapped), so the two peaks should differ by far less than the sets do; the pages a run
touches grow with ``steps x batch``, not with the corpus.

A benchmark, not a test: it prints figures (JSON) and asserts nothing. Run it on a quiet machine.

Usage (from the repository root, in the [jax] venv):
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.shard_rss [--blocks 20000] [--factor 10] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def write_shard_set(folder: Path, tokenizer, blocks: int, seq_length: int, seed: int) -> int:
    """Random ids in ``[5, len(tokenizer))`` as one train split of ``blocks`` blocks; returns the bytes written."""
    import numpy as np

    from hf_tpu_ext.data.block_shards import write_manifest, write_split

    rng = np.random.default_rng(seed)
    manifest = {"source": "benchmarks/shard_rss.py random ids", "seed": seed}
    write_split(rng.integers(5, len(tokenizer), size=(blocks, seq_length), dtype=np.int32), str(folder), "train",
                8, manifest)
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    write_manifest(str(folder), manifest, tokenizer, "tokenizer")
    return sum(p.stat().st_size for p in folder.glob("train-*.arrow"))


def train_argv(shards: Path, out: Path, args) -> list:
    return ["train", "--backend", "keras", "--train_file", str(shards), "--output_dir", str(out),
            "--max_seq_length", str(args.seq_length), "--hidden_size", "32", "--num_hidden_layers", "2",
            "--num_attention_heads", "2", "--intermediate_size", "64", "--per_device_train_batch_size",
            str(args.batch), "--max_steps", str(args.steps), "--save_steps", str(args.steps), "--logging_steps",
            str(args.steps), "--eval_strategy", "no", "--report_to", "none", "--disable_tqdm", "true"]


def child(argv) -> None:
    """One training run in this process; prints ``{"peak_rss_mb": ...}`` as the last line."""
    from hf_tpu_ext.cli import main

    rc = main(argv)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    print(json.dumps({"rc": rc, "peak_rss_mb": round(peak_kb / 1024, 1)}), flush=True)


def run_one(shards: Path, out: Path, args) -> dict:
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=os.pathsep.join([str(REPO_ROOT),
                                                                           os.environ.get("PYTHONPATH", "")]))
    env.setdefault("JAX_PLATFORMS", "cpu")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.shard_rss", "--child", *train_argv(shards, out, args)],
                          env=env, capture_output=True, text=True, cwd=str(REPO_ROOT))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"training from {shards} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]), wall_seconds=round(time.perf_counter() - t0, 1))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20000, help="blocks of the smaller set")
    parser.add_argument("--factor", type=int, default=10, help="the larger set has this many times more")
    parser.add_argument("--seq_length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16, help="per-device batch")
    args = parser.parse_args()
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(default_corpus_texts(), vocab_size=400, model_max_length=args.seq_length)
    with tempfile.TemporaryDirectory(prefix="hf-tpu-shard-rss-") as tmp:
        root, result = Path(tmp), {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for name, blocks in (("small", args.blocks), ("large", args.blocks * args.factor)):
            size = write_shard_set(root / name, tokenizer, blocks, args.seq_length, seed=1)
            run = run_one(root / name, root / f"out-{name}", args)
            result[name] = {"blocks": blocks, "shard_mb": round(size / 2**20, 1), **run}
        result["peak_rss_growth_mb"] = round(result["large"]["peak_rss_mb"] - result["small"]["peak_rss_mb"], 1)
        result["shard_growth_mb"] = round(result["large"]["shard_mb"] - result["small"]["shard_mb"], 1)
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
        result["settings"] = vars(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
