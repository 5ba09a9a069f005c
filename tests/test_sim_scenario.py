"""Scenario files: built-ins, validation errors with key and line, and the ground truth they declare."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from fleethealth.sim import Simulation, builtin_names, load_scenario, parse_scenario
from fleethealth.sim.scenario import ScenarioError, parse_duration

REQUIRED = {
    "node37-thermal-drift", "xid79-off-bus", "row-remap-pending", "nvlink-down", "xid13-bad-kernel",
    "bad-driver-rollout", "exporter-outage", "rack-partition", "serving-build-regression", "replica-slo-burn",
    "oom-mix", "stage-imbalance", "noise-only", "mixed",
}


@cache
def built(name: str) -> Simulation:
    return Simulation(load_scenario(name))


def truth(name: str) -> tuple[Simulation, list]:
    sim = built(name)
    return sim, sim.ground_truth


def test_builtins_exist_and_build() -> None:
    assert set(builtin_names()) >= REQUIRED
    for name in builtin_names():
        sim = built(name)
        assert sim.scenario.name == name
        # HGX fleets of 64 nodes x 8 GPUs; the GB200 NVL72 fleet is five racks of 18 trays x 4 GPUs
        assert sim.fleet.n_gpus == (360 if name in ("xid45-nvl72-crash", "nvl72-fabric-degraded") else 512)
        assert sim.scenario.step == 15


def test_noise_only_is_a_healthy_week() -> None:
    sim, gt = truth("noise-only")
    assert sim.scenario.duration == 7 * 86400
    assert sim.scenario.n_steps == 40320
    assert gt and not any(g.faulty for g in gt)
    assert {g.expected_action for g in gt} == {"none"}


def test_node37_truth_matches_the_seed() -> None:
    sim, gt = truth("node37-thermal-drift")
    assert [(g.entity, g.kind, g.faulty, g.expected_action) for g in gt] == [
        ("node-37", "node", True, "quarantine")
    ]
    assert gt[0].onset == sim.start + 6 * 3600


def test_missing_data_and_software_scenarios_have_no_faulty_entity() -> None:
    for name in ("exporter-outage", "rack-partition", "xid13-bad-kernel", "serving-build-regression",
                 "stage-imbalance"):
        _, gt = truth(name)
        assert gt, name
        assert not any(g.faulty for g in gt), name
    _, gt = truth("rack-partition")
    assert len(gt) == 8 and all(g.end is not None for g in gt)
    _, gt = truth("xid13-bad-kernel")
    assert len({g.entity for g in gt}) == 16 and {g.expected_action for g in gt} == {"none"}
    _, gt = truth("serving-build-regression")
    reps = [g for g in gt if g.kind == "replica"]
    assert len(reps) == 16 and {g.expected_action for g in reps} == {"page"}


def test_hardware_scenarios_truth() -> None:
    _, gt = truth("xid79-off-bus")
    assert {(g.entity, g.expected_action) for g in gt if g.kind == "gpu"} == {
        ("node-12/gpu3", "quarantine"), ("node-55/gpu1", "quarantine")}
    _, gt = truth("row-remap-pending")
    pend = [g for g in gt if g.fault == "row_remap_pending"]
    assert pend and all(g.faulty and g.expected_action == "schedule_reset" for g in pend)
    dbe = [g for g in gt if g.fault == "ecc_dbe_remap_failure"]
    assert dbe and all(g.expected_action == "quarantine" for g in dbe)
    _, gt = truth("replica-slo-burn")
    kinds = {g.kind: g for g in gt}
    assert kinds["replica"].faulty and kinds["gpu"].faulty and kinds["node"].faulty
    _, gt = truth("bad-driver-rollout")
    assert len(gt) == 16 and {g.expected_action for g in gt} == {"page"}
    assert len({g.group for g in gt}) == 1 and gt[0].group


def test_oom_mix_has_all_four_classes() -> None:
    _, gt = truth("oom-mix")
    reps = {g.fault: g.expected_action for g in gt if g.kind == "replica"}
    assert reps == {
        "cuda_oom:single_request": "reject_request", "cuda_oom:batch_overload": "limit_concurrency",
        "cuda_oom:fragmentation": "rebuild_worker", "cuda_oom:driver": "quarantine",
    }
    assert [g.faulty for g in gt if g.kind == "replica" and g.fault != "cuda_oom:driver"] == [False] * 3


def test_durations() -> None:
    assert parse_duration("15s") == 15 and parse_duration("6h") == 21600 and parse_duration("7d") == 604800
    assert parse_duration(90) == 90 and parse_duration("12.5h") == 45000
    with pytest.raises(ValueError):
        parse_duration("soon")


BAD = """\
name: bad
fleet:
  pools:
    - name: p
      nodes: 2
faults:
  - kind: thermal_drift
    target: node-00
  - kind: meteor_strike
    target: node-01
"""


def test_validation_errors_name_key_and_line() -> None:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(BAD, "s.yaml")
    msg = str(e.value)
    assert "s.yaml:9" in msg and "faults[1].kind" in msg
    with pytest.raises(ScenarioError) as e:
        parse_scenario("name: x\nduration: soon\nfleet: {pools: [{name: p, nodes: 1}]}\n", "d.yaml")
    assert "d.yaml:2" in str(e.value) and "duration" in str(e.value)
    with pytest.raises(ScenarioError, match="not valid YAML"):
        parse_scenario("name: [", "y.yaml")


def test_unknown_target_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(BAD.replace("meteor_strike", "xid79_off_bus").replace("node-01", "node-99"))
    sc = load_scenario(p)
    with pytest.raises(ValueError, match=r"faults\[1\].*node-99"):
        Simulation(sc)


def test_unknown_name_lists_builtins() -> None:
    with pytest.raises(ScenarioError, match="noise-only"):
        load_scenario("no-such-scenario")


def test_documented_example_is_valid() -> None:
    import textwrap

    import fleethealth.sim.scenario as mod

    doc = mod.__doc__ or ""
    example = textwrap.dedent(doc[doc.index("    name: my-incident"):doc.index("Per-kind")])
    sim = Simulation(parse_scenario(example, "doc"))
    assert {g.fault for g in sim.ground_truth} == {"thermal_drift", "exporter_outage", "cuda_oom:fragmentation"}
