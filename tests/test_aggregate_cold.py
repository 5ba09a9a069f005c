"""A cold cycle's aggregation (score/aggregate.py): the reasons of entities that lack a signal or wait for
a second sample are made once per distinct pattern (``_by_pattern``), and the sub-scores kept to find an
unchanged cycle are only the rows with a fresh sub-score. On random inputs: the same reasons as the loop
per entity, and the same scores as an aggregation with nothing kept (each cycle of a stream)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.score.aggregate import _aggregate, _by_pattern
from fleethealth.score.context import _Mats
from fleethealth.score.kept import Kept


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(0, 60), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_by_pattern_is_the_loop(rows: int, n: int, seed: int, density: float) -> None:
    rng = np.random.default_rng(seed)
    cols = rng.random((rows, n)) < density
    if n and rng.random() < 0.5:  # few patterns: repeat some columns
        cols = cols[:, rng.integers(0, n, n)]
    ents = np.flatnonzero(rng.random(n) < 0.7)

    def make(e: int) -> str:
        return "x:" + ",".join(map(str, np.flatnonzero(cols[:, e]).tolist()))

    got = _by_pattern(ents, cols[:, ents], make)
    want = {e: make(e) for e in ents.tolist()}
    assert got == want and list(got) == list(want)


def _mats(sub: np.ndarray, seen: np.ndarray) -> _Mats:
    m, n = sub.shape
    mt = _Mats(m, n)
    mt.sub[:] = sub
    mt.seen[:] = seen
    return mt


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(2, 5))
def test_kept_live_rows_give_the_scores_of_a_fresh_aggregation(seed: int, n: int, cycles: int) -> None:
    pol = default_policy()
    specs = [s for s in pol.signals if "gpu" in s.entities]
    cats = list(dict.fromkeys(s.category for s in specs if s.score))
    m = len(specs)
    rng = np.random.default_rng(seed)
    # some signals never reported (NaN rows), the rest healthy (1.0: equal cycle to cycle) or not
    live = rng.random(m) < 0.4
    seen = live[:, None] & (rng.random((m, n)) < 0.9)
    kept = Kept()
    sub = np.where(seen, 1.0, np.nan)
    for _ in range(cycles):
        if rng.random() < 0.5:  # change a fresh sub-score, or a whole row (mask changes too)
            sub = sub.copy()
            e = int(rng.integers(0, n))
            j = int(rng.integers(0, m))
            sub[j, e] = rng.choice([0.0, 0.5, np.nan]) if seen[j, e] else np.nan
        names = [f"g{i}" for i in range(n)]
        for how in ("min", "gmean"):
            a = _mats(sub, seen)
            b = _mats(sub, seen)
            got = _aggregate("gpu", names, specs, [a.result(j) for j in range(m)], how, cats, True, {}, a, kept)
            want = _aggregate("gpu", names, specs, [b.result(j) for j in range(m)], how, cats, True, {}, b, None)
            np.testing.assert_array_equal(got.value, want.value)
            np.testing.assert_array_equal(got.confidence, want.confidence)
            np.testing.assert_array_equal(got.worst, want.worst)
            np.testing.assert_array_equal(got.cat, want.cat)
            assert got.reason == want.reason
