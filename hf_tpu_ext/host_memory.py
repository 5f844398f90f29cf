"""Keep glibc's allocator from handing a step's temporaries back to the OS between steps (CPU hosts).

Why: an XLA:CPU step allocates its temporaries in one block per execution (328 MB for the small benchmark preset
on JAX) and frees it at the end. glibc serves a block that large with ``mmap`` and returns it with ``munmap``, so
every step page-faults the whole block in again: ~90,000 faults of 4 KiB per step, 21.6% of the process's CPU
time in the kernel (``perf``, keras/JAX small preset; benchmarks/NOTES.md "Round four"). TensorFlow's steps had
the same fault storm (NOTES "Steady fp32 steps").

Three glibc settings (``mallopt``; the environment variables ``MALLOC_*_`` are the same settings, read at process
start) stop it:

* ``M_MMAP_MAX = 0``: no ``mmap`` for large blocks, they come from the heap;
* ``M_TRIM_THRESHOLD = 1 GiB``: freed heap memory is kept for the next step, not trimmed;
* ``M_ARENA_MAX = 1`` (``single_arena``): one heap for every thread. Needed where a worker thread allocates the
  block (XLA:CPU's executor threads do): a thread's own arena grows in heaps of at most 64 MiB, and glibc falls
  back to ``mmap`` for anything larger whatever ``M_MMAP_MAX`` says. Set it before those threads first allocate
  (before the JAX client starts); threads already attached to an arena keep it.

Peak resident memory does not grow: the memory is reused, not added. Off glibc (macOS, musl) nothing is changed.
"""

from __future__ import annotations

from typing import Optional

# glibc's malloc.h parameter numbers
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
KEEP_BYTES = 1 << 30  # M_TRIM_THRESHOLD: the most freed memory a step may leave in the heap before it is trimmed

_libc: Optional[object] = None


def _glibc():
    global _libc
    if _libc is None:
        import ctypes
        import ctypes.util

        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return _libc


def keep_step_memory(single_arena: bool = False) -> bool:
    """Apply the settings of the module doc to this process.

    Args:
        single_arena: also ``M_ARENA_MAX = 1`` (for runtimes whose worker threads allocate the step's block).

    Returns:
        True when glibc accepted every setting; False off glibc (nothing changed) or when one was refused.
    """
    try:
        libc = _glibc()
        settings = [(M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, KEEP_BYTES)]
        if single_arena:
            settings.append((M_ARENA_MAX, 1))
        # mallopt returns 1 on success, 0 on a refused value
        return all(bool(libc.mallopt(param, value)) for param, value in settings)
    except (OSError, AttributeError):  # not glibc: no mallopt
        return False


def heap_usage() -> Optional[dict]:
    """glibc's heap totals over every arena (``mallinfo2``), to tell a leak from memory kept for reuse.

    Returns:
        ``{"in_use_bytes", "free_bytes", "mmapped_bytes"}``: bytes handed out by ``malloc`` and not freed
        (``uordblks``; grows with a leak), bytes freed but kept in the heap (``fordblks``; resident once touched,
        reused by later allocations), bytes in ``mmap``-ed blocks (``hblkhd``); None off glibc or before 2.33
        (no ``mallinfo2``).
    """
    import ctypes

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    try:
        fn = _glibc().mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    fn.restype = _Mallinfo2
    info = fn()
    return {"in_use_bytes": int(info.uordblks), "free_bytes": int(info.fordblks), "mmapped_bytes": int(info.hblkhd)}
