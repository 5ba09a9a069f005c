"""A built-in scenario at another fleet size (``sim.sizes.resize``, ``backtest --nodes``): pools scaled in
whole racks, every fault on the same place of its pool, and the scenario's meaning (which domain, which
job, which replica slot) kept; what cannot keep its meaning is an error, never a different scenario."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.sim.faults import resolve_targets
from fleethealth.sim.fleet import build_fleet
from fleethealth.sim.scenario import Scenario, builtin_names, load_scenario
from fleethealth.sim.sizes import resize


def pools(sc: Scenario) -> dict[str, int]:
    return {p.name: p.nodes for p in sc.fleet.pools}


def test_rack_cooling_at_three_sizes_keeps_its_rack_and_scales_whole_racks() -> None:
    sc = load_scenario("rack-cooling")
    assert pools(sc) == {"train-a": 48, "serve-a": 16}
    small, large = resize(sc, 32), resize(sc, 256)
    assert pools(small) == {"train-a": 24, "serve-a": 8}
    assert pools(large) == {"train-a": 192, "serve-a": 64}
    for r in (small, large):
        assert r.name == "rack-cooling" and r.faults[0].target == "rack:rack-02"
        assert r.faults[0].onset == sc.faults[0].onset and r.faults[0].end == sc.faults[0].end
        assert "resized from 64 to" in r.description


def test_a_node_keeps_its_place_in_its_pool_and_names_follow_the_fleet_width() -> None:
    sc = load_scenario("mixed")
    old = build_fleet(sc.fleet, sc.seed)
    big = resize(sc, 256)
    new = build_fleet(big.fleet, big.seed)
    for f_old, f_new in zip(sc.faults, big.faults, strict=True):
        for t_old, t_new in zip(f_old.targets, f_new.targets, strict=True):
            if ":" in t_old:
                assert t_old == t_new or t_old.split(":")[0] == t_new.split(":")[0]
                continue
            n_old, _, gpu_old = t_old.partition("/gpu")
            n_new, _, gpu_new = t_new.partition("/gpu")
            assert gpu_old == gpu_new
            i, k = old.node_index(n_old), new.node_index(n_new)
            pool = old.node_pool[i]
            assert new.node_pool[k] == pool
            assert i - old.node_pool.index(pool) == k - new.node_pool.index(pool)
    assert "node-037" in {t for f in big.faults for t in f.targets}  # the seed's node-37, at 3-digit width


def test_a_smaller_pool_folds_a_node_into_its_last_rack_at_the_same_place() -> None:
    sc = load_scenario("node37-thermal-drift")
    small = resize(sc, 32)
    fleet = build_fleet(small.fleet, small.seed)
    (target,) = small.faults[0].targets
    n = fleet.node_index(target)
    pool = fleet.node_pool[n]
    size = fleet.node_pool.count(pool)
    assert n - fleet.node_pool.index(pool) < size
    assert n % small.fleet.nodes_per_rack == 37 % sc.fleet.nodes_per_rack


def test_the_nvl72_scenario_keeps_its_crashing_job_in_whole_nvlink_domains() -> None:
    big = resize(load_scenario("xid45-nvl72-crash"), 360)
    fleet = build_fleet(big.fleet, big.seed)
    job = fleet.job_by_name("pretrain-a")
    assert len(job.nodes) % 18 == 0
    domains = {fleet.node_labels(int(n))["nvlink_domain"] for n in job.nodes}
    assert len(domains) * 18 == len(job.nodes)


def test_a_size_a_job_cannot_keep_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="pretrain-"):
        resize(load_scenario("xid45-nvl72-crash"), 20)
    with pytest.raises(ValueError, match="at least 1"):
        resize(load_scenario("mixed"), 0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(builtin_names()), nodes=st.integers(min_value=8, max_value=400))
def test_any_size_either_resolves_every_target_or_says_why(name: str, nodes: int) -> None:
    sc = load_scenario(name)
    try:
        r = resize(sc, nodes)
    except ValueError as e:
        assert str(e)
        return
    fleet = build_fleet(r.fleet, r.seed)
    assert len(r.faults) == len(sc.faults)
    for f in r.faults:
        assert resolve_targets(fleet, f.targets, None).nodes


def test_backtest_runs_a_builtin_at_another_size_and_refuses_one_it_cannot_keep() -> None:
    import json

    from typer.testing import CliRunner

    from fleethealth.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["backtest", "-s", "power-zone-brownout", "--nodes", "32", "--compress", "30m",
                              "-b", "none", "--format", "json", "--no-progress"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["gpus"] == 32 * 8 and out["quarantines"] == 0
    assert [g["group"] for g in out["groups"]] == ["power:power_zone:pz-01"]
    bad = runner.invoke(app, ["backtest", "-s", "xid45-nvl72-crash", "--nodes", "20", "-b", "none"])
    assert bad.exit_code != 0 and "--nodes" in bad.output and "pretrain-" in bad.output
