"""Signal families remembered across restarts on both state-store backends (issue 14: the prior of the
expectation model): the controller learns which families each node's GPUs reported, saves them in the
store's ``expectations`` table through the store interface, and a new controller on the same database
(a restart, or a standby taking over) expects them again. SQLite and PostgreSQL (tests/pg_harness.py;
skipped where the server is not installed)."""

from __future__ import annotations

import json
from typing import Any

from fleethealth.controller.loop import Controller
from fleethealth.policy import default_policy
from fleethealth.score.expect import FamilyMemory
from fleethealth.store import open_store
from test_controller import FakeClock, run_for
from test_controller_restart import _RankedSource
from test_store_conformance import postgres, url  # noqa: F401  (fixtures: one database per backend)


def _controller(db: str, src: Any, clock: FakeClock) -> tuple[Controller, Any]:
    store = open_store(db)
    return Controller(default_policy(), [src], interval_s=15.0, clock=clock, store=store), store


def test_families_survive_a_restart_on_each_backend(url: str) -> None:  # noqa: F811
    clock = FakeClock()
    src = _RankedSource(2)
    ctl, store = _controller(url, src, clock)
    run_for(ctl, clock, 45)
    rows = store.expectations()
    assert json.loads(rows[("n0", "families")])["families"].keys() == {"DCGM", "rank"}
    assert rows[("n1", "gpus")].startswith('{"count": 8')
    store.close()
    clock.t += 600
    src.no_dcgm.add("n1")
    ctl2, store2 = _controller(url, src, clock)
    ctl2.cycle()
    h = ctl2.published.health
    assert h is not None and h.tuples["n1/gpu3"].reason == "missing:DCGM"
    store2.close()


def test_family_memory_is_bounded_and_forgets_what_it_has_not_seen_for_its_ttl() -> None:
    mem = FamilyMemory(ttl_s=100.0, refresh_s=10.0, max_entities=2)
    mem.seen = {"a": {"DCGM": 0.0}, "b": {"DCGM": 50.0}, "c": {"DCGM": 60.0, "rank": 5.0}}
    mem._forget(120.0)  # a and c's rank are older than the ttl; at most two entities
    assert mem.seen == {"b": {"DCGM": 50.0}, "c": {"DCGM": 60.0}}
    rows = mem.rows()
    assert rows[("a", "families")] == "" and json.loads(rows[("c", "families")]) == {"families": {"DCGM": 60.0}}
    assert mem.expectations(120.0).families == {"b": frozenset({"DCGM"}), "c": frozenset({"DCGM"})}
    assert mem.expectations(155.0).families == {"c": frozenset({"DCGM"})}  # b's DCGM past the ttl
    bad = FamilyMemory().restore({("x", "families"): "not json", ("y", "gpus"): "{}"})
    assert bad == ["x"]
