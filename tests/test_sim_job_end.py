"""Simulated training jobs that end (sim/job_end.py, JobSpec.ends_at): after its end a job's ranks stop
reporting and its GPUs go idle, as a real job's end looks; jobs without an end are untouched (the same
telemetry, bit for bit); the end is validated (a duration inside the run) and a shorter run drops it."""

from __future__ import annotations

import numpy as np
import pytest

from fleethealth.sim import Simulation, load_scenario, parse_scenario
from fleethealth.sim.scenario import ScenarioError

BASE = """
name: two-jobs
seed: 11
duration: 2h
step: 15s
fleet:
  pools:
    - name: p1
      nodes: 8
      workload: training
      jobs:
        - {{name: short, nodes: 4, pp: 2{end}}}
        - {{name: long, nodes: 4, pp: 2}}
"""


def _scenario(end: str = "") -> Simulation:
    return Simulation(parse_scenario(BASE.format(end=end), "two-jobs.yaml"))


def _by_metric(snap) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # type: ignore[no-untyped-def]
    """metric -> (values, node of each row) of one snapshot."""
    names = np.array(snap.metrics)[snap.metric_ids]
    nodes = np.array([dict(snap.labelsets[s]).get("Hostname") or dict(snap.labelsets[s]).get("node")
                      for s in snap.series_ids])
    return {m: (snap.values[names == m], nodes[names == m]) for m in set(names.tolist())}


def test_ends_at_takes_a_written_duration_and_is_validated_naming_the_key() -> None:
    sc = parse_scenario(BASE.format(end=", ends_at: 1h30m"), "s.yaml")
    assert sc.fleet.pools[0].jobs[0].ends_at == 5400.0 and sc.fleet.pools[0].jobs[1].ends_at is None
    with pytest.raises(ScenarioError, match=r"s\.yaml:\d+: .*ends_at"):
        parse_scenario(BASE.format(end=", ends_at: soon"), "s.yaml")
    with pytest.raises(ScenarioError, match="ends_at"):
        parse_scenario(BASE.format(end=", ends_at: 0"), "s.yaml")
    # an end after the run is no error: the job runs through it (a shortened or compressed run)
    assert sc.with_overrides(duration="1h").fleet.pools[0].jobs[0].ends_at == 5400.0


def test_after_its_end_a_jobs_ranks_stop_reporting_and_its_gpus_go_idle() -> None:
    sim = _scenario(", ends_at: 30m")
    short = {sim.fleet.nodes[n] for n in sim.fleet.jobs[0].nodes}
    before = after = None
    for k, (t, snap) in enumerate(sim.steps(130)):
        if k == 115:
            before = _by_metric(snap)
        if k == 125:
            after = _by_metric(snap)
            assert t - sim.start > 1800
    assert before is not None and after is not None
    util_b, nodes_b = before["DCGM_FI_DEV_GPU_UTIL"]
    util_a, nodes_a = after["DCGM_FI_DEV_GPU_UTIL"]
    mine_a = np.isin(nodes_a, list(short))
    assert util_b[np.isin(nodes_b, list(short))].min() > 80  # busy while it runs
    assert mine_a.sum() == 32 and util_a[mine_a].max() < 10  # idle after, still reported
    assert util_a[~mine_a].min() > 80  # the other job runs on
    ranks_b = before["fleethealth_rank_compute_seconds"][1]
    ranks_a = after["fleethealth_rank_compute_seconds"][1]
    assert np.isin(ranks_b, list(short)).sum() == 32
    assert not np.isin(ranks_a, list(short)).any() and len(ranks_a) == 32  # its ranks are gone
    # a release (say, after its active test) does not bring the ended job back
    node = sorted(short)[0]
    sim.apply_action(node, "drain", sim.t)
    sim.apply_action(node, "release", sim.t)
    assert sim.node_out[sim.fleet.node_index(node)]


def test_jobs_without_an_end_are_bit_for_bit_what_they_were() -> None:
    """A job's end changes nothing before it, and a scenario without ``ends_at`` (or one past the run's
    end) is the old telemetry."""
    plain, ending, later = _scenario(), _scenario(", ends_at: 1h"), _scenario(", ends_at: 3h")
    for (t1, a), (t2, b), (_, c) in zip(plain.steps(239), ending.steps(239), later.steps(239), strict=True):
        assert np.array_equal(a.values, c.values)
        assert t1 == t2
        assert np.array_equal(a.values, b.values) and np.array_equal(a.series_ids, b.series_ids)


def test_the_chronic_small_job_builtin_ends_its_slow_nodes_job() -> None:
    sc = load_scenario("chronic-small-job")
    jobs = {j.name: j.ends_at for j in sc.fleet.pools[0].jobs}
    assert jobs["small-a"] == 15 * 3600 and sum(v is not None for v in jobs.values()) == 1
    sim = Simulation(sc)
    job = next(j for j in sim.fleet.jobs if j.name == "small-a")
    assert sim.fleet.node_index("sm-02") in job.nodes.tolist() and len(job.nodes) == 4
    assert [(g.entity, g.faulty, g.expected_action) for g in sim.ground_truth] == [("sm-02", True, "quarantine")]


def test_chronic_small_job_end_to_end_ticket_while_it_runs_out_at_its_end() -> None:
    """The scenario's targets, closed loop at the default cadence (``fleethealth backtest -s
    chronic-small-job``): sm-02 (a 32-GPU job's node, too small a loss to pay for a swap) gets one ticket
    while its job runs, no page about its slowness, and is quarantined ``chronic:idle`` at its job's
    end (15 h: its last rank sample goes stale, then the 5-minute idle dwell), never before; nothing
    else is quarantined."""
    from fleethealth.backtest import evaluate, run_backtest
    from fleethealth.backtest.arms import PRODUCT
    from fleethealth.decide import chronic
    from fleethealth.decide.incidents import is_new_page
    from fleethealth.decide.model import IntentKind, State
    from fleethealth.policy import default_policy

    run = run_backtest(load_scenario("chronic-small-job"), default_policy(), [], cycle_s=60.0)
    log = run.arms[PRODUCT]
    end = run.start + 15 * 3600
    out = [x for x in log.transitions if x.to_state == State.QUARANTINED]
    assert [(x.entity, x.reason) for x in out] == [("sm-02", chronic.IDLE_REASON)]
    assert end + default_policy().chronic.idle_dwell_s <= out[0].ts <= end + 900
    opened = [i for i in log.intents if i.kind == IntentKind.PAGE and is_new_page(i.params)]
    tickets = [i for i in opened if i.reason == chronic.TICKET_REASON]
    assert len(tickets) == 1 and tickets[0].ts < end and tickets[0].params["severity"] == "ticket"
    # no page before it is out; after, its failed active test hands it to a human (FAILED: a page)
    assert [i for i in opened if i.params.get("severity") == "page" and i.ts < out[0].ts] == []
    res = evaluate(run)
    assert res["false_quarantines"] == 0 and res["precision"] == 1.0 and res["recall"] == 1.0
