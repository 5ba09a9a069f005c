"""A controller restart forgets nothing a node is expected to report (issue 14's expectation model, "prior"):
the structural tracker's memory (the most GPUs each node has had, and their ids) is kept in the SQLite
state store next to the lifecycles. Each restart here is new objects (Controller, SqliteStore) on the
same database file, as a new process would be; the sources are the in-process fleet of test_controller."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fleethealth.controller.loop import Controller
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import default_policy
from fleethealth.signals.snapshot import Snapshot
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


def test_gated_node_stays_gated_across_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    clock = FakeClock()
    src = FleetSource()
    ctl, store = _controller(db, src, clock)
    run_for(ctl, clock, 60)
    _without(src, "n2", "3")
    run_for(ctl, clock, 30)
    assert ctl.state.entities["n2"].state == State.QUARANTINED
    h = ctl.published.health
    assert h is not None and h.tuples["n2"].reason == "gate:gpus_missing"
    store.close()
    # restart: a new process has no history and no memory of its own; the store has both
    clock.t += 300
    ctl2, store2 = _controller(db, src, clock)
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
