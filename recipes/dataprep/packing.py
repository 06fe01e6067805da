"""Sequence packing: best-fit decreasing over a length histogram, O(N log N), pure Python + NumPy.

Items are integer sizes in [1, capacity]. Best-fit decreasing (BFD) takes the items longest first and
puts each into the open bin with the least room that still fits it, opening a new bin when none does.

Done item by item that is N Python steps, too slow for millions of sequences. Here the loop runs over
*distinct* sizes and over *groups of identical bins* instead:

* bins with the same remaining room are interchangeable for BFD, so the open bins are kept as a map
  room -> stack of bin groups (a group = `count` bins with identical contents, stored as a parent
  pointer plus the (size, multiplicity) it added), with a sorted list of the rooms that hold any;
* all `k` items of one size L are placed in bulk: the best-fitting room r (the smallest >= L, found
  by bisection) takes floor(r / L) items per bin, which is exactly what BFD does item by item (after
  one item the bin's room r - L is, if it still fits L, the new unique best fit, since no room lay in
  [L, r)); whole groups move at once, splitting a group only where k runs out;
* what is left opens new bins of `capacity` the same way.

Every step either finishes a size or empties a room, and each size creates O(1) new rooms, so the loop
does O(D) steps, D = number of distinct sizes (<= capacity), each O(log D). Turning groups back into
item ids is vectorised NumPy over the N items (a stable argsort, so O(N log N) overall).

The result is a deterministic function of the sizes: equal sizes are dealt out in index order and bins
come out in the order their groups were made (no randomness, no dependence on timing).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Packing:
    """Bins as CSR: the items of bin b are `items[offsets[b]:offsets[b + 1]]` (indices into the input)."""

    items: np.ndarray  # int64, every input index exactly once
    offsets: np.ndarray  # int64, num_bins + 1
    capacity: int
    steps: int  # group operations the packer did (the O(D) loop), for sanity checks

    @property
    def num_bins(self) -> int:
        return len(self.offsets) - 1

    def bin_loads(self, sizes: np.ndarray) -> np.ndarray:
        """Sum of sizes per bin."""
        if not len(self.items):
            return np.zeros(0, dtype=np.int64)
        return np.add.reduceat(np.asarray(sizes, dtype=np.int64)[self.items], self.offsets[:-1])

    def bins(self) -> list[np.ndarray]:
        return [self.items[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:])]


def efficiency(sizes: np.ndarray, packing: Packing) -> float:
    """Fraction of the bins' capacity that the items fill."""
    if not packing.num_bins:
        return 0.0
    return float(np.asarray(sizes, dtype=np.int64).sum()) / (packing.num_bins * packing.capacity)


