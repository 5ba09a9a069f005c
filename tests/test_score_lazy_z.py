"""_Mats keeps z per row until the whole matrix is asked for: the same values as a full NaN matrix."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.score.context import _Mats


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 6),
                                                                 st.floats(-5, 5)), max_size=12))
def test_lazy_z_equals_full_matrix(m: int, n: int, writes: list[tuple[int, int, float]]) -> None:
    mats, full = _Mats(m, n), np.full((m, n), np.nan)
    results = [mats.result(j) for j in range(m)]
    for j, e, v in writes:
        if j < m and e < n:
            results[j].z[e] = v  # written where taken, as _shape_peer does
            full[j, e] = v
    for j in range(m):  # rows read before the matrix is stacked
        np.testing.assert_array_equal(results[j].z, full[j])
    np.testing.assert_array_equal(mats.z, full)
    for j in range(m):  # and after: views of it
        np.testing.assert_array_equal(results[j].z, full[j])
        assert results[j].z.base is mats.z or results[j].z.base is mats.z.base
