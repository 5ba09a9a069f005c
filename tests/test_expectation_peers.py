"""Issue 14's expectation model, peers and provenance: a signal most of an entity's *peer group* carries
is expected of it (GPUs by pool and training job, replicas by pool, model and role; a small group falls
back to the pool), and every expected signal says why it is expected (its own exporter, its past, its
peers, declared inventory) in the tuple's detail and in ``fleethealth explain``.

Each test failed on the engine before peer groups: peers were the whole GPU fleet (a serving pool's GPUs
read ``missing:rank`` because the training pool is bigger), replicas had no peers rule (a replica with
only its load category read confidence 1.0), and no detail said why a missing signal was expected."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.score.expect import Expectations
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder
from fleethealth.sim.scenario import parse_scenario
from fleethealth.sim.simulation import Simulation

POL = default_policy()
NOW = 1_000_000.0


def _gpu(b: SnapshotBuilder, node: str, g: int, t: float, rank_job: str | None = None, rank: int = 0) -> None:
    lab = {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node, "modelName": "H100"}
    b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0, t)
    b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, t)
    b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
    b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 0.0, t)
    if rank_job:
        b.add("fleethealth_rank_compute_seconds", {"job": rank_job, "rank": str(rank), "node": node,
                                                   "gpu": str(g), "peer_group": "s0"}, 0.5, t)


def _node_info(b: SnapshotBuilder, node: str, pool: str, t: float) -> None:
    b.add("fleethealth_node_info", {"node": node, "pool": pool}, 1.0, t)


def _two_pools() -> SnapshotBuilder:
    """Pool ``train`` (t1..t4, t4's rank exporter gone) runs a job with rank timings; pool ``serve`` (s1)
    has no ranks. 24 of 40 GPUs carry rank timings: the whole fleet's majority."""
    b = SnapshotBuilder()
    for i, node in enumerate(("t1", "t2", "t3", "t4")):
        _node_info(b, node, "train", NOW)
        for g in range(8):
            _gpu(b, node, g, NOW, rank_job=None if node == "t4" else "pretrain", rank=8 * i + g)
    _node_info(b, "s1", "serve", NOW)
    for g in range(8):
        _gpu(b, "s1", g, NOW)
    return b


def test_a_pool_without_a_family_is_not_missing_it_because_another_pool_carries_it() -> None:
    fh = score_snapshot(_two_pools().build(NOW), POL, NOW)
    s1 = fh.tuples["s1"]
    # 3 of its 4 policy-expected signals fresh (the PCIe replay counter, seen once, needs a second sample)
    assert s1.reason == "min:hardware" and s1.confidence == 0.75
    assert not any(t.reason.startswith("missing:") for t in fh.by_kind("gpu") if t.entity.startswith("s1/"))


def test_a_node_lacking_a_family_its_own_pool_carries_is_missing_it_and_says_why() -> None:
    fh = score_snapshot(_two_pools().build(NOW), POL, NOW)
    g = fh.tuples["t4/gpu0"]
    assert g.reason == "missing:rank"
    d = {x.signal: x for x in g.details}["rank_compute_time"]
    assert d.score is None and d.note == "missing"
    # t4's GPUs are in no training job: compared with their pool, where 24 of 32 GPUs carry the signal
    assert d.expected_by == "its peers (pool=train) carry it: 24 of 32"
    assert {x.signal: x for x in g.details}["gpu_temp"].expected_by == "reporting"
    assert fh.tuples["t4"].reason == "missing:rank"


def test_a_small_group_falls_back_to_its_pool() -> None:
    """Two GPUs of a job (smaller than expectation.min_group) are compared with their pool."""
    b = SnapshotBuilder()
    for node in ("a1", "a2", "a3"):
        _node_info(b, node, "a", NOW)
        for g in range(8):
            _gpu(b, node, g, NOW)
    b.add("fleethealth_rank_compute_seconds", {"job": "tiny", "rank": "0", "node": "a1", "gpu": "0",
                                               "peer_group": "s0"}, 0.5, NOW)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    assert fh.kinds["gpu"].expect is not None
    groups = fh.kinds["gpu"].expect.groups
    assert groups is not None
    a10 = fh.kinds["gpu"].names.index("a1/gpu0")
    assert groups.names[int(groups.grp[a10])] == "pool=a"
    assert fh.tuples["a1/gpu0"].reason == "min:hardware" and fh.tuples["a2/gpu0"].reason == "min:hardware"


def _replica(b: SnapshotBuilder, name: str, model: str, slo: bool) -> None:
    lab = {"replica": name, "model_name": model, "pool": "serve"}
    for t, n in ((NOW - 60, 10.0), (NOW, 70.0)):
        b.add("vllm:num_requests_waiting", lab, 0.0, t)
        if slo:
            b.add("fleethealth_replica_requests_total", lab, n, t)
            b.add("fleethealth_replica_errors_total", lab, 0.0, t)
            for h in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
                b.add(f"{h}_count", lab, n, t)
                b.add(f"{h}_bucket", {**lab, "le": "0.1"}, n, t)
                b.add(f"{h}_bucket", {**lab, "le": "+Inf"}, n, t)


def test_a_replica_with_only_its_load_category_is_not_confident_when_its_peers_carry_slos() -> None:
    b = SnapshotBuilder()
    for i in range(4):
        _replica(b, f"llama-{i}", "llama", slo=True)
    _replica(b, "llama-9", "llama", slo=False)
    for i in range(3):  # another model's replicas export only their queue: no SLO expected of them
        _replica(b, f"qwen-{i}", "qwen", slo=False)
    fh = score_snapshot(b.build(NOW), POL, NOW, consumer="serving")
    r9 = fh.tuples["llama-9"]
    assert r9.confidence < POL.lifecycle.min_confidence
    assert r9.reason == "missing:ttft_slo,itl_slo,error_slo"
    d = {x.signal: x for x in r9.details}
    assert d["ttft_slo"].expected_by == "its peers (pool=serve,model=llama) carry it: 4 of 5"
    assert fh.tuples["llama-0"].confidence == 1.0 and not fh.tuples["llama-0"].reason.startswith("missing")
    q = fh.tuples["qwen-0"]
    assert q.confidence == 1.0 and q.reason == "gmean:load"


def test_two_pools_with_different_dcgm_field_lists_do_not_mark_each_others_signals_missing() -> None:
    """The simulator's per-pool exporter fields: ``big`` exports the full DCGM list, ``small`` the
    default one (no ECC, NVLink, violations, row remaps). ``small`` is not missing ``big``'s fields."""
    sc = parse_scenario("""
name: two-exporters
duration: 10m
step: 15s
fleet:
  pools:
    - {name: big, nodes: 5, workload: training, dcgm_fields: full, jobs: [{name: j, nodes: 5, pp: 1}]}
    - {name: small, nodes: 2, workload: training, dcgm_fields: default, jobs: [{name: k, nodes: 2, pp: 1}]}
""")
    sim = Simulation(sc)
    hist = SignalHistory(POL, memory_s=3600)
    at = 0.0
    for t, snap in sim.steps(8):
        hist.add(snap)
        at = t
    fh = score_snapshot(hist.view(at), POL, at)
    small = [x for x in fh.by_kind("gpu") if x.labels.get("Hostname", x.entity.split("/")[0]) in
             {sim.fleet.nodes[i] for i in sim.fleet.pool_nodes("small")}]
    assert small and all(not x.reason.startswith("missing:") and x.confidence == 1.0 for x in small)
    for x in small:
        assert all(d.signal != "ecc_dbe" for d in x.details)  # not expected there, not shown
    big = [x for x in fh.by_kind("gpu") if x not in small]
    assert all(x.confidence == 1.0 for x in big)
    # with peers taken from the whole fleet, small's 16 GPUs would be missing what big's 40 carry
    ks = fh.kinds["gpu"]
    assert ks.expect is not None and ks.expect.groups is not None
    assert {ks.expect.groups.names[int(g)] for g in ks.expect.groups.grp.tolist()} == {"pool=big,job=j",
                                                                                       "pool=small,job=k"}


def test_declared_gpu_and_prior_family_say_why_they_are_expected() -> None:
    """The controller's expectations: a GPU declared by inventory that reports nothing, and a family the
    node reported before (kept in the state store) that is gone now."""
    b = SnapshotBuilder()
    for node in ("n1", "n2", "n3"):
        for g in range(8):
            if (node, g) != ("n1", 7):
                _gpu(b, node, g, NOW)
    for g in range(8):  # a lone node whose dcgm-exporter is gone: only its training ranks report
        b.add("fleethealth_rank_compute_seconds", {"job": "solo", "rank": str(g), "node": "solo", "gpu": str(g),
                                                   "peer_group": "s0"}, 0.5, NOW)
    exp = Expectations(families={"solo": frozenset({"DCGM", "rank"})},
                       declared={"n1/gpu7": "nvidia.com/gpu capacity 8"})
    fh = score_snapshot(b.build(NOW), POL, NOW, inventory={"gpu": ["n1/gpu7"]}, expectations=exp)
    g7 = fh.tuples["n1/gpu7"]
    assert g7.value is None and fh.tuples["n1"].reason == "missing:gpu7"
    d = {x.signal: x for x in g7.details}
    assert d["gpu_temp"].expected_by == "declared by inventory (nvidia.com/gpu capacity 8); " \
                                        "its peers (all GPUs) carry it: 23 of 32"
    solo = fh.tuples["solo/gpu0"]
    assert solo.reason == "missing:DCGM" and solo.confidence < POL.lifecycle.min_confidence
    assert {x.signal: x for x in solo.details}["gpu_temp"].expected_by.startswith("it reported this family")
    assert fh.tuples["n3/gpu0"].reason == "min:hardware"
    # without the prior, the lone rank-only node reads confident: nothing else says DCGM belongs there
    fh = score_snapshot(b.build(NOW), POL, NOW, inventory={"gpu": ["n1/gpu7"]})
    assert fh.tuples["solo/gpu0"].confidence == 1.0


def test_explain_prints_why_a_missing_signal_is_expected(tmp_path: Path) -> None:
    lines = []
    for i, node in enumerate(("t1", "t2", "t3", "t4")):
        lines.append(f'fleethealth_node_info{{node="{node}",pool="train"}} 1')
        for g in range(8):
            lab = f'gpu="{g}",UUID="GPU-{node}-{g}",Hostname="{node}",modelName="H100"'
            for m, v in (("DCGM_FI_DEV_GPU_TEMP", 50), ("DCGM_FI_DEV_SM_CLOCK", 1980), ("DCGM_FI_DEV_XID_ERRORS", 0),
                         ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0)):
                lines.append(f"{m}{{{lab}}} {v}")
            if node != "t4":
                lines.append(f'fleethealth_rank_compute_seconds{{job="pretrain",rank="{8 * i + g}",node="{node}",'
                             f'gpu="{g}",peer_group="s0"}} 0.5')
    page = tmp_path / "fleet.prom"
    page.write_text("\n".join(lines) + "\n")
    from fleethealth.cli.main import app

    res = CliRunner().invoke(app, ["explain", "t4/gpu3", str(page)])
    assert res.exit_code == 0, res.output
    assert "reason missing:rank" in res.output
    assert "rank_compute_time [peer] score=unknown (missing) expected: its peers (pool=train) carry it: 24 of 32" \
        in res.output
