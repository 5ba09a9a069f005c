"""A chronically slow node whose swap does not pay gets a ticket, not silence (issue 16 item 3,
decide/chronic.py ``ticket``): a DEGRADED node slow for ``chronic.ticket_after_s`` in a job too small to
pay for a checkpoint restart opens ONE ticket-severity incident naming the node, its GPU-hours lost a
day, the swap cost and why it is not swapped; it is updated while it lasts and resolved when the node
recovers or is taken out. When its job ends (no rank runs on it) the ticketed node is quarantined for its
active test before new work lands on it. The estimate is computed for DEGRADED nodes only (and shown in
``explain``); a READY node that cannot pay is still not even priced."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from typer.testing import CliRunner

from fleethealth.decide import chronic
from fleethealth.decide.incidents import is_new_page
from fleethealth.decide.lifecycle import Timer
from fleethealth.decide.loop import DecisionLoop
from fleethealth.decide.model import Intent, IntentKind, State, Transition
from fleethealth.policy import Policy, PolicyError, default_policy, default_policy_text, parse_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

MODEL = "NVIDIA H100 80GB HBM3"
POL = default_policy()
SLOW = (1.82 * 1.03, 1980.0 - 6 * 14.63)  # rank compute 3 % slow, SM clock z ~6: DEGRADED (0.56)
NODES = 12  # one 96-GPU job: 3 % of 96 GPUs is ~69 GPU-h a day, below one 100 GPU-h swap


def _quantiles(n: int, center: float, sigma: float, rng: np.random.Generator) -> np.ndarray:
    nd = NormalDist(center, sigma)
    v = np.array([nd.inv_cdf((i + 0.5) / n) for i in range(n)])
    rng.shuffle(v)
    return v


def _samples(rng: np.random.Generator, slow: tuple[float, float] | None, idle: bool = False,
             lost: bool = False, util: bool = True) -> list[tuple[str, dict[str, str], float]]:
    """``NODES`` x 8 GPUs in one synchronous job (as tests/test_chronic.py); node-07 computes and clocks
    ``slow`` (None: as its peers); ``idle``: node-07's job has ended (no rank on it; idle and cooler,
    its SM clock only z ~3 low: its score is 1.0 again, it would read as recovered; its GPU utilisation
    0 %); ``lost``: node-07's rank telemetry is lost while its job still runs (utilisation 95 %, as every
    busy GPU's); ``util``: dcgm-exporter serves DCGM_FI_DEV_GPU_UTIL."""
    out: list[tuple[str, dict[str, str], float]] = []
    n_gpu = NODES * 8
    comp = _quantiles(n_gpu, 1.82, 0.01 / 0.6745, rng)
    clk = _quantiles(n_gpu, 1980.0, 9.87 / 0.6745, rng)
    for n in range(NODES):
        node = f"node-{n:02d}"
        for g in range(8):
            r = n * 8 + g
            c, k = (slow if n == 7 and slow is not None else (comp[r], clk[r]))
            if idle and n == 7:
                k = 1980.0 - 3 * 14.63
            if not ((idle or lost) and n == 7):
                out.append(("fleethealth_rank_compute_seconds",
                            {"job": "pretrain", "rank": str(r), "node": node, "gpu": str(g), "peer_group": "stage0"},
                            float(c)))
            lab = {"Hostname": node, "gpu": str(g), "modelName": MODEL, "UUID": f"GPU-{node}-{g}"}
            out += [("DCGM_FI_DEV_SM_CLOCK", lab, float(k)), ("DCGM_FI_DEV_GPU_TEMP", lab, 60.0),
                    ("DCGM_FI_DEV_XID_ERRORS", lab, 0.0)]
            if util:
                out.append(("DCGM_FI_DEV_GPU_UTIL", lab, 0.0 if idle and n == 7 else 95.0))
    return out


def _scrape(t: float, rng: np.random.Generator, slow: tuple[float, float] | None, idle: bool = False,
            lost: bool = False, util: bool = True) -> Snapshot:
    b = SnapshotBuilder()
    for metric, lab, v in _samples(rng, slow, idle, lost, util):
        b.add(metric, lab, v, t)
    return b.build(t)


