"""The expectation model's parts (score/expect.py), pinned down where mutation testing found nothing
checking them (issue 21; docs/mutation.md): which peer group an entity is compared with and what the
group is called in its tuple's detail, how many peers carry each signal, the prior and declared
inventory per entity, the words for why a signal is expected, and FamilyMemory's learning, forgetting,
saving and restoring (what a restarted controller expects again)."""

from __future__ import annotations

import json

import numpy as np

from fleethealth.policy import default_policy
from fleethealth.score import expect as ex
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import SnapshotBuilder

POL = default_policy()
NOW = 1_000_000.0


def col(name: str, codes: list[int], vals: list[str]) -> tuple[str, np.ndarray, list[str]]:
    return name, np.asarray(codes, np.int64), vals


# --- peer groups -----------------------------------------------------------------------------------------

def test_groups_by_pool_and_job_with_the_small_group_falling_back_to_its_pool() -> None:
    # pool a: 3 GPUs of job j, 1 of job k (too small: its pool); pool b: 2 GPUs (too small: everyone)
    pools = col("pool", [0, 0, 0, 0, 1, 1], ["a", "b"])
    jobs = col("job", [0, 0, 0, 1, 0, 0], ["j", "k"])
    g = ex._groups_from([pools, jobs], 6, 3, "all GPUs")
    named = [g.names[int(i)] for i in g.grp]
    assert named == ["pool=a,job=j"] * 3 + ["pool=a", "all GPUs", "all GPUs"]
    assert dict(zip(g.names, g.sizes.tolist(), strict=True)) == {
        "pool=a,job=j": 3, "pool=a,job=k": 1, "pool=b,job=j": 2, "pool=a": 4, "pool=b": 2, "all GPUs": 6}
    assert len(g.names) == 6 and len(g.levels) == 3


def test_a_group_of_exactly_min_group_is_its_own_group() -> None:
    g = ex._groups_from([col("pool", [0, 0, 1], ["a", "b"])], 3, 2, "all")
    assert [g.names[int(i)] for i in g.grp] == ["pool=a", "pool=a", "all"]
    g1 = ex._groups_from([col("pool", [0, 0, 1], ["a", "b"])], 3, 1, "all")
    assert [g1.names[int(i)] for i in g1.grp] == ["pool=a", "pool=a", "pool=b"]


def test_an_entity_without_a_finer_label_its_pool_has_is_compared_with_the_pool() -> None:
    # pool a: three GPUs in job j and three in no job; pool b: three GPUs and no job at all
    pools = col("pool", [0, 0, 0, 0, 0, 0, 1, 1, 1], ["a", "b"])
    jobs = col("job", [0, 0, 0, -1, -1, -1, -1, -1, -1], ["j"])
    g = ex._groups_from([pools, jobs], 9, 3, "all GPUs")
    named = [g.names[int(i)] for i in g.grp]
    # the no-job GPUs of pool a are compared with pool a (not with a group of "no job"); pool b has no job
    # label anywhere, so its group of three is pool b itself
    assert named == ["pool=a,job=j"] * 3 + ["pool=a"] * 3 + ["pool=b"] * 3


def test_entities_without_a_pool_are_compared_with_everyone() -> None:
    g = ex._groups_from([col("pool", [-1, -1, -1, 0], ["a"])], 4, 3, "all GPUs")
    assert [g.names[int(i)] for i in g.grp] == ["all GPUs"] * 4
    assert g.names[:2] == ["all GPUs", "pool=a"]  # the group with no value is named as everyone


def test_no_labels_or_no_entities_is_one_group_of_everyone() -> None:
    g = ex._groups_from([], 3, 3, "all replicas")
    assert g.names == ["all replicas"] and g.sizes.tolist() == [3] and g.grp.tolist() == [0, 0, 0]
    assert g.counts(np.asarray([[True, False, True]])).tolist() == [[2]]
    empty = ex._groups_from([col("pool", [], [])], 0, 3, "all")
    assert empty.names == ["all"] and empty.sizes.tolist() == [0] and empty.levels == []
    assert empty.counts(np.zeros((2, 0), bool)).tolist() == [[0], [0]]


