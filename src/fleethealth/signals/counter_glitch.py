"""Exporter glitches on counters: a counter that reads 0 for a scrape or two and then its old value again
was not reset, and its return is not new errors.

The history reset-corrects counters as PromQL does: a counter that goes down was restarted, the value it
had is added to its offset, and everything it reads from then on counts as increase since the restart.
An exporter restart glitch or a DCGM field briefly unavailable reads 0 and then the old count: corrected
that way, the return to the old count counts the counter's whole life again (a PCIe replay counter at
10,000 reads as a storm of 10,000 replays in one scrape).

The rule (``CounterGlitches``): a drop opens a candidate (the value before the drop, the offset before it
and the drop's time) and is corrected as a reset meanwhile. While the counter does not grow it stays a
candidate. If it comes back to at least the value before the drop within ``GLITCH_S`` of the drop, the
drop was a glitch: the offset goes back to what it was before the drop, raised only as far as keeps the
corrected series from going down (a drop to 0 and back counts nothing; a partial drop counts what the
reset correction already counted during it), so the increase across the glitch is the return value minus
the value before the drop. If it grows but stays below the value before the drop, or ``GLITCH_S`` passes,
the drop was a real reset (a restart stays small and grows from there) and keeps its reset correction:
no error after a restart is lost.

What cannot be told apart: a restart after which the counter jumps from its restart value straight to at
least its pre-restart value within ``GLITCH_S`` (more errors in one scrape than in its whole life before)
reads as a glitch, and counts only the excess over the pre-restart value.

Candidates are few (series that just dropped), so they are kept sparse: slot ids in order with their
values, found among a scrape's slots by position (a run of slots) or binary search. A scrape without a
drop while no candidate exists costs nothing here. Pure: times are the samples' own.
"""

from __future__ import annotations

import math

import numpy as np

GLITCH_S = 300.0  # how long after a drop a return to the old count still makes it a glitch

_NO_IX = np.zeros(0, np.int64)