def _run(pol: Policy, hours: float, slow_until_h: float = 1e9, idle_from_h: float = 1e9,
         every: float = 600.0, lost_from_h: float = 1e9, util: bool = True,
         ) -> tuple[DecisionLoop, list[Transition], list[Intent]]:
    rng = np.random.default_rng(7)
    loop = DecisionLoop(pol)
    trs: list[Transition] = []
    intents: list[Intent] = []
    t = 0.0
    while t <= hours * 3600:
        h = t / 3600
        snap = _scrape(t, rng, SLOW if h < slow_until_h else None, idle=h >= idle_from_h,
                       lost=h >= lost_from_h, util=util)
        res = loop.cycle(snap, t)
        trs += res.decision.transitions
        intents += res.decision.intents
        t += every
    return loop, trs, intents


def _tickets(intents: list[Intent]) -> list[Intent]:
    return [i for i in intents if i.kind == IntentKind.PAGE and i.reason == chronic.TICKET_REASON]


def test_a_small_jobs_chronically_slow_node_gets_one_ticket_naming_its_price() -> None:
    loop, trs, intents = _run(POL, hours=12)
    assert [(x.entity, x.to_state) for x in trs] == [("node-07", State.DEGRADED)]  # not swapped: it does not pay
    degraded_at = trs[0].ts
    tickets = _tickets(intents)
    firing = [i for i in tickets if is_new_page(i.params)]
    assert len(firing) == 1  # one ticket, not a page per cycle
    p = firing[0].params
    assert firing[0].entity == "node-07" and p["severity"] == "ticket" and p["node"] == "node-07"
    # slow for ticket_after_s (6 h) in DEGRADED: opened then, within a cycle
    assert firing[0].ts - degraded_at == pytest.approx(POL.chronic.ticket_after_s, abs=1200)
    assert p["loss_gpu_hours_per_day"] == pytest.approx(96 * 0.03 * 24, rel=0.1)  # ~69
    assert p["swap_cost_gpu_hours"] == 100.0 and p["when"] == "job_end"
    assert p["chronic"]["pays"] is False and p["chronic"]["job"] == "pretrain" and p["chronic"]["job_gpus"] == 96
    assert "GPU-h per hour" in p["summary"] and "not swapped" in p["summary"] and "when its job ends" in p["summary"]
    assert not [i for i in intents if i.kind == IntentKind.PAGE and i.reason != chronic.TICKET_REASON]
    assert chronic.TICKET_PREFIX + "node-07" in loop.state.incidents  # open while it lasts
    assert loop.state.entities["node-07"].state == State.DEGRADED


def test_the_ticket_resolves_when_the_node_recovers() -> None:
    _, trs, intents = _run(POL, hours=10, slow_until_h=8)
    assert (trs[-1].entity, trs[-1].to_state) == ("node-07", State.READY)
    states = [i.params.get("state", "firing") for i in _tickets(intents)]
    assert states[0] == "firing" and states[-1] == "resolved" and states.count("firing") == 1
    resolved = _tickets(intents)[-1]
    assert resolved.ts >= trs[-1].ts and resolved.params["severity"] == "ticket"


def test_when_its_job_ends_the_ticketed_node_is_taken_out_for_its_active_test() -> None:
    _, trs, intents = _run(POL, hours=10, idle_from_h=8)
    out = [x for x in trs if x.to_state == State.QUARANTINED]
    assert [(x.entity, x.reason) for x in out] == [("node-07", chronic.IDLE_REASON)]
    assert 8 * 3600 <= out[0].ts <= 8 * 3600 + 1200  # the job's end, not before
    tests = [i for i in intents if i.kind == IntentKind.RUN_ACTIVE_TEST and i.entity == "node-07"]
    assert tests and tests[0].ts == out[0].ts
    q = [i for i in intents if i.kind == IntentKind.QUARANTINE and i.entity == "node-07"][0]
    assert q.params["chronic"]["when"] == "now"
    # its ticket said so, and no second page: the ticket resolves once the node is out
    assert [i for i in intents if i.kind == IntentKind.PAGE and is_new_page(i.params)] == \
        [i for i in _tickets(intents) if is_new_page(i.params)]
    assert _tickets(intents)[-1].params["state"] == "resolved"