def test_counts_how_many_members_of_each_group_carry_each_signal() -> None:
    pools = col("pool", [0, 0, 0, 1, 1], ["a", "b"])
    jobs = col("job", [0, 0, 1, 0, 0], ["j", "k"])
    g = ex._groups_from([pools, jobs], 5, 1, "all")
    seen = np.asarray([[True, True, False, True, False],
                       [False, False, True, False, False]])
    got = {name: c for name, c in zip(g.names, g.counts(seen).T.tolist(), strict=True)}
    assert got == {"pool=a,job=j": [2, 0], "pool=a,job=k": [0, 1], "pool=b,job=j": [1, 0],
                   "pool=a": [2, 1], "pool=b": [1, 0], "all": [3, 1]}


def test_merge_fills_absent_codes_from_the_other_kind() -> None:
    own = np.asarray([0, -1, -1, 1], np.int64)
    other = np.asarray([1, 1, -1, 0], np.int64)  # another kind's codes per entity, into its own values
    codes, vals = ex._merge(own, ["a", "b"], other, ["c", "a"])
    assert [vals[int(c)] if c >= 0 else None for c in codes] == ["a", "a", None, "b"]
    assert vals == ["a", "b", "c"]
    codes, vals = ex._merge(np.asarray([-1], np.int64), [], np.asarray([-1], np.int64), [])
    assert codes.tolist() == [-1] and vals == []


def test_gpus_take_their_nodes_pool_and_replicas_their_own_labels_in_a_scored_snapshot() -> None:
    b = SnapshotBuilder()
    for node, pool in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        b.add("fleethealth_node_info", {"node": node, "pool": pool}, 1.0, NOW)
        for g in range(2):
            lab = {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0, NOW)
    for i in range(3):
        b.add("vllm:num_requests_waiting", {"replica": f"r{i}", "model_name": "llama", "pool": "s"}, 0.0, NOW)
    b.add("vllm:num_requests_waiting", {"replica": "q0", "model": "qwen", "pool": "s"}, 0.0, NOW)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    gk = fh.kinds["gpu"]
    assert gk.expect is not None and gk.expect.groups is not None
    gg = gk.expect.groups
    assert {n: gg.names[int(gg.grp[i])] for i, n in enumerate(gk.names)} == {
        "a1/gpu0": "pool=a", "a1/gpu1": "pool=a", "a2/gpu0": "pool=a", "a2/gpu1": "pool=a",
        "b1/gpu0": "all GPUs", "b1/gpu1": "all GPUs"}
    rk = fh.kinds["replica"]
    assert rk.expect is not None and rk.expect.groups is not None
    rg = rk.expect.groups
    assert {n: rg.names[int(rg.grp[i])] for i, n in enumerate(rk.names)} == {
        "r0": "pool=s,model=llama", "r1": "pool=s,model=llama", "r2": "pool=s,model=llama", "q0": "pool=s"}


# --- the prior and inventory per entity ----------------------------------------------------------------

def test_the_prior_is_spread_from_each_node_to_its_gpus() -> None:
    exp = ex.Expectations(families={"n1": frozenset({"DCGM", "rank"}), "n2": frozenset({"DCGM"}),
                                    "n9": frozenset({"rank"}), "n3": frozenset()})
    ke = ex.kind_expect("gpu", ["n1/gpu0", "n1/gpu1", "n2/gpu0", "n3/gpu0"], None, exp, ["n1", "n2", "n3"],
                        np.asarray([0, 0, 1, 2]), 0.6)
    assert {f: m.tolist() for f, m in ke.prior.items()} == {"DCGM": [True, True, True, False],
                                                            "rank": [True, True, False, False]}
    assert ke.carried_share == 0.6 and ke.declared is None and ke.declared_why == {}
    pm = ke.prior_matrix(["DCGM", "nvml", "rank"], 4)
    assert pm is not None and pm.tolist() == [[True, True, True, False], [False] * 4, [True, True, False, False]]
    # replicas are their own owners
    rk = ex.kind_expect("replica", ["r1", "r2"], None, ex.Expectations(families={"r2": frozenset({"slo"})}),
                        None, None, 0.5)
    assert rk.prior["slo"].tolist() == [False, True]


