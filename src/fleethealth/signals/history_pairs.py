"""Slot bookkeeping of the signal history (signals/history.py) as pure numpy functions.

Theory of operation
-------------------
The history gives each (metric, series) pair a slot. ``_unique_pairs`` finds a batch's distinct pairs
and each row's rank among them (what ``np.unique`` of the packed pairs answers) with a presence table
over metric x series, ids being small and dense; ``_stable_order`` is a stable argsort of slots that
places distinct slots forming one run (a cold start's) at their offsets instead of sorting. Both make
their temporaries in place where they can: on a cold start at 100k GPUs every new MB is page faults.
No I/O, no state.
"""

from __future__ import annotations

import numpy as np


def _unique_pairs(m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique((m << 32) | s, return_inverse=True)``. Ids are small and dense (a few dozen metrics,
    series numbered from 0), so a presence table over metric x series replaces the sort: at 100k GPUs
    (2.9M pairs on a cold start) a sort costs ~0.5 s, the table a tenth of that. Temporaries are made in
    place where they can be: on a cold start each new MB is page faults (~0.25 ms per MB)."""
    if m.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    n_s = int(s.max()) + 1
    cells = (int(m.max()) + 1) * n_s
    if int(m.min()) < 0 or int(s.min()) < 0 or cells > 4 * m.size + 4096:
        uniq, inv = np.unique((m.astype(np.int64) << 32) | s.astype(np.int64), return_inverse=True)
        return uniq, inv.reshape(-1)
    flat = m.astype(np.int64)
    flat *= n_s
    flat += s
    present = np.zeros(cells, bool)
    present[flat] = True
    cell = np.flatnonzero(present)
    rank = np.cumsum(present, dtype=np.int64)
    rank -= 1
    inv = rank[flat]
    del rank, flat
    hi, lo = np.divmod(cell, n_s)
    hi <<= 32
    hi |= lo
    return hi, inv


def _stable_order(slot: np.ndarray) -> np.ndarray:
    """``np.argsort(slot, kind="stable")``; for distinct slots forming one run (a plan made on a cold
    start: every slot new) by placing each at its offset instead of sorting."""
    if slot.size > 1:
        lo = int(slot.min())
        if int(slot.max()) - lo + 1 == slot.size:
            at = slot - lo
            seen = np.zeros(slot.size, bool)
            seen[at] = True
            if bool(seen.all()):  # each offset taken once: distinct, so the order is the sort
                order = np.empty(slot.size, np.int64)
                order[at] = np.arange(slot.size)
                return order
    return np.argsort(slot, kind="stable")
