"""Gradio fill-mask test bench for a RoBERTa-style masked language model and its pushed revisions: the page.

This file is both the local demo (``hf-tpu demo``) and the ``app.py`` of the Hub Space that
``hf-tpu deploy-space`` creates. It is the UI only: the predictor, the model cache, the revision listing and
the probe scoring with error bars are :mod:`hf_tpu_ext.fill_mask` (framework-free at import), whose files
``hf-tpu deploy-space`` uploads next to this one (``hf_tpu_ext/...``), so the Space needs only its
``requirements.txt`` (``transformers``, ``gradio``, ``numpy``, ``huggingface_hub``, ``torch``).

Which model is shown (first match wins): the ``model`` argument of :func:`build_demo` / ``--model``, the
``MODEL_ID`` environment variable, the first line of ``model_id.txt`` next to this file (written by
``hf-tpu deploy-space``). For a Hub repo the page lists its branches and the commits that hold a model
(``HfApi.list_repo_refs`` / ``list_repo_commits`` / ``list_repo_files`` through ``HF_ENDPOINT``; re-listed
on every page load, so new pushes show up without a restart; the repo's initial commit and card-only commits
are not offered, and a note under the revision pickers says why), labelled with the commit titles the push
callback writes ("Training in progress, step 200", "End of training").

API (``gradio_client``; only the first argument of each endpoint is required)::

    from gradio_client import Client
    c = Client("http://127.0.0.1:7860/")
    c.predict("The <mask> sat.", api_name="/fill_mask")                       # top_k=5, targets="", revision=""
    c.predict("The <mask> sat.", 3, "", "main", "0a1b2c3", api_name="/compare")  # two revisions side by side
    c.predict("Paris is the <mask> of France. => Paris | Lyon", "main,0a1b2c3", api_name="/probe")
    c.predict(api_name="/revisions")

Concurrency: single-sentence requests (``/fill_mask``, ``/compare`` and the page's Fill button) share one
queue (``concurrency_id="fill_mask"``) and are batched: Gradio hands up to 16 queued requests to one call
(``batch=True``), and that call runs them as **one forward pass** per model revision, padded to the longest
sentence. Probe sets have their own queue (one at a time, 64 rows per forward pass), so a probe set never
holds up single sentences. PyTorch runs one intra-op thread per request (``FILL_MASK_TORCH_THREADS``,
default 1): the parallel requests use the cores instead.

Quiet by default: no Gradio analytics (``GRADIO_ANALYTICS_ENABLED=False`` unless set), no download bars,
deprecation notices or per-request warnings unless ``--log_level info`` (see
:func:`hf_tpu_ext.fill_mask.quiet.quiet_libraries`).
"""

from __future__ import annotations

import argparse
import functools
import html
import os
import sys
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.isdir(os.path.join(_HERE, "hf_tpu_ext")) and _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # the Space: the package files `hf-tpu deploy-space` uploaded next to this file
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported (in build_demo)

from hf_tpu_ext.fill_mask import DEFAULT_TOP_K, FillMaskBench, FillMaskPredictor, parse_top_k  # noqa: E402
from hf_tpu_ext.fill_mask.predictor import BACKEND_ENV, BACKENDS, other_mask_spelling, select_backend  # noqa: E402
from hf_tpu_ext.fill_mask.bench import CACHE_ENV, REVISION_ENV  # noqa: E402
from hf_tpu_ext.fill_mask.quiet import LOG_LEVELS, ignore_request_warnings, quiet_libraries  # noqa: E402

__all__ = ["FillMaskBench", "FillMaskPredictor", "build_demo", "default_model_id", "main", "parse_top_k",
           "select_backend"]

MODEL_ENV = "MODEL_ID"
THREADS_ENV = "FILL_MASK_TORCH_THREADS"
MODEL_ID_FILE = "model_id.txt"
DEFAULT_CONCURRENCY_LIMIT = 4
MAX_BATCH_SIZE = 16  # queued single sentences run together in one forward pass


def model_id_from_environment() -> Optional[str]:
    """The ``MODEL_ID`` environment variable (a Space variable), stripped; ``None`` when unset or blank (its one
    reader: ``hf-tpu demo`` asks here too)."""
    return os.environ.get(MODEL_ENV, "").strip() or None