def test_no_prior_no_matrix_and_nothing_without_expectations() -> None:
    ke = ex.kind_expect("gpu", ["a"], None, None, None, None, 0.5)
    assert ke.prior == {} and ke.declared is None and ke.prior_matrix(["DCGM"], 1) is None
    assert ex.kind_expect("gpu", [], None, ex.Expectations(declared={"a": "x"}), None, None, 0.5).declared is None


def test_declared_entities_and_why_whether_few_or_many_are_declared() -> None:
    names = [f"n/gpu{i}" for i in range(20)]
    few = ex.kind_expect("gpu", names, None, ex.Expectations(declared={"n/gpu3": "capacity 8", "x/gpu0": "y"}),
                         None, None, 0.5)
    assert few.declared is not None and np.flatnonzero(few.declared).tolist() == [3]
    assert few.declared_why == {3: "capacity 8"}
    many_decl = {f"n/gpu{i}": f"cap {i}" for i in range(0, 20, 2)} | {"gone": "z"}
    many = ex.kind_expect("gpu", names, None, ex.Expectations(declared=many_decl), None, None, 0.5)
    assert many.declared is not None and np.flatnonzero(many.declared).tolist() == list(range(0, 20, 2))
    assert many.declared_why == {i: f"cap {i}" for i in range(0, 20, 2)}
    # at the edge: 8 names per declared entity is scanned the same way
    edge = ex.kind_expect("gpu", names[:16], None, ex.Expectations(declared={"n/gpu0": "a", "n/gpu15": "b"}),
                          None, None, 0.5)
    assert edge.declared_why == {0: "a", 15: "b"}


# --- why a signal is expected, in words --------------------------------------------------------------

def test_each_reason_a_signal_is_expected_in_words() -> None:
    g = ex._groups_from([col("pool", [0, 0, 0], ["a"])], 3, 3, "all GPUs")
    ke = ex.KindExpect(g, {}, np.asarray([False, True, False]), {1: "nvidia.com/gpu capacity 8"})
    carry = np.asarray([[0, 0], [2, 2]])
    assert ex.expected_by(ex.WHY_NONE, ke, 0, 1, carry) == ""
    assert ex.expected_by(ex.WHY_FRESH, ke, 0, 1, carry) == "reporting"
    assert ex.expected_by(ex.WHY_OWN, ke, 0, 1, carry) == "its exporter reports this family (policy: expected)"
    assert ex.expected_by(ex.WHY_PENDING, ke, 0, 1, carry) == \
        "needs two samples; its exporter reports (not yet fresh)"
    assert ex.expected_by(ex.WHY_PRIOR, ke, 0, 1, carry) == \
        "it reported this family before (prior, kept in the state store)"
    assert ex.expected_by(ex.WHY_PEERS, ke, 0, 1, carry) == "its peers (pool=a) carry it: 2 of 3"
    assert ex.expected_by(ex.WHY_INVENTORY, ke, 1, 1, carry) == \
        "declared by inventory (nvidia.com/gpu capacity 8); its peers (pool=a) carry it: 2 of 3"
    assert ex.expected_by(ex.WHY_INVENTORY, ke, 0, 1, None) == "declared by inventory (declared)"
    assert ex.expected_by(ex.WHY_INVENTORY, None, 0, 1, None) == "declared by inventory (declared)"
    assert ex.expected_by(ex.WHY_PEERS, None, 0, 1, carry) == "its peers carry it"
    no_groups = ex.KindExpect(None, {}, None, {})
    assert ex.expected_by(ex.WHY_PEERS, no_groups, 0, 1, carry) == "its peers carry it"


# --- FamilyMemory -------------------------------------------------------------------------------------

def _fleet(at: float, dcgm: set[str], ranks: set[str]) -> object:
    """Nodes n1, n2 with four GPUs each: DCGM from the nodes in ``dcgm``, rank timings (four ranks, the
    fewest a peer-shaped signal is scored with) from the nodes in ``ranks``."""
    b = SnapshotBuilder()
    for node in ("n1", "n2"):
        for g in range(4):
            if node in dcgm:
                b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node}, 50.0, at)
            if node in ranks:
                b.add("fleethealth_rank_compute_seconds", {"job": f"j{node}", "rank": str(g), "node": node,
                                                           "gpu": str(g), "peer_group": "s0"}, 0.5, at)
    return score_snapshot(b.build(at), POL, at)


