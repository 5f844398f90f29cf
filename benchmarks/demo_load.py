"""Load benchmark of the fill-mask demo: concurrent ``gradio_client`` requests against ``/fill_mask``.

Launches the demo in this process on 127.0.0.1 (or uses ``--url`` of a running one), sends one warm-up
request, then fires ``--requests`` (default 32) requests from as many threads at once through one
``gradio_client.Client``. Every request must come back ``ok``; the script fails (exit 1) otherwise.
Latency percentiles and throughput are printed, never asserted on.

Usage (from the repository root):
    python -m benchmarks.demo_load --model OUTPUT_DIR [--requests 32] [--concurrency_limit 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
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


def percentile(values: List[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` with linear interpolation (numpy's default)."""
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def run_load(url: str, requests: int, top_k: int) -> dict:
    """Fire ``requests`` concurrent ``/fill_mask`` calls at ``url``.

    Args:
        url: the demo's base URL.
        requests: number of requests, all sent at once from that many threads.
        top_k: candidates per mask asked for.

    Returns:
        ``{"latencies_s": [...], "wall_s": float, "failures": [str, ...]}`` (latencies in seconds).
    """
    from gradio_client import Client

    client = Client(url, verbose=False)
    warm = client.predict(TEXTS[0], top_k, "", api_name="/fill_mask")
    if not warm.get("ok"):
        raise SystemExit(f"warm-up request failed: {warm.get('message')}")

    def one(i: int):
        text = TEXTS[i % len(TEXTS)]
        start = time.perf_counter()
        try:
            result = client.predict(text, top_k, "", api_name="/fill_mask")
        except Exception as err:  # counted as a failure, reported below
            return time.perf_counter() - start, f"request {i}: {type(err).__name__}: {err}"
        elapsed = time.perf_counter() - start
        expected_masks = text.count("<mask>")
        if not result.get("ok") or len(result.get("masks", [])) != expected_masks:
            return elapsed, f"request {i}: {result.get('message')!r}"
        if any(len(ranked) != top_k for ranked in result["masks"]):
            return elapsed, f"request {i}: expected {top_k} candidates per mask"
        return elapsed, None

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=requests) as pool:
        outcomes = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    return {"latencies_s": [o[0] for o in outcomes], "wall_s": wall, "failures": [o[1] for o in outcomes if o[1]]}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark; returns 0 when every request succeeded, else 1."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo_load", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="Model folder or repo id to launch the demo with.")
    parser.add_argument("--url", default=None, help="Benchmark an already running demo instead of launching one.")
    parser.add_argument("--requests", type=int, default=32, help="Concurrent requests (one thread each).")
    parser.add_argument("--top_k", type=int, default=5)
    parser.add_argument("--concurrency_limit", type=int, default=4, help="Queue concurrency of the launched demo.")
    parser.add_argument("--backend", default=None, choices=("auto", "torch", "tensorflow"))
    args = parser.parse_args(argv)
    if not args.url and not args.model:
        parser.error("give --model DIR (or --url of a running demo)")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

    demo = None
    url = args.url
    if url is None:
        from spaces_demo.app import build_demo

        demo = build_demo(args.model, backend=args.backend, concurrency_limit=args.concurrency_limit)
        demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True)
        url = demo.local_url
    try:
        res = run_load(url, args.requests, args.top_k)
    finally:
        if demo is not None:
            demo.close()

    lat = sorted(res["latencies_s"])
    ok = len(lat) - len(res["failures"])
    print(f"fill_mask load: {args.requests} concurrent requests, top_k={args.top_k}"
          + (f", concurrency_limit={args.concurrency_limit}" if demo is not None else f", url={url}"))
    print(f"  succeeded      {ok}/{len(lat)}")
    print(f"  latency p50    {percentile(lat, 50) * 1000:8.1f} ms")
    print(f"  latency p95    {percentile(lat, 95) * 1000:8.1f} ms")
    print(f"  latency max    {lat[-1] * 1000:8.1f} ms   mean {statistics.fmean(lat) * 1000:.1f} ms")
    print(f"  wall time      {res['wall_s']:8.2f} s")
    print(f"  throughput     {len(lat) / res['wall_s']:8.2f} requests/s")
    for failure in res["failures"]:
        print(f"  FAILED {failure}", file=sys.stderr)
    assert not res["failures"], f"{len(res['failures'])} of {len(lat)} requests failed"
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as err:
        print(f"demo_load: {err}", file=sys.stderr)
        sys.exit(1)
