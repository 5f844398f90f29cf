"""Continue pre-training a BERT-base-sized model with ``hf-tpu train`` (issue 42): the child's peak RSS, its first
step (tracing + compilation) and its steady step time.

A temporary folder gets ``BertConfig()``'s model (bert-base-uncased's config: 12 layers, hidden 768, 30,522
tokens; random weights, seed 0, ``model.safetensors``) and a WordPiece tokenizer trained by the project
(:func:`hf_tpu_ext.data.tokenizer.train_wordpiece_tokenizer`) on the embedded corpus to at most the config's
``vocab_size`` (the run refuses a tokenizer with more tokens than embedding rows). The folder is made in its own
child process, so the parent stays small: a child started from a large parent would report the parent's RSS as
its own peak (Linux keeps the pre-``exec`` high-water mark in ``ru_maxrss``). Then each round runs
``python -m hf_tpu_ext train --model_name_or_path <folder> --max_steps N --max_seq_length 128
--per_device_train_batch_size 8 --save_strategy no --eval_strategy no`` as a child (WikiText-2 ``valid.txt``
when ``../shared/data`` has it, else the run's embedded corpus) and reads:

* ``peak_rss_mb``: the child's ``ru_maxrss`` from ``os.wait4`` (MB; its own children count as their maximum);
* ``first_step_seconds``: ``all_results.json``'s ``first_step_seconds`` (the first device call, compilation
  included);
* ``step_seconds``: tokens per step (``tokens_seen / global_step``) over ``steady_tokens_per_second`` (the run's
  median training step after the first); ``xla_step_compile_seconds`` beside them.

Usage (from the repository root; the default backend is Keras 3 on JAX, so the current-releases venv):
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.continue_base            # the issue's figure, 20 steps
    python -m benchmarks.continue_base --steps 3 \\
        --config_overrides "hidden_size=64,num_hidden_layers=2,num_attention_heads=2,intermediate_size=128"  # tiny
    python -m benchmarks.continue_base --rounds 3 --alternate \\
        --variant 'jax=' --variant 'tf=--backend tensorflow'

A variant is ``name=<extra hf-tpu train arguments>`` (last, so they win). Rounds run variant by variant (A1 A2
B1 B2), or with ``--alternate`` round by round (A1 B1 A2 B2). Prints one JSON line per child and a summary with
the per-variant lists and medians, the machine (CPU model, cores, memory) and the load, and the CPU's vector and
bf16 flags from /proc/cpuinfo. Take the figure alone on the machine (``quiet`` in each line says whether others
used more than 10% of the cores during that round).

Raises:
    SystemExit: a child failed (its output's tail on stderr) or its outputs lack the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

from benchmarks.common import REPO_ROOT, data_file

#: /proc/cpuinfo flags the summary reports (what the step's dots can run on)
CPU_FLAGS_REPORTED = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
#: the figures read from the run's all_results.json, as the summary lists them
FIGURES = ("peak_rss_mb", "first_step_seconds", "step_seconds", "xla_step_compile_seconds")


def make_model_folder(folder: str, overrides: str, seq_length: int) -> Dict[str, Any]:
    """Write a random-weight BERT masked LM (``BertConfig()`` updated by ``overrides``, seed 0) and a WordPiece
    tokenizer of at most its ``vocab_size`` tokens to ``folder``; returns its shapes, parameters and tokens.

    Raises:
        ValueError: an override names no ``BertConfig`` field or has a value of the wrong type.
    """
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_wordpiece_tokenizer

    config = BertConfig()
    if overrides:
        config.update_from_string(overrides)
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer = train_wordpiece_tokenizer(default_corpus_texts(), config.vocab_size, max(seq_length, 512))
    tokenizer.save_pretrained(folder)
    return {"num_parameters": sum(p.numel() for p in model.parameters()), "tokenizer_tokens": len(tokenizer),
            **{k: getattr(config, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                               "num_attention_heads", "intermediate_size")}}


def train_argv(folder: str, out: str, args: argparse.Namespace, extra: List[str]) -> List[str]:
    """The ``hf-tpu train`` command of one round: no evaluation, no periodic saves; ``extra`` last (it wins)."""
    data = Path(args.train_file) if args.train_file else data_file()
    argv = [sys.executable, "-m", "hf_tpu_ext", "train", "--model_name_or_path", folder, "--output_dir", out,
            "--overwrite_output_dir", "true", "--max_steps", str(args.steps), "--max_seq_length", str(args.seq),
            "--per_device_train_batch_size", str(args.batch), "--save_strategy", "no", "--eval_strategy", "no",
            "--logging_steps", "10", "--disable_tqdm", "true"]
    return argv + (["--train_file", str(data)] if data is not None else []) + extra


def run_child(argv: List[str], log_path: str) -> Tuple[int, float]:
    """Run ``argv`` with its output in ``log_path``; its exit status and peak RSS in MB (``wait4``'s
    ``ru_maxrss``, KiB on Linux)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return proc.returncode, usage.ru_maxrss / 1024.0


def _fail(what: str, log_path: str) -> None:
    sys.stderr.write(Path(log_path).read_text(encoding="utf-8", errors="replace")[-3000:])
    raise SystemExit(what)