def default_model_id() -> Optional[str]:
    """The model to show when none is passed: ``MODEL_ID`` env var, else ``model_id.txt`` next to this file.

    Returns:
        The model folder or Hub repo id, or ``None`` when neither is set.
    """
    env = model_id_from_environment()
    if env:
        return env
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), MODEL_ID_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            first = f.readline().strip()
        return first or None
    return None


# ------------------------------------------------------------------------------------------------ page

RESULT_HEADERS = ["mask", "rank", "token", "vocab entry", "id", "score"]
PROBE_HEADERS = ["revision", "step", "probes", "top-1 [95% CI]", "top-5 [95% CI]", "MRR [95% CI]",
                 "log-lik/char [95% CI]", "lines/s"]
METRICS = (("top1", "top-1"), ("top5", "top-5"), ("mrr", "MRR"))


def _with_interval(value: float, interval: Sequence[float], digits: int = 3) -> str:
    lo, hi = interval
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def result_rows(result: Dict[str, Any]) -> List[list]:
    """Table rows ``[mask #, rank, token text (quoted), vocab entry, id, score rounded to 4]`` of a result."""
    rows = []
    for m, ranked in enumerate(result.get("masks") or [], start=1):
        for c in ranked:
            rows.append([m, c["rank"], repr(c["token_str"]), c["raw_token"], c["token"], round(c["score"], 4)])
    return rows


def probe_rows(result: Dict[str, Any]) -> List[list]:
    """Table rows of a probe result (:data:`PROBE_HEADERS`): each figure as ``"0.450 [0.310, 0.600]"``,
    the value and its 95% interval (Wilson for accuracies, bootstrap for MRR and log-likelihood)."""
    rows = []
    for r in result.get("rows") or []:
        ci = r["intervals"]
        rows.append([r["label"], r["step"] if r["step"] is not None else "", r["n"],
                     *(_with_interval(r[k], ci[k]) for k, _ in METRICS),
                     _with_interval(r["loglik_per_char"], ci["loglik_per_char"]), r["lines_per_second"]])
    return rows


def probe_notes(result: Dict[str, Any]) -> str:
    """Markdown under the table: spread across templates per revision, and the paired comparisons."""
    lines = []
    for r in result.get("rows") or []:
        t = r.get("templates")
        if t:
            per = ", ".join(f"#{x['template']} {x['top1']:.3f}/{x['mrr']:.3f}" for x in t["per_template"])
            lines.append(f"- **{html.escape(r['label'])}**: {t['templates']} templates, top-1/MRR per template {per}; "
                         f"spread (max - min) top-1 {t['spread']['top1']:.3f}, MRR {t['spread']['mrr']:.3f}")
    for c in result.get("comparisons") or []:
        lines.append(f"- {html.escape(c['summary'])}")
    return "\n".join(lines)


def probe_frame(result: Dict[str, Any]):
    """Long-format ``pandas.DataFrame`` (``step``, ``score``, ``low``, ``high``, ``metric``) of a probe result.

    Revisions without a known step are placed by their order instead (x = 0, 1, ...); ``low``/``high`` are the
    95% interval.
    """
    import pandas as pd

    rows = sorted(result.get("rows") or [], key=lambda r: (r["step"] is None, r["step"] or 0))
    records = []
    for i, r in enumerate(rows):
        x = r["step"] if r["step"] is not None else i
        for key, name in METRICS:
            lo, hi = r["intervals"][key]
            records.append({"step": x, "score": r[key], "low": lo, "high": hi, "metric": name})
    frame = pd.DataFrame(records, columns=["step", "score", "low", "high", "metric"])
    return frame.astype({"step": "float64", "score": "float64", "low": "float64", "high": "float64",
                         "metric": "object"})