def test_family_memory_learns_each_nodes_families_and_saves_only_what_changed() -> None:
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    mem.learn(_fleet(100.0, {"n1", "n2"}, {"n1"}), 100.0)
    assert mem.seen == {"n1": {"DCGM": 100.0, "rank": 100.0}, "n2": {"DCGM": 100.0}}
    assert mem.version == 1
    rows = mem.rows()
    assert set(rows) == {("n1", "families"), ("n2", "families")}
    assert json.loads(rows[("n1", "families")]) == {"families": {"DCGM": 100.0, "rank": 100.0}}
    assert mem.rows() == {}  # saved: nothing new
    # the same families a cycle later: nothing to save, the version (the scorer's cache key) holds
    mem.learn(_fleet(130.0, {"n1", "n2"}, {"n1"}), 130.0)
    assert mem.rows() == {} and mem.version == 1
    # n2 starts a rank: n2 (only) changed
    mem.learn(_fleet(160.0, {"n1", "n2"}, {"n1", "n2"}), 160.0)
    assert set(mem.rows()) == {("n2", "families")} and mem.version == 2
    assert mem.seen["n2"] == {"DCGM": 160.0, "rank": 160.0}


def test_family_memory_sweeps_every_refresh_s_and_forgets_after_ttl_s() -> None:
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    mem.learn(_fleet(100.0, {"n1", "n2"}, {"n1"}), 100.0)
    mem.rows()
    mem.learn(_fleet(599.0, {"n1", "n2"}, set()), 599.0)  # before the sweep: n1's rank gone, nothing new
    assert mem.seen["n1"]["rank"] == 100.0 and mem.rows() == {}
    mem.learn(_fleet(600.0, {"n1", "n2"}, set()), 600.0)  # the sweep: every entity's times refreshed
    assert mem.seen == {"n1": {"DCGM": 600.0, "rank": 100.0}, "n2": {"DCGM": 600.0}}
    assert set(mem.rows()) == {("n1", "families"), ("n2", "families")}
    mem.learn(_fleet(1100.0, {"n1", "n2"}, set()), 1100.0)  # n1's rank 1000 s old: kept (at the ttl)
    assert "rank" in mem.seen["n1"]
    mem.learn(_fleet(1101.0, {"n2"}, set()), 1101.0)  # not a sweep (only 1 s later)
    assert "rank" in mem.seen["n1"]
    mem.learn(_fleet(1600.0, {"n2"}, set()), 1600.0)  # sweep: rank (t=100) and n1's DCGM (t=1100) ...
    assert mem.seen["n1"] == {"DCGM": 1100.0} and "n2" in mem.seen
    mem.learn(_fleet(2101.0, {"n2"}, set()), 2101.0)  # ... n1's DCGM past the ttl: n1 forgotten, saved as ""
    assert "n1" not in mem.seen and mem.rows()[("n1", "families")] == ""


def test_family_memory_keeps_the_most_recently_seen_entities() -> None:
    mem = ex.FamilyMemory(ttl_s=1e9, refresh_s=1.0, max_entities=2)
    mem.seen = {"old": {"DCGM": 10.0, "rank": 500.0}, "older": {"DCGM": 20.0}, "new": {"DCGM": 300.0}}
    mem._forget(1000.0)
    assert set(mem.seen) == {"old", "new"}  # by each entity's latest family
    assert set(mem.rows()) == {("older", "families")}
    mem._forget(1000.0)  # at the bound: nothing dropped
    assert set(mem.seen) == {"old", "new"} and mem.rows() == {}