def test_a_policy_that_keeps_idle_nodes_says_so_and_keeps_it() -> None:
    pol = POL.model_copy(update={"chronic": POL.chronic.model_copy(update={"quarantine_when_idle": False})})
    _, trs, intents = _run(pol, hours=10, idle_from_h=8)
    assert not [x for x in trs if x.to_state == State.QUARANTINED]
    firing = [i for i in _tickets(intents) if is_new_page(i.params)]
    assert len(firing) == 1 and firing[0].params["when"] == "not_swapped"
    assert "stays DEGRADED" in firing[0].params["summary"]
    assert (trs[-1].entity, trs[-1].to_state) == ("node-07", State.READY)  # idle, it reads as recovered


def test_no_ticket_without_the_policy_duration_or_with_it_off() -> None:
    _, _, intents = _run(POL, hours=5)  # DEGRADED for less than 6 h
    assert _tickets(intents) == []
    off = POL.model_copy(update={"chronic": POL.chronic.model_copy(update={"ticket_after_s": None})})
    _, trs, intents = _run(off, hours=12, idle_from_h=10)
    assert _tickets(intents) == [] and not [x for x in trs if x.to_state == State.QUARANTINED]


def test_the_estimate_is_computed_for_a_degraded_node_only_and_explain_prints_it() -> None:
    fh = score_snapshot(_scrape(0.0, np.random.default_rng(1), SLOW), POL, 0.0)
    assert "node-07" not in chronic.node_evidence(fh, POL)  # READY, cannot pay: not priced (healthy path)
    ev = chronic.node_evidence(fh, POL, degraded=lambda n: n == "node-07")["node-07"]
    assert ev.pays is False and ev.job_gpus == 96 and not ev.idle
    words = chronic.describe(chronic.estimate(ev, {}, POL))
    assert "96 GPUs" in words and "against 100 GPU-h for a swap" in words and "when its job ends" in words
    watched = chronic.node_evidence(fh, POL, watch=["node-03", "no-such-node"])
    assert set(watched) == {"node-03"} and watched["node-03"].combined_z < POL.chronic.combined_z


def test_ticket_policy_keys_are_validated_naming_key_and_line() -> None:
    text = default_policy_text() + "\nchronic:\n  ticket_after_s: 6h\n  quarantine_when_idle: false\n"
    pol = parse_policy(text, "mine.yaml")
    assert pol.chronic.ticket_after_s == 6 * 3600.0 and pol.chronic.quarantine_when_idle is False
    bad = default_policy_text() + "\nchronic:\n  ticket_after_s: -1\n"
    with pytest.raises(PolicyError) as e:
        parse_policy(bad, "mine.yaml")
    msg = str(e.value)
    assert "chronic.ticket_after_s" in msg
    line = int(msg.split("mine.yaml:")[1].split(":")[0])
    assert bad.splitlines()[line - 1].strip().startswith("ticket_after_s:")
    with pytest.raises(PolicyError, match="chronic.quarantine_when_idle"):
        parse_policy(default_policy_text() + "\nchronic:\n  quarantine_when_idle: maybe\n", "mine.yaml")


def test_explain_prices_the_node_asked_about_even_when_its_swap_does_not_pay(tmp_path: Path) -> None:
    from fleethealth.cli.main import app

    rec = tmp_path / "rec.jsonl"
    rng = np.random.default_rng(1)
    with rec.open("w", encoding="utf-8") as f:
        for t in (1_767_000_000.0, 1_767_000_015.0):
            for metric, lab, v in _samples(rng, SLOW):
                f.write(json.dumps({"ts": t, "metric": metric, "value": v, **lab}) + "\n")
    res = CliRunner().invoke(app, ["explain", "node-07", str(rec)], terminal_width=200)
    assert res.exit_code == 0, res.output
    words = " ".join(res.stdout.split("chronic slowness:")[1].split())  # (the console wraps at 200)
    assert "(96 GPUs)" in words and "the swap does not pay: not swapped" in words
    d = json.loads(CliRunner().invoke(app, ["explain", "node-07", str(rec), "--format", "json"]).stdout)
    assert d["chronic"]["pays"] is False and d["chronic"]["when"] == "job_end"
    assert d["chronic"]["loss_gpu_hours_per_day"] == pytest.approx(96 * 0.03 * 24, rel=0.1)


