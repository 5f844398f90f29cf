"""The result of one preset: :func:`assemble` (the JSON: tokens/s, MFU, ratios, targets, quietness) and its
Markdown row and table, ``RESULTS.md`` and the chart.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from benchmarks.common import (ALL_RECIPES, HUB_LATENCY_SECONDS, PREPARE_PROCS, PUSH_EVERY_STEPS,
                               QUIET_FOREIGN_CPU_SHARE, QUIET_START_LOAD, RESULTS_MD, Preset, data_file)

#: what the ratios of a result should reach (``..._max``: at most)
TARGETS = {"hf_tpu_vs_plain": 1.6, "hf_tpu_vs_plain_xla": 1.0, "input_pipeline_vs_training": 5.0,
           "callback_overhead_mean_max": 0.03, "train_step_compilations": 1,
           "hf_tpu_bf16_default_vs_plain": 2.2, "bf16_default_perplexity_change_abs_max": 0.02,
           "hf_tpu_slowest_round_vs_median_max": 0.05, "prepare_data_np_vs_1": 1.8,
           "first_step_latency_hf_tpu_vs_plain_max": 1.0}
#: the fields of a recipe's job result copied into the result as they are (when present)
_PASSED_THROUGH = ("xla_step_compilations", "runs_ms_per_step", "fastest_ms_per_step", "spread_ms_per_step",
                   "runs_first_step_latency_seconds", "precision", "compiler", "runs_load", "quiet_rounds",
                   "rounds", "load", "runs_cpu_ms_per_step")


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None



def _flops(preset: Preset, parts: Dict[str, Dict[str, Any]]) -> Tuple[int, float, float]:
    """``(vocab_size, flops_per_token, flops_per_token_full_head)``: the LM head at the masked positions, or at
    every position (as the plain recipes run it)."""
    from types import SimpleNamespace

    from hf_tpu_ext.flops import flops_per_token

    vocab = (parts.get("prepare_data") or {}).get("vocab_size") or preset.vocab_size
    config = SimpleNamespace(hidden_size=preset.hidden_size, num_hidden_layers=preset.num_hidden_layers,
                             intermediate_size=preset.intermediate_size, vocab_size=vocab)
    fpt = flops_per_token(config, preset.seq_length, masked_fraction=preset.max_predictions / preset.seq_length)
    fpt_full = flops_per_token(config, preset.seq_length, masked_fraction=None)
    return vocab, fpt, fpt_full


def _recipe_entry(name: str, part: Dict[str, Any], tokens_per_step: int, fpt: float, fpt_full: float,
                  peak: Optional[float]) -> Dict[str, Any]:
    """One recipe of the result: tokens/s, ms/step, compilations, RSS, MFU (None without a peak)."""
    if "error" in part:
        return {"error": part["error"], "tokens_per_second": None, "ms_per_step": None,
                "compile_seconds": None, "train_step_compilations": None, "peak_rss_mb": None, "mfu": None}
    tps = tokens_per_step / (part["ms_per_step"] / 1e3)
    entry = {
        "tokens_per_second": round(tps, 1),
        "ms_per_step": round(part["ms_per_step"], 2),
        "ms_per_step_mean": round(part["ms_per_step_mean"], 2),
        "compile_seconds": round(part["compile_seconds"], 2),
        "train_step_compilations": part["train_step_compilations"],
        "peak_rss_mb": round(part["peak_rss_mb"], 1),
        "mfu": round(tps * fpt / peak, 4) if peak else None,
        "steps_measured": part["steps_measured"],
        "final_loss": round(part["final_loss"], 4),
    }
    if name != "hf_tpu" and peak:
        entry["mfu_executed"] = round(tps * fpt_full / peak, 4)
    for key in _PASSED_THROUGH:
        if key in part:
            entry[key] = part[key]
    for key in ("first_step_latency_seconds", "eval_loss", "perplexity"):
        if part.get(key) is not None:
            entry[key] = round(float(part[key]), 4)
    return entry


def _callback_overhead(preset: Preset, none: Dict[str, Any], push: Dict[str, Any]) -> Dict[str, Any]:
    """The callbacks' cost: the ``callbacks_push`` run's step times over the ``callbacks_none`` run's."""
    overhead = {"push_every_steps": PUSH_EVERY_STEPS, "hub_latency_ms": HUB_LATENCY_SECONDS * 1e3,
                "steps": preset.overhead_steps}
    if "error" not in none and "error" not in push and none and push:
        overhead.update(
            no_callbacks_ms_per_step=round(none["ms_per_step"], 2),
            no_callbacks_ms_per_step_mean=round(none["ms_per_step_mean"], 2),
            callbacks_push_ms_per_step=round(push["ms_per_step"], 2),
            callbacks_push_ms_per_step_mean=round(push["ms_per_step_mean"], 2),
            overhead_median=round(push["ms_per_step"] / none["ms_per_step"] - 1.0, 4),
            overhead_mean=round(push["ms_per_step_mean"] / none["ms_per_step_mean"] - 1.0, 4),
            hub_commits=push.get("hub_commits"),
            runs_no_callbacks_ms_per_step_mean=none.get("runs_ms_per_step_mean"),
            runs_callbacks_push_ms_per_step_mean=push.get("runs_ms_per_step_mean"),
        )
    else:
        overhead["error"] = (none.get("error") or push.get("error") or "not run")
    return overhead