def test_expectations_are_the_same_object_until_something_changes() -> None:
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    mem.learn(_fleet(100.0, {"n1"}, set()), 100.0)
    e1 = mem.expectations(100.0)
    assert e1.families == {"n1": frozenset({"DCGM"})} and e1.declared == {}
    assert mem.expectations(599.0) is e1
    assert mem.expectations(600.0) is not e1  # refresh_s later: made again
    e2 = mem.expectations(600.0, {"n1/gpu3": "capacity"})
    assert e2.declared == {"n1/gpu3": "capacity"} and mem.expectations(601.0, {"n1/gpu3": "capacity"}) is e2
    mem.learn(_fleet(700.0, {"n1", "n2"}, set()), 700.0)  # n2 is new: made again
    assert mem.expectations(701.0, {"n1/gpu3": "capacity"}).families == {"n1": frozenset({"DCGM"}),
                                                                          "n2": frozenset({"DCGM"})}
    # a family older than the ttl is not expected, and an entity with none left is not listed
    assert mem.expectations(1701.0).families == {}


def test_rows_the_store_did_not_take_are_saved_again_and_restore_keeps_the_latest_time() -> None:
    mem = ex.FamilyMemory()
    mem.seen = {"n1": {"DCGM": 5.0}}
    mem._dirty.add("n1")
    rows = mem.rows()
    mem.undo_rows(rows)
    assert mem.rows() == rows
    v = mem.version
    bad = mem.restore({("n1", "families"): json.dumps({"families": {"DCGM": 3.0, "rank": 4}}),
                       ("n2", "families"): json.dumps({"families": {"DCGM": 9.5}}),
                       ("n3", "families"): json.dumps({"other": {}}),
                       ("n4", "families"): json.dumps({"families": {"DCGM": "soon"}}),
                       ("n5", "families"): json.dumps({"families": ["DCGM"]}),
                       ("n6", "families"): "null",
                       ("n1", "gpus"): json.dumps({"count": 8})})
    assert sorted(bad) == ["n3", "n4", "n5", "n6"]
    assert mem.seen == {"n1": {"DCGM": 5.0, "rank": 4.0}, "n2": {"DCGM": 9.5}}
    assert mem.version == v + 1
    assert mem.expectations(10.0).families == {"n1": frozenset({"DCGM", "rank"}), "n2": frozenset({"DCGM"})}


# --- found by the mutation run ----------------------------------------------------------------------------

def _groups_of(fh: object, kind: str) -> dict[str, str]:
    ks = fh.kinds[kind]  # type: ignore[attr-defined]
    assert ks.expect is not None and ks.expect.groups is not None
    g = ks.expect.groups
    return {n: g.names[int(g.grp[i])] for i, n in enumerate(ks.names)}


def test_a_pool_of_small_jobs_compares_each_gpu_with_its_pool_not_everyone() -> None:
    # pool a: one GPU; pool b: three GPUs, each in its own job (groups of one): b's GPUs fall back to pool b
    pools = col("pool", [0, 1, 1, 1], ["a", "b"])
    jobs = col("job", [0, 1, 2, 3], ["w", "x", "y", "z"])
    g = ex._groups_from([pools, jobs], 4, 3, "all GPUs")
    assert [g.names[int(i)] for i in g.grp] == ["all GPUs", "pool=b", "pool=b", "pool=b"]


def test_an_empty_snapshot_with_declared_gpus_groups_them_as_everyone() -> None:
    fh = score_snapshot(SnapshotBuilder().build(NOW), POL, NOW, inventory={"node": ["n1"], "gpu": ["n1/gpu0", "n1/gpu1"]})
    assert _groups_of(fh, "gpu") == {"n1/gpu0": "all gpus", "n1/gpu1": "all gpus"}
    assert fh.tuples["n1/gpu0"].value is None


def test_a_scrape_jobs_label_is_no_training_job_and_every_rank_counts() -> None:
    b = SnapshotBuilder()
    for node in ("a1", "a2"):
        b.add("fleethealth_node_info", {"node": node, "pool": "a"}, 1.0, NOW)
        for g in range(2):
            lab = {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node, "job": "dcgm-exporter"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0, NOW)
            b.add("fleethealth_rank_compute_seconds", {"job": "pretrain", "rank": str(2 * int(node[-1]) + g - 2),
                                                       "node": node, "gpu": str(g), "peer_group": "s0"}, 0.5, NOW)
    assert set(_groups_of(score_snapshot(b.build(NOW), POL, NOW), "gpu").values()) == {"pool=a,job=pretrain"}