def make_folder_in_child(folder: str, args: argparse.Namespace, log_path: str) -> Dict[str, Any]:
    """:func:`make_model_folder` in a child process (the parent keeps no model in memory)."""
    argv = [sys.executable, "-m", "benchmarks.continue_base", "--make_folder", folder, "--seq", str(args.seq),
            "--config_overrides", args.config_overrides]
    status, _ = run_child(argv, log_path)
    lines = [x for x in Path(log_path).read_text(encoding="utf-8").splitlines() if x.startswith("FOLDER ")]
    if status != 0 or not lines:
        _fail(f"making the model folder failed (exit {status})", log_path)
    return json.loads(lines[-1][len("FOLDER "):])


def one_round(folder: str, workdir: str, args: argparse.Namespace, extra: List[str]) -> Dict[str, Any]:
    """One child run: its peak RSS, first-step and steady step seconds, steps, tokens per step and loss."""
    from benchmarks.rounds import RoundLoad

    out, log_path = os.path.join(workdir, "out"), os.path.join(workdir, "train.log")
    load = RoundLoad()
    status, peak_mb = run_child(train_argv(folder, out, args, extra), log_path)
    if status != 0:
        _fail(f"hf-tpu train failed (exit {status})", log_path)
    with open(os.path.join(out, "all_results.json"), encoding="utf-8") as f:
        results = json.load(f)
    steps, rate = int(results.get("global_step") or 0), results.get("steady_tokens_per_second")
    if steps <= 1 or not rate or results.get("first_step_seconds") is None:
        _fail(f"all_results.json has no steady step time (global_step {steps}): run at least 2 steps", log_path)
    tokens_per_step = int(results["tokens_seen"]) // steps
    shutil.rmtree(out, ignore_errors=True)
    return {"peak_rss_mb": round(peak_mb, 1), "first_step_seconds": round(float(results["first_step_seconds"]), 3),
            "step_seconds": round(tokens_per_step / float(rate), 4),
            "xla_step_compile_seconds": results.get("xla_step_compile_seconds"), "steps": steps,
            "tokens_per_step": tokens_per_step, "train_loss": results.get("train_loss"), **load.finish()}


def rounds_order(variants: List[Tuple[str, List[str]]], rounds: int, alternate: bool) -> List[Tuple[int, str, List[str]]]:
    """``(round, name, extra)`` in run order: variant by variant, or round by round with ``alternate``."""
    if alternate:
        return [(r + 1, name, extra) for r in range(rounds) for name, extra in variants]
    return [(r + 1, name, extra) for name, extra in variants for r in range(rounds)]


def summarize(rows: List[Dict[str, Any]], model: Dict[str, Any], machine: Dict[str, Any]) -> Dict[str, Any]:
    """Per variant the figures' lists (run order) and medians; the model, ``machine`` (taken before the first
    child), the load at the end and the CPU flags."""
    from hf_tpu_ext.precision import cpu_flags

    summary: Dict[str, Any] = {"model": model, "machine": machine,
                               "load_average_end": [round(x, 2) for x in os.getloadavg()],
                               "cpu_flags": sorted(cpu_flags() & set(CPU_FLAGS_REPORTED)),
                               "all_rounds_quiet": all(r["quiet"] for r in rows)}
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        summary[name] = {key: [r[key] for r in mine] for key in FIGURES}
        summary[name].update({"median_" + key: statistics.median(r[key] for r in mine) for key in FIGURES
                              if all(r[key] is not None for r in mine)})
    return summary


def _versions(*packages: str) -> Dict[str, str]:
    """The installed versions of ``packages`` (a missing one is left out)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in packages:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run (>= 2: the first compiles)")
    parser.add_argument("--seq", type=int, default=128, help="--max_seq_length (tokens)")
    parser.add_argument("--batch", type=int, default=8, help="--per_device_train_batch_size (sequences)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--alternate", action="store_true", help="run round by round (A1 B1 A2 B2)")
    parser.add_argument("--variant", action="append", default=[],
                        help="name=<extra hf-tpu train arguments> (repeatable; default: one variant 'base=')")
    parser.add_argument("--config_overrides", default="",
                        help="BertConfig fields to change, e.g. 'hidden_size=64,num_hidden_layers=2' (tiny runs)")
    parser.add_argument("--train_file", default=None,
                        help="text to train on (default: ../shared/data WikiText-2 valid.txt, else the embedded corpus)")
    parser.add_argument("--make_folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.rounds < 1 or args.seq < 1 or args.batch < 1:
        parser.error("--steps must be >= 2 (the first step compiles), --rounds, --seq and --batch >= 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.make_folder:
        print("FOLDER " + json.dumps(make_model_folder(args.make_folder, args.config_overrides, args.seq)), flush=True)
        return
    variants = []
    for text in args.variant or ["base="]:
        name, _, extra = text.partition("=")
        variants.append((name, shlex.split(extra)))
    from benchmarks.rounds import machine_description

    machine = machine_description()  # the load before any child ran
    machine["versions"].update(_versions("keras", "jax", "torch"))
    workdir = tempfile.mkdtemp(prefix="continue-base-")
    try:
        folder = os.path.join(workdir, "bert-base-random")
        model = make_folder_in_child(folder, args, os.path.join(workdir, "make.log"))
        rows = []
        for rnd, name, extra in rounds_order(variants, args.rounds, args.alternate):
            row = {"variant": name, "round": rnd, **one_round(folder, workdir, args, extra)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        print(json.dumps(summarize(rows, model, machine), indent=1))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
