"""A relabelled entity's old series no longer counts once a newer series of the same metric replaced it.

A relabel (a driver rolled back) ends every DCGM series of a node and starts new ones. The old series'
last sample stays within ``freshness.max_age_s`` for a scrape or two; Prometheus marks it stale at the first
scrape without it, and so must the engine: only an entity's series at its newest sample time count
(``score.signals._current``). Here the old series' last value is a gate (``recovery_action`` 1, the bad
driver's) and the new one is healthy: before the fix the GPU was gated at the rollback. Series of one
scrape share a timestamp, so a gate in a series still scraped beside others still counts.
Real parts: SnapshotBuilder -> SignalHistory (the fast path) or a plain snapshot (the per-signal path)
-> the engine's Scorer, and the scalar reference scorer; no mocks.
"""

from __future__ import annotations

import pytest

from fleethealth.backtest.runner import decision_records, run_backtest
from fleethealth.cli.cmd_backtest import load_inputs
from fleethealth.policy import default_policy
from fleethealth.score.reference import score_reference
from fleethealth.score.scorer import Scorer
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

POLICY = default_policy()
NODES = 4
GOOD, BAD = "550.54.15", "565.57.01"
ROLLBACK = 60.0  # node-1 runs the bad driver (recovery_action 1) until here, the good one (0) from here


def _add_scrape(b: SnapshotBuilder, t: float, both: bool = False, bad_action: float = 1.0,
                bad_xid: float = 0.0) -> None:
    """One scrape at ``t`` of NODES nodes x 2 GPUs. ``both``: node-1 exposes its old (bad, gated) and its
    new (good) series in this same scrape. The bad driver's series read ``bad_action`` (recovery action)
    and, from 30 s, ``bad_xid`` (DCGM's last Xid)."""
    for n in range(NODES):
        node = f"node-{n}"
        if n == 1:
            versions = [(BAD, 1.0), (GOOD, 0.0)] if both else [(BAD, 1.0) if t < ROLLBACK else (GOOD, 0.0)]
        else:
            versions = [(GOOD, 0.0)]
        for drv, is_bad in versions:
            action = bad_action if is_bad else 0.0
            xid = bad_xid if is_bad and t >= 30.0 else 0.0
            b.add("fleethealth_node_info", {"node": node, "pool": "p", "driver_version": drv}, 1.0, t)
            for g in range(2):
                lab = {"Hostname": node, "gpu": str(g), "UUID": f"GPU-{n}-{g}", "driver_version": drv}
                b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
                b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, t)
                b.add("DCGM_FI_DEV_XID_ERRORS", lab, xid, t)
                b.add("DCGM_FI_DEV_GPU_RECOVERY_ACTION", lab, action, t)


def _scrape(t: float, both: bool = False) -> Snapshot:
    b = SnapshotBuilder()
    _add_scrape(b, t, both)
    return b.build(t)


def _plain(until: float) -> Snapshot:
    """Every scrape from 0 to ``until`` in one snapshot (no history: the per-signal path)."""
    b = SnapshotBuilder()
    t = 0.0
    while t <= until:
        _add_scrape(b, t)
        t += 15.0
    return b.build(until)


def _gated(value: float | None, reason: str) -> bool:
    return value == 0.0 and reason == "gate:recovery_action"


def test_history_path_old_series_gate_does_not_count_after_relabel() -> None:
    history, scorer = SignalHistory(POLICY), Scorer()
    seen: dict[float, tuple[float | None, str]] = {}
    for i in range(7):
        t = 15.0 * i
        history.add(_scrape(t))
        h = scorer.score(history.view(t), POLICY, t, "remediation").tuples["node-1/gpu0"]
        seen[t] = (h.value, h.reason)
    assert _gated(*seen[45.0])  # the bad driver's gate counts while its series is the newest
    for t in (60.0, 75.0, 90.0):  # the old series' last sample (45 s) is still within max_age
        value, reason = seen[t]
        assert not _gated(value, reason), (t, value, reason)
        assert value is not None and value > 0.0


