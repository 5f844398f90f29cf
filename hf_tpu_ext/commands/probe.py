"""``hf-tpu probe``: score a cloze probe set (top-1/top-5 accuracy, MRR, answer log-likelihood, each with a 95%
interval) on a model folder or Hub revisions, and compare consecutive revisions with paired tests (Holm-corrected
over the comparisons; fewer than 30 facts: no difference called real).

The scoring is the Gradio test bench's (``spaces_demo/app.py``, ``/probe``) and the training run's
(``--probe_file``): :mod:`hf_tpu_ext.probes` (multi-token answers scored left to right), with the intervals
and tests of :mod:`hf_tpu_ext.fill_mask.report`. Lines that cannot be scored (malformed, too long, a multi-token
answer without distractors) are listed on stderr and skipped; ``--strict`` makes them an error (for CI).
Revisions that name one commit (``main`` and its sha) are scored once.

Examples:
    hf-tpu probe output/ probes.txt
    hf-tpu probe alice/tiny-roberta@main probes.jsonl --json
    hf-tpu probe alice/tiny-roberta@0a1b2c3,main probes.csv
"""

from __future__ import annotations

import argparse
import json
import os
from typing import List, Optional, Tuple

from hf_tpu_ext.errors import ArgumentError, DataError, MissingExtraError
from hf_tpu_ext.extras import missing_for, no_framework_message, require_extra
from hf_tpu_ext.hub.model_ref import check_model_ref

# hf_tpu_ext.probes and hf_tpu_ext.fill_mask: imported inside the functions that use them, so numpy stays out of
# `hf-tpu probe --help` (+0.15 s measured)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hf-tpu probe``."""
    parser = argparse.ArgumentParser(
        prog="hf-tpu probe",
        description="Score cloze probes ('The capital of France is <mask>. => Paris' lines, CSV or JSONL) on a model: "
                    "top-1/top-5 accuracy and mean reciprocal rank.")
    parser.add_argument("model", help="Model folder, or Hub repo id with optional revisions: user/name[@rev[,rev...]].")
    parser.add_argument("probe_file", help="Probe file: .txt lines 'sentence with <mask> => answer', .csv or .jsonl.")
    parser.add_argument("--revision", default=None, help="Branch, tag or commit (instead of @rev).")
    parser.add_argument("--backend", default=None, choices=("auto", "torch", "tensorflow"),
                        help="Forward pass: torch when installed (auto), else TensorFlow.")
    parser.add_argument("--batch_size", type=int, default=64, help="Probes per forward pass.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object per revision instead of a table.")
    parser.add_argument("--ranks", action="store_true",
                        help="With --json: include the answer's rank and log-probability per probe.")
    parser.add_argument("--strict", action="store_true",
                        help="Fail when a line is malformed (no mask, no arrow) or a probe cannot be scored (too "
                             "long, characters the vocabulary lacks, a multi-token answer without distractors) "
                             "instead of skipping and listing it.")
    return parser


def split_model_ref(ref: str) -> Tuple[str, List[Optional[str]]]:
    """``"user/name@a,b"`` -> ``("user/name", ["a", "b"])``; a local folder or no ``@`` -> ``(ref, [None])``."""
    if os.path.isdir(ref) or "@" not in ref:
        return ref, [None]
    model, _, revs = ref.rpartition("@")
    return model, [r.strip() for r in revs.split(",") if r.strip()] or [None]


def _check_model(model: str, revisions: List[Optional[str]]) -> None:
    """A model folder with config.json, or a repo (and revisions) that exists: answered in seconds."""
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ArgumentError(f"{model} has no config.json: give the output_dir of `hf-tpu train` or a Hub repo id.")
        return
    for rev in revisions:
        check_model_ref(model, "MODEL", revision=rev)


