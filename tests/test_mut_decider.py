"""The decider's safety vetoes at their edges (issue 21): a replica's quarantine held after an overload was
answered with a concurrency limit (and only for signal-driven rules, only for the hold); the version
correlation's rate against other versions that also fail; exactly ``version_min_entities`` unhealthy; an
already isolated entity or a human's approval passing an exhausted budget; confidence exactly at
``min_confidence``; a drain timeout that does not fire before ``drain_timeout_s``."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind, State, Tier
from fleethealth.decide.state import Event
from fleethealth.policy import default_policy

POL = default_policy()
LC = POL.lifecycle


def _warm_replica(r: Run, name: str = "r1") -> float:
    r.steps(0, 90, 15, lambda t: [tup(name, 0.95, kind="replica")])
    assert r.st(name) == State.READY
    return 105.0


def _overload(ts: float, entity: str = "r1") -> Event:
    return Event(ts, "oom", entity, payload={"kv_cache_usage": 0.97, "running_requests": 16})


def test_held_overload_keeps_a_replica_in_service_for_the_hold_then_lets_the_quarantine_through() -> None:
    r = Run()
    t0 = _warm_replica(r)
    _, intents = r.step(t0, [tup("r1", 0.95, kind="replica")], [_overload(t0 - 5)])
    (lim,) = [i for i in intents if i.kind == IntentKind.LIMIT_CONCURRENCY]
    assert lim.params["max_concurrency"] == 12 and lim.entity == "r1"
    assert r.state.entities["r1"].overload_until == t0 + LC.overload_hold_s
    # the score collapses right after: below quarantine well past its dwell, but inside the hold
    r.steps(t0 + 15, t0 + 900, 15, lambda t: [tup("r1", 0.1, kind="replica", worst="serving")])
    assert r.st("r1") != State.QUARANTINED
    assert not r.of(IntentKind.DRAIN, "r1")
    held = [i for i in r.of(IntentKind.SET_WEIGHT, "r1") if i.soft]
    assert held and held[0].reason == "held:held:overload" and held[0].params["instead_of"] == "quarantine"
    assert len(held) == 1  # once, not every cycle
    # the hold ends: the next cycle quarantines (the dwell was met long ago)
    end = t0 + LC.overload_hold_s
    r.steps(t0 + 915, end - 15, 15, lambda t: [tup("r1", 0.1, kind="replica", worst="serving")])
    assert r.st("r1") != State.QUARANTINED
    r.step(end, [tup("r1", 0.1, kind="replica", worst="serving")])
    assert r.st("r1") == State.QUARANTINED
    last = r.transitions[-1]
    assert (last.ts, last.from_state, last.reason, last.detail) == (end, State.DEGRADED, "min:serving",
                                                                    "below_quarantine dwell 300s")
    assert [i.ts for i in r.of(IntentKind.DRAIN, "r1")] == [end]


def test_held_overload_does_not_hold_a_hard_gate_or_a_node() -> None:
    r = Run()
    t0 = _warm_replica(r)
    r.step(t0, [tup("r1", 0.95, kind="replica")], [_overload(t0 - 5)])
    r.step(t0 + 15, [tup("r1", 0.0, kind="replica", reason="gate:xid")])
    assert r.st("r1") == State.QUARANTINED  # a fatal gate is not an overload
    # a node given an overload event (it has no concurrency to limit) keeps no hold
    r2 = Run()
    r2.step(0, [tup("n1", 0.97)])
    r2.step(15, [tup("n1", 0.97)], [_overload(10, "n1")])
    r2.steps(30, 30 + LC.quarantine_dwell_s, 15, lambda t: [tup("n1", 0.1)])
    assert r2.st("n1") == State.QUARANTINED


def _fleet(bad: dict[str, int], sizes: dict[str, int], value: float = 0.2) -> list:
    """Nodes per driver version (``sizes``), the first ``bad[v]`` of each version unhealthy."""
    out = []
    i = 0
    for v, n in sizes.items():
        for k in range(n):
            lab = {"pool": "p", "driver_version": v}
            val = value if k < bad.get(v, 0) else 0.97
            out.append(tup(f"n{i:03d}", val, labels=lab, reason="min:performance" if val < 0.9 else None))
            i += 1
    return out


def _version_pages(r: Run) -> list:
    return [i for i in r.of(IntentKind.PAGE) if i.reason == "version_correlation"]


def test_version_rate_must_be_over_twice_the_other_versions_rate() -> None:
    # 5 of 10 on 575.1 fail (50%), 3 of 10 on 550.9 (30%): 5/8 of the failures, but not twice the others' rate
    r = Run()
    r.step(0, _fleet({"575.1": 5, "550.9": 3}, {"575.1": 10, "550.9": 10}))
    assert _version_pages(r) == []
    # 2 of 10 on 550.9 (20%): 50% is more than twice 20%: one page naming the version and the counts
    r2 = Run()
    r2.step(0, _fleet({"575.1": 5, "550.9": 2}, {"575.1": 10, "550.9": 10}))
    (page,) = _version_pages(r2)
    assert page.entity == "version/driver_version=575.1"
    assert {k: page.params[k] for k in ("label", "value", "kind", "unhealthy", "unhealthy_total", "population")} == {
        "label": "driver_version", "value": "575.1", "kind": "node", "unhealthy": 5, "unhealthy_total": 7,
        "population": 10}
    # and its nodes' quarantines are held with the suspicion as the reason; the other version's are not
    r2.steps(15, 15 + LC.quarantine_dwell_s, 15, lambda t: _fleet({"575.1": 5, "550.9": 2},
                                                                  {"575.1": 10, "550.9": 10}))
    assert all(r2.st(f"n{i:03d}") != State.QUARANTINED for i in range(5))
    soft = [i for i in r2.intents if i.soft and i.entity == "n000"]
    assert soft and soft[0].reason == "held:version:driver_version=575.1"


def test_a_version_just_under_half_of_the_failures_is_not_suspect() -> None:
    # 4 of 10 on 575.1, 5 of 90 on 550.9: 4/9 < version_fraction 0.5 even though its rate is far higher
    r = Run()
    r.step(0, _fleet({"575.1": 4, "550.9": 5}, {"575.1": 10, "550.9": 90}))
    assert _version_pages(r) == []
    # 5 and 5: exactly half of the failures is enough
    r2 = Run()
    r2.step(0, _fleet({"575.1": 5, "550.9": 5}, {"575.1": 10, "550.9": 90}))
    assert [p.entity for p in _version_pages(r2)] == ["version/driver_version=575.1"]


def test_exactly_version_min_entities_unhealthy() -> None:
    assert POL.attribution.version_min_entities == 3
    r = Run()
    r.step(0, _fleet({"575.1": 3}, {"575.1": 3, "550.9": 40}))
    (page,) = _version_pages(r)
    assert page.params["unhealthy"] == 3 and page.params["population"] == 3
    r2 = Run()
    r2.step(0, _fleet({"575.1": 2}, {"575.1": 2, "550.9": 40}))
    assert _version_pages(r2) == []


def test_a_version_everyone_runs_is_suspect_only_when_most_of_it_fails() -> None:
    # one version only (no others to compare with): suspect when at least version_fraction of it fails
    r = Run()
    r.step(0, _fleet({"575.1": 5}, {"575.1": 10}))
    assert [p.params["unhealthy"] for p in _version_pages(r)] == [5]
    r2 = Run()
    r2.step(0, _fleet({"575.1": 4}, {"575.1": 10}))
    assert _version_pages(r2) == []


def test_unusable_tuples_do_not_count_towards_a_version() -> None:
    fleet = _fleet({"575.1": 3}, {"575.1": 3, "550.9": 40})
    fleet[2] = tup(fleet[2].entity, 0.2, conf=0.49, labels=dict(fleet[2].labels), reason="min:performance")
    r = Run()
    r.step(0, fleet)
    assert _version_pages(r) == []
    fleet[2] = tup(fleet[2].entity, 0.2, conf=0.5, labels=dict(fleet[2].labels), reason="min:performance")
    r2 = Run()
    r2.step(0, fleet)
    assert len(_version_pages(r2)) == 1


def _gates(n: int, bad: set[int], pool: str = "a", extra: dict[str, tuple] | None = None) -> list:
    out = []
    for i in range(n):
        e = f"n{i:02d}"
        if extra and e in extra:
            out.append(tup(e, 0.97, labels={"pool": pool}, flags=extra[e]))
        elif i in bad:
            out.append(tup(e, 0.0, reason="gate:oom_device_fault", labels={"pool": pool}, worst="hardware"))
        else:
            out.append(tup(e, 0.97, labels={"pool": pool}))
    return out


def test_an_already_isolated_node_is_quarantined_past_an_exhausted_budget() -> None:
    pol = POL.model_copy(update={"lifecycle": LC.model_copy(update={"drain_timeout_s": 4000.0})})
    r = Run(policy=pol)
    drain = {"n01": ("recovery_action:DRAIN_P2P",)}
    r.step(0, _gates(50, set(), extra=drain))
    assert r.st("n01") == State.DRAINING  # spends the pool's one quarantine of the hour
    # an hour later the budget is n00's: it is quarantined, so the hour's one is spent again
    r.steps(60, 3690, 60, lambda t: _gates(50, set(), extra=drain))
    r.step(3700, _gates(50, {0}, extra=drain))
    assert r.st("n00") == State.QUARANTINED
    # n01's drain times out: it is already out of service, so no budget is asked and it is quarantined
    r.steps(3760, 3940, 60, lambda t: _gates(50, {0}, extra=drain))
    assert r.st("n01") == State.DRAINING
    r.step(4000, _gates(50, {0}, extra=drain))
    assert r.st("n01") == State.QUARANTINED
    assert r.transitions[-1].reason.startswith("drain_timeout") or r.transitions[-1].to_state == State.QUARANTINED
    assert not [i for i in r.of(IntentKind.PAGE) if i.reason == "budget_exhausted"]


def test_a_human_approval_passes_an_exhausted_budget() -> None:
    r = Run()
    r.step(0, _gates(50, {0, 1}))
    assert r.st("n00") == State.QUARANTINED and r.st("n01") != State.QUARANTINED
    (page,) = [i for i in r.of(IntentKind.PAGE) if i.reason == "budget_exhausted"]
    assert page.params["wanted"] == "n01" and page.params["used"] == 1 and page.params["allowed"] == 1
    assert page.params["pool_size"] == 50 and page.entity == "pool/a"
    r.step(15, _gates(50, {0, 1}), [Event(10, "ack", "n01", to="QUARANTINED", actor="dana")])
    assert r.st("n01") == State.QUARANTINED
    # a budget in another pool is another budget
    r2 = Run()
    r2.step(0, _gates(50, {0}, "a") + [tup("m00", 0.0, reason="gate:xid", labels={"pool": "b"})])
    assert r2.st("n00") == State.QUARANTINED and r2.st("m00") == State.QUARANTINED


def test_confidence_exactly_at_min_confidence_acts_just_under_it_does_not() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.0, conf=LC.min_confidence, reason="gate:xid")])
    assert r.st("n1") == State.QUARANTINED
    r2 = Run()
    r2.step(0, [tup("n1", 0.0, conf=LC.min_confidence - 0.01, reason="gate:xid")])
    assert r2.st("n1") == State.READY
    assert not r2.of(IntentKind.QUARANTINE)


def test_drain_timeout_does_not_fire_before_drain_timeout_s() -> None:
    r = Run()
    flags = ("recovery_action:DRAIN_P2P",)
    r.step(0, [tup("n1", 0.9, flags=flags)])
    assert r.st("n1") == State.DRAINING
    r.steps(60, LC.drain_timeout_s - 60, 60, lambda t: [tup("n1", 0.9, flags=flags)])
    r.step(LC.drain_timeout_s - 1, [tup("n1", 0.9, flags=flags)])
    assert r.st("n1") == State.DRAINING
    r.step(LC.drain_timeout_s, [tup("n1", 0.9, flags=flags)])
    assert r.st("n1") == State.QUARANTINED
    assert r.transitions[-1].ts == LC.drain_timeout_s


def test_what_a_held_quarantine_does_instead() -> None:
    # a node: no new work, once, with the budget that held it as the reason
    r = Run()
    r.step(0, _gates(50, {0, 1}))
    soft = [i for i in r.intents if i.soft and i.entity == "n01"]
    assert [(i.kind, i.reason, i.params.get("instead_of"), i.tier) for i in soft] == [
        (IntentKind.NO_NEW_WORK, "held:budget:a", "quarantine", Tier.NODE)]
    es = r.state.entities["n01"]
    assert es.no_new_work is True and es.blocked == "budget:a"
    # a replica held after an overload: its weight halved from the lower of its weight and its score
    r2 = Run()
    t0 = _warm_replica(r2)
    r2.step(t0, [tup("r1", 0.95, kind="replica")], [_overload(t0 - 5)])
    r2.steps(t0 + 15, t0 + 400, 15, lambda t: [tup("r1", 0.1, kind="replica", worst="serving")])
    (held,) = [i for i in r2.of(IntentKind.SET_WEIGHT, "r1") if i.soft]
    assert (held.params["weight"], held.tier, held.ts) == (0.05, Tier.INSTANCE, t0 + 15 + LC.quarantine_dwell_s)
    assert r2.state.entities["r1"].weight == 0.05
    # a replica held before it ever had a weight (gated while starting, the pool's budget spent)
    r3 = Run()
    reps = [tup("r1", 0.0, kind="replica", reason="gate:oom_device_fault", labels={"pool": "s"}),
            tup("r2", 0.6, kind="replica", reason="gate:oom_device_fault", labels={"pool": "s"})]
    r3.step(0, reps)
    assert (r3.st("r1"), r3.st("r2")) == (State.QUARANTINED, State.WARMING)
    held3 = [i for i in r3.intents if i.soft and i.kind == IntentKind.SET_WEIGHT]
    assert [(i.entity, i.params["weight"], i.reason) for i in held3] == [("r2", 0.3, "held:budget:s")]


def test_an_unreadable_oom_event_is_a_ticket_not_a_crash() -> None:
    r = Run()
    r.step(0, [tup("r1", 0.95, kind="replica")])
    _, intents = r.step(15, [tup("r1", 0.95, kind="replica")],
                        [Event(10, "oom", "r1", payload={"prompt_tokens": 10, "bogus_field": 1})])
    (page,) = [i for i in intents if i.kind == IntentKind.PAGE]
    assert (page.entity, page.reason, page.params["severity"]) == ("r1", "oom:unreadable_event", "ticket")
    assert "bogus_field" in page.params["error"]


def test_oom_intents_through_the_decider_carry_the_cycle_time_and_policy_version() -> None:
    r = Run()
    r.step(0, [tup("r1", 0.95, kind="replica")])
    ev = Event(5, "oom", "r1", payload={"prompt_tokens": 200_000, "max_tokens": 1000, "model_max_len": 32768})
    _, intents = r.step(15, [tup("r1", 0.95, kind="replica")], [ev])
    (rej,) = [i for i in intents if i.kind == IntentKind.REJECT_REQUEST]
    assert (rej.ts, rej.entity, rej.policy_version, rej.tier, rej.soft) == (15, "r1", POL.version_tag,
                                                                            Tier.INSTANCE, False)
    assert rej.reason.startswith("request needs 201000 tokens (prompt 200000 + output 1000)")
    assert rej.params["max_tokens_allowed"] is None and rej.params["oom_class"] == "oversized_request"


def test_an_overload_oom_for_an_entity_the_decider_does_not_know() -> None:
    r = Run()
    r.step(0, [tup("r1", 0.95, kind="replica")])
    _, intents = r.step(15, [tup("r1", 0.95, kind="replica")], [_overload(10, "r-unknown")])
    assert [(i.kind, i.entity, i.params["max_concurrency"]) for i in intents
            if i.kind == IntentKind.LIMIT_CONCURRENCY] == [(IntentKind.LIMIT_CONCURRENCY, "r-unknown", 12)]
    assert "r-unknown" not in r.state.entities
    assert r.state.entities["r1"].overload_until is None


def test_while_frozen_an_oom_changes_nothing_that_runs_but_still_limits_concurrency() -> None:
    r = Run()
    fleet = lambda t: [tup(f"n{i:02d}", 0.97) for i in range(30)] + [tup("r1", 0.95, kind="replica")]  # noqa: E731
    r.steps(0, 300, 15, fleet)
    outage = lambda t: [tup(f"n{i:02d}", None, conf=0.0) for i in range(30)] + [  # noqa: E731
        tup("r1", 0.95, kind="replica")]
    r.steps(315, 600, 15, outage)
    assert r.state.frozen
    frag = Event(605, "oom", "r1", payload={"requested_bytes": 2 << 30, "free_bytes": 1 << 30,
                                            "reserved_bytes": 4 << 30, "total_bytes": 80 << 30})
    _, intents = r.step(615, outage(615), [frag])
    kinds = [i.kind for i in intents if i.entity == "r1"]
    assert IntentKind.DRAIN not in kinds and IntentKind.REBUILD_WORKER not in kinds
    assert IntentKind.CAPTURE_EVIDENCE in kinds  # evidence is not a change to what runs
    _, intents2 = r.step(630, outage(630), [_overload(625)])
    assert [i.kind for i in intents2 if i.entity == "r1" and i.kind == IntentKind.LIMIT_CONCURRENCY] == [
        IntentKind.LIMIT_CONCURRENCY]


def test_the_tp_group_page_says_how_many_are_out_and_who_waits() -> None:
    r = Run()
    fleet = [tup(f"n{i:02d}", 0.0 if i in (0, 1) else 0.97, reason="gate:oom_device_fault" if i in (0, 1) else None,
                 labels={"pool": "a", "tp_group": f"g{i // 4}"}) for i in range(200)]
    r.step(0, fleet)
    (page,) = [i for i in r.of(IntentKind.PAGE) if i.reason == "tp_group_limit"]
    assert (page.entity, page.params["tp_group"], page.params["isolated"], page.params["limit"]) == (
        "tp_group/g0", "g0", 1, 1)
    assert page.params["wanted"] in ("n00", "n01")


def test_a_held_replicas_weight_is_rounded_to_two_decimals() -> None:
    r = Run()
    t0 = _warm_replica(r)
    r.step(t0, [tup("r1", 0.95, kind="replica")], [_overload(t0 - 5)])
    r.steps(t0 + 15, t0 + 400, 15, lambda t: [tup("r1", 0.123, kind="replica", worst="serving")])
    (held,) = [i for i in r.of(IntentKind.SET_WEIGHT, "r1") if i.soft]
    assert held.params["weight"] == 0.06  # 0.123 / 2 = 0.0615
