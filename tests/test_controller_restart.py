"""A controller restart forgets nothing a node is expected to report (issue 14's expectation model, "prior"):
the structural tracker's memory (the most GPUs each node has had, and their ids) is kept in the SQLite
state store next to the lifecycles. Each restart here is new objects (Controller, SqliteStore) on the
same database file, as a new process would be; the sources are the in-process fleet of test_controller."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fleethealth.controller.loop import Controller
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import default_policy
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.store.sqlite import SqliteStore
from test_controller import FakeClock, FleetSource, run_for


def _without(src: FleetSource, node: str, gpu: str) -> None:
    orig = src.read

    def read(now: float) -> Snapshot:
        snap = orig(now)
        k = np.asarray([("gpu", gpu) not in snap.labelsets[s] or ("Hostname", node) not in snap.labelsets[s]
                        for s in snap.series_ids.tolist()], bool)
        return Snapshot(now, snap.metrics, snap.labelsets, snap.metric_ids[k], snap.series_ids[k],
                        snap.values[k], snap.ts[k])

    src.read = read  # type: ignore[method-assign]


def _controller(db: Path, src: FleetSource, clock: FakeClock) -> tuple[Controller, SqliteStore]:
    store = SqliteStore(db)
    return Controller(default_policy(), [src], interval_s=15.0, clock=clock, store=store), store


def _gate_n2_then_restart(tmp_path: Path) -> tuple[Controller, Controller, SqliteStore, FleetSource, FakeClock]:
    """A controller gates n2 (GPU 3 gone) and stops; five minutes later a new process opens the same store.
    Returns the stopped controller (for what it recorded), the new one, its store, the source and the clock."""
    db = tmp_path / "state.db"
    clock = FakeClock()
    src = FleetSource()
    ctl, store = _controller(db, src, clock)
    run_for(ctl, clock, 60)
    _without(src, "n2", "3")
    run_for(ctl, clock, 30)
    assert ctl.state.entities["n2"].state == State.QUARANTINED
    store.close()
    clock.t += 300  # a new process has no history and no memory of its own; the store has both
    ctl2, store2 = _controller(db, src, clock)
    return ctl, ctl2, store2, src, clock


def test_gated_node_stays_gated_across_a_restart(tmp_path: Path) -> None:
    ctl, ctl2, store2, src, clock = _gate_n2_then_restart(tmp_path)
    h = ctl.published.health
    assert h is not None and h.tuples["n2"].reason == "gate:gpus_missing"
    run_for(ctl2, clock, 60)
    assert ctl2.state.entities["n2"].state == State.QUARANTINED
    h = ctl2.published.health
    assert h is not None and h.tuples["n2"].value == 0.0 and h.tuples["n2"].reason == "gate:gpus_missing"
    allow = [i for i in ctl2.recent_intents if i["entity"] == "n2" and i["intent"] == str(IntentKind.ALLOW_NEW_WORK)]
    assert not allow
    # the missing GPU is shown, unknown, not dropped from the node
    g3 = h.tuples.get("n2/gpu3")
    assert g3 is not None and g3.value is None
    store2.close()


def test_gpu_removed_while_the_controller_was_down_is_detected_at_start(tmp_path: Path) -> None:
    """No ``gpu_capacity`` configured: only the stored memory says n4 had eight GPUs."""
    db = tmp_path / "state.db"
    clock = FakeClock()
    src = FleetSource()
    ctl, store = _controller(db, src, clock)
    run_for(ctl, clock, 60)
    assert {e.state for e in ctl.state.entities.values()} == {State.READY}
    store.close()
    clock.t += 3600  # the controller is down for an hour; meanwhile GPU 6 of n4 is gone
    _without(src, "n4", "6")
    ctl2, store2 = _controller(db, src, clock)
    first = ctl2.cycle()  # the first scrape after start fills the history (rates need two); shown, not decided
    h = ctl2.published.health
    assert h is not None and h.tuples["n4"].reason == "gate:gpus_missing" and h.tuples["n4"].value == 0.0
    assert first.skipped.startswith("warming up") and not first.transitions
    clock.t += ctl2.interval_s
    rep = ctl2.cycle()
    assert [(t.entity, t.to_state) for t in rep.transitions] == [("n4", State.QUARANTINED)]
    assert store2.expectations()[("n4", "gpus")].startswith('{"count": 8')
    store2.close()


class _RankedSource(FleetSource):
    """``FleetSource`` plus a training rank's step timing on every GPU; ``no_dcgm``: nodes whose
    dcgm-exporter is gone (their ranks still report)."""

    def __init__(self, nodes: int) -> None:
        super().__init__(nodes)
        self.no_dcgm: set[str] = set()

    def read(self, now: float) -> Snapshot:
        base = super().read(now)
        b = SnapshotBuilder()
        for mid, sid, v, t in zip(base.metric_ids.tolist(), base.series_ids.tolist(), base.values.tolist(),
                                  base.ts.tolist(), strict=True):
            lab = dict(base.labelsets[sid])
            if lab.get("Hostname") not in self.no_dcgm:
                b.add(base.metrics[mid], lab, v, t)
        for n in range(self.nodes):
            for g in range(8):
                b.add("fleethealth_rank_compute_seconds", {"job": "train", "rank": str(8 * n + g), "node": f"n{n}",
                                                           "gpu": str(g), "peer_group": "s0"}, 0.5, now)
        return b.build(now)


def test_a_signal_family_gone_while_the_controller_was_down_is_missing_not_forgotten(tmp_path: Path) -> None:
    """Two nodes: too few for peers to tell (8 of 16 GPUs is no majority), so only the stored prior says
    n1's GPUs reported DCGM fields before. Before the families were kept, n1 read 1.0 at confidence 1.0
    after the restart (its ranks alone)."""
    db = tmp_path / "state.db"
    clock = FakeClock()
    src = _RankedSource(2)
    ctl, store = _controller(db, src, clock)
    run_for(ctl, clock, 60)
    assert json.loads(store.expectations()[("n1", "families")])["families"].keys() == {"DCGM", "rank"}
    store.close()
    clock.t += 1800  # down for half an hour; meanwhile n1's dcgm-exporter is gone
    src.no_dcgm.add("n1")
    ctl2, store2 = _controller(db, src, clock)
    ctl2.cycle()  # warm-up: scored and shown, not decided
    h = ctl2.published.health
    assert h is not None
    g = h.tuples["n1/gpu0"]
    assert g.reason == "missing:DCGM" and g.confidence < ctl2.policy.lifecycle.min_confidence
    d = {x.signal: x for x in g.details}["gpu_temp"]
    assert d.score is None and d.expected_by.startswith("it reported this family before")
    n0 = h.tuples["n0/gpu0"]  # its PCIe replay counter needs a second sample: 4 of 5 fresh
    assert n0.reason == "min:hardware" and n0.confidence > ctl2.policy.lifecycle.min_confidence
    # a standby taking over restores the same prior (the take-over path reads the store again)
    ctl2.families.seen.clear()
    ctl2._restore_expectations()
    assert "DCGM" in ctl2.families.expectations(clock.t).families["n1"]
    store2.close()


def test_transitions_and_intents_are_served_from_the_store_after_a_restart(tmp_path: Path) -> None:
    """Finding 4: a restarted controller (a new process: new Controller, new store object, nothing in
    memory) serves the transitions and intents of before its restart on /api/v1/transitions, /intents,
    the entity page and `fleethealth describe` (a real HTTP server, real client process)."""
    import os
    import subprocess
    import sys

    import httpx

    from fleethealth.controller.api import ApiServer
    from prom_harness import free_port

    ctl, ctl2, store2, src, clock = _gate_n2_then_restart(tmp_path)
    before = [t for t in ctl.recent_transitions if t["entity"] == "n2"]
    before_intents = [i for i in ctl.recent_intents if i["entity"] == "n2"]
    assert before and before_intents
    srv = ApiServer(ctl2, "127.0.0.1", free_port()).start()
    try:
        run_for(ctl2, clock, 30)
        assert not [t for t in ctl2.recent_transitions if t["entity"] == "n2"]  # nothing new in this process
        trs = httpx.get(f"{srv.url}/api/v1/transitions").json()["transitions"]
        assert [(t["ts"], t["to"]) for t in trs if t["entity"] == "n2"] == [(t["ts"], t["to"]) for t in before]
        one = httpx.get(f"{srv.url}/api/v1/transitions", params={"entity": "n2", "limit": 1}).json()["transitions"]
        assert [t["to"] for t in one] == [before[-1]["to"]] == ["QUARANTINED"]
        assert httpx.get(f"{srv.url}/api/v1/transitions", params={"until": before[0]["ts"] - 1}).json()[
            "transitions"] == [t for t in trs if t["ts"] <= before[0]["ts"] - 1]
        ints = httpx.get(f"{srv.url}/api/v1/intents", params={"entity": "n2"}).json()["intents"]
        assert {i["key"] for i in before_intents} <= {i["key"] for i in ints}
        page = httpx.get(f"{srv.url}/entity/n2").text
        assert f"{len(before)} transitions" in page and "QUARANTINED" in page.split('id="feed"')[1], page[-3000:]
        env = {k: v for k, v in os.environ.items() if k not in ("FLEETHEALTH_SERVER", "FLEETHEALTH_TOKEN")}
        r = subprocess.run([sys.executable, "-m", "fleethealth.cli.main", "describe", "node", "n2", "--server",
                            srv.url], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        assert "Transitions: none recent" not in r.stdout and "-> QUARANTINED" in r.stdout, r.stdout
        assert "Intents:     none recent" not in r.stdout, r.stdout
    finally:
        srv.stop()
        store2.close()