def _check_frameworks(backend: Optional[str]) -> None:
    """The framework of ``--backend`` (or, for auto, PyTorch or TensorFlow) is installed; checked without importing it.

    Raises:
        MissingExtraError: names the pip extra to install.
    """
    if backend == "torch":
        require_extra("torch", "hf-tpu probe --backend torch", ("torch",))
    elif backend == "tensorflow":
        require_extra("tensorflow", "hf-tpu probe --backend tensorflow", ("tensorflow",))
    elif missing_for("torch", ("torch",)) and missing_for("tensorflow", ("tensorflow",)):
        raise MissingExtraError(no_framework_message("hf-tpu probe"))


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``hf-tpu probe``; prints one line (or JSON object) per revision.

    Returns:
        0.

    Raises:
        DataError: the probe file is missing, not UTF-8 or has no probe; with ``--strict``, a malformed line or a
            probe this tokenizer cannot score (without it, only when none can be).
        ArgumentError: a bad model reference or batch size, or a model/revision that cannot be loaded.
        HubRepoError, HubAuthError: the repo or a revision does not exist or cannot be reached (named at once).
        MissingExtraError: neither PyTorch nor TensorFlow (or not the ``--backend`` one) is installed.
    """
    import sys

    args = build_parser().parse_args(argv)
    _check_frameworks(args.backend)
    from hf_tpu_ext import probes

    if args.batch_size < 1:
        raise ArgumentError(f"--batch_size must be >= 1, got {args.batch_size}.")
    try:
        probe_list = probes.read_probe_file(args.probe_file, strict=args.strict)  # before any model download
    except probes.ProbeError as err:
        raise DataError(str(err)) from None
    model, revisions = split_model_ref(args.model)
    if args.revision:
        revisions = [args.revision]
    _check_model(model, revisions)

    from hf_tpu_ext.fill_mask import report

    results, labels, commits = [], [], {}
    for rev in revisions:
        where = f"{model}@{rev}" if rev else model
        sha = _commit_of(model, rev)
        if sha is not None and sha in commits:  # e.g. main and its commit: one commit, scored and listed once
            print(f"hf-tpu probe: {where} is the same commit as {commits[sha]} ({sha[:7]}): scored once.",
                  file=sys.stderr)
            continue
        commits[sha or where] = where
        result = _score(model, rev, where, probe_list, args, list_skipped=not results)
        results.append(result)
        labels.append(where)
        _print_result(model, rev, where, result, args)
    if not args.json:
        for comparison in report.compare_all(results, labels):
            print(comparison["summary"])
    return 0


def _commit_of(model: str, rev: Optional[str]) -> Optional[str]:
    """The commit sha a Hub revision names (``HfApi.model_info``), or ``None`` (a folder, offline, not found)."""
    if rev is None or os.path.isdir(model):
        return None
    try:
        from huggingface_hub import HfApi

        return HfApi().model_info(model, revision=rev).sha
    except Exception:  # a failed lookup only means duplicates are not recognised; loading says what is wrong
        return None


def _score(model: str, rev: Optional[str], where: str, probe_list, args, list_skipped: bool):
    """One revision's :class:`~hf_tpu_ext.probes.ProbeResult`; with ``list_skipped`` the skipped lines on stderr
    (the same lines for every revision of one tokenizer: the first lists them).

    Raises:
        ArgumentError: the revision cannot be loaded. DataError: with ``--strict``, an unscorable probe.
    """
    import sys

    from hf_tpu_ext import probes
    from hf_tpu_ext.fill_mask import FillMaskPredictor

    try:
        predictor = FillMaskPredictor(model, backend=args.backend, revision=rev)
    except (OSError, ValueError, ImportError) as err:
        raise ArgumentError(f"Cannot load {where}: {err}") from None
    try:
        result = predictor.score_probes(probe_list, batch_size=args.batch_size, strict=args.strict)
    except probes.ProbeError as err:
        raise DataError(f"{os.path.basename(args.probe_file)}: {err}") from None
    total = len(probe_list) + len(getattr(probe_list, "malformed", []))
    if result.skipped and list_skipped:
        print(f"hf-tpu probe: skipped {len(result.skipped)} of {total} probes that cannot be scored "
              "(--strict makes this an error):", file=sys.stderr)
        for line, template, reason in result.skipped:
            print(f"  line {line}" + (f" (template {template + 1})" if template else "") + f": {reason}",
                  file=sys.stderr)
    return result


def _print_result(model: str, rev: Optional[str], where: str, result, args) -> None:
    """One JSON object (``--json``) or one table line (and the template spread) for a revision."""
    from hf_tpu_ext.fill_mask import report

    full = report.revision_report(result)
    if args.json:
        extra = {"ranks": result.ranks, "logprobs": result.logprobs} if args.ranks else {}
        print(json.dumps({"model": model, "revision": rev, **full, **extra}))
        return
    ci = full["intervals"]
    figures = " ".join(f"{k}={full[k]:.4f} [{ci[k][0]:.4f}, {ci[k][1]:.4f}]" for k in ("top1", "top5", "mrr"))
    print(f"{where}: probes={result.n} {figures} loglik/char={result.loglik_per_char:.4f} "
          f"({result.n / max(result.seconds, 1e-9):.0f} probes/s)")
    spread = full["templates"]
    if spread:
        print(f"  {spread['templates']} templates: spread (max - min) top1={spread['spread']['top1']:.4f} "
              f"mrr={spread['spread']['mrr']:.4f}")
