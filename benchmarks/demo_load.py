"""Load benchmark of the fill-mask test bench: probe-set throughput, and single sentences while a probe set runs.

Launches the app (``spaces_demo/app.py``) in a process of its own on 127.0.0.1 (or uses ``--url`` of a running
one) and, through
``gradio_client``:

1. scores a ``--probe_lines`` (default 1,000) probe set alone on ``/probe``: probe throughput in lines/s;
2. sends ``--requests`` (default 32) single-sentence ``/fill_mask`` requests at once, alone: latency p50/p95;
3. starts the same probe set again and, while it runs, the same 32 concurrent single requests: their p50/p95
   under load, and how many finished before the probe set did (single requests have their own queue, so they
   should not wait for it).

Every request must come back ``ok``; the script fails (exit 1) otherwise. Figures are printed (and written as
JSON with ``--json_out``), never asserted on.

The model: ``--model DIR_OR_REPO``, or ``--small_preset`` to build the "small" preset of ``hf-tpu train``
(hidden 256, 4 layers, 4 heads, an 8,000-token byte-level BPE vocabulary, 128 positions; randomly
initialized, which costs the same compute as trained weights) in a temporary folder. Probe lines are cut
from the embedded default corpus (a mid-sentence word that is one vocabulary token, masked).

Usage (from the repository root):
    python -m benchmarks.demo_load --small_preset [--probe_lines 1000] [--requests 32] [--concurrency_limit 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

TEXTS = [
    "the <mask> sat on the mat .",
    "paris is the <mask> of france .",
    "i like to drink <mask> in the morning .",
    "the <mask> is hot and the <mask> is cold .",
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(model: str, backend: Optional[str], concurrency_limit: int, timeout: float = 300.0):
    """``python spaces_demo/app.py`` on a free port in a subprocess; returns ``(process, url)`` once it answers."""
    import subprocess
    import urllib.request

    port = _free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "spaces_demo", "app.py"), "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--concurrency_limit", str(concurrency_limit)] + (["--backend", backend] if backend else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"the app did not answer within {timeout:.0f} s")


def percentile(values: List[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` with linear interpolation (numpy's default)."""
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def build_small_preset(folder: str, vocab_size: int = 8000, max_seq_length: int = 128) -> str:
    """A randomly initialized model folder of ``hf-tpu train``'s default "small" shape (see module docstring)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.model_types import record_for

    os.makedirs(folder, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(default_corpus_texts(), vocab_size=vocab_size, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(folder)
    tok = RobertaTokenizerFast(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"),
                               model_max_length=max_seq_length)
    tok.save_pretrained(folder)
    config = RobertaConfig(vocab_size=len(tok), max_position_embeddings=max_seq_length + 2, type_vocab_size=1,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           **record_for("roberta").small_preset)
    RobertaForMaskedLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def corpus_probe_lines(tokenizer, n: int, max_tokens: int = 40) -> List[str]:
    """``n`` lines ``"<10 corpus words, one masked> ⇒ <word>"`` whose answer is one ``Ġword`` token."""
    from hf_tpu_ext.data.corpus import default_corpus_texts

    vocab = tokenizer.get_vocab()
    lines: List[str] = []
    for text in default_corpus_texts():
        words = text.split()
        for start in range(0, max(0, len(words) - 10), 5):
            window = words[start:start + 10]
            for j in range(2, len(window)):
                w = window[j]
                if w.isascii() and w.isalpha() and "\u0120" + w in vocab:
                    sentence = " ".join(window[:j] + ["<mask>"] + window[j + 1:])
                    if sentence.startswith("#") or "=>" in sentence or "\u21d2" in sentence or "|" in sentence:
                        break  # a comment, an arrow or a template separator inside would change the probe
                    if len(tokenizer(sentence.replace("<mask>", tokenizer.mask_token))["input_ids"]) <= max_tokens:
                        lines.append(f"{sentence} \u21d2 {w}")
                    break
            if len(lines) == n:
                return lines
    raise SystemExit(f"the default corpus gave only {len(lines)} probe lines for this tokenizer")


def run_load(url: str, requests: int, top_k: int, client=None) -> dict:
    """Fire ``requests`` concurrent ``/fill_mask`` calls (one thread each) at ``url``.

    Returns:
        ``{"latencies_s": [...], "done_at": [perf_counter times], "wall_s": float, "failures": [str, ...]}``.
    """
    from gradio_client import Client

    client = client or Client(url, verbose=False)
    warm = client.predict(TEXTS[0], top_k, api_name="/fill_mask")
    if not warm.get("ok"):
        raise SystemExit(f"warm-up request failed: {warm.get('message')}")

    def one(i: int):
        text = TEXTS[i % len(TEXTS)]
        start = time.perf_counter()
        try:
            result = client.predict(text, top_k, api_name="/fill_mask")
        except Exception as err:  # counted as a failure, reported below
            return time.perf_counter() - start, time.perf_counter(), f"request {i}: {type(err).__name__}: {err}"
        end = time.perf_counter()
        if not result.get("ok") or len(result.get("masks", [])) != text.count("<mask>"):
            return end - start, end, f"request {i}: {result.get('message')!r}"
        if any(len(ranked) != top_k for ranked in result["masks"]):
            return end - start, end, f"request {i}: expected {top_k} candidates per mask"
        return end - start, end, None

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=requests) as pool:
        outcomes = list(pool.map(one, range(requests)))
    return {"latencies_s": [o[0] for o in outcomes], "done_at": [o[1] for o in outcomes],
            "wall_s": time.perf_counter() - start, "failures": [o[2] for o in outcomes if o[2]]}


def run_probe(client, text: str) -> dict:
    """One ``/probe`` call; returns its result plus ``wall_s`` and ``done_at`` (perf_counter)."""
    start = time.perf_counter()
    result = client.predict(text, api_name="/probe")
    end = time.perf_counter()
    if not result.get("ok"):
        raise SystemExit(f"probe set failed: {result.get('message')}")
    return dict(result, wall_s=end - start, started_at=start, done_at=end)


def _latency_summary(lat: List[float]) -> dict:
    lat = sorted(lat)
    return {"p50_ms": percentile(lat, 50) * 1000, "p95_ms": percentile(lat, 95) * 1000, "max_ms": lat[-1] * 1000,
            "mean_ms": statistics.fmean(lat) * 1000}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark; returns 0 when every request succeeded, else 1."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo_load", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="Model folder or repo id to launch the app with.")
    parser.add_argument("--small_preset", action="store_true", help="Build and use the small preset model (random init).")
    parser.add_argument("--url", default=None, help="Benchmark an already running app (needs --model for the probe lines' tokenizer).")
    parser.add_argument("--requests", type=int, default=32, help="Concurrent single-sentence requests (one thread each).")
    parser.add_argument("--probe_lines", type=int, default=1000, help="Lines of the probe set.")
    parser.add_argument("--top_k", type=int, default=5)
    parser.add_argument("--concurrency_limit", type=int, default=4, help="Single-sentence batches run at once (launched app).")
    parser.add_argument("--backend", default=None, choices=("auto", "torch", "tensorflow"))
    parser.add_argument("--json_out", default=None, help="Also write the figures to this JSON file.")
    args = parser.parse_args(argv)
    if not (args.model or args.small_preset):
        parser.error("give --model DIR (or --small_preset)")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gradio_client import Client
    from transformers import AutoTokenizer

    model = args.model or build_small_preset(tempfile.mkdtemp(prefix="small-preset-"))
    lines = corpus_probe_lines(AutoTokenizer.from_pretrained(model), args.probe_lines)
    probe_text = "\n".join(lines)

    server, url = None, args.url
    if url is None:  # the app in its own process, as deployed: client threads do not share its GIL
        server, url = _start_server(model, args.backend, args.concurrency_limit)
    try:
        client = Client(url, verbose=False)
        alone = run_probe(client, probe_text)
        singles_alone = run_load(url, args.requests, args.top_k, client)

        holder: dict = {}
        worker = threading.Thread(target=lambda: holder.update(probe=run_probe(Client(url, verbose=False), probe_text)))
        worker.start()
        time.sleep(0.3)  # the probe set is queued and running before the single requests arrive
        under = run_load(url, args.requests, args.top_k, client)
        worker.join()
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)

    loaded_probe = holder["probe"]
    before_probe_done = sum(t < loaded_probe["done_at"] for t in under["done_at"])
    row = alone["rows"][0]
    figures = {
        "model": "small preset (random init)" if args.small_preset and not args.model else model,
        "concurrency_limit": args.concurrency_limit,
        "cpu_threads": os.cpu_count(),
        "probe_lines": alone["n"],
        "probe_alone": {"wall_s": alone["wall_s"], "lines_per_s": alone["n"] / alone["wall_s"],
                        "server_s": row["seconds"], "server_lines_per_s": row["lines_per_second"]},
        "probe_under_load": {"wall_s": loaded_probe["wall_s"], "lines_per_s": loaded_probe["n"] / loaded_probe["wall_s"]},
        "singles_alone": dict(_latency_summary(singles_alone["latencies_s"]), requests=args.requests,
                              wall_s=singles_alone["wall_s"]),
        "singles_under_probe": dict(_latency_summary(under["latencies_s"]), requests=args.requests,
                                    wall_s=under["wall_s"], finished_before_probe=before_probe_done),
        "failures": singles_alone["failures"] + under["failures"],
    }
    print(f"fill-mask test bench load: model {figures['model']}, {figures['cpu_threads']} CPU threads")
    print(f"  probe set {alone['n']} lines alone:        {alone['wall_s']:6.2f} s  "
          f"{figures['probe_alone']['lines_per_s']:8.1f} lines/s (server side {row['lines_per_second']:.1f})")
    s = figures["singles_alone"]
    print(f"  {args.requests} single requests alone:       p50 {s['p50_ms']:7.1f} ms  p95 {s['p95_ms']:7.1f} ms  "
          f"max {s['max_ms']:7.1f} ms")
    u = figures["singles_under_probe"]
    print(f"  {args.requests} single requests + probe set: p50 {u['p50_ms']:7.1f} ms  p95 {u['p95_ms']:7.1f} ms  "
          f"max {u['max_ms']:7.1f} ms; {before_probe_done}/{args.requests} done before the probe set")
    print(f"  probe set under that load:        {loaded_probe['wall_s']:6.2f} s  "
          f"{figures['probe_under_load']['lines_per_s']:8.1f} lines/s")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    for failure in figures["failures"]:
        print(f"  FAILED {failure}", file=sys.stderr)
    assert not figures["failures"], f"{len(figures['failures'])} requests failed"
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as err:
        print(f"demo_load: {err}", file=sys.stderr)
        sys.exit(1)
