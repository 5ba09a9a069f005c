"""A changed metadata label (a driver upgraded or rolled back) is read the cycle it is scraped.

A real rollback changes a node's info labels and its DCGM series' labels: a new series with the new value,
while the old one stays in the history's view, stale, for ``memory_s`` (an hour). The newest series must
speak for the entity (issue 16 follow-up: the held nodes of driver-not-rolled-back read the bad driver
for an hour after the rollback, and version holds release a node only when its label changes).
Real parts: SnapshotBuilder -> SignalHistory -> the engine's Scorer -> DecisionLoop, no mocks.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.decide.loop import DecisionLoop
from fleethealth.policy import default_policy
from fleethealth.score.scorer import Scorer
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

NODES = 4
GOOD, BAD = "550.54.15", "565.57.01"


def _scrape(t: float, drivers: dict[str, str], both: frozenset[str] = frozenset()) -> Snapshot:
    """One scrape of NODES nodes x 2 GPUs: DCGM gauges and a node info series, each carrying the node's
    driver. A node in ``both`` exposes its old (GOOD) and new series in this same scrape."""
    b = SnapshotBuilder()
    for n in range(NODES):
        node = f"node-{n}"
        versions = [drivers.get(node, GOOD)]
        if node in both:
            versions.insert(0, GOOD)
        for drv in versions:
            b.add("fleethealth_node_info", {"node": node, "pool": "p", "driver_version": drv}, 1.0, t)
            for g in range(2):
                lab = {"Hostname": node, "gpu": str(g), "UUID": f"GPU-{n}-{g}", "driver_version": drv}
                b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
                b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, t)
                b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
    return b.build(t)


def _drivers(schedule: list[tuple[float, dict[str, str]]], ask: list[float],
             both: dict[float, frozenset[str]] | None = None) -> dict[float, tuple[str | None, str | None]]:
    """Feed one scrape every 15 s through a history and the engine; at each time in ``ask``, node-1's
    driver label as its node tuple and its first GPU's tuple read it."""
    policy = default_policy()
    history, scorer = SignalHistory(policy), Scorer()
    out: dict[float, tuple[str | None, str | None]] = {}
    for t, drivers in schedule:
        history.add(_scrape(t, drivers, (both or {}).get(t, frozenset())))
        if t in ask:
            fh = scorer.score(history.view(t), policy, t, "remediation")
            tuples = fh.tuples
            out[t] = (tuples["node-1"].labels.get("driver_version"),
                      tuples["node-1/gpu0"].labels.get("driver_version"))
            assert tuples["node-2"].labels.get("driver_version") == GOOD  # untouched nodes keep theirs
    return out


def _timeline(changes: dict[float, str], end: float) -> list[tuple[float, dict[str, str]]]:
    drv = GOOD
    out = []
    for i in range(int(end // 15) + 1):
        t = 15.0 * i
        drv = changes.get(t, drv)
        out.append((t, {"node-1": drv}))
    return out


def test_an_upgrade_is_read_the_scrape_it_lands() -> None:
    """Before the fix the GPU read the old driver (its lowest series id) until the old series was
    forgotten an hour later."""
    got = _drivers(_timeline({60.0: BAD}, 120.0), [45.0, 60.0, 120.0])
    assert got[45.0] == (GOOD, GOOD)
    assert got[60.0] == (BAD, BAD)
    assert got[120.0] == (BAD, BAD)


def test_a_rollback_to_a_series_still_remembered_is_read_the_scrape_it_lands() -> None:
    """Upgrade at 60 s, rollback at 300 s: the GOOD series is still in the view (stale), the BAD one too.
    Before the fix the node read BAD (the info series interned last) until BAD was forgotten."""
    got = _drivers(_timeline({60.0: BAD, 300.0: GOOD}, 390.0), [285.0, 300.0, 390.0])
    assert got[285.0] == (BAD, BAD)
    assert got[300.0] == (GOOD, GOOD)
    assert got[390.0] == (GOOD, GOOD)


def test_a_rollback_after_the_old_series_was_forgotten() -> None:
    """The probe's shape: the bad driver for over an hour, then rolled back."""
    got = _drivers(_timeline({60.0: BAD, 4200.0: GOOD}, 4260.0), [4185.0, 4200.0, 4215.0])
    assert got[4185.0] == (BAD, BAD)
    assert got[4200.0] == (GOOD, GOOD)
    assert got[4215.0] == (GOOD, GOOD)


def test_two_fresh_series_in_one_scrape_the_label_set_seen_last_wins() -> None:
    """An exporter exposing the old and the new label set in the same scrape (mid-restart): equal times,
    so the label set the stream saw last (interned last: the new one) speaks; the next scrape without the
    old one settles it either way."""
    sched = _timeline({60.0: BAD}, 90.0)
    got = _drivers(sched, [60.0, 75.0], both={60.0: frozenset({"node-1"})})
    assert got[60.0] == (BAD, BAD)
    assert got[75.0] == (BAD, BAD)


def test_the_decider_state_follows_a_rollback_within_the_memory() -> None:
    """The decider keeps labels while the view's set of series is unchanged (``labels_key``): a rollback
    to a label set still remembered changes no set, yet must reach the lifecycle state at once."""
    policy = default_policy()
    loop = DecisionLoop(policy)
    seen: dict[float, str | None] = {}
    for t, drivers in _timeline({60.0: BAD, 300.0: GOOD}, 330.0):
        res = loop.cycle(_scrape(t, drivers), t)
        seen[t] = res.decision.state.entities["node-1"].labels.get("driver_version")
    assert seen[45.0] == GOOD
    assert seen[60.0] == BAD
    assert seen[285.0] == BAD
    assert seen[300.0] == GOOD
    assert seen[330.0] == GOOD


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([GOOD, BAD, "570.86.10"]), min_size=2, max_size=12),
       st.lists(st.integers(1, 300), min_size=12, max_size=12))
def test_any_sequence_of_driver_changes_reads_the_latest_scraped(drivers: list[str], gaps: list[int]) -> None:
    """Invariant: whatever the changes (back to a remembered label set, or not) and the gaps between them
    (seconds, within the hour the old series is remembered), the engine's tuples and the decider's state
    read the driver of the latest scrape, every cycle."""
    policy = default_policy()
    loop = DecisionLoop(policy)
    t = 0.0
    for drv, gap in zip(drivers, gaps, strict=False):
        for _ in range(2):  # two scrapes on each driver: the change, then a steady one
            res = loop.cycle(_scrape(t, {"node-1": drv}), t)
            assert res.health.tuples["node-1"].labels.get("driver_version") == drv
            assert res.health.tuples["node-1/gpu1"].labels.get("driver_version") == drv
            assert res.decision.state.entities["node-1"].labels.get("driver_version") == drv
            t += 15.0
        t += float(gap)