def _bf16_default(machine: Dict[str, Any]):
    """``(recipe, plan)``: the path ``hf-tpu train --bf16 true`` takes on this machine (hf_tpu_ext/precision.py)."""
    from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags, resolve_precision

    native = bool(cpu_flags() & NATIVE_BF16_CPU_FLAGS) if machine.get("accelerator", "CPU") == "CPU" else True
    bf16_plan = resolve_precision(True, None, machine.get("accelerator", "CPU"), native, elementwise_fusion=True)
    return ("hf_tpu_bf16" if bf16_plan.jit_compile else "hf_tpu_bf16_fused"), bf16_plan


def _ratios(recipes: Dict[str, Dict[str, Any]], parts: Dict[str, Dict[str, Any]], overhead: Dict[str, Any],
            bf16_default: str) -> Dict[str, Optional[float]]:
    """The result's ratios (rounded to 4 digits; None where a side is missing)."""
    hf_tps = recipes["hf_tpu"]["tokens_per_second"]
    plain_tps = recipes["plain"]["tokens_per_second"]
    pipeline = parts.get("pipeline") or {}
    prep1, prepn = parts.get(f"prepare_data_np{PREPARE_PROCS[0]}") or {}, parts.get(f"prepare_data_np{PREPARE_PROCS[-1]}") or {}

    def ppl_change(name):
        a, b = recipes[name].get("perplexity"), recipes["hf_tpu"].get("perplexity")
        return a / b - 1.0 if a and b else None

    ratios = {
        "hf_tpu_bf16_default_vs_plain": _ratio(recipes[bf16_default]["tokens_per_second"], plain_tps),
        "hf_tpu_bf16_vs_plain": _ratio(recipes["hf_tpu_bf16"]["tokens_per_second"], plain_tps),
        "hf_tpu_bf16_no_xla_vs_plain": _ratio(recipes["hf_tpu_bf16_no_xla"]["tokens_per_second"], plain_tps),
        "bf16_default_perplexity_change": ppl_change(bf16_default),
        "hf_tpu_slowest_round_vs_median": recipes["hf_tpu"].get("spread_ms_per_step"),
        "prepare_data_np_vs_1": _ratio(prepn.get("tokens_per_second"), prep1.get("tokens_per_second")),
        "first_step_latency_hf_tpu_vs_plain": _ratio(recipes["hf_tpu"].get("first_step_latency_seconds"),
                                                     recipes["plain"].get("first_step_latency_seconds")),
        "hf_tpu_vs_plain": _ratio(hf_tps, recipes["plain"]["tokens_per_second"]),
        "hf_tpu_vs_plain_xla": _ratio(hf_tps, recipes["plain_xla"]["tokens_per_second"]),
        "hf_tpu_no_xla_vs_plain": _ratio(recipes["hf_tpu_no_xla"]["tokens_per_second"],
                                         recipes["plain"]["tokens_per_second"]),
        "hf_tpu_vs_hf_tpu_no_xla": _ratio(hf_tps, recipes["hf_tpu_no_xla"]["tokens_per_second"]),
        # issue 19's targets: keras/JAX fp32 >= 0.9x the TensorFlow backend, >= 1.8x keras-hub's stock fit
        "keras_jax_vs_hf_tpu": _ratio(recipes["keras_jax"]["tokens_per_second"], hf_tps),
        "keras_jax_vs_keras_hub_fit": _ratio(recipes["keras_jax"]["tokens_per_second"],
                                             recipes["keras_hub_fit"]["tokens_per_second"]),
        "keras_jax_bf16_vs_keras_jax": _ratio(recipes["keras_jax_bf16"]["tokens_per_second"],
                                              recipes["keras_jax"]["tokens_per_second"]),
        # issue 29: --bf16 true on the TensorFlow backend (its default bf16 path) >= 1.5x its float32
        "hf_tpu_bf16_default_vs_hf_tpu": _ratio(recipes[bf16_default]["tokens_per_second"], hf_tps),
        "input_pipeline_vs_training": _ratio(pipeline.get("tokens_per_second"), hf_tps),
        "callback_overhead_mean": overhead.get("overhead_mean"),
    }
    return {k: (round(v, 4) if v is not None else None) for k, v in ratios.items()}


