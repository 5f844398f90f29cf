"""What every part of the throughput benchmark shares: paths, recipe names, presets, the data and the training
arguments of ``hf-tpu train`` (:mod:`benchmarks.train_throughput` and :mod:`benchmarks.keras_recipes` both read
it; it imports no framework and nothing else of ``benchmarks``, so neither imports the other).
"""

from __future__ import annotations

import dataclasses
import resource
from pathlib import Path
from typing import List, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
RESULTS_MD = REPO_ROOT / "benchmarks" / "RESULTS.md"
RECIPES = ("hf_tpu", "plain", "plain_xla")
# hf-tpu train with --jit_compile false: what the XLA step (and its counter-based dropout) buys; bf16 mixed
# precision on both compiler paths, and `--bf16 true` alone, which picks the path per device
# (hf_tpu_ext/precision.py): on a native-bf16 CPU TensorFlow's kernels with XLA-fused element-wise ops
# (hf_tpu_ext/backends/tensorflow/fusion.py), elsewhere the XLA step of hf_tpu_bf16
EXTRA_RECIPES = ("hf_tpu_no_xla", "hf_tpu_bf16", "hf_tpu_bf16_no_xla", "hf_tpu_bf16_fused")
RECIPE_FLAGS = {
    "hf_tpu": [],
    "hf_tpu_no_xla": ["--jit_compile", "false"],
    "hf_tpu_bf16": ["--bf16", "true", "--jit_compile", "true"],
    "hf_tpu_bf16_no_xla": ["--bf16", "true", "--jit_compile", "false"],
    "hf_tpu_bf16_fused": ["--bf16", "true"],
}
#: prepare-data tokenizing processes compared (1 and N)
PREPARE_PROCS = (1, 2)
#: `hf-tpu train --backend keras` (Keras 3 on JAX) fp32/bf16 and keras-hub's stock RobertaMaskedLM.fit
#: (benchmarks/keras_recipes.py), each run by the current-releases venv's Python (--keras_python)
KERAS_RECIPES = ("keras_jax", "keras_jax_bf16", "keras_hub_fit")
ALL_RECIPES = RECIPES + EXTRA_RECIPES + KERAS_RECIPES
HUB_LATENCY_SECONDS = 0.2
PUSH_EVERY_STEPS = 20
#: a round is quiet when other processes used at most this share of the machine's cores during it (on average)
QUIET_FOREIGN_CPU_SHARE = 0.1
#: a headline result needs the 1-minute load average at most this x cores before its first round
QUIET_START_LOAD = 0.3
BENCH_USER_TOKEN = "hf_bench_loopback_token_0123456789"


@dataclasses.dataclass(frozen=True)
class Preset:
    """Model, data and run sizes of one benchmark preset.

    Attributes:
        name: preset name.
        num_hidden_layers, hidden_size, num_attention_heads, intermediate_size, vocab_size: RoBERTa shapes
            (``vocab_size`` is what the BPE tokenizer is trained to; a small corpus may give fewer tokens).
        seq_length: tokens per sequence.
        global_batch_size: sequences per optimizer step over all replicas.
        cpu_devices: logical CPU devices to split the CPU into (1: no split).
        bf16: mixed bfloat16 compute.
        steps: optimizer steps per recipe run; warmup: leading steps not in the steady state.
        overhead_steps: steps of each callback-overhead run (pushes at every ``PUSH_EVERY_STEPS``).
        pipeline_batches: batches timed for the input pipeline alone.
    """

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    seq_length: int
    global_batch_size: int
    cpu_devices: int = 1
    bf16: bool = False
    steps: int = 30
    warmup: int = 5
    overhead_steps: int = 41
    pipeline_batches: int = 200

    @property
    def max_predictions(self) -> int:
        from hf_tpu_ext.data.masking import default_max_predictions

        return default_max_predictions(self.seq_length, 0.15)


PRESETS = {
    "small": Preset("small", 4, 256, 4, 1024, 8000, 128, 16),
    "multi": Preset("multi", 4, 256, 4, 1024, 8000, 128, 16, cpu_devices=4),
    "base": Preset("base", 12, 768, 12, 3072, 50265, 512, 32, bf16=True, steps=60, warmup=10, overhead_steps=81,
                   pipeline_batches=100),
}


#: copies of the shared texts in the prepare-data processes comparison (WikiText-2 valid + test, tiny-shakespeare,
#: Jargon File: 5.2 MB, ~1.8 M tokens once): a corpus big enough that --num_proc matters
PREPARE_CORPUS_COPIES = 4


def prepare_corpus_file(workdir: Path) -> Optional[Path]:
    """The text of the prepare-data processes comparison (``workdir/prepare-corpus.txt``), or None without data.

    Every ``*.txt`` under ``../shared/data``, concatenated ``PREPARE_CORPUS_COPIES`` times (~20 MB).
    """
    files = sorted(SHARED_DATA.glob("*/*.txt"))
    if not files:
        return None
    path = workdir / "prepare-corpus.txt"
    if not path.is_file():
        text = "".join(f.read_text(encoding="utf-8") for f in files)
        path.write_text(text * PREPARE_CORPUS_COPIES, encoding="utf-8")
    return path


def data_file() -> Optional[Path]:
    """WikiText-2 ``valid.txt`` next to the repository (``../shared/data``), or None: the embedded corpus."""
    path = SHARED_DATA / "wikitext-2" / "valid.txt"
    return path if path.is_file() else None



def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def setup_devices(preset: Preset) -> None:
    """Split the CPU into ``preset.cpu_devices`` logical TensorFlow devices (nothing for 1); before any op runs."""
    if preset.cpu_devices > 1:
        from hf_tpu_ext.backends.tensorflow.strategy import split_cpu

        split_cpu(preset.cpu_devices)


def train_argv(preset: Preset, workdir: Path, out: Path, steps: int, callbacks: str, extra=()) -> List[str]:
    """The ``hf-tpu train`` argv of a recipe: the preset's shapes, ``steps`` steps, no evaluation or saves, the
    tokenizer of ``workdir/prepared`` and ``--output_dir out``; ``extra`` arguments last (they win)."""
    data = data_file()
    argv = [
        "--output_dir", str(out), "--overwrite_output_dir", "true",
        "--tokenizer_name", str(workdir / "prepared" / "tokenizer"),
        "--num_hidden_layers", str(preset.num_hidden_layers), "--hidden_size", str(preset.hidden_size),
        "--num_attention_heads", str(preset.num_attention_heads), "--intermediate_size", str(preset.intermediate_size),
        "--max_seq_length", str(preset.seq_length),
        "--per_device_train_batch_size", str(preset.global_batch_size // preset.cpu_devices),
        "--max_steps", str(steps), "--logging_steps", "10", "--eval_strategy", "no", "--save_strategy", "no",
        "--disable_tqdm", "true", "--callbacks", callbacks,
    ]
    if data is not None:
        argv += ["--train_file", str(data)]
    if preset.bf16:
        argv += ["--bf16", "true"]
    return argv + list(extra)
