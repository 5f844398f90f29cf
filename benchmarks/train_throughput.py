"""Training throughput, MFU and overheads of ``hf-tpu train`` against the recipes users would otherwise run.

One invocation runs, one after the other, on the same model config, data, sequence length and global batch:

1. ``hf_tpu``: ``hf-tpu train`` through its library entry point (:func:`hf_tpu_ext.run.train`), default
   callbacks (``throughput,xla_recompile_guard``) on;
2. ``plain``: the recipe of transformers' docs/``run_mlm``: ``datasets.map`` tokenization, ``group_texts``,
   ``DataCollatorForLanguageModeling`` + ``model.prepare_tf_dataset``, ``TFAutoModelForMaskedLM.from_config``,
   ``compile(optimizer=create_optimizer(...))``, ``model.fit``;
3. ``plain_xla``: the same with ``compile(..., jit_compile=True)``;

plus the ``tf.data`` input pipeline alone, ``hf-tpu prepare-data`` and the step-time overhead of the callbacks
(all defaults + an async Hub push every 20 steps to a loopback Hub answering each request after 200 ms, against
no callbacks; the loopback Hub's request threads run at nice 19, see :func:`benchmarks.rounds.loopback_hub`).
Every part runs in its own Python process (``--job``), so each gets a fresh TensorFlow and its own peak RSS.

Step times are host wall times from one ``on_train_batch_begin`` to the next
(:class:`benchmarks.step_timer.StepTimer`); steady state = the steps after ``warmup`` steps. Each recipe and
callback run is repeated ``--repeats`` times (default 3), round-robin, and the fastest run counts (median
step for the recipes, mean step for the callback runs, whose save points are periodic costs); every run's
figure is kept in the JSON (``runs_ms_per_step``). The callback runs both write the trainer's checkpoint every
20 steps, so their difference is the callbacks' cost alone.

MFU = tokens/s x FLOPs per token / peak FLOP/s. FLOPs per token: :func:`hf_tpu_ext.flops.flops_per_token`
(Kaplan et al. 2020, Sec. 2.1: ``6 N`` per token for ``N`` non-embedding parameters, plus PaLM's
``12 n_layer d n_ctx`` attention term, Chowdhery et al. 2022, App. B), with the LM head counted at the
``max_predictions_per_seq`` masked positions the loss needs, for every recipe (so MFU compares useful work;
``mfu_executed`` counts the plain recipes' head at every position, as they run it). The peak is the hardware's,
the same one ``hf-tpu train`` logs (:func:`hf_tpu_ext.flops.device_peak`: a TPU/GPU datasheet value times the
accelerators, or the CPU formula cores x clock x FLOP/cycle); the XLA matmul rate the ``probe`` job measures is
recorded beside it (``achievable_matmul_flops``) but never divides MFU: it moves with the machine's load.

Quiet rounds: every child process (a round of one recipe) records the 1- and 5-minute load average at its start
and end and the CPU time other processes used meanwhile (``/proc/stat`` busy time minus this benchmark's own
children: the load average also counts the benchmark's previous round). A round is quiet when those others used
at most :data:`QUIET_FOREIGN_CPU_SHARE` of the cores; a result is a headline (``"headline": true``, README and
RESULTS.md figures) only when the 1-minute load was at most :data:`QUIET_START_LOAD` x cores before the first
round and every timed round was quiet. Run it alone on the machine.

Usage (from the repository root; results go to ``benchmarks/results/`` and ``benchmarks/RESULTS.md``):
    python -m benchmarks.train_throughput --preset small     # CPU, a few minutes on 2 cores
    python -m benchmarks.train_throughput --preset multi     # the CPU as 4 logical devices
    python -m benchmarks.train_throughput --preset base      # roberta-base shapes, seq 512, bf16 (GPU/TPU)

Layout: :mod:`benchmarks.common` (presets, recipe names, paths, the ``hf-tpu train`` argv), :mod:`benchmarks.jobs`
(each part, run in a child process), :mod:`benchmarks.rounds` (the child processes, their load, the median over
rounds), :mod:`benchmarks.report` (the JSON result, RESULTS.md, the chart), :mod:`benchmarks.keras_recipes` (the
Keras 3 recipes, run by the current-releases environment); this module is the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from benchmarks.common import (ALL_RECIPES, BENCH_USER_TOKEN, EXTRA_RECIPES, HUB_LATENCY_SECONDS, KERAS_RECIPES,
                               PREPARE_CORPUS_COPIES, PREPARE_PROCS, PRESETS, PUSH_EVERY_STEPS,
                               QUIET_FOREIGN_CPU_SHARE, QUIET_START_LOAD, RECIPE_FLAGS, RECIPES, REPO_ROOT,
                               RESULTS_DIR, RESULTS_MD, SHARED_DATA, Preset, data_file, prepare_corpus_file)
from benchmarks.jobs import job_hf_tpu, job_pipeline, job_plain, job_prepare_data, job_probe, run_job
from benchmarks.report import (RESULTS_HEADER, RESULTS_HEADER_V2, TARGETS, append_results_row, assemble, draw_chart,
                               markdown_table, quietness, results_row)
from benchmarks.rounds import (RoundLoad, child, keras_python, loopback_hub, machine_description, median_run,
                               round_load_fields, run_parts)

# what tests and scripts read as ``benchmarks.train_throughput.<name>`` since before the split
__all__ = ["ALL_RECIPES", "BENCH_USER_TOKEN", "EXTRA_RECIPES", "HUB_LATENCY_SECONDS", "KERAS_RECIPES",
           "PREPARE_CORPUS_COPIES", "PREPARE_PROCS", "PRESETS", "PUSH_EVERY_STEPS", "QUIET_FOREIGN_CPU_SHARE",
           "QUIET_START_LOAD", "RECIPE_FLAGS", "RECIPES", "REPO_ROOT", "RESULTS_DIR", "RESULTS_HEADER",
           "RESULTS_HEADER_V2", "RESULTS_MD", "SHARED_DATA", "TARGETS", "Preset", "RoundLoad", "append_results_row",
           "assemble", "child", "data_file", "draw_chart", "job_hf_tpu", "job_pipeline", "job_plain",
           "job_prepare_data", "job_probe", "keras_python", "loopback_hub", "machine_description", "main",
           "markdown_table", "median_run", "prepare_corpus_file", "quietness", "results_row", "round_load_fields",
           "run_job", "run_parts"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--skip", default="", help="comma-separated parts not to run (e.g. callbacks_push,plain_xla)")
    parser.add_argument("--results_dir", default=str(RESULTS_DIR), help="where <preset>.json and the chart go")
    parser.add_argument("--no_results_md", action="store_true", help="do not append a row to benchmarks/RESULTS.md")
    parser.add_argument("--steps", type=int, help="optimizer steps per recipe run (default: the preset's)")
    parser.add_argument("--global_batch_size", type=int,
                        help="sequences per optimizer step (default: the preset's; issue 29's table used 32)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each recipe and callback run, round-robin; the median counts (default 3)")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    return parser


def _write_result(result: Dict[str, Any], preset: Preset, args: argparse.Namespace) -> None:
    """``<results_dir>/<preset>.json``, the chart, the RESULTS.md row (unless ``--no_results_md``) and the summary
    on stdout."""
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    json_path = results_dir / f"{preset.name}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    draw_chart(result, results_dir / f"{preset.name}_tokens_per_second.png")
    if not args.no_results_md:
        append_results_row(result)
    print(markdown_table(result))
    if not result["headline"]:
        print(f"[bench] NOT a headline result: the machine was not quiet ({json.dumps(result['quiet'])}); "
              "README.md and RESULTS.md quote quiet runs only", flush=True)
    print("ratios:", json.dumps(result["ratios"]))
    print(f"[bench] wrote {json_path} in {result['wall_seconds']:.0f}s")


def main(argv: Optional[List[str]] = None) -> int:
    """Run a preset (or, with ``--job``, one part of it in this process). Returns the exit status."""
    args = _parser().parse_args(argv)
    preset = PRESETS[args.preset]
    if args.steps:
        preset = dataclasses.replace(preset, steps=args.steps)
    if args.global_batch_size:
        preset = dataclasses.replace(preset, global_batch_size=args.global_batch_size)

    if args.job:  # child: one part, result as JSON in the workdir
        workdir = Path(args.workdir)
        result = run_job(args.job, preset, workdir)
        (workdir / f"{args.job}.json").write_text(json.dumps(result, indent=1))
        return 0

    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    machine = machine_description()
    start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix=f"hf-tpu-bench-{preset.name}-"))
    try:
        parts = run_parts(preset, skip, args.repeats, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if parts is None:
        return 1

    result = assemble(preset, parts, machine)
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    _write_result(result, preset, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
