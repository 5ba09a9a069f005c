"""Which bucket of a latency histogram a latency SLO reads at its threshold: per histogram, the largest
bound at or below the threshold.

A latency SLO counts a request slow when it took longer than ``threshold_s``; a histogram only tells how
many requests took at most each of its bounds. Serious tools differ where the threshold is not a bound:
Prometheus' ``histogram_quantile`` interpolates linearly inside a bucket (an estimate, off by up to the
bucket's width); Sloth's and Pyrra's latency SLIs select ``..._bucket{le="<threshold>"}``, so the
threshold must be a bound of the served histogram (a bound that does not exist selects no series: no
data, an SLO that never fires); Pyrra's ``latencyNative`` reads native histograms at any threshold.

Here the threshold is policy data while the buckets belong to each exporter and are known only at
runtime (a policy-time check is not possible), so each histogram, the bucket series that share every
label but ``le``, is read at its own largest bound at or below the threshold. Conservative: requests
between that bound and the threshold count as slow, so the burn rate can read high, never hide a breach;
the scorer says which bound it read (``score.slo``). Per histogram, not one bound for the fleet: replicas
of two vLLM versions with different buckets each read their own (one fleet-wide bound left every replica
that lacks it ``pending:ttft_slo`` for ever). A histogram with no bound at or below the threshold is not
read (every request would count as slow: the policy's threshold is below the exporter's first bucket);
the scorer says that too. The history keeps only the chosen buckets and the engine scores with them, so
both use this one rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleethealth.signals.snapshot import LabelSet


def histogram_key(ls: LabelSet) -> LabelSet:
    """The histogram a bucket series belongs to: its label set without ``le``."""
    return tuple(p for p in ls if p[0] != "le")


def histogram_ids(labelsets: Sequence[LabelSet], series: np.ndarray) -> np.ndarray:
    """Per entry of ``series`` (label-set ids), an id of its histogram, local to this call."""
    uniq, inv = np.unique(series, return_inverse=True)
    ids: dict[LabelSet, int] = {}
    of = np.fromiter((ids.setdefault(histogram_key(labelsets[s]), len(ids)) for s in uniq.tolist()), np.int64,
                     uniq.size)
    return of[inv.reshape(-1)]


class HistogramIds:
    """Histogram ids of an append-only label-set list (a history's), extended as it grows."""

    def __init__(self) -> None:
        self._ids: dict[LabelSet, int] = {}
        self._of: list[int] = []
        self._arr = np.zeros(0, np.int64)

    def of(self, labelsets: Sequence[LabelSet], series: np.ndarray) -> np.ndarray:
        if len(self._of) < len(labelsets):
            self._of.extend(self._ids.setdefault(histogram_key(ls), len(self._ids))
                            for ls in labelsets[len(self._of):])
            self._arr = np.asarray(self._of, np.int64)
        return self._arr[series]


def buckets_at_threshold(le: np.ndarray, hist: np.ndarray, threshold: float) -> np.ndarray:
    """Which bucket samples (bounds ``le``, histogram ids ``hist``) a latency SLO reads at ``threshold``:
    those at their histogram's largest bound <= threshold (none of a histogram without such a bound)."""
    with np.errstate(invalid="ignore"):
        usable = le <= threshold + 1e-12
    if not usable.any():
        return usable
    best = np.full(int(hist.max()) + 1, -np.inf)
    np.maximum.at(best, hist[usable], le[usable])
    return usable & (le == best[hist])