def test_replicas_take_their_nodes_pool_and_unlabelled_ones_are_compared_with_all_replicas() -> None:
    b = SnapshotBuilder()
    for i in range(3):
        b.add("fleethealth_node_info", {"node": f"n{i}", "pool": "s"}, 1.0, NOW)
        b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "UUID": f"GPU-n{i}", "Hostname": f"n{i}"}, 50.0, NOW)
        b.add("vllm:num_requests_waiting", {"replica": f"r{i}", "model_name": "llama", "node": f"n{i}"}, 0.0, NOW)
    assert _groups_of(score_snapshot(b.build(NOW), POL, NOW), "replica") == {
        "r0": "pool=s,model=llama", "r1": "pool=s,model=llama", "r2": "pool=s,model=llama"}
    bare = SnapshotBuilder()
    for i in range(3):
        bare.add("vllm:num_requests_waiting", {"replica": f"r{i}"}, 0.0, NOW)
    assert set(_groups_of(score_snapshot(bare.build(NOW), POL, NOW), "replica").values()) == {"all replicas"}


def test_a_new_policys_min_group_regroups_the_same_fleet() -> None:
    from fleethealth.score.scorer import Scorer

    b = SnapshotBuilder()
    for node, pool in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        b.add("fleethealth_node_info", {"node": node, "pool": pool}, 1.0, NOW)
        b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "UUID": f"GPU-{node}", "Hostname": node}, 50.0, NOW)
    snap = b.build(NOW)
    sc = Scorer()
    assert _groups_of(sc.score(snap, POL, NOW), "gpu")["a1/gpu0"] == "all GPUs"  # min_group 3
    one = POL.model_copy(update={"expectation": POL.expectation.model_copy(update={"min_group": 1})})
    assert _groups_of(sc.score(snap, one, NOW), "gpu")["a1/gpu0"] == "pool=a"


def test_family_memory_learns_replicas_that_appear_after_the_gpus() -> None:
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    mem.learn(_fleet(100.0, {"n1", "n2"}, set()), 100.0)
    b = SnapshotBuilder()
    for node in ("n1", "n2"):
        for g in range(4):
            b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node}, 50.0, 130.0)
    b.add("vllm:num_requests_waiting", {"replica": "r1", "model_name": "m"}, 0.0, 130.0)
    mem.learn(score_snapshot(b.build(130.0), POL, 130.0), 130.0)  # not a sweep; the GPUs unchanged
    assert mem.seen["r1"] == {"vllm": 130.0} and mem.seen["n1"] == {"DCGM": 100.0}


def test_family_memory_learns_a_node_that_replaced_another_between_sweeps() -> None:
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    mem.learn(_fleet(100.0, {"n1", "n2"}, set()), 100.0)
    b = SnapshotBuilder()
    for node in ("n1", "n3"):
        for g in range(4):
            b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node}, 50.0, 130.0)
    mem.learn(score_snapshot(b.build(130.0), POL, 130.0), 130.0)
    assert mem.seen["n3"] == {"DCGM": 130.0}


def test_a_change_between_sweeps_refreshes_only_the_entities_that_changed() -> None:
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    mem.learn(_fleet(100.0, {"n1", "n2"}, {"n1"}), 100.0)
    mem.learn(_fleet(160.0, {"n1", "n2"}, {"n1", "n2"}), 160.0)
    assert mem.seen["n1"] == {"DCGM": 100.0, "rank": 100.0}  # unchanged: its times move at the next sweep


def test_a_family_exactly_ttl_s_old_is_still_expected() -> None:
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    mem.seen = {"n1": {"DCGM": 100.0}}
    assert mem.expectations(1100.0).families == {"n1": frozenset({"DCGM"})}


def test_gpus_whose_samples_carry_only_a_scrape_job_label_are_in_no_training_job() -> None:
    b = SnapshotBuilder()
    for node in ("a1", "a2"):
        b.add("fleethealth_node_info", {"node": node, "pool": "a"}, 1.0, NOW)
        for g in range(2):
            b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node,
                                           "job": "dcgm-exporter"}, 50.0, NOW)
    assert set(_groups_of(score_snapshot(b.build(NOW), POL, NOW), "gpu").values()) == {"pool=a"}