def test_plain_snapshot_path_and_reference_agree() -> None:
    for until in (45.0, 60.0, 75.0):
        snap = _plain(until)
        h = Scorer().score(snap, POLICY, until, "remediation").tuples["node-1/gpu0"]
        ref = score_reference(snap, POLICY, until)["node-1/gpu0"]
        want_gate = until < ROLLBACK
        assert _gated(h.value, h.reason) == want_gate, (until, h.value, h.reason)
        assert (ref.value == 0.0 and ref.reason == "gate:recovery_action") == want_gate, (until, ref)


def test_a_gate_in_a_series_scraped_beside_a_new_one_still_counts() -> None:
    """Two series of one GPU in the same scrape share its timestamp: neither supersedes the other, and
    the worst (the gate) decides. Missing or superseded data never reads healthier than what is scraped."""
    history, scorer = SignalHistory(POLICY), Scorer()
    for i in range(4):
        history.add(_scrape(15.0 * i, both=(i == 3)))
    h = scorer.score(history.view(45.0), POLICY, 45.0, "remediation").tuples["node-1/gpu0"]
    assert _gated(h.value, h.reason)
    snap = _scrape(45.0, both=True)
    plain = Scorer().score(snap, POLICY, 45.0, "remediation").tuples["node-1/gpu0"]
    assert _gated(plain.value, plain.reason)
    ref = score_reference(snap, POLICY, 45.0)["node-1/gpu0"]
    assert ref.value == 0.0 and ref.reason == "gate:recovery_action"


def test_an_old_series_xid_does_not_gate_after_relabel() -> None:
    """The bad driver's last-Xid gauge reads 79 (fallen off the bus: a gate) from 30 s; after the rollback
    the new series reads 0. The old series' Xid gated the GPU until its last sample went stale."""
    history, scorer = SignalHistory(POLICY), Scorer()
    plain = SnapshotBuilder()
    for i in range(7):
        t = 15.0 * i
        scrape = SnapshotBuilder()
        _add_scrape(scrape, t, bad_action=0.0, bad_xid=79.0)
        _add_scrape(plain, t, bad_action=0.0, bad_xid=79.0)
        history.add(scrape.build(t))
        h = scorer.score(history.view(t), POLICY, t, "remediation").tuples["node-1/gpu0"]
        snap = plain.build(t)
        p = Scorer().score(snap, POLICY, t, "remediation").tuples["node-1/gpu0"]
        ref = score_reference(snap, POLICY, t)["node-1/gpu0"]
        want_gate = 30.0 <= t < ROLLBACK
        for got in (h, p, ref):
            assert (got.value == 0.0 and got.reason == "gate:xid") == want_gate, (t, got)


@pytest.mark.slow
def test_bad_driver_rollout_quarantines_no_healthy_node_at_the_rollback() -> None:
    """The built-in scenario (about 10 s): at 20.0 h pool train-b is rolled back to the good driver and
    every node's DCGM series are relabelled. Before the fix the old series' ``recovery_action`` 1 gated
    node-36/37/41 at 20.0 h (quarantined, a reset each, train-b's hard-gate budget exhausted, 11 more
    nodes held), all healthy on the good driver."""
    sc, pol = load_inputs("bad-driver-rollout", None, "20h30m", None)
    records = decision_records(run_backtest(sc, pol, [], cycle_s=60.0))
    rollback = 20 * 3600.0
    at = [r for r in records if rollback <= r["t_s"] < rollback + 1800.0]
    assert not [r for r in at if r["record"] == "transition" and r["to"] == "QUARANTINED"]
    assert not [r for r in at if str(r["reason"]).startswith(("gate:", "held:budget", "budget_exhausted"))]
    # the version veto lifts at the rollback: the held nodes on the good driver are released
    assert {r["entity"] for r in at if str(r["reason"]).startswith("version_resolved")} == {"node-32", "node-34"}
