"""The four normalisation shapes at their edges, as the scores an operator reads (issue 21): a gate on listed
values, a ramp at warn and crit, peer medians and MAD of groups of one, two and more, the MAD floor among
identical peers, the deviation dead band, burn rates with no traffic, an SLO score with one window missing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleethealth.score import shapes

NAN = float("nan")


def same(a: np.ndarray, b: list[float]) -> bool:
    return bool(np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), equal_nan=True))


def test_ramp_edges_and_missing() -> None:
    out = shapes.ramp(np.array([84.9, 85.0, 87.5, 95.0, 99.0, NAN]), 85.0, 95.0)
    assert same(out, [1.0, 1.0, 0.75, 0.0, 0.0, NAN])
    assert out.dtype == np.float64
    # worse-when-lower (crit < warn): 10 -> 1, 5 -> 0.5, 0 -> 0
    assert same(shapes.ramp(np.array([12.0, 10.0, 5.0, 0.0, -1.0]), 10.0, 0.0), [1.0, 1.0, 0.5, 0.0, 0.0])
    # a list of ints is read as floats
    assert same(shapes.ramp([1, 2, 3], 1, 3), [1.0, 0.5, 0.0])  # type: ignore[arg-type]


def test_gate_on_listed_values_directly() -> None:
    # the fatal values only: 2 and 4 gate, 3 and 5 do not, NaN stays missing (never healthy, never fatal)
    out = shapes.gate(np.array([0.0, 2.0, 3.0, 4.0, 5.0, NAN]), values=[2.0, 4.0])
    assert same(out, [1.0, 0.0, 1.0, 0.0, 1.0, NAN])
    # ints in the list match float readings
    assert same(shapes.gate(np.array([1.0, 2.0]), values=[2]), [1.0, 0.0])  # type: ignore[list-item]
    # an empty list gates nothing
    assert same(shapes.gate(np.array([0.0, 2.0, NAN]), values=[]), [1.0, 1.0, NAN])


def test_gate_above_is_strict_and_combines_with_values() -> None:
    out = shapes.gate(np.array([-1.0, 0.0, 0.5, 1.0, NAN]), above=0.0)
    assert same(out, [1.0, 1.0, 0.0, 0.0, NAN])
    # either condition gates
    out = shapes.gate(np.array([-3.0, 0.0, 1.0, 7.0]), above=5.0, values=[-3.0])
    assert same(out, [0.0, 1.0, 1.0, 0.0])
    # neither given: nothing is fatal
    assert same(shapes.gate(np.array([1e9, NAN])), [1.0, NAN])
    # a gate at above=0 does not trip on 0 (a zero count is healthy)
    assert shapes.gate(np.array([0.0]), above=0.0)[0] == 1.0


def test_group_median_odd_even_empty_and_missing() -> None:
    vals = np.array([5.0, 1.0, 3.0, 10.0, 20.0, NAN, 7.0, NAN])
    groups = np.array([0, 0, 0, 1, 1, 1, 3, 2])
    med, counts = shapes.group_median(vals, groups, 5)
    # group 0: 1,3,5 -> 3; group 1: 10,20 (NaN ignored) -> 15; group 2: only NaN -> NaN; 3: one value; 4: none
    assert same(med, [3.0, 15.0, NAN, 7.0, NAN])
    assert counts.tolist() == [3, 2, 0, 1, 0]


def test_group_median_many_groups_uses_wide_ids() -> None:
    # more than 32767 groups: the group ids must not be narrowed to 16 bits
    n = 40000
    groups = np.arange(n, dtype=np.int64)[::-1].copy()
    vals = groups.astype(np.float64) * 2.0
    med, counts = shapes.group_median(vals, groups, n)
    assert np.array_equal(med, np.arange(n) * 2.0)
    assert counts.min() == 1 and counts.max() == 1


@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-1e6, 1e6)), min_size=1, max_size=40))
def test_group_median_equals_numpy_median(pairs: list[tuple[int, float]]) -> None:
    groups = np.array([g for g, _ in pairs])
    vals = np.array([v for _, v in pairs])
    med, counts = shapes.group_median(vals, groups, 5)
    for g in range(5):
        sel = vals[groups == g]
        assert counts[g] == sel.size
        if sel.size:
            assert med[g] == pytest.approx(float(np.median(sel)), rel=1e-12, abs=1e-12)
        else:
            assert np.isnan(med[g])


def test_robust_z_values_and_sign() -> None:
    # group 0: 10, 12, 14, 100 -> median 13, |dev| 3,1,1,87 -> MAD 2; z = dev / (1.4826 * 2)
    vals = np.array([10.0, 12.0, 14.0, 100.0, 5.0, 5.0, 6.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 1])
    z, med, mad, counts = shapes.peer_robust_z(vals, groups, 2)
    assert same(med, [13.0, 5.0])
    assert same(mad, [2.0, 0.0])
    assert counts.tolist() == [4, 3]
    assert z[:4] == pytest.approx(np.array([-3.0, -1.0, 1.0, 87.0]) / (1.4826 * 2.0))
    # group 1: MAD 0 among identical peers -> the floor is 0.001 of the median (0.005), not a division by 0
    assert z[4:] == pytest.approx(np.array([0.0, 0.0, 1.0 / (1.4826 * 0.005)]))
    zl, *_ = shapes.peer_robust_z(vals, groups, 2, worse_if="lower")
    assert zl == pytest.approx(-z)


def test_robust_z_mad_floor_options_and_absolute_floor() -> None:
    vals = np.array([100.0, 100.0, 100.0, 101.0])
    groups = np.zeros(4, np.int64)
    z, med, mad, _ = shapes.peer_robust_z(vals, groups, 1, mad_floor_rel=0.01)
    assert med[0] == 100.0 and mad[0] == 0.0
    assert z[3] == pytest.approx(1.0 / (1.4826 * 1.0))
    # median 0 and MAD 0: the absolute floor 1e-9 keeps z finite
    z0, *_ = shapes.peer_robust_z(np.array([0.0, 0.0, 0.0, 1e-9]), groups, 1)
    assert np.isfinite(z0).all()
    assert z0[3] == pytest.approx(1.0 / 1.4826)


def test_robust_z_dead_band_counts_small_deviations_as_none() -> None:
    vals = np.array([100.0, 100.0, 104.0, 96.0, 110.0])
    groups = np.zeros(5, np.int64)
    z, med, mad, _ = shapes.peer_robust_z(vals, groups, 1, min_rel_dev=0.05)
    assert med[0] == 100.0 and mad[0] == 4.0
    # 4% off the median is inside a 5% band: no deviation; 10% is outside and keeps its full size
    assert z.tolist()[:4] == [0.0, 0.0, 0.0, 0.0]
    assert z[4] == pytest.approx(10.0 / (1.4826 * 4.0))
    # exactly at the band's edge counts as a deviation
    z2, *_ = shapes.peer_robust_z(vals, groups, 1, min_rel_dev=0.04)
    assert z2[2] == pytest.approx(4.0 / (1.4826 * 4.0))
    assert z2[3] == pytest.approx(-4.0 / (1.4826 * 4.0))


@given(st.lists(st.tuples(st.integers(0, 3), st.floats(-1e3, 1e3)), min_size=1, max_size=30),
       st.sampled_from(["higher", "lower"]), st.sampled_from([0.0, 0.02]))
def test_laid_out_peers_equal_the_sorted_ones(pairs: list[tuple[int, float]], worse: str, band: float) -> None:
    groups = np.array([g for g, _ in pairs])
    used = np.unique(groups)
    groups = np.searchsorted(used, groups)  # every group non-empty, as PeerLayout requires
    vals = np.array([v for _, v in pairs])
    layout = shapes.PeerLayout(groups, used.size)
    a = shapes.peer_robust_z(vals, groups, used.size, worse_if=worse, min_rel_dev=band)
    b = shapes.peer_robust_z_laid_out(vals, layout, worse_if=worse, min_rel_dev=band)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y, equal_nan=True)


def test_peer_layout_cells_and_fit() -> None:
    groups = np.array([1, 0, 1, 1, 0])
    lay = shapes.PeerLayout(groups, 2)
    assert lay.counts.tolist() == [2, 3]
    assert lay.width == 3
    assert lay.pos.tolist() == [3, 0, 4, 5, 1]
    assert lay.lo.tolist() == [0, 4] and lay.hi.tolist() == [1, 4]
    assert same(lay.median(np.array([9.0, 1.0, 7.0, 8.0, 3.0])), [2.0, 8.0])
    # an empty layout: no width
    empty = shapes.PeerLayout(np.array([], np.int64), 0)
    assert empty.width == 0
    assert shapes.PeerLayout.fits(np.array([], np.int64), 0) is False
    assert shapes.PeerLayout.fits(np.array([0, 1]), 0) is False
    # similar sizes fit; one giant group among many singletons does not
    assert shapes.PeerLayout.fits(np.repeat(np.arange(10), 8), 10) is True
    lopsided = np.concatenate([np.zeros(200, np.int64), np.arange(1, 101)])
    assert shapes.PeerLayout.fits(lopsided, 101) is False
    # exactly at the limit: 16 groups of width 8 (128 cells) for 32 values (2 * 32 + 64 = 128) fit
    g5 = np.concatenate([np.zeros(8, np.int64), np.arange(1, 16), np.arange(1, 10)])  # 32 values, width 8
    assert g5.size == 32 and int(np.bincount(g5).max()) == 8
    assert shapes.PeerLayout.fits(g5, 16) is True
    g6 = np.concatenate([np.zeros(9, np.int64), np.arange(1, 16), np.arange(1, 9)])  # 32 values, width 9
    assert g6.size == 32 and shapes.PeerLayout.fits(g6, 16) is False


def test_burn_rate_no_traffic_missing_and_clipped() -> None:
    bad = np.array([0.0, 1.0, 5.0, 3.0, NAN, 1.0, 0.0])
    total = np.array([0.0, 100.0, 100.0, 2.0, 10.0, NAN, 50.0])
    out = shapes.burn_rate(bad, total, 0.99)
    # no traffic burns nothing; 1% bad of a 1% budget is 1x; 5% is 5x; more bad than total clips to 100x
    assert out[0] == 0.0
    assert out[1] == pytest.approx(1.0)
    assert out[2] == pytest.approx(5.0)
    assert out[3] == pytest.approx(100.0)
    assert np.isnan(out[4]) and np.isnan(out[5])
    assert out[6] == 0.0
    assert shapes.burn_rate(np.array([1.0]), np.array([10.0]), 0.9)[0] == pytest.approx(1.0)


def test_slo_score_needs_both_windows_and_worst_pair_wins() -> None:
    long_b = np.array([20.0, 1.0, 8.0, 20.0])
    short_b = np.array([20.0, 20.0, 8.0, 0.5])
    # page factor 14.4: both windows over it -> 0; one window quiet -> the smaller burn decides
    out = shapes.slo_score([(long_b, short_b, 14.4)])
    assert out[0] == 0.0
    assert out[1] == 1.0
    assert out[2] == pytest.approx(1.0 - 7.0 / 13.4)
    assert out[3] == 1.0
    # a second pair (slow burn, factor 6) is worse for the third entity: the worst pair wins
    out2 = shapes.slo_score([(long_b, short_b, 14.4), (np.array([1.0, 1.0, 6.0, 1.0]),
                                                       np.array([1.0, 1.0, 7.0, 1.0]), 6.0)])
    assert same(out2, [0.0, 1.0, 0.0, 1.0])


def test_slo_score_with_one_burn_window_missing_is_missing() -> None:
    long_b = np.array([NAN, 20.0, NAN, 3.0])
    short_b = np.array([20.0, NAN, NAN, 3.0])
    out = shapes.slo_score([(long_b, short_b, 14.4)])
    # a missing window is missing data, never healthy (fmin alone would read it as the other window)
    assert np.isnan(out[0]) and np.isnan(out[1]) and np.isnan(out[2])
    assert out[3] == pytest.approx(1.0 - 2.0 / 13.4)
    # with a second, complete pair the missing one is passed over by fmin: that pair decides
    out2 = shapes.slo_score([(long_b, short_b, 14.4), (np.full(4, 1.0), np.full(4, 1.0), 6.0)])
    assert same(out2[:3], [1.0, 1.0, 1.0])


def test_slo_score_needs_a_pair() -> None:
    with pytest.raises(AssertionError):
        shapes.slo_score([])


def test_a_reading_of_none_is_missing_not_a_crash() -> None:
    # a source that hands Python lists with None for an absent sample: missing, never healthy
    assert same(shapes.ramp([None, 90.0], 85.0, 95.0), [NAN, 0.5])  # type: ignore[list-item]
    assert same(shapes.gate([None, 1.0, 0.0], above=0.0), [NAN, 0.0, 1.0])  # type: ignore[arg-type]


def test_medians_of_large_groups_in_any_order() -> None:
    # groups of hundreds of GPUs, values arriving in no order: each group's median is its own
    rng = np.random.default_rng(7)
    groups = rng.integers(0, 3, 3000)
    vals = rng.normal(groups * 10.0, 1.0)
    med, counts = shapes.group_median(vals, groups, 3)
    for g in range(3):
        assert med[g] == float(np.median(vals[groups == g]))
        assert counts[g] == int((groups == g).sum())


def test_burn_rate_edges_an_operator_sees() -> None:
    # errors counted but no requests (a counter race): no traffic, no burn
    assert shapes.burn_rate(np.array([1.0]), np.array([0.0]), 0.99)[0] == 0.0
    # one request, and it failed: the whole budget 100 times over
    assert shapes.burn_rate(np.array([1.0]), np.array([1.0]), 0.99)[0] == pytest.approx(100.0)
    # fractional rates (increase() over a window): 0.25 bad of 0.5 is half bad
    assert shapes.burn_rate(np.array([0.25]), np.array([0.5]), 0.9)[0] == pytest.approx(5.0)
    # a negative bad count (a counter reset inside the window) burns nothing, it does not refund
    assert shapes.burn_rate(np.array([-1.0]), np.array([10.0]), 0.99)[0] == 0.0


def test_peer_layout_keeps_empty_trailing_groups_and_a_single_value_fits() -> None:
    lay = shapes.PeerLayout(np.array([0, 0]), 3)
    assert lay.counts.tolist() == [2, 0, 0]
    assert lay.width == 2
    assert shapes.PeerLayout.fits(np.array([0]), 1) is True
    # one cell over the limit: 67 groups of width 3 (201 cells) for 68 values (2 * 68 + 64 = 200)
    g = np.concatenate([np.zeros(3, np.int64), np.arange(1, 66)])
    assert g.size == 68 and int(np.bincount(g).max()) == 3
    assert shapes.PeerLayout.fits(g, 67) is False


def test_laid_out_defaults_equal_peer_robust_z_defaults() -> None:
    vals = np.array([1.0, 1.2, 1.1, 5.0, 2.0, 2.0, 2.2])
    groups = np.array([0, 0, 0, 0, 1, 1, 1])
    a = shapes.peer_robust_z(vals, groups, 2)
    b = shapes.peer_robust_z_laid_out(vals, shapes.PeerLayout(groups, 2))
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    assert a[0][3] > 3.0  # the outlier stands out with the default (no) dead band