def _model_fields(preset: Preset, vocab: int) -> Dict[str, Any]:
    """The ``model`` part of a result: shapes, precision, data and steps of the preset."""
    return {"num_hidden_layers": preset.num_hidden_layers, "hidden_size": preset.hidden_size,
            "num_attention_heads": preset.num_attention_heads, "intermediate_size": preset.intermediate_size,
            "vocab_size": vocab, "seq_length": preset.seq_length, "global_batch_size": preset.global_batch_size,
            "max_predictions_per_seq": preset.max_predictions, "cpu_devices": preset.cpu_devices,
            "precision": "bf16 mixed" if preset.bf16 else "float32",
            "data": f"wikitext-2 {data_file().name}" if data_file() else "embedded corpus",
            "steps": preset.steps, "warmup_steps": preset.warmup}


def assemble(preset: Preset, parts: Dict[str, Dict[str, Any]], machine: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON result: per-recipe tokens/s, ms/step, compile time, compilations, peak RSS, MFU, and the extras.

    Args:
        preset: the preset run.
        parts: job name -> what the job returned (or ``{"error": ...}``).
        machine: :func:`benchmarks.rounds.machine_description`.

    Returns:
        dict with ``preset``, ``machine``, ``model``, ``flops``, ``recipes`` (``hf_tpu``, ``plain``,
        ``plain_xla``), ``input_pipeline``, ``prepare_data``, ``callback_overhead`` and ``ratios``.
    """
    vocab, fpt, fpt_full = _flops(preset, parts)
    peak = (parts.get("probe") or {}).get("peak_flops")
    tokens_per_step = preset.global_batch_size * preset.seq_length
    recipes = {name: _recipe_entry(name, parts.get(name) or {"error": "not run"}, tokens_per_step, fpt, fpt_full, peak)
               for name in ALL_RECIPES}
    none, push = parts.get("callbacks_none") or {}, parts.get("callbacks_push") or {}
    overhead = _callback_overhead(preset, none, push)
    bf16_default, bf16_plan = _bf16_default(machine)
    ratios = _ratios(recipes, parts, overhead, bf16_default)
    machine = dict(machine, load_average_end=[round(x, 2) for x in os.getloadavg()])
    return {
        "preset": preset.name,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "model": _model_fields(preset, vocab),
        "flops": {"flops_per_token": fpt, "flops_per_token_full_head": fpt_full,
                  "formula": "hf_tpu_ext.flops.flops_per_token: 6*N_nonembedding + 12*n_layer*d*n_ctx + "
                             "6*(d^2 + d*V)*P/L (Kaplan et al. 2020 Sec. 2.1; PaLM App. B)",
                  "probe": parts.get("probe")},
        "recipes": recipes,
        "input_pipeline": parts.get("pipeline") or {},
        "prepare_data": parts.get("prepare_data"),
        "prepare_data_num_proc": {str(n): parts.get(f"prepare_data_np{n}") for n in PREPARE_PROCS},
        "bf16_default_recipe": bf16_default,
        "bf16_default_path": {"precision": bf16_plan.precision, "compiler": bf16_plan.compiler,
                              "native_bf16": bf16_plan.native_bf16, "reason": bf16_plan.reason},
        "callback_overhead": overhead,
        "ratios": ratios,
        **quietness(machine, {**recipes, "callbacks_none": none, "callbacks_push": push}),
        "targets": dict(TARGETS),
    }


def quietness(machine: Dict[str, Any], timed: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Whether a result may be a headline: ``quiet`` (the criteria, the start load and the rounds that were not
    quiet, ``{name: "k of n"}``) and ``headline`` (start load <= ``QUIET_START_LOAD`` x cores and every timed
    round quiet)."""
    cores = machine.get("cpu_cores") or os.cpu_count() or 1
    start = (machine.get("load_average_start") or [None])[0]
    start_ok = start is not None and start <= QUIET_START_LOAD * cores
    loaded = {}
    for name, part in timed.items():
        if not part or part.get("error"):
            continue
        if "rounds" in part:
            rounds, quiet = part["rounds"], part.get("quiet_rounds", 0)
        else:  # one run (no median over rounds)
            rounds, quiet = 1, int(bool((part.get("load") or {}).get("quiet")))
        if quiet < rounds:
            loaded[name] = f"{rounds - quiet} of {rounds}"
    return {"quiet": {"criteria": f"1-minute load <= {QUIET_START_LOAD} x {cores} cores before the first round; in "
                                  f"every round other processes used <= {QUIET_FOREIGN_CPU_SHARE:.0%} of the cores",
                      "start_load": start, "start_load_ok": start_ok, "loaded_rounds": loaded},
            "headline": bool(start_ok and not loaded)}


def _fmt(value, spec: str = ",.0f", missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown_table(result: Dict[str, Any]) -> str:
    """A Markdown table of the recipes of one result (for the README section)."""
    lines = ["| recipe | precision, compiler | tokens/s | ms/step (median of rounds) | rounds ms/step | slowest round "
             "| first step s | eval perplexity | train-step compilations | peak RSS MB | MFU |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for name in ALL_RECIPES:
        r = result["recipes"].get(name)
        if r is None:
            continue
        if r.get("error"):
            lines.append(f"| `{name}` | failed: {r['error'][:80]} | | | | | | | | | |")
            continue
        path = f"{r['precision']}, {r.get('compiler')}" if r.get("precision") else "n/a"
        rounds = ", ".join(f"{v:.0f}" for v in r.get("runs_ms_per_step") or [])
        lines.append(f"| `{name}` | {path} | {_fmt(r['tokens_per_second'])} | {_fmt(r['ms_per_step'], '.1f')} | "
                     f"{rounds} | {_fmt(r.get('spread_ms_per_step'), '+.1%')} | "
                     f"{_fmt(r.get('first_step_latency_seconds'), '.1f')} | {_fmt(r.get('perplexity'), ',.1f')} | "
                     f"{r['train_step_compilations']} | {_fmt(r['peak_rss_mb'], '.0f')} | {_fmt(r['mfu'], '.1%')} |")
    return "\n".join(lines)


RESULTS_HEADER = (
    "# Benchmark results\n\n"
    "One row per run of `python -m benchmarks.train_throughput --preset NAME` (newest last). tokens/s: median "
    "step time after warm-up; ratios are hf-tpu train over the plain transformers recipe; pipeline: `tf.data` "
    "tokens/s over hf-tpu training tokens/s; callbacks: mean step-time overhead of the default callbacks + async "
    "Hub push every 20 steps (200 ms per request) over no callbacks. Full numbers: `benchmarks/results/<preset>.json`.\n\n"
    "| date | preset | machine | hf_tpu tok/s | plain tok/s | plain_xla tok/s | hf/plain | hf/plain_xla | "
    "compilations | MFU hf_tpu | hf_tpu no-XLA tok/s (/plain) | pipeline x | prepare-data tok/s | callbacks overhead |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
)
RESULTS_HEADER_V2 = (
    "\n## With bf16, rounds' spread, first-step latency and prepare-data processes (from 2026-12-01)\n\n"
    "tokens/s: the median of the rounds' median step times (rounds alternate recipes); slowest round: how much "
    "the slowest round of `hf_tpu` lost against that median; bf16 default: the path `--bf16 true` takes on this "
    "machine (hf_tpu_ext/precision.py); ppl change: its eval perplexity after the same steps against fp32 "
    "`hf_tpu`; first step: process start to the first finished step, hf_tpu / plain; prepare-data: tokenization "
    "tokens/s with 1 and N processes; load: the 1-minute load average at the start and the end.\n\n"
    "| date | preset | machine; load | hf_tpu tok/s | plain tok/s | hf/plain | slowest round | bf16 XLA tok/s | "
    "bf16 TF-kernels tok/s | bf16 default /plain | bf16 ppl change | first step s (hf / plain) | prepare-data tok/s "
    "1 proc / N (x) | callbacks overhead |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|\n"
)


def results_row(result: Dict[str, Any]) -> str:
    """One ``RESULTS.md`` row of a result (the table under :data:`RESULTS_HEADER_V2`)."""
    m, r, q = result["machine"], result["recipes"], result["ratios"]
    load_end = (m.get("load_average_end") or [None])[0]
    machine = (f"{m['cpu']}, {m['cpu_cores']} cores, {m['memory_gb']} GB; load {m['load_average_start'][0]:.1f}"
               + (f"-{load_end:.1f}" if load_end is not None else "")
               + (f"; {result['flops']['probe']['device_kind']}" if (result["flops"].get("probe") or {}).get(
                   "device_kind", "CPU") != "CPU" else "")
               + ("; quiet" if result.get("headline") else "; **not quiet: not a headline** ("
                  + (", ".join(f"{k} {v} rounds loaded" for k, v in (result.get("quiet") or {}).get("loaded_rounds", {}).items())
                     or "busy at the start") + ")"))
    procs = result.get("prepare_data_num_proc") or {}
    p1, pn = (procs.get(str(PREPARE_PROCS[0])) or {}), (procs.get(str(PREPARE_PROCS[-1])) or {})
    hf, plain = r["hf_tpu"], r["plain"]
    return (f"| {result['date']} | {result['preset']} | {machine} | {_fmt(hf['tokens_per_second'])} | "
            f"{_fmt(plain['tokens_per_second'])} | {_x(q['hf_tpu_vs_plain'])} | "
            f"{_fmt(q.get('hf_tpu_slowest_round_vs_median'), '+.1%')} | "
            f"{_fmt((r.get('hf_tpu_bf16') or {}).get('tokens_per_second'))} | "
            f"{_fmt((r.get('hf_tpu_bf16_no_xla') or {}).get('tokens_per_second'))} | "
            f"{_x(q.get('hf_tpu_bf16_default_vs_plain'))} | {_fmt(q.get('bf16_default_perplexity_change'), '+.2%')} | "
            f"{_fmt(hf.get('first_step_latency_seconds'), '.1f')} / {_fmt(plain.get('first_step_latency_seconds'), '.1f')} | "
            f"{_fmt(p1.get('tokens_per_second'))} / {_fmt(pn.get('tokens_per_second'))} "
            f"({_x(q.get('prepare_data_np_vs_1'))}) | {_fmt(q['callback_overhead_mean'], '+.1%')} |\n")


def append_results_row(result: Dict[str, Any], path: Path = RESULTS_MD) -> None:
    """Append :func:`results_row` to ``RESULTS.md`` (created with its headers when missing)."""
    if not path.is_file():
        path.write_text(RESULTS_HEADER)
    text = path.read_text()
    with path.open("a") as f:
        if RESULTS_HEADER_V2.strip().splitlines()[0] not in text:
            f.write(RESULTS_HEADER_V2)
        f.write(results_row(result))


def draw_chart(result: Dict[str, Any], path: Path) -> None:
    """A bar chart PNG of tokens/s per recipe (and what the input pipeline alone delivers, as a line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ALL_RECIPES if (result["recipes"].get(n) or {}).get("tokens_per_second")]
    values = [result["recipes"][n]["tokens_per_second"] for n in names]
    labels = {"hf_tpu": "hf-tpu train", "plain": "plain recipe", "plain_xla": "plain + jit_compile",
              "hf_tpu_no_xla": "hf-tpu train\n--jit_compile false", "hf_tpu_bf16": "hf-tpu train\n--bf16 (XLA)",
              "hf_tpu_bf16_no_xla": "hf-tpu train\n--bf16 (TF kernels)",
              "hf_tpu_bf16_fused": "hf-tpu train\n--bf16 (TF kernels,\nfused)", "keras_jax": "--backend keras\n(JAX)",
              "keras_jax_bf16": "--backend keras\n(JAX) --bf16", "keras_hub_fit": "keras-hub\nRobertaMaskedLM.fit"}
    fig, ax = plt.subplots(figsize=(9.6, 4.4), dpi=120)
    colors = {"hf_tpu": "#ff9d00", "plain": "#7f7f7f", "plain_xla": "#4c72b0", "hf_tpu_no_xla": "#ffc266",
              "hf_tpu_bf16": "#d62728", "hf_tpu_bf16_no_xla": "#ff9896", "hf_tpu_bf16_fused": "#e377c2",
              "keras_jax": "#2ca02c",
              "keras_jax_bf16": "#98df8a", "keras_hub_fit": "#9467bd"}
    bars = ax.bar([labels[n] for n in names], values, color=[colors[n] for n in names])
    for bar, value, name in zip(bars, values, names):
        mfu = result["recipes"][name].get("mfu")
        text = f"{value:,.0f}" + (f"\nMFU {mfu:.1%}" if mfu is not None else "")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("tokens / s (median step, after warm-up)")
    model = result["model"]
    ax.set_title(f"preset {result['preset']}: {model['num_hidden_layers']}x{model['hidden_size']}, seq "
                 f"{model['seq_length']}, batch {model['global_batch_size']}, {model['precision']}", fontsize=10)
    ax.set_ylim(0, max(values or [1]) * 1.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
