"""The backtest's score timeline (columns remembered per names list) holds what a plain per-entity loop
would: every cycle's value per node and replica, NaN when unknown or absent, columns in order of first
appearance, as entities come, go and change order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.backtest.runner import Timeline


@dataclass
class _KS:
    names: list[str]
    value: np.ndarray


class _Health:
    def __init__(self, kinds: dict[str, _KS]) -> None:
        self.kinds = kinds


def _plain(cycles: list[dict[str, _KS]]) -> tuple[list[str], dict[str, str], np.ndarray]:
    names: list[str] = []
    kinds: dict[str, str] = {}
    rows: list[dict[int, float]] = []
    for kk in cycles:
        vals: dict[int, float] = {}
        for kind in ("node", "replica"):
            ks = kk.get(kind)
            if ks is None:
                continue
            for name, v in zip(ks.names, ks.value.tolist(), strict=True):
                if name not in names:
                    names.append(name)
                    kinds[name] = kind
                vals[names.index(name)] = v
        rows.append(vals)
    out = np.full((len(rows), len(names)), np.nan)
    for k, vals in enumerate(rows):
        for i, v in vals.items():
            out[k, i] = v
    return names, kinds, out


names_st = st.lists(st.sampled_from(["n1", "n2", "n3", "r1", "r2"]), unique=True, max_size=4)
value_st = st.one_of(st.just(float("nan")), st.floats(0.0, 1.0))


@settings(max_examples=60, deadline=None)
@given(script=st.lists(st.tuples(names_st, names_st, st.booleans(), st.lists(value_st, min_size=8, max_size=8)),
                       min_size=1, max_size=12))
def test_timeline_matches_a_plain_per_entity_loop(script: list[Any]) -> None:
    tl = Timeline()
    cycles: list[dict[str, _KS]] = []
    same_lists: dict[str, list[str]] = {}
    for t, (node_names, rep_names, reuse, vals) in enumerate(script):
        kinds: dict[str, _KS] = {}
        for kind, nm in (("node", node_names), ("replica", rep_names)):
            if reuse and kind in same_lists:
                nm = same_lists[kind]  # the engine hands over the very same list while the fleet is unchanged
            same_lists[kind] = nm
            kinds[kind] = _KS(nm, np.array(vals[: len(nm)], np.float64))
        cycles.append(kinds)
        tl.add(float(t), _Health(kinds))
    names, kinds_of, mat = _plain(cycles)
    assert tl.names == names and tl.kinds == kinds_of
    got = tl.matrix()
    assert got.shape == mat.shape
    assert np.array_equal(got, mat, equal_nan=True)
