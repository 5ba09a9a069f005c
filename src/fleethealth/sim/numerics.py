"""The arithmetic the simulator's step shares: 0-d constants, the erf, Poisson counts, run finding.

Theory of operation. A step's values are computed with numpy's element-wise operations, whose results do
not depend on the shape of the array they run over; the plain step, the draw-ahead of quiet steps
(``quiet_regime``) and the load plan (``load_plan``) all take their constants and helpers from here, so
that each value is the same operation on the same operands, bit for bit, whichever path computed it.
Constants are 0-d arrays (numpy applies them faster than Python floats, with the same bits). ``erf`` and
the latency CDF table bounds serve the latency histograms; ``poisson_counts`` and ``sprinkle`` are the
counter draws; ``consecutive_runs`` finds the runs of consecutive indices that let the hot path work on
slices instead of gathers. Pure functions: randomness only through the generator the caller passes.
"""

from __future__ import annotations

import math

import numpy as np

from fleethealth.sim.metric_catalog import FB_TOTAL_MIB, ITL_SIGMA, TTFT_SIGMA

SQRT2 = math.sqrt(2.0)
# 0-d constants for the step's element-wise operations (same values, same bits as the Python floats)
K0, K1, K2, K6, K38, K100, K1935 = (np.array(x) for x in (0.0, 1.0, 2.0, 6.0, 38.0, 100.0, 1935.0))
K0_35, K0_4, K0_5, K0_6, K1_6 = (np.array(x) for x in (0.35, 0.4, 0.5, 0.6, 1.6))
K0_01, K0_02, K0_1, K0_15, K0_75, K0_8, K0_85, K0_9, K30, K40, K256 = (
    np.array(x) for x in (0.01, 0.02, 0.1, 0.15, 0.75, 0.8, 0.85, 0.9, 30.0, 40.0, 256.0))
FB_USABLE = np.array(FB_TOTAL_MIB - 300.0)
# latency CDF lookup table: medians from 0.1 ms to 1000 s in steps of 0.5 % (log space)
CDF_LO = math.log(1e-4)
CDF_STEP = 0.005
CDF_N = int((math.log(1e3) - CDF_LO) / CDF_STEP) + 1
CDF_LAST = np.array(float(CDF_N - 1))
# a lognormal's mean over its median
TTFT_MEAN = math.exp(TTFT_SIGMA * TTFT_SIGMA / 2)
ITL_MEAN = math.exp(ITL_SIGMA * ITL_SIGMA / 2)


def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf and scipy is not a dependency."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def lognormal_bucket_probs(median: np.ndarray, sigma: float, les: np.ndarray) -> np.ndarray:
    """P(bucket) per row for lognormal latencies: shape (len(median), len(les) + 1), last = above the top."""
    z = (np.log(les)[None, :] - np.log(median)[:, None]) / (sigma * SQRT2)
    cdf = 0.5 * (1.0 + erf(z))
    full = np.concatenate([np.zeros((len(median), 1)), cdf, np.ones((len(median), 1))], axis=1)
    return np.clip(np.diff(full, axis=1), 0.0, 1.0)


def with_inf_column(cdf: np.ndarray) -> np.ndarray:
    """A CDF table with a column for the +Inf bucket (filled per step with the count, not looked up)."""
    return np.concatenate([cdf, np.ones((len(cdf), 1))], axis=1)


def consecutive_runs(idx: np.ndarray, tag: np.ndarray, limit: int, same: bool = False) -> list[tuple[int, int, int]] | None:
    """Maximal runs (lo, hi, t) of consecutive values lo..hi-1 in the sorted ``idx`` over which ``tag``
    goes up by one (``same``: stays equal), with ``t`` the tag at lo; None beyond ``limit`` runs."""
    out: list[tuple[int, int, int]] = []
    step = 0 if same else 1
    for g, t in zip(idx.tolist(), tag.tolist(), strict=True):
        if out and g == out[-1][1] and t == out[-1][2] + step * (g - out[-1][0]):
            out[-1] = (out[-1][0], g + 1, out[-1][2])
        else:
            out.append((g, g + 1, t))
    return out if len(out) <= limit else None


def poisson_counts(rng: np.random.Generator, lam: np.ndarray) -> np.ndarray:
    """Poisson counts: exact for small means (the latency tail matters for SLOs), normal approximation
    for large ones, where Poisson sampling is the most expensive call of a step."""
    big = np.rint(lam + np.sqrt(lam) * rng.standard_normal(lam.shape))
    return np.where(lam >= 30.0, np.maximum(big, 0.0), rng.poisson(np.minimum(lam, 30.0)))


def sprinkle(rng: np.random.Generator, counter: np.ndarray, mean_total: float) -> None:
    """Rare independent increments over a whole fleet: draw how many, then where (cheaper than a
    Poisson draw per GPU when almost all are zero)."""
    k = int(rng.poisson(mean_total))
    if k:
        np.add.at(counter, rng.integers(0, counter.shape[-1], k), 1.0)

