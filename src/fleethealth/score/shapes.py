"""The four normalisation shapes, vectorised: each maps raw values to sub-scores in [0, 1] (1 = healthy).

NaN in means NaN out (missing stays missing; it is never a score). Peer statistics are grouped by
sorting once, never by a Python loop per group.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MAD_SCALE = 1.4826  # makes MAD a consistent estimator of the standard deviation for normal data


def ramp(x: np.ndarray, warn: float, crit: float) -> np.ndarray:
    """1 at or below warn, 0 at or above crit, linear between. For "worse when lower" pass crit < warn."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        out = 1.0 - (x - warn) / (crit - warn)
        out = np.clip(out, 0.0, 1.0)
    return out


def gate(x: np.ndarray, above: float | None = None, values: list[float] | None = None) -> np.ndarray:
    """0 where the fatal condition holds (x > above, or x in values), else 1; NaN stays NaN."""
    x = np.asarray(x, np.float64)
    bad = np.zeros(x.shape, bool)
    if above is not None:
        with np.errstate(invalid="ignore"):
            bad |= x > above
    if values:
        bad |= np.isin(x, np.asarray(values, np.float64))
    out = np.where(bad, 0.0, 1.0)
    out[np.isnan(x)] = np.nan
    return out


def group_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Median of ``values`` per group id (0..n_groups-1) and the group sizes; NaN values are ignored."""
    ok = ~np.isnan(values)
    v = values[ok]
    g = groups[ok]
    # sort by value, then stably by group (a radix sort for small ints): two passes beat np.lexsort
    order = np.argsort(v)
    gk = g[order]
    if n_groups < 32768:
        gk = gk.astype(np.int16)
    order = order[np.argsort(gk, kind="stable")]
    v = v[order]
    g = g[order]
    counts = np.bincount(g, minlength=n_groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    med = np.full(n_groups, np.nan)
    has = counts > 0
    lo = starts + (counts - 1) // 2
    hi = starts + counts // 2
    med[has] = 0.5 * (v[lo[has]] + v[hi[has]])
    return med, counts


def peer_robust_z(
    values: np.ndarray,
    groups: np.ndarray,
    n_groups: int,
    *,
    worse_if: str = "higher",
    min_rel_dev: float = 0.0,
    mad_floor_rel: float = 0.001,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Robust z of each value against its peer group: (x - median) / (1.4826 * MAD), signed so that
    positive is worse. Returns (z, median per group, MAD per group, group sizes).

    MAD of 0 (identical peers) would divide by zero; the MAD used is at least ``mad_floor_rel`` of the
    median's magnitude (and 1e-9), so a tiny absolute difference among identical peers is not an
    infinite z. Deviations smaller than ``min_rel_dev`` of the median count as no deviation at all.
    """
    sizes: list[np.ndarray] = []

    def median(x: np.ndarray) -> np.ndarray:
        med, counts = group_median(x, groups, n_groups)
        sizes.append(counts)  # (the values' first: the group sizes returned)
        return med

    z, med, mad = _robust_z(values, groups, median, worse_if, min_rel_dev, mad_floor_rel)
    return z, med, mad, sizes[0]


def _robust_z(values: np.ndarray, groups: np.ndarray, median: Callable[[np.ndarray], np.ndarray], worse_if: str,
              min_rel_dev: float, mad_floor_rel: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The robust z arithmetic of both peer functions, given how a group median is taken."""
    med = median(values)
    m = med[groups]
    dev = values - m
    absdev = np.abs(dev)
    mad = median(absdev)
    mad_eff = np.maximum(np.nan_to_num(mad, nan=0.0), np.maximum(mad_floor_rel * np.abs(med), 1e-9))
    if min_rel_dev > 0:
        with np.errstate(invalid="ignore"):
            dev = np.where(absdev < min_rel_dev * np.abs(m), 0.0, dev)
    z = dev / (MAD_SCALE * mad_eff[groups])
    if worse_if == "lower":
        z = -z
    return z, med, mad


def burn_rate(bad: np.ndarray, total: np.ndarray, objective: float) -> np.ndarray:
    """SRE burn rate: the bad fraction divided by the error budget (1 - objective). No traffic: 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(total > 0, bad / np.where(total > 0, total, 1.0), 0.0)
    frac = np.clip(frac, 0.0, 1.0)
    out = frac / (1.0 - objective)
    out[np.isnan(bad) | np.isnan(total)] = np.nan
    return out


def slo_score(burns: list[tuple[np.ndarray, np.ndarray, float]]) -> np.ndarray:
    """Multi-window SLO score. For each (long burn, short burn, page factor) pair the effective burn is
    the smaller of the two (an alert needs both windows), ramped from 1x (score 1) to the page factor
    (score 0). The sub-score is the worst pair: 0 exactly when a burn-rate page would fire."""
    out: np.ndarray | None = None
    for long_b, short_b, factor in burns:
        eff = np.fmin(long_b, short_b)
        eff = np.where(np.isnan(long_b) | np.isnan(short_b), np.nan, eff)
        s = ramp(eff, 1.0, factor)
        out = s if out is None else np.fmin(out, s)
    assert out is not None
    return out


class PeerLayout:
    """Peer groups fixed in advance (``groups``: the group id 0..n_groups-1 of each value), laid out as
    a groups x width matrix (``pos``: each value's cell, the rest NaN) so that every group's median is
    one row sort of that matrix: the same order statistics ``group_median`` picks, without its two
    argsorts. Built once while the groups stay the same (cycle after cycle of one fleet)."""

    def __init__(self, groups: np.ndarray, n_groups: int) -> None:
        self.groups = groups
        self.n_groups = n_groups
        self.counts = np.bincount(groups, minlength=n_groups)
        self.width = int(self.counts.max()) if groups.size else 0
        order = np.argsort(groups, kind="stable")
        starts = np.concatenate(([0], np.cumsum(self.counts)[:-1]))
        slot = np.empty(groups.size, np.int64)
        slot[order] = np.arange(groups.size) - starts[groups[order]]
        self.pos = groups * self.width + slot
        rows = np.arange(n_groups) * self.width
        self.lo = rows + (self.counts - 1) // 2
        self.hi = rows + self.counts // 2

    @staticmethod
    def fits(groups: np.ndarray, n_groups: int) -> bool:
        """Worth it: groups of similar sizes (the padded matrix at most about twice the values)."""
        if groups.size == 0 or n_groups == 0:
            return False
        width = int(np.bincount(groups, minlength=n_groups).max())
        return n_groups * width <= 2 * groups.size + 64

    def median(self, values: np.ndarray) -> np.ndarray:
        """Per group, the median of ``values`` (no NaN among them; every group non-empty)."""
        flat = np.full(self.n_groups * self.width, np.nan)
        flat[self.pos] = values
        flat.reshape(self.n_groups, self.width).sort(axis=1)  # in place; NaN padding sorts last
        return 0.5 * (flat[self.lo] + flat[self.hi])


def peer_robust_z_laid_out(
    values: np.ndarray,
    layout: PeerLayout,
    *,
    worse_if: str = "higher",
    min_rel_dev: float = 0.0,
    mad_floor_rel: float = 0.001,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``peer_robust_z(values, layout.groups, layout.n_groups, ...)`` for finite ``values``: the same
    numbers (the same order statistics, the same arithmetic), the medians read off ``layout``."""
    z, med, mad = _robust_z(values, layout.groups, layout.median, worse_if, min_rel_dev, mad_floor_rel)
    return z, med, mad, layout.counts
