"""A fixed-size window of step times whose memory is allocated once: :class:`StepWindow`.

Why: the steady (median) step time looks back over the last 10,000 device calls. Kept as a
``deque(maxlen=10_000)`` of ``(seconds per step, steps)`` tuples it cost ~88 B per call (a tuple, a float
object and the deque's slot: ~0.9 MB per window) and grew for the first 10,000 calls of every run, which a
memory soak reads as growth per step (issue 31 item 9: ~3 minutes of a tiny model's run). Two typed arrays
of ``size`` entries (8 B each) are allocated at construction and overwritten in place: 160 KB for 10,000
entries, the same from the first step to the last.
"""

from __future__ import annotations

from array import array
from typing import Iterable, Iterator, List, Optional, Tuple


def weighted_median(pairs: Iterable[Tuple[float, int]]) -> Optional[float]:
    """Median of per-step times given as ``(seconds_per_step, steps)`` pairs (each pair counts ``steps`` times).

    Returns None for no pairs; with an even total the mean of the two middle steps (as ``statistics.median``).
    """
    ordered = sorted(pairs)
    if not ordered:
        return None
    total = sum(n for _, n in ordered)
    half, seen = total / 2.0, 0
    for i, (v, n) in enumerate(ordered):
        seen += n
        if seen > half:
            return v
        if seen == half:  # even count split between two values
            return (v + ordered[i + 1][0]) / 2.0
    return ordered[-1][0]


class StepWindow:
    """The last ``size`` ``(seconds per step, steps)`` pairs, oldest first, in two preallocated arrays.

    Behaves like ``collections.deque(maxlen=size)`` of those pairs for what the meters use: ``append(pair)``,
    ``len()``, iteration (oldest first), truth value, ``clear()``. Memory: ``16 * size`` bytes, fixed.

    Args:
        size: pairs kept (>= 1).

    Raises:
        ValueError: ``size`` < 1.
    """

    def __init__(self, size: int):
        if int(size) < 1:
            raise ValueError(f"StepWindow: size must be >= 1, got {size}.")
        self.size = int(size)
        self._seconds = array("d", [0.0]) * self.size  # exactly 8 B an entry, allocated here once
        self._steps = array("q", [0]) * self.size
        self._next = 0  # index the next pair is written to
        self._count = 0

    def append(self, pair: Tuple[float, int]) -> None:
        """Add one call's ``(seconds per step, steps)``; the oldest pair goes once ``size`` are held."""
        self._seconds[self._next] = float(pair[0])
        self._steps[self._next] = int(pair[1])
        self._next = (self._next + 1) % self.size
        self._count = min(self._count + 1, self.size)

    def add_steps(self, seconds_per_step: float, steps: int) -> None:
        """``steps`` entries of ``(seconds_per_step, 1)``: a window of steps rather than of calls."""
        for _ in range(max(int(steps), 0)):
            self.append((seconds_per_step, 1))

    def clear(self) -> None:
        """Forget every pair (the arrays are kept: nothing is allocated again)."""
        self._next = self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Tuple[float, int]]:
        start = (self._next - self._count) % self.size
        for i in range(self._count):
            j = (start + i) % self.size
            yield self._seconds[j], self._steps[j]

    def pairs(self) -> List[Tuple[float, int]]:
        """The pairs held, oldest first (a new list)."""
        return list(self)

    def median(self) -> Optional[float]:
        """:func:`weighted_median` of the pairs held (None when empty), in the unit appended (seconds per step)."""
        return weighted_median(self)