def test_a_rank_sample_without_a_gpu_moves_no_gpu_out_of_its_job() -> None:
    b = SnapshotBuilder()
    for node in ("a1", "a2"):
        b.add("fleethealth_node_info", {"node": node, "pool": "a"}, 1.0, NOW)
        for g in range(2):
            b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node}, 50.0, NOW)
            b.add("fleethealth_rank_compute_seconds", {"job": "pretrain", "rank": f"{node}{g}", "node": node,
                                                       "gpu": str(g), "peer_group": "s0"}, 0.5, NOW)
    b.add("fleethealth_rank_compute_seconds", {"job": "stray", "rank": "0", "peer_group": "s9"}, 0.5, NOW)
    assert set(_groups_of(score_snapshot(b.build(NOW), POL, NOW), "gpu").values()) == {"pool=a,job=pretrain"}


def test_family_memory_of_a_scorers_stream_learns_a_replica_whose_family_changes_beside_steady_gpus() -> None:
    """The controller's path: a Scorer over a SignalHistory keeps the GPU table between cycles, so steady
    GPUs take the shortcut; a replica's family appearing in the same cycle is still learned."""
    from fleethealth.score.scorer import Scorer
    from fleethealth.signals.history import SignalHistory

    sc = Scorer()
    hist = SignalHistory(POL, memory_s=3600)
    mem = ex.FamilyMemory(ttl_s=1000.0, refresh_s=500.0)
    for at in (100.0, 130.0, 160.0):
        b = SnapshotBuilder()
        for node in ("n1", "n2"):
            for g in range(4):
                b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node}, 50.0, at)
        b.add("vllm:num_requests_waiting", {"replica": "r1", "model_name": "m"}, 0.0, at)
        # the same series every cycle (the tables stay the same); no value before 160: not fresh
        b.add("sglang:num_queue_reqs", {"replica": "r1", "model_name": "m"}, 0.0 if at == 160.0 else float("nan"), at)
        hist.add(b.build(at))
        mem.learn(sc.score(hist.view(at), POL, at), at)
    assert mem.seen["r1"] == {"vllm": 160.0, "sglang": 160.0}  # a changed entity: all its families now
    assert mem.seen["n1"] == {"DCGM": 100.0}


# --- a node's GPU count from its peers (gpu_count_from_peers) ------------------------------------------

def _count(per_node: list[int], pools: list[int], names: list[str], min_peers: int = 4,
           fraction: float = 0.8) -> tuple[list[int], list[int], list[int]]:
    e, a, p = ex.gpu_count_from_peers(np.asarray(per_node), np.asarray(pools), names, min_peers, fraction)
    return e.tolist(), a.tolist(), p.tolist()


def test_a_pool_at_exactly_min_peers_and_fraction_expects_its_common_count() -> None:
    assert _count([8, 8, 8, 8, 7], [0] * 5, ["a"], min_peers=5) == ([8] * 5, [4] * 5, [5] * 5)
    assert _count([8, 8, 8, 7, 7], [0] * 5, ["a"], min_peers=5) == ([0] * 5, [0] * 5, [0] * 5)  # 3 of 5
    assert _count([8, 8, 8, 8], [0] * 4, ["a"], min_peers=5) == ([0] * 4, [0] * 4, [0] * 4)  # too few


def test_single_gpu_nodes_are_peers_too_and_each_pool_has_its_own_count() -> None:
    assert _count([1, 1, 1, 1], [0] * 4, ["a"]) == ([1] * 4, [4] * 4, [4] * 4)
    got = _count([8, 4, 8, 4, 8, 4, 8, 4, 0], [0, 1, 0, 1, 0, 1, 0, 1, -1], ["a", "b"])
    assert got[0] == [8, 4, 8, 4, 8, 4, 8, 4, 0]
    assert ex.gpu_count_why("pool=a", 4, 5, 8) == "its peers (pool=a): 4 of 5 nodes have 8 GPUs"
