"""Property tests of the decisions layer's invariants (hypothesis)."""

from __future__ import annotations

import json
import math
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decide_support import tup
from fleethealth.decide.decider import REMEDIATION_KINDS, WORSE_STATES, Decider
from fleethealth.decide.lifecycle import ISOLATED_STATES
from fleethealth.decide.model import State
from fleethealth.decide.state import DecisionState
from fleethealth.policy import default_policy

POL = default_policy()
LC = POL.lifecycle
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

values = st.one_of(st.none(), st.floats(0.0, 1.0))
reasons = st.sampled_from(["min:performance", "min:thermal", "gate:xid", "min:hardware"])
flagsets = st.sampled_from([(), ("row_remap_pending",), ("recovery_action:DRAIN_AND_RESET",),
                            ("recovery_action:NODE_REBOOT",), ("xid:13",)])
known_obs = st.tuples(st.floats(0.0, 1.0), st.floats(0.5, 1.0), reasons, flagsets)
unknown_obs = st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)), st.floats(0.0, 0.49), reasons, flagsets)
ENTS = [("n1", "node"), ("n2", "node"), ("r1", "replica")]


def _tuples(obs_per_entity: list[tuple[float | None, float, str, tuple[str, ...]]]) -> list:
    out = []
    for (eid, kind), (v, c, r, f) in zip(ENTS, obs_per_entity, strict=True):
        reason = "no_fresh_data" if v is None else r
        out.append(tup(eid, v, conf=0.0 if v is None else c, reason=reason, kind=kind, flags=f))
    return out


@SETTINGS
@given(prefix=st.lists(st.lists(known_obs, min_size=3, max_size=3), max_size=30),
       suffix=st.lists(st.lists(unknown_obs, min_size=3, max_size=3), min_size=1, max_size=60),
       dt=st.sampled_from([5.0, 15.0, 60.0, 400.0]))
def test_no_sequence_of_unknown_tuples_causes_remediation_or_a_worse_state(prefix, suffix, dt) -> None:
    d = Decider(POL)
    s = DecisionState()
    t = 0.0
    for obs in prefix:
        s = d.decide(s, _tuples(obs), t).state
        t += dt
    for obs in suffix:
        dec = d.decide(s, _tuples(obs), t)
        assert not [i for i in dec.intents if i.kind in REMEDIATION_KINDS], dec.intents
        assert not [x for x in dec.transitions if x.to_state in WORSE_STATES], dec.transitions
        s = dec.state
        t += dt


@SETTINGS
@given(seq=st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=150),
       dt=st.sampled_from([1.0, 15.0, 30.0, 90.0]))
def test_transitions_never_come_faster_than_their_dwell(seq, dt) -> None:
    """Every dwell-driven transition happened at least its dwell after the state's window started
    (the previous transition, or for READY->DEGRADED->QUARANTINED the slide's start)."""
    d = Decider(POL)
    s = DecisionState()
    trs = []
    for k, (v, gate) in enumerate(seq):
        reason = "gate:xid" if gate and v < 0.05 else "min:performance"
        dec = d.decide(s, [tup("n1", 0.0 if reason.startswith("gate") else v, reason=reason)], k * dt)
        trs += dec.transitions
        s = dec.state
    window_start = 0.0
    slide_start = 0.0
    for tr in trs:
        m = re.search(r"dwell ([0-9.]+)s", tr.detail)
        if m:
            dwell = float(m.group(1))
            start = slide_start if (tr.from_state == State.DEGRADED and tr.to_state == State.QUARANTINED) \
                else window_start
            assert tr.ts - start >= dwell - 1e-6, (tr, start)
        if not (tr.from_state == State.READY and tr.to_state == State.DEGRADED):
            slide_start = tr.ts
        window_start = tr.ts
    assert s.entities["n1"].transitions == len(trs)
    # flapping bound: without events, nothing leaves QUARANTINED, and a READY<->DEGRADED round trip
    # takes at least degraded_dwell_s + ready_dwell_s
    span = len(seq) * dt
    assert len(trs) <= 2 + 2 * math.ceil(span / (LC.degraded_dwell_s + LC.ready_dwell_s))


fleet_step = st.lists(st.tuples(st.integers(0, 29), st.sampled_from(["gate", "low"])), max_size=6)


@SETTINGS
@given(steps=st.lists(fleet_step, min_size=1, max_size=40), dt=st.sampled_from([60.0, 300.0, 900.0]))
def test_budgets_and_tp_groups_hold_and_state_survives_a_json_round_trip(steps, dt) -> None:
    """30 nodes in one pool (budget: 1 per hour), TP groups of 4. Random failures never quarantine more
    than the budget in any window, never isolate two of a group with one reading (a second only with a
    reason no other member shares), and a run whose state goes through JSON
    every cycle (a restart every cycle) decides exactly the same."""
    d = Decider(POL)
    s = DecisionState()
    s2 = DecisionState()
    bad: dict[int, str] = {}
    entries: list[float] = []
    for k, failures in enumerate(steps):
        for node, how in failures:
            bad[node] = how
        now = k * dt
        tuples = []
        for i in range(30):
            lab = {"pool": "p", "tp_group": f"g{i // 4}"}
            if bad.get(i) == "gate":
                tuples.append(tup(f"n{i:02d}", 0.0, reason="gate:oom_device_fault", labels=lab))  # rate-budgeted
            elif bad.get(i) == "low":
                tuples.append(tup(f"n{i:02d}", 0.1, labels=lab))
            else:
                tuples.append(tup(f"n{i:02d}", 0.95, labels=lab))
        dec = d.decide(s, tuples, now)
        dec2 = d.decide(DecisionState.from_dict(json.loads(json.dumps(s2.to_dict()))), tuples, now)
        assert [i.to_dict() for i in dec.intents] == [i.to_dict() for i in dec2.intents]
        assert [x.to_dict() for x in dec.transitions] == [x.to_dict() for x in dec2.transitions]
        s, s2 = dec.state, dec2.state
        entries += [x.ts for x in dec.transitions if x.to_state == State.QUARANTINED]
        groups: dict[str, int] = {}
        for e in s.entities.values():
            if e.state in ISOLATED_STATES:
                groups[e.labels["tp_group"]] = groups.get(e.labels["tp_group"], 0) + 1
        # one more than the limit only for a reading of its own (decide.safety._own_fault): a node whose
        # reason no other member of its group shares is isolated behind an isolated mate, and this fleet
        # has two reasons (gate, low)
        assert all(v <= POL.budgets.max_per_tp_group + 1 for v in groups.values()), groups
    allowed = max(POL.budgets.quarantine_min_per_hour, math.floor(POL.budgets.quarantine_fraction_per_hour * 30))
    for t0 in entries:
        assert sum(1 for t in entries if t0 <= t < t0 + POL.budgets.window_s) <= allowed
