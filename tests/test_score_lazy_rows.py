"""_Mats keeps raw, rate, z and age per row (``_Rows``: rows handed in by the layout plan's compact
buffers, others made NaN where taken) until the whole matrix is asked for: the same values as full NaN
matrices with the same writes, rows read before and after stacking."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.score.context import _Mats

_QS = ("raw", "rate", "z", "age")


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.lists(st.integers(0, 5), max_size=4),
       st.lists(st.tuples(st.sampled_from(_QS), st.integers(0, 5), st.integers(0, 6), st.floats(-5, 5)),
                max_size=16),
       st.sampled_from(_QS))
def test_lazy_rows_equal_full_matrices(m: int, n: int, handed: list[int], writes: list[tuple[str, int, int, float]],
                                       first: str) -> None:
    handed = sorted({j for j in handed if j < m})
    buf = np.full(3 * len(handed) * n, np.nan)  # a plan's compact buffers: one row per handed-in signal
    per_q = {q: {j: buf[(k * len(handed) + i) * n:(k * len(handed) + i + 1) * n] for i, j in enumerate(handed)}
             for k, q in enumerate(("raw", "rate", "age"))}
    mats = _Mats.__new__(_Mats)
    mats.sub, mats.seen = np.full((m, n), np.nan), np.zeros((m, n), bool)
    mats.lazy_rows(m, n, per_q["raw"], per_q["rate"], per_q["age"])
    full = {q: np.full((m, n), np.nan) for q in _QS}
    results = [mats.result(j) for j in range(m)]
    for q, j, e, v in writes:
        if j < m and e < n:
            getattr(results[j], q)[e] = v  # written where taken, as the evaluators do
            full[q][j, e] = v
    for q in _QS:
        for j in range(m):  # rows read before the matrix is stacked
            np.testing.assert_array_equal(getattr(results[j], q), full[q][j])
    for q in (first, *_QS):
        np.testing.assert_array_equal(getattr(mats, q), full[q])
        for j in range(m):  # and after: views of it
            row = getattr(results[j], q)
            np.testing.assert_array_equal(row, full[q][j])
            assert row.base is getattr(mats, q) or row.base is getattr(mats, q).base
