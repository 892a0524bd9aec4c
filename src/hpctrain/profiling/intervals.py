"""Time intervals as NumPy arrays: the union, overlap and gaps that GPU-time accounting needs.

An interval set is a pair (starts, ends) of float arrays in microseconds. `union` turns any
set into disjoint, sorted intervals; the other functions expect such disjoint sets.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Disjoint sorted intervals covering exactly what the input covers."""
    if len(starts) == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    opens = np.r_[True, starts[1:] > reach[:-1]]
    first = np.flatnonzero(opens)
    return starts[first], np.maximum.reduceat(ends, first)


def length(intervals: Intervals) -> float:
    return float(np.sum(intervals[1] - intervals[0]))


def overlap(a: Intervals, b: Intervals) -> float:
    """How long two disjoint interval sets both cover."""
    both = union(np.r_[a[0], b[0]], np.r_[a[1], b[1]])
    return length(a) + length(b) - length(both)


def gaps(busy: Intervals) -> Intervals:
    """The idle intervals between consecutive busy ones."""
    return busy[1][:-1], busy[0][1:]


def clip(intervals: Intervals, start: float, end: float) -> Intervals:
    """The part of a disjoint set inside [start, end]."""
    s, e = np.clip(intervals[0], start, end), np.clip(intervals[1], start, end)
    keep = e > s
    return s[keep], e[keep]
