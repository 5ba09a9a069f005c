"""Fixed-width rows of the page plans (``exposition_plan``): the distinct rows of many lines, read without
reading most of them, and the checks that prove rows in place.

Theory of operation. A plan's prefix rows (comment lines, metric names, label strings) are byte ranges of
a chunk of joined pages. ``_row_ids`` numbers them (equal rows, equal ids), reading as bytes objects only
the rows that have no likely equal earlier row of the same width. ``_checks`` turns (line, width, row)
triples into ``_RowCheck``s, one per width: the rows at those places must read the given table's rows,
proven by one numpy gather and one memcmp per check (``_RowCheck.holds``); rows that all occur equally
often are ordered so that the gathered bytes are the table repeated (a bytes repeat, no index gather of
the table). Pure functions of their arguments; no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import numpy as np


@dataclass(slots=True)
class _RowCheck:
    """Rows of width ``width`` at ``line_start[lines] + shift`` must read ``table[tidx]``, or, when
    ``tiles`` (every distinct row occurs equally often and the lines are ordered so), the table's bytes
    ``tiles`` times over: a bytes repeat instead of a gather (which costs ten times more)."""

    width: int
    lines: np.ndarray
    shift: np.ndarray | None
    table: np.ndarray  # distinct rows, np.void of ``width`` bytes
    tidx: np.ndarray | None
    tiles: int = 0
    pattern: bytes = b""  # the table's bytes, when tiled

    def holds(self, got: bytes) -> bool:
        """Whether the gathered rows read as planned (tiled: one memcmp per tile, in place)."""
        if self.tidx is not None:
            return got == self.table[self.tidx].tobytes()
        size = len(self.pattern)
        if self.tiles > 64:  # many small tiles (a metric name on every line): one repeat, one compare
            return got == self.pattern * self.tiles
        return len(got) == size * self.tiles and all(
            map(got.startswith, repeat(self.pattern, self.tiles), range(0, size * self.tiles, size)))


def _run_starts(a: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a sorted array starts."""
    if a.shape[0] == 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1])))


def _dense_unique(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for keys in 0..size-1 (a count instead of a sort when the
    range is small)."""
    if size > 8 * key.shape[0] + 1024:
        u, inv = np.unique(key, return_inverse=True)
        return u, inv
    present = np.bincount(key, minlength=size) > 0
    return np.flatnonzero(present), (np.cumsum(present) - 1)[key]


def _row_ids(text: bytes, arr: np.ndarray, at: np.ndarray, width: np.ndarray, cand: np.ndarray, exact: bool
             ) -> tuple[np.ndarray, list[bytes]]:
    """Ids of the rows text[at[i] : at[i] + width[i]] (equal rows, equal ids) and the distinct rows. Row
    i with ``cand[i] >= 0`` and the width of row ``cand[i]`` (which has ``cand == -1``) is taken to equal
    it, ``exact``: after a vectorised compare; only the other rows are read as bytes objects."""
    test = np.flatnonzero(cand >= 0)
    test = test[width[test] == width[cand[test]]]
    same = np.zeros(at.shape[0], bool)
    if not exact:
        same[test] = True
    elif test.shape[0]:
        wt = width[test]
        for w in np.unique(wt).tolist():
            sel = test[wt == w]
            view = np.ndarray((arr.shape[0] - w + 1,), np.dtype((np.void, w)), text, 0, (1,))
            same[sel] = view[at[sel]] == view[at[cand[sel]]]
    own = np.flatnonzero(~same)
    rows = list(map(text.__getitem__, map(slice, at[own].tolist(), (at[own] + width[own]).tolist())))
    ix: dict[bytes, int] = {}
    own_ids = [ix.setdefault(r, len(ix)) for r in rows]
    ids = np.empty(at.shape[0], np.int64)
    ids[own] = own_ids
    match = np.flatnonzero(same)
    ids[match] = ids[cand[match]]
    return ids, list(ix)


def _checks(lines: np.ndarray, widths: np.ndarray, ids: np.ndarray, rows: list[bytes], shift: np.ndarray | None
            ) -> list[_RowCheck]:
    """Row checks for ``rows[ids[i]]`` (``widths[i]`` bytes) at line ``lines[i]`` (+ ``shift[i]``), one per
    width."""
    out: list[_RowCheck] = []
    if widths.shape[0] == 0:
        return out
    by_width = _stable_argsort(widths)
    starts = _run_starts(widths[by_width])
    for sel in np.split(by_width, starts[1:]):
        w = int(widths[sel[0]])
        uniq, tidx = _dense_unique(ids[sel], len(rows))
        table = np.frombuffer(b"".join(rows[k] for k in uniq.tolist()), np.dtype((np.void, w)))
        at, by = lines[sel], None if shift is None else shift[sel]
        per = np.bincount(tidx)
        if sel.shape[0] >= 256 and per.min() == per.max():  # the lines as (k-th occurrence, row): the table k times
            # over; the lines by row, per[0] of each in turn, read column by column
            order = _stable_argsort(tidx).reshape(per.shape[0], int(per[0])).T.ravel()
            out.append(_RowCheck(w, at[order], None if by is None else by[order], table, None, int(per[0]),
                                 table.tobytes()))
        else:
            out.append(_RowCheck(w, at, by, table, tidx))
    return out


def _stable_argsort(a: np.ndarray) -> np.ndarray:
    """``np.argsort(a, kind="stable")`` of non-negative ints; below 65536 as uint16, which numpy sorts by
    radix (a cold plan's 2.8M line widths: ~0.05 s instead of ~0.25 s)."""
    if a.shape[0] and int(a.min()) >= 0 and int(a.max()) < 65536:
        return np.argsort(a.astype(np.uint16), kind="stable")
    return np.argsort(a, kind="stable")