def best_fit_decreasing(sizes, capacity: int) -> Packing:
    """Pack `sizes` (ints in [1, capacity]) into bins of `capacity` by best-fit decreasing."""
    sizes = np.asarray(sizes, dtype=np.int64)
    capacity = int(capacity)
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    n = len(sizes)
    if n == 0:
        return Packing(np.zeros(0, np.int64), np.zeros(1, np.int64), capacity, 0)
    lo, hi = int(sizes.min()), int(sizes.max())
    if lo < 1 or hi > capacity:
        raise ValueError(f"sizes must lie in [1, {capacity}], got [{lo}, {hi}]")

    counts = np.bincount(sizes, minlength=capacity + 1)
    distinct = np.flatnonzero(counts)[::-1].tolist()  # longest first
    count_of = counts.tolist()

    # groups of identical bins: content = own (size, mult) + the parent's content
    g_parent: list[int] = []
    g_size: list[int] = []
    g_mult: list[int] = []
    g_count: list[int] = []  # bins still in this group (not moved on to a child)
    levels: dict[int, list[int]] = {}  # room -> stack of group ids with that room
    active: list[int] = []  # sorted rooms >= 1 that have a non-empty stack

    def add(parent: int, size: int, mult: int, count: int, room: int) -> None:
        gid = len(g_parent)
        g_parent.append(parent)
        g_size.append(size)
        g_mult.append(mult)
        g_count.append(count)
        stack = levels.get(room)
        if stack is None:
            levels[room] = [gid]
            if room > 0:
                insort(active, room)
        else:
            stack.append(gid)

    steps = 0
    for size in distinct:
        k = count_of[size]
        while k:
            steps += 1
            i = bisect_left(active, size)
            if i == len(active):  # nothing open fits: open new bins, q items each
                q = capacity // size
                full, rest = divmod(k, q)
                if full:
                    add(-1, size, q, full, capacity - q * size)
                if rest:
                    add(-1, size, rest, 1, capacity - rest * size)
                break
            room = active[i]
            q = room // size
            stack = levels[room]
            while k and stack:
                gid = stack[-1]
                have = g_count[gid]
                if k >= q:
                    take, mult = min(have, k // q), q
                else:  # the last few items go into one bin
                    take, mult = 1, k
                k -= take * mult
                g_count[gid] = have - take
                if have == take:
                    stack.pop()
                add(gid, size, mult, take, room - mult * size)  # a lower room, never this stack
                steps += 1
            if not stack:
                del levels[room]
                active.pop(bisect_left(active, room))  # rooms added above lie below it: look again

    return _materialise(sizes, counts, capacity, g_parent, g_size, g_mult, g_count, steps)


def _materialise(sizes, counts, capacity, g_parent, g_size, g_mult, g_count, steps) -> Packing:
    """Groups -> CSR of item indices, vectorised (over chain depth, then over items)."""
    parent = np.array(g_parent, dtype=np.int64)
    live = np.flatnonzero(np.array(g_count, dtype=np.int64))
    live_count = np.array(g_count, dtype=np.int64)[live]

    # (live group, ancestor) pairs by walking all chains up at once; depth 0 = the live group itself
    cur, owner, depth = live, np.arange(len(live), dtype=np.int64), 0
    parts_owner, parts_group, parts_depth = [], [], []
    while len(cur):
        parts_owner.append(owner)
        parts_group.append(cur)
        parts_depth.append(np.full(len(cur), depth, dtype=np.int64))
        up = parent[cur]
        keep = up != -1
        cur, owner, depth = up[keep], owner[keep], depth + 1
    t_owner = np.concatenate(parts_owner)
    t_group = np.concatenate(parts_group)
    order = np.lexsort((-np.concatenate(parts_depth), t_owner))  # per live group, root first
    t_owner, t_group = t_owner[order], t_group[order]
    t_size = np.array(g_size, dtype=np.int64)[t_group]
    t_mult = np.array(g_mult, dtype=np.int64)[t_group]

    bin_items = np.bincount(t_owner, weights=t_mult, minlength=len(live)).astype(np.int64)
    t_pos = np.cumsum(t_mult) - t_mult
    t_pos -= (np.cumsum(bin_items) - bin_items)[t_owner]  # position of the triple inside its bin

    first_bin = np.cumsum(live_count) - live_count
    offsets = np.concatenate(([0], np.cumsum(np.repeat(bin_items, live_count)))).astype(np.int64)
    t_n = live_count[t_owner] * t_mult  # items each triple takes

    # items of each size in index order; the triples of one size consume them in triple order
    by_size = np.argsort(sizes, kind="stable")
    by_t = np.lexsort((np.arange(len(t_size)), t_size))
    t_src = np.empty(len(t_size), dtype=np.int64)
    t_src[by_t] = np.cumsum(t_n[by_t]) - t_n[by_t]  # = items of smaller sizes + earlier triples

    n = len(sizes)
    rep = np.repeat(np.arange(len(t_n)), t_n)
    k = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(t_n) - t_n, t_n)
    m = t_mult[rep]
    b = k // m
    dest = offsets[first_bin[t_owner[rep]] + b] + t_pos[rep] + (k - b * m)
    items = np.empty(n, dtype=np.int64)
    items[dest] = by_size[t_src[rep] + k]
    return Packing(items, offsets, capacity, steps)


def first_fit_naive(sizes, capacity: int) -> Packing:
    """Reference first-fit in input order with a linear scan over open bins: O(N * bins). Tests and
    benchmarks compare against it; never used for real data."""
    rooms: list[int] = []
    bins: list[list[int]] = []
    for idx, s in enumerate(np.asarray(sizes).tolist()):
        for b, room in enumerate(rooms):
            if room >= s:
                rooms[b] -= s
                bins[b].append(idx)
                break
        else:
            rooms.append(capacity - s)
            bins.append([idx])
    items = np.array([i for b in bins for i in b], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum([len(b) for b in bins]))).astype(np.int64)
    return Packing(items, offsets, capacity, len(sizes))


def best_fit_decreasing_naive(sizes, capacity: int) -> Packing:
    """Reference best-fit decreasing item by item (bisect over sorted rooms): the oracle for tests."""
    sizes = np.asarray(sizes, dtype=np.int64)
    order = np.argsort(-sizes, kind="stable").tolist()
    rooms: list[tuple[int, int]] = []  # sorted (room, bin)
    bins: list[list[int]] = []
    for idx in order:
        s = int(sizes[idx])
        i = bisect_left(rooms, (s, -1))
        if i == len(rooms):
            bins.append([idx])
            if capacity - s:
                insort(rooms, (capacity - s, len(bins) - 1))
        else:
            room, b = rooms.pop(i)
            bins[b].append(idx)
            if room - s:
                insort(rooms, (room - s, b))
    items = np.array([i for b in bins for i in b], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum([len(b) for b in bins]))).astype(np.int64)
    return Packing(items, offsets, capacity, len(sizes))
