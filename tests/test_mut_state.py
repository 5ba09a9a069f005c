"""What the store persists of the decisions layer, field by field (issue 21: decide/state.py and
decide/model.py had no test of their own). A restarted controller resumes from ``DecisionState.from_dict``
of what ``to_dict`` wrote, and the audit log, the API and the outbox read ``Transition.to_dict`` and
``Intent.to_dict``: every field an operator reads must come back under its documented key, with its value,
and a state written by an older version (keys missing) must load with the documented defaults."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fleethealth.decide.lifecycle import Timer
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.decide.state import (
    EVENT_KINDS,
    Decision,
    DecisionState,
    EntityLifecycle,
    Event,
    intent_from_dict,
    transition_from_dict,
)


def _transition() -> Transition:
    return Transition(120.0, "node-3", "node", State.DEGRADED, State.QUARANTINED, "gate:xid", 0.0, 0.9, "v7",
                      "xid 79 fell off the bus")


def _intent(tier: Tier | None = Tier.NODE) -> Intent:
    return Intent(130.0, IntentKind.QUARANTINE, "node-3", "gate:xid", {"n": 4, "gpus": ["GPU-1"]}, tier, True,
                  "v7")


def test_a_transition_is_logged_under_its_documented_keys_and_reads_back_unchanged() -> None:
    t = _transition()
    d = t.to_dict()
    assert d == {"ts": 120.0, "entity": "node-3", "kind": "node", "from": "DEGRADED", "to": "QUARANTINED",
                 "reason": "gate:xid", "value": 0.0, "confidence": 0.9, "policy_version": "v7",
                 "detail": "xid 79 fell off the bus"}
    assert transition_from_dict(json.loads(json.dumps(d))) == t


def test_a_transition_from_an_older_log_without_optional_fields_loads_with_defaults() -> None:
    t = transition_from_dict({"ts": "5", "entity": "r1", "kind": "replica", "from": "READY", "to": "DEGRADED",
                              "reason": "min:serving"})
    assert (t.ts, t.value, t.confidence, t.policy_version, t.detail) == (5.0, None, 0.0, "", "")


def test_an_intent_is_logged_with_its_idempotency_key_and_reads_back_unchanged() -> None:
    i = _intent()
    d = i.to_dict()
    assert d == {"ts": 130.0, "intent": "quarantine", "entity": "node-3", "reason": "gate:xid",
                 "params": {"n": 4, "gpus": ["GPU-1"]}, "tier": "node", "soft": True, "policy_version": "v7",
                 "key": i.key}
    back = intent_from_dict(json.loads(json.dumps(d)))
    assert back == i and back.key == i.key
    # the logged params are a copy: editing the log does not edit the intent
    d["params"]["n"] = 99
    assert i.params["n"] == 4


def test_an_intent_without_a_tier_is_logged_as_null_and_from_an_older_log_defaults_to_hard() -> None:
    i = _intent(tier=None)
    assert i.to_dict()["tier"] is None
    assert intent_from_dict(i.to_dict()).tier is None
    old = intent_from_dict({"ts": 1, "intent": "page", "entity": "fleet", "reason": "budget"})
    assert (old.params, old.tier, old.soft, old.policy_version) == ({}, None, False, "")


def test_the_idempotency_key_depends_on_kind_entity_params_and_tier_but_not_on_time_or_reason() -> None:
    i = _intent()
    same = Intent(999.0, i.kind, i.entity, "other reason", dict(i.params), i.tier, False, "v8")
    assert same.key == i.key and len(i.key) == 16
    assert Intent(i.ts, IntentKind.DRAIN, i.entity, i.reason, i.params, i.tier).key != i.key
    assert Intent(i.ts, i.kind, "node-4", i.reason, i.params, i.tier).key != i.key
    assert Intent(i.ts, i.kind, i.entity, i.reason, {"n": 5}, i.tier).key != i.key
    assert Intent(i.ts, i.kind, i.entity, i.reason, i.params, Tier.POD).key != i.key


def _entity() -> EntityLifecycle:
    return EntityLifecycle(
        entity="node-3", kind="node", state=State.QUARANTINED, since=100.0,
        timers={"below_quarantine": Timer(45.0, 90.0), "flag": Timer(15.0, None)}, transitions=3,
        recoveries=[10.0, 50.0], labels={"pool": "a", "zone": "z1"}, last_value=0.2, last_confidence=0.8,
        last_reason="gate:xid", last_known_ts=95.0, weight=0.5, no_new_work=True, flagged=True,
        blocked="budget:node:a", reset_scheduled=True, absent_since=97.0, overload_until=400.0,
        repair={"ladder": "xid", "step": 1}, blocked_since=80.0, remaps=[[60.0, ["GPU-1"]]],
        episodes=[[70.0, "xid", ["GPU-1", "GPU-2"], "quarantine"]],
        version_hold="version:node:driver_version=560.28.03",
    )


def test_an_entity_survives_a_restart_field_by_field() -> None:
    e = _entity()
    d = json.loads(json.dumps(e.to_dict()))
    assert d == {
        "entity": "node-3", "kind": "node", "state": "QUARANTINED", "since": 100.0,
        "timers": {"below_quarantine": {"accum_s": 45.0, "last_ts": 90.0}, "flag": {"accum_s": 15.0,
                                                                                      "last_ts": None}},
        "transitions": 3, "recoveries": [10.0, 50.0], "labels": {"pool": "a", "zone": "z1"}, "last_value": 0.2,
        "last_confidence": 0.8, "last_reason": "gate:xid", "last_known_ts": 95.0, "weight": 0.5,
        "no_new_work": True, "flagged": True, "blocked": "budget:node:a", "reset_scheduled": True,
        "absent_since": 97.0, "overload_until": 400.0, "repair": {"ladder": "xid", "step": 1},
        "blocked_since": 80.0, "remaps": [[60.0, ["GPU-1"]]],
        "episodes": [[70.0, "xid", ["GPU-1", "GPU-2"], "quarantine"]],
        "version_hold": "version:node:driver_version=560.28.03",
    }
    assert EntityLifecycle.from_dict(d) == e


def test_an_entity_written_by_an_older_version_loads_with_the_documented_defaults() -> None:
    e = EntityLifecycle.from_dict({"entity": "r1", "kind": "replica", "state": "READY", "since": "7"})
    assert e == EntityLifecycle("r1", "replica", State.READY, 7.0)
    assert (e.transitions, e.last_confidence, e.last_reason, e.no_new_work, e.flagged, e.reset_scheduled) == (
        0, 0.0, "", False, False, False)
    assert e.timers == {} and e.recoveries == [] and e.labels == {} and e.remaps == [] and e.episodes == []


def test_a_malformed_episode_is_dropped_on_load_and_the_rest_are_typed() -> None:
    d = _entity().to_dict()
    d["episodes"] = [[1, 2, [3], 4], [5.0, "xid"], "junk", [6.0, "nvlink", ["GPU-9"], "degraded", "extra"]]
    assert EntityLifecycle.from_dict(d).episodes == [[1.0, "2", ["3"], "4"]]


def test_an_entity_copy_is_equal_and_shares_nothing_the_decider_changes() -> None:
    e = _entity()
    c = e.copy()
    assert c == e
    c.timers["below_quarantine"].accum_s = 0.0
    c.recoveries.append(1.0)
    c.labels["pool"] = "b"
    c.remaps[0].append("x")
    c.episodes[0][2].append("GPU-7")
    assert e == _entity()


def test_seen_records_the_observation_and_keeps_everything_else() -> None:
    e = _entity()
    s = e.seen(0.9, 1.0, "ok", 200.0)
    assert (s.last_value, s.last_confidence, s.last_reason, s.last_known_ts) == (0.9, 1.0, "ok", 200.0)
    assert replace(s, last_value=0.2, last_confidence=0.8, last_reason="gate:xid", last_known_ts=95.0) == e
    assert e.last_value == 0.2  # the original is untouched


def _state() -> DecisionState:
    return DecisionState(
        entities={"node-3": _entity(), "node-1": EntityLifecycle("node-1", "node", State.READY, 0.0)},
        ledger=[(100.0, "node:a", "node-3")], app_xids={"node-3": {"job-b": 5.0, "job-a": 6.0}},
        pages={"budget:node:a": 110.0}, frozen=True, frozen_since=111.0, seq=17, last_ts=130.0,
        incidents={"budget:node:a": {"entity": "pool a", "opened": 110.0}},
    )


def test_the_decision_state_survives_a_restart() -> None:
    s = _state()
    d = json.loads(json.dumps(s.to_dict()))
    assert list(d["entities"]) == ["node-1", "node-3"]  # sorted: stable files
    assert d["ledger"] == [[100.0, "node:a", "node-3"]]
    assert d["app_xids"] == {"node-3": {"job-a": 6.0, "job-b": 5.0}}
    assert (d["pages"], d["frozen"], d["frozen_since"], d["seq"], d["last_ts"]) == (
        {"budget:node:a": 110.0}, True, 111.0, 17, 130.0)
    assert d["incidents"] == {"budget:node:a": {"entity": "pool a", "opened": 110.0}}
    assert DecisionState.from_dict(d) == s
    assert DecisionState.from_dict({}) == DecisionState()
    assert s.transition_counts() == {"node-1": 0, "node-3": 3}


def test_shallow_and_deep_copies_leave_the_callers_state_alone() -> None:
    for copy in (DecisionState.shallow, DecisionState.copy):
        s = _state()
        c = copy(s)
        assert c == s
        c.entities["node-9"] = EntityLifecycle("node-9", "node", State.READY, 0.0)
        c.ledger.append((1.0, "node:a", "node-9"))
        c.app_xids["node-3"]["job-c"] = 1.0
        c.pages["x"] = 1.0
        c.incidents["budget:node:a"]["seen"] = 1.0
        assert s == _state()
    deep = _state().copy()
    deep.entities["node-3"].labels["pool"] = "b"
    assert _state().entities["node-3"].labels["pool"] == "a"
    assert deep.entities["node-3"] is not _state().entities["node-3"]


def test_an_event_round_trips_and_an_unknown_kind_is_refused_with_the_known_ones() -> None:
    ev = Event(5.0, "active_test", "node-3", passed=True, to=None, actor="dcgm", payload={"level": 3})
    d = ev.to_dict()
    assert d == {"ts": 5.0, "kind": "active_test", "entity": "node-3", "passed": True, "to": None,
                 "actor": "dcgm", "payload": {"level": 3}}
    assert Event.from_dict(json.loads(json.dumps(d))) == ev
    assert Event.from_dict({"ts": "1", "kind": "ack", "entity": "n", "to": "READY"}) == Event(1.0, "ack", "n",
                                                                                             to="READY")
    with pytest.raises(ValueError) as err:
        Event(1.0, "reboot", "n")
    assert str(err.value) == "unknown event kind 'reboot': expected one of " + ", ".join(EVENT_KINDS)


def test_a_decision_is_logged_with_its_state_transitions_and_intents() -> None:
    dec = Decision(_state(), [_transition()], [_intent()], 130.0)
    d = dec.to_dict()
    assert d == {"ts": 130.0, "state": _state().to_dict(), "transitions": [_transition().to_dict()],
                 "intents": [_intent().to_dict()]}