class CounterGlitches:
    """Open glitch candidates per counter slot (sorted by slot) and the rule that settles them."""

    def __init__(self, window_s: float = GLITCH_S) -> None:
        self.window_s = window_s
        self.slot = np.zeros(0, np.int64)  # ascending
        self.pre = np.zeros(0, np.float64)  # the raw value before the drop
        self.base = np.zeros(0, np.float64)  # the slot's offset before the drop
        self.t0 = np.zeros(0, np.float64)  # the drop's sample time

    def __len__(self) -> int:
        return int(self.slot.size)

    def _in_batch(self, sl: slice | np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(candidate indexes, their positions in the batch) of the candidates whose slot is in ``sl``."""
        cs = self.slot
        if not cs.size or not n:
            return _NO_IX, _NO_IX
        if isinstance(sl, slice):
            ok = (cs >= sl.start) & (cs < sl.stop)
            return np.flatnonzero(ok), cs[ok] - sl.start
        sorter = None if n < 2 or bool((sl[1:] > sl[:-1]).all()) else np.argsort(sl, kind="stable")
        p = np.minimum(np.searchsorted(sl, cs, sorter=sorter), n - 1)
        if sorter is not None:
            p = sorter[p]
        ok = sl[p] == cs
        return np.flatnonzero(ok), p[ok]

    def _replace(self, keep: np.ndarray, slots: np.ndarray, pre: np.ndarray, base: np.ndarray,
                 t0: np.ndarray) -> None:
        s = np.concatenate((self.slot[keep], slots.astype(np.int64)))
        order = np.argsort(s, kind="stable")
        self.slot = s[order]
        self.pre = np.concatenate((self.pre[keep], pre))[order]
        self.base = np.concatenate((self.base[keep], base))[order]
        self.t0 = np.concatenate((self.t0[keep], t0))[order]

    def scrape(self, sl: slice | np.ndarray, v: np.ndarray, t: np.ndarray, prev: np.ndarray, reset: np.ndarray,
               c_off: np.ndarray) -> None:
        """One sample per slot (``sl``: the slots, a run or ids without repeats; ``prev``: their last raw
        values; ``reset``: ``v < prev``): the reset correction and the glitch rule applied to ``c_off``
        (every slot's offset, updated in place where it changes: a drop, a glitch that came back)."""
        rp = np.flatnonzero(reset)
        ci, pos = self._in_batch(sl, v.size)
        stay = np.zeros(ci.size, bool)
        back = stay
        if ci.size:
            vc, pc = v[pos], prev[pos]
            live = t[pos] - self.t0[ci] <= self.window_s
            back = live & (vc >= self.pre[ci])
            stay = live & ~back & ~(vc > pc)
            if back.any():  # a glitch: the count before the drop goes on; drop and return count nothing
                at = _slots(sl, pos[back])
                c_off[at] = np.maximum(self.base[ci[back]], pc[back] + c_off[at] - vc[back])
        if not rp.size and stay.all():
            return
        rs = _slots(sl, rp)
        before = c_off[rs]
        c_off[rs] = before + prev[rp]  # PromQL's reset correction (never at a glitch's return: v >= pre)
        opened = ~np.isin(rp, pos[stay])  # a candidate that drops again is still the drop it was
        keep = np.ones(self.slot.size, bool)
        keep[ci[~stay]] = False
        self._replace(keep, rs[opened], prev[rp[opened]], before[opened], t[rp[opened]])

    def runs(self, slot: np.ndarray, v: np.ndarray, t: np.ndarray, prev0: np.ndarray, off0: np.ndarray,
             off: np.ndarray, start: np.ndarray) -> np.ndarray:
        """``off`` (the plain reset-corrected offsets of samples in (slot, time) order, several per slot;
        ``start``: a slot's first sample in the batch; ``prev0`` / ``off0``: per sample, its slot's last raw
        value and offset before the batch) with the runs of slots that drop or hold a candidate redone
        sample by sample under the glitch rule."""
        drops = np.zeros(slot.size, bool)
        drops[1:] = (v[1:] < v[:-1]) & ~start[1:]
        drops |= start & (v < prev0)
        ci, pos = self._in_batch(slot, slot.size)
        touched = np.unique(np.concatenate((slot[drops], self.slot[ci])))
        if not touched.size:
            return off
        out = off.copy()
        cand = {int(s): (float(p), float(b), float(t0)) for s, p, b, t0 in
                zip(self.slot[ci].tolist(), self.pre[ci].tolist(), self.base[ci].tolist(), self.t0[ci].tolist(),
                    strict=True)}
        ends = np.concatenate((np.flatnonzero(start)[1:], [slot.size]))
        firsts = np.flatnonzero(start)
        run_of = {int(slot[a]): (int(a), int(b)) for a, b in zip(firsts.tolist(), ends.tolist(), strict=True)}
        settled: dict[int, tuple[float, float, float] | None] = {}
        for s in touched.tolist():
            a, b = run_of[s]
            o, prev, c = float(off0[a]), float(prev0[a]), cand.get(s)
            for i in range(a, b):
                o, c = glitch_step(float(v[i]), float(t[i]), prev, o, c, self.window_s)
                out[i] = o
                prev = float(v[i])
            settled[s] = c
        keep = ~np.isin(self.slot, touched)
        new = [(s, c) for s, c in settled.items() if c is not None]
        self._replace(keep, np.array([s for s, _ in new], np.int64), np.array([c[0] for _, c in new]),
                      np.array([c[1] for _, c in new]), np.array([c[2] for _, c in new]))
        return out


def _slots(sl: slice | np.ndarray, positions: np.ndarray) -> np.ndarray:
    return positions + sl.start if isinstance(sl, slice) else sl[positions]


def glitch_step(v: float, t: float, prev: float, off: float, cand: tuple[float, float, float] | None,
                window_s: float = GLITCH_S) -> tuple[float, tuple[float, float, float] | None]:
    """One sample of one counter under the glitch rule: (its offset, its open candidate (value before the
    drop, offset before it, drop time) or None) from the sample before it."""
    if cand is not None:
        pre, base, t0 = cand
        if t - t0 > window_s:
            cand = None  # too long ago: the drop was a reset
        elif v >= pre:
            return max(base, prev + off - v), None  # back to the old count: a glitch
        elif v > prev:
            cand = None  # growing from where it dropped to: a restart
    if not math.isnan(prev) and v < prev:
        if cand is None:
            cand = (prev, off, t)
        off += prev
    return off, cand