def probe_chart(result: Dict[str, Any]):
    """A matplotlib figure: top-1, top-5 and MRR (y, 0 to 1) with 95% error bars against the training step."""
    import matplotlib

    matplotlib.use("Agg")  # no display in a Space
    from matplotlib.figure import Figure

    frame = probe_frame(result)
    fig = Figure(figsize=(9, 3.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for metric, group in frame.groupby("metric", sort=False):
        # a percentile interval need not contain the mean: matplotlib refuses negative error bars
        yerr = [(group["score"] - group["low"]).clip(lower=0), (group["high"] - group["score"]).clip(lower=0)]
        ax.errorbar(group["step"], group["score"], yerr=yerr, marker="o", capsize=3, label=metric)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel("score (95% interval)")
    ax.set_title("Probe scores across revisions")
    ax.grid(alpha=0.3)
    if len(frame):
        ax.legend(loc="lower right")
    return fig


def _choices(listing: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return [(r["label"], r["value"]) for r in listing if r.get("loadable", True)]


def _not_offered_note(listing: List[Dict[str, Any]]) -> str:
    skipped = [r for r in listing if not r.get("loadable", True)]
    if not skipped:
        return ""
    return "Not offered (no model at that revision): " + "; ".join(
        f"{html.escape(r['label'])} ({html.escape(str(r['reason']))})" for r in skipped)


def _batched(fn, many):
    """A Gradio ``batch=True`` function for ``fn`` (one request): the queued requests go to ``many`` in one call.

    Args:
        fn: the one-request function; its signature (``functools.wraps``) is what Gradio shows the API client.
        many: ``list of argument tuples -> list of results`` (one forward pass per model revision).
    """

    @functools.wraps(fn)
    def wrapper(*columns):
        return (many(list(zip(*columns))),)

    return wrapper


def build_demo(model_id_or_path: Optional[str] = None, *, backend: Optional[str] = None,
               revision: Optional[str] = None, concurrency_limit: int = DEFAULT_CONCURRENCY_LIMIT,
               predictor: Optional[FillMaskPredictor] = None, cache_size: Optional[int] = None,
               torch_threads: Optional[int] = None):
    """Build the Gradio app (queued, not launched).

    Args:
        model_id_or_path: model folder or Hub repo id; ``None`` uses :func:`default_model_id`.
        backend: ``"torch"``, ``"tensorflow"`` or ``"auto"``/``None`` (see :func:`select_backend`).
        revision: default branch, tag or commit of a Hub repo.
        concurrency_limit: single-sentence batches run at the same time (probe sets: one at a time, in
            their own queue).
        predictor: an already loaded :class:`FillMaskPredictor` of the default revision.
        cache_size: models kept loaded (default ``$MODEL_CACHE_SIZE`` or 4).
        torch_threads: PyTorch intra-op threads of the process (default ``$FILL_MASK_TORCH_THREADS`` or 1: the
            server's parallel requests use the cores; 0 leaves torch's default).

    Returns:
        A ``gr.Blocks`` with the endpoints ``/fill_mask``, ``/compare``, ``/probe``, ``/revisions`` (see the
        module docstring); ``demo.bench`` is its :class:`~hf_tpu_ext.fill_mask.FillMaskBench`,
        ``demo.predictor`` the default revision's predictor.

    Raises:
        ValueError: no model given and none configured, or an unknown backend.
        OSError: the model cannot be loaded.
    """
    import gradio as gr

    ignore_request_warnings()  # however the app is launched: no two-line warning per request
    _set_torch_threads(backend, torch_threads)
    if predictor is not None:
        model_id_or_path = model_id_or_path or predictor.model_id
    model_id_or_path = model_id_or_path or default_model_id()
    if not model_id_or_path:
        raise ValueError(f"No model: pass a model folder or repo id, or set the {MODEL_ENV} environment variable.")
    bench = FillMaskBench(model_id_or_path, backend=backend, revision=revision, cache_size=cache_size,
                          predictor=predictor)
    listing = bench.revisions()
    choices = _choices(listing)
    shown = {"a": choices, "b": [("(none)", "")] + choices}  # what the page was built with / last updated to
    api, page = _api_functions(bench), _page_functions(bench, shown)
    with gr.Blocks(title=f"Fill-mask: {bench.model}") as demo:
        picks = _revision_pickers(bench, listing, choices)
        with gr.Tabs():
            with gr.Tab("Fill mask"):
                fill = _fill_tab(bench.default.mask_token)
            with gr.Tab("Probe set"):
                probe = _probe_tab(bench.default.mask_token, choices)
        _wire_page(demo, page, picks, fill, probe, concurrency_limit)
        fill_group = dict(concurrency_id="fill_mask", concurrency_limit=concurrency_limit)
        gr.api(_batched(api.fill_mask, api.fill_mask_batch), api_name="fill_mask", batch=True,
               max_batch_size=MAX_BATCH_SIZE, **fill_group)
        gr.api(api.compare, api_name="compare", **fill_group)
        gr.api(api.probe, api_name="probe", concurrency_id="probe", concurrency_limit=1)
        gr.api(api.revisions, api_name="revisions", concurrency_id="hub", concurrency_limit=4)
    demo.queue(default_concurrency_limit=concurrency_limit)
    demo.bench = bench
    demo.predictor = bench.default
    return demo


def _set_torch_threads(backend: Optional[str], torch_threads: Optional[int]) -> None:
    """PyTorch's intra-op threads for the process (see :func:`build_demo`)."""
    threads = torch_threads if torch_threads is not None else int(os.environ.get(THREADS_ENV) or 1)
    if threads > 0 and select_backend(backend) == "torch":
        import torch

        # Requests run in parallel threads (batches, the probe queue); intra-op threads on top of them
        # oversubscribe the cores, and OpenMP's spinning then made a probe set 5-10x slower on 2 cores.
        torch.set_num_threads(threads)


def _api_functions(bench: FillMaskBench) -> SimpleNamespace:
    """The API endpoints' functions (typed: gradio derives the client's parameters and defaults from them)."""

    def fill_mask(text: str, top_k: Union[int, str] = DEFAULT_TOP_K, targets: str = "", revision: str = "") -> dict:
        """Fill the masks of `text` with one revision of the model (default: the configured one)."""
        return bench.fill_mask_many([(text, top_k, targets, "", revision)])[0]

    def compare(text: str, top_k: Union[int, str] = DEFAULT_TOP_K, targets: str = "", revision_a: str = "",
                revision_b: str = "", model_b: str = "") -> dict:
        """The same sentence answered by two revisions (or by a revision of another repo, `model_b`)."""
        a, b = bench.fill_mask_many([(text, top_k, targets, "", revision_a),
                                     (text, top_k, targets, model_b, revision_b)])
        return {"a": a, "b": b}

    def fill_mask_batch(requests):
        return bench.fill_mask_many([(text, k, targets, "", rev) for text, k, targets, rev in requests])

    def probe(probes_text: str, revisions: str = "", model: str = "", strict: bool = False) -> dict:
        """Top-1/top-5 accuracy, MRR and answer log-likelihood, with 95% intervals, of a probe set on
        comma-separated revisions; each revision compared with the one before it (paired tests, Holm-corrected).
        Malformed and unscorable lines are skipped and listed (`strict`: they fail the revision instead)."""
        return bench.probe(probes_text, revisions, model, strict=bool(strict))

    def revisions(model: str = "") -> list:
        """The model repo's branches and commits, newest first, one entry per commit; `loadable` false (with
        `reason`) where there is no model."""
        try:
            return bench.revisions(bench.check_model(model), refresh=True)
        except ValueError as err:
            return [{"error": str(err)}]

    return SimpleNamespace(fill_mask=fill_mask, compare=compare, fill_mask_batch=fill_mask_batch, probe=probe,
                           revisions=revisions)


def _page_functions(bench: FillMaskBench, shown: Dict[str, Any]) -> SimpleNamespace:
    """The page's event functions; ``shown`` holds the revision choices the widgets show now."""
    import gradio as gr

    def ui_fill(text, top_k, targets, rev_a, model_b, rev_b):
        return ui_fill_batch([(text, top_k, targets, rev_a, model_b, rev_b)])[0]

    def ui_fill_batch(requests):
        """Every queued page request (A, and B when picked) in one ``fill_mask_many``: one forward pass per revision."""
        reqs, slots = [], []
        for text, top_k, targets, rev_a, model_b, rev_b in requests:
            slots.append(len(reqs))
            reqs.append((text, top_k, targets, "", rev_a or ""))
            if rev_b or (model_b or "").strip():
                reqs.append((text, top_k, targets, model_b or "", rev_b or ""))
        answers = bench.fill_mask_many(reqs)
        ends = slots[1:] + [len(reqs)]
        return [{"a": answers[s], "b": answers[s + 1] if e - s > 1 else None} for s, e in zip(slots, ends)]

    def render(raw):
        raw = raw or {}
        return (*_render_one(raw.get("a")), *_render_one(raw.get("b")))

    def ui_probe(text, picked, rev_a, rev_b):
        chosen = list(picked or []) or [r for r in (rev_a, rev_b) if r is not None]
        result = bench.probe(text, chosen or [""])
        status = ("" if result["ok"] else "**Note:** ") + html.escape(result["message"])
        return probe_rows(result), probe_chart(result), status, probe_notes(result), result

    def read_upload(path):
        if not path:
            return gr.update()
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            return f.read()

    def refresh(model_b, rev_a, rev_b):
        listing = bench.revisions(refresh=True)
        choices = _choices(listing)
        values = [v for _, v in choices]
        try:
            listing_b = bench.revisions(bench.check_model(model_b), refresh=True) if (model_b or "").strip() else listing
        except ValueError:
            listing_b = []
        choices_b = [("(none)", "")] + _choices(listing_b)
        a = rev_a if rev_a in values else bench.default_value()
        b = rev_b if rev_b in [v for _, v in choices_b] else ""
        if choices == shown["a"] and choices_b == shown["b"] and a == rev_a and b == rev_b:
            return gr.update(), gr.update(), gr.update(), gr.update()  # nothing new: leave the widgets alone
        shown.update(a=choices, b=choices_b)
        return (gr.update(choices=choices, value=a), gr.update(choices=choices_b, value=b),
                gr.update(choices=choices, value=[]), _not_offered_note(listing))

    return SimpleNamespace(ui_fill=ui_fill, ui_fill_batch=ui_fill_batch, render=render, ui_probe=ui_probe,
                           read_upload=read_upload, refresh=refresh)


def _render_one(result):
    """``(table rows, filled sentence, Markdown title + status)`` of one revision's answer."""
    if not result:
        return [], "", "Pick a revision B to compare."
    status = ("" if result.get("ok") else "**Note:** ") + html.escape(str(result.get("message", "")))
    rev = result.get("revision") or {}
    title = f"**{html.escape(str(rev.get('label') or result.get('model') or ''))}**"
    return result_rows(result), result.get("filled") or "", title + "\n\n" + status


def _revision_pickers(bench: FillMaskBench, listing, choices) -> SimpleNamespace:
    """The page's header: title, revision A/B pickers, model B, refresh button, the not-offered note."""
    import gradio as gr

    where = "local folder" if bench.local else "Hub repo"
    mask = bench.default.mask_token  # the model's own, named once; the other spelling is read as it too
    other = other_mask_spelling(mask)
    gr.Markdown(
        f"# Fill-mask test bench\nModel: `{bench.model}` ({where}, {bench.default.backend}). Pick one or two "
        f"revisions, type a sentence with `{mask}` (or `{other}`) where a word is missing, or "
        "score a probe set on several revisions. Several masks are predicted independently in one forward pass.")
    with gr.Row():
        rev_a = gr.Dropdown(label="Revision A", choices=choices, value=bench.default_value(), elem_id="revision-a",
                            scale=3)
        rev_b = gr.Dropdown(label="Revision B (optional)", choices=[("(none)", "")] + choices, value="",
                            elem_id="revision-b", scale=3)
        model_b = gr.Textbox(label="Model B (optional: another repo id)", value="", elem_id="model-b", scale=2)
        refresh_btn = gr.Button("Refresh revisions", scale=1)
    note = gr.Markdown(_not_offered_note(listing), elem_id="revisions-note")
    return SimpleNamespace(rev_a=rev_a, rev_b=rev_b, model_b=model_b, refresh_btn=refresh_btn, note=note)


def _fill_tab(mask: str) -> SimpleNamespace:
    """The Fill mask tab's widgets (inside ``gr.Tab``)."""
    import gradio as gr

    with gr.Row():
        with gr.Column(scale=3):
            text = gr.Textbox(label="Sentence", lines=2, placeholder=f"Paris is the {mask} of France.")
            targets = gr.Textbox(label="Targets (optional, comma-separated candidate words)", value="",
                                 placeholder="capital, city")
        with gr.Column(scale=1):
            top_k = gr.Textbox(label="top_k", value=str(DEFAULT_TOP_K))
            submit = gr.Button("Fill", variant="primary")
    with gr.Row():
        with gr.Column():
            message_a = gr.Markdown(elem_id="fill-mask-message")
            filled_a = gr.Textbox(label="Filled with the best guesses", interactive=False, elem_id="fill-mask-filled")
            table_a = gr.Dataframe(headers=RESULT_HEADERS, label="Ranked candidates (A)", interactive=False,
                                   elem_id="fill-mask-table")
        with gr.Column():
            message_b = gr.Markdown(elem_id="fill-mask-message-b")
            filled_b = gr.Textbox(label="Filled by B", interactive=False, elem_id="fill-mask-filled-b")
            table_b = gr.Dataframe(headers=RESULT_HEADERS, label="Ranked candidates (B)", interactive=False,
                                   elem_id="fill-mask-table-b")
    with gr.Accordion("JSON (what the /compare API returns)", open=False):
        raw = gr.JSON(label="result")
    gr.Examples(
        examples=[[f"Paris is the {mask} of France.", str(DEFAULT_TOP_K), ""],
                  [f"The {mask} sat on the {mask}.", "3", ""],
                  [f"I like to drink {mask} in the morning.", "5", "coffee, tea, water"]],
        inputs=[text, top_k, targets], cache_examples=False)
    return SimpleNamespace(text=text, targets=targets, top_k=top_k, submit=submit, raw=raw,
                           outputs=[table_a, filled_a, message_a, table_b, filled_b, message_b])


def _probe_tab(mask: str, choices) -> SimpleNamespace:
    """The Probe set tab's widgets (inside ``gr.Tab``)."""
    import gradio as gr

    with gr.Row():
        text = gr.Textbox(label=f"Probes, one per line: sentence with {mask} \u21d2 answer; templates 'a {mask} | b "
                                f"{mask}', distractors '\u21d2 answer | other' (or CSV text,answer / JSONL)", lines=8,
                          elem_id="probe-text", scale=3,
                          placeholder=f"The capital of France is {mask}. | France's capital is {mask}. \u21d2 Paris "
                                      "| Lyon")
        upload = gr.File(label="Or upload a probe file (.txt, .csv, .jsonl)", type="filepath",
                         file_types=[".txt", ".csv", ".tsv", ".jsonl", ".json"], scale=1)
    revisions = gr.CheckboxGroup(label="Revisions to score (none ticked: revisions A and B)", choices=choices,
                                 value=[], elem_id="probe-revisions")
    score_btn = gr.Button("Score probe set", variant="primary")
    message = gr.Markdown(elem_id="probe-message")
    table = gr.Dataframe(headers=PROBE_HEADERS, label="Scores per revision", interactive=False, elem_id="probe-table")
    notes = gr.Markdown(elem_id="probe-compare")
    plot = gr.Plot(label="Probe scores across revisions", elem_id="probe-plot")
    raw = gr.JSON(visible=False)
    return SimpleNamespace(text=text, upload=upload, revisions=revisions, score_btn=score_btn,
                           outputs=[table, plot, message, notes, raw])


def _wire_page(demo, page: SimpleNamespace, picks: SimpleNamespace, fill: SimpleNamespace, probe: SimpleNamespace,
               concurrency_limit: int) -> None:
    """The page's events (all private: the API is the ``gr.api`` endpoints)."""
    import gradio as gr

    gr.on(triggers=[fill.submit.click, fill.text.submit], fn=_batched(page.ui_fill, page.ui_fill_batch),
          inputs=[fill.text, fill.top_k, fill.targets, picks.rev_a, picks.model_b, picks.rev_b], outputs=fill.raw,
          batch=True, max_batch_size=MAX_BATCH_SIZE, api_visibility="private", concurrency_id="fill_mask",
          concurrency_limit=concurrency_limit
          ).then(page.render, inputs=fill.raw, outputs=fill.outputs, api_visibility="private", queue=False)
    probe.score_btn.click(page.ui_probe, inputs=[probe.text, probe.revisions, picks.rev_a, picks.rev_b],
                          outputs=probe.outputs, api_visibility="private", concurrency_id="probe", concurrency_limit=1)
    probe.upload.upload(page.read_upload, inputs=probe.upload, outputs=probe.text, api_visibility="private",
                        queue=False)
    hub = dict(inputs=[picks.model_b, picks.rev_a, picks.rev_b],
               outputs=[picks.rev_a, picks.rev_b, probe.revisions, picks.note], api_visibility="private",
               concurrency_id="hub", concurrency_limit=4)
    for trigger in (picks.refresh_btn.click, picks.model_b.submit, demo.load):
        trigger(page.refresh, **hub)


def launch(demo, host: Optional[str] = None, port: Optional[int] = None, share: bool = False,
           share_hint: str = "--share", **kwargs) -> None:
    """``demo.launch`` without Gradio's own start-up lines, which name ``launch()``'s arguments
    (``set share=True in launch()``); prints the URL and, without a public link, the flag that makes one.

    Args:
        demo: from :func:`build_demo`.
        host, port: where to listen (``None``: Gradio's defaults / ``GRADIO_SERVER_NAME``, ``GRADIO_SERVER_PORT``).
        share: create a public gradio.live link.
        share_hint: how the caller's command line asks for one, e.g. ``"--share"`` or ``"--share yes"``.
        **kwargs: passed to ``demo.launch``.

    Returns without blocking (``prevent_thread_lock``); ``demo.block_thread()`` serves until Ctrl-C.
    """
    demo.launch(server_name=host, server_port=port, share=share, quiet=True, prevent_thread_lock=True, **kwargs)
    print(f"Fill-mask test bench running on {demo.local_url}", flush=True)
    if share and getattr(demo, "share_url", None):
        print(f"Public link: {demo.share_url}", flush=True)
    elif not share:
        print(f"For a public link, pass {share_hint}.", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Launch the demo. ``python app.py [--model M] [--revision R] [--host H] [--port P] [--backend B] [--share]
    [--log_level L]``.

    Host and port default to gradio's own defaults (``GRADIO_SERVER_NAME``/``GRADIO_SERVER_PORT``, else
    127.0.0.1:7860), which is what a Hub Space sets.

    Returns:
        0 after the server stops.
    """
    parser = argparse.ArgumentParser(description="Gradio fill-mask test bench.")
    parser.add_argument("--model", default=None, help=f"Model folder or Hub repo id (default: ${MODEL_ENV} or {MODEL_ID_FILE}).")
    parser.add_argument("--host", default=None, help="Address to listen on (default: gradio's, 127.0.0.1).")
    parser.add_argument("--port", type=int, default=None, help="Port (default: gradio's, 7860).")
    parser.add_argument("--backend", default=None, choices=BACKENDS, help=f"Forward pass (default: ${BACKEND_ENV} or auto).")
    parser.add_argument("--revision", default=None, help=f"Default branch, tag or commit (default: ${REVISION_ENV} or main).")
    parser.add_argument("--concurrency_limit", type=int, default=DEFAULT_CONCURRENCY_LIMIT)
    parser.add_argument("--cache_size", type=int, default=None, help=f"Models kept loaded (default: ${CACHE_ENV} or 4).")
    parser.add_argument("--share", action="store_true", help="Create a public gradio.live link.")
    parser.add_argument("--log_level", default="warning", choices=LOG_LEVELS,
                        help="info or debug shows download bars and library notices (default: warning).")
    args = parser.parse_args(argv)
    quiet_libraries(args.log_level)
    demo = build_demo(args.model, backend=args.backend, revision=args.revision, concurrency_limit=args.concurrency_limit,
                      cache_size=args.cache_size)
    launch(demo, args.host, args.port, args.share, share_hint="--share")
    demo.block_thread()
    return 0


if __name__ == "__main__":
    sys.exit(main())