def test_a_noisy_estimate_is_no_update_a_real_change_is() -> None:
    assert chronic._loss_sig(None, 20.0) is None
    assert chronic._loss_sig(16.5, None) == 16.0  # two significant digits
    assert chronic._loss_sig(13.1, 16.0) == 16.0 and chronic._loss_sig(22.0, 16.0) == 16.0  # within x1.5: kept
    assert chronic._loss_sig(25.0, 16.0) == 25.0 and chronic._loss_sig(9.0, 16.0) == 9.0  # moved: new
    loop, _, intents = _run(POL, hours=12)
    assert [i.params["state"] for i in _tickets(intents)] == ["firing"]  # 6 h of a steady slowdown: no update
    assert loop.state.incidents[chronic.TICKET_PREFIX + "node-07"]["sig"][1] == "job_end"


def _ev(slowdown: float | None = 0.03, pays: bool = False, idle: bool | None = None) -> chronic.Evidence:
    return chronic.Evidence(5.5, {"sm_clock": 6.0, "rank_compute_time": 3.2}, "node-3/gpu1", slowdown, "job-a",
                            96, pays=pays, idle=slowdown is None if idle is None else idle)


def _idle(after: float, idle_for: float | None = None) -> dict[str, Timer]:
    """Timers of a node ticketed, and idle (positive evidence) for ``idle_for`` (default: the dwell)."""
    d = POL.chronic.idle_dwell_s if idle_for is None else idle_for
    return {chronic.SLOW_KEY: Timer(after, 0.0), chronic.IDLE_KEY: Timer(d, after)}


def test_ticket_and_idle_conditions_at_their_edges() -> None:
    from fleethealth.decide.lifecycle import Cond, Observation, Timer

    after = POL.chronic.ticket_after_s
    assert after is not None
    due = {chronic.SLOW_KEY: Timer(after, 0.0)}
    short = {chronic.SLOW_KEY: Timer(after - 1.0, 0.0)}
    assert chronic.ticket("node-3", State.DEGRADED, short, _ev(), POL) is None  # not slow long enough
    assert chronic.ticket("node-3", State.READY, due, _ev(), POL) is None  # recovered: it resolves
    assert chronic.ticket("node-3", State.DEGRADED, due, None, POL) == ("chronic:node-3", None, None)  # kept open
    assert chronic.ticket("node-3", State.DEGRADED, due, _ev(pays=True), POL) == ("chronic:node-3", None, None)
    got = chronic.ticket("node-3", State.DEGRADED, due, _ev(), POL)
    assert got is not None and got[1] is not None
    assert got[1]["loss_gpu_hours_per_day"] == pytest.approx(96 * 0.03 * 24) and got[2] == [69.0, "job_end"]
    # idle (no rank time) and ticketed: out, if its score is not already taking it out
    ok = Observation(0.9, 1.0, "min:hardware")
    at = after + 60.0
    assert chronic.conds(State.DEGRADED, _idle(after), _ev(None), at, POL, ok) == {Cond.CHRONIC_COST}
    # idle, but not for the dwell yet (the timer counts the 60 s since it was last fed): not yet
    assert chronic.conds(State.DEGRADED, _idle(after, POL.chronic.idle_dwell_s - 120.0), _ev(None), at, POL,
                         ok) == set()
    # no rank time but no positive idle evidence (telemetry lost, job still running): never out, and
    # the idle dwell restarts
    t = _idle(after)
    assert chronic.conds(State.DEGRADED, t, _ev(None, idle=False), at, POL, ok) == set()
    assert chronic.IDLE_KEY not in t
    t = _idle(after)  # low confidence: unusable, no decision and the dwell restarts
    assert chronic.conds(State.DEGRADED, t, _ev(None), at, POL, Observation(0.9, 0.2, "min:hardware")) == set()
    assert chronic.IDLE_KEY not in t
    assert chronic.conds(State.DEGRADED, {chronic.SLOW_KEY: Timer(after - 120.0, None)}, _ev(None), at, POL,
                         ok) == set()  # (paused: no evidence a cycle ago) not yet ticketed
    low = Observation(POL.lifecycle.quarantine_below - 0.01, 1.0, "min:performance")
    assert chronic.conds(State.DEGRADED, _idle(after), _ev(None), at, POL, low) == set()
    keep = POL.model_copy(update={"chronic": POL.chronic.model_copy(update={"quarantine_when_idle": False})})
    assert chronic.conds(State.DEGRADED, _idle(after), _ev(None), at, keep, ok) == set()
    assert chronic.conds(State.READY, _idle(after), _ev(None), at, POL, ok) == set()
    # with a job that does not pay: no swap
    assert chronic.conds(State.DEGRADED, {chronic.SLOW_KEY: Timer(after, 0.0)}, _ev(), at, POL, ok) == set()
    why, _ = chronic.on_transition(Cond.CHRONIC_COST, "node-3", {}, {"node-3": _ev(None)}, POL)  # type: ignore[misc]
    assert why == chronic.IDLE_REASON


