"""XLA compilation counters of this process (torch_xla), for the backend's results and the recompile guard."""

from __future__ import annotations

from typing import Dict, Optional


def compile_counts() -> Dict[str, Optional[int]]:
    """XLA graph compilations of this process so far, from ``torch_xla.debug.metrics``.

    Returns:
        ``{"compile_time_count": int, "uncached_compile": int}``: samples of the ``CompileTime`` metric and
        the ``UncachedCompile`` counter (0 before the first compilation; both ``None`` without torch_xla).
    """
    try:
        import torch_xla.debug.metrics as met
    except Exception:
        return {"compile_time_count": None, "uncached_compile": None}
    data = met.metric_data("CompileTime")
    return {"compile_time_count": int(data[0]) if data else 0,
            "uncached_compile": int(met.counter_value("UncachedCompile") or 0)}