def test_lost_rank_telemetry_on_a_busy_node_is_not_idleness() -> None:
    """A dead rank-timer endpoint (or a Prometheus gap) while the job runs: no rank reports a compute
    time on node-07, but its GPUs still read 95 % busy. Missing data is never a decision's evidence:
    no chronic:idle, whatever the time (before the fix it was quarantined one cycle after the loss)."""
    _, trs, intents = _run(POL, hours=10, lost_from_h=7)
    # (its SM clock alone, z ~6, may take it down on its score: that is evidence, not missing data)
    assert not [x for x in trs if x.reason == chronic.IDLE_REASON]
    assert [i for i in _tickets(intents) if is_new_page(i.params)]  # ticketed all the same
    # nor without the GPUs' utilisation at all (an exporter without the field): unknown is not idle
    _, trs, _ = _run(POL, hours=10, idle_from_h=7, util=False)
    assert not [x for x in trs if x.reason == chronic.IDLE_REASON]


def test_a_truly_idle_node_is_taken_out_after_the_idle_dwell_not_before() -> None:
    every = 60.0
    _, trs, _ = _run(POL, hours=8.5, idle_from_h=8, every=every)
    out = [x for x in trs if x.to_state == State.QUARANTINED]
    assert [(x.entity, x.reason) for x in out] == [("node-07", chronic.IDLE_REASON)]
    # the dwell starts once the last rank sample is no longer fresh (freshness.max_age_s 90 s: the
    # cycle at 8 h + 60 s); out at the first cycle the dwell has passed, never before it
    assert out[0].ts == 8 * 3600 + every + POL.chronic.idle_dwell_s


def test_a_source_error_or_low_confidence_is_no_idle_evidence() -> None:
    rng = np.random.default_rng(3)
    snap = _scrape(0.0, rng, SLOW, idle=True)
    fh = score_snapshot(snap, POL, 0.0)
    assert chronic.node_evidence(fh, POL, watch=["node-07"])["node-07"].idle
    assert not chronic.node_evidence(fh, POL, degraded=lambda n: n == "node-07")["node-07"].idle  # not ticketed
    from fleethealth.signals.snapshot import InputIssue

    fh.issues = [InputIssue("target node-03:9400", 0, "connection refused")]
    assert not chronic.node_evidence(fh, POL, watch=["node-07"])["node-07"].idle


def test_idle_policy_keys_are_validated() -> None:
    pol = parse_policy(default_policy_text() + "\nchronic:\n  idle_dwell_s: 10m\n  idle_util_below: 3\n", "p.yaml")
    assert pol.chronic.idle_dwell_s == 600.0 and pol.chronic.idle_util_below == 3.0
    for bad in ("idle_dwell_s: 0", "idle_util_below: 150"):
        key = bad.split(":")[0]
        with pytest.raises(PolicyError, match=f"chronic.{key}"):
            parse_policy(default_policy_text() + f"\nchronic:\n  {bad}\n", "p.yaml")
