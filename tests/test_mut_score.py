"""Behaviours of the scoring engine's stages (score/*) that mutation testing found unpinned (issue 21):
exact values on small hand-computed fleets, the reasons and confidences operators read.

The numbers come from the default policy: a ramp is 1 at ``warn`` and 0 at ``crit``; a category is the
weighted mean of its fresh signals (a fresh 0 zeroes it); training takes the minimum across categories,
serving the geometric mean; confidence is fresh / expected signals (1 for a gated entity).
"""

from __future__ import annotations

import gc

import pytest

from fleethealth.policy import Policy, default_policy, default_policy_text, parse_policy
from fleethealth.score.engine import Scorer, score_snapshot
from fleethealth.score.expect import Expectations, FamilyMemory
from fleethealth.score.health import HealthTuple, SignalDetail
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from test_engine import fleet, gpu_labels, healthy_node

NOW = 1_800_000_000.0
POL = default_policy()


def _replica(b: SnapshotBuilder, name: str, step: int, err_share: float, queue: float | None = None,
             preempt_per_s: float | None = None, span: int = 3600) -> None:
    """A replica serving 10 requests/s for ``span`` seconds, sampled every ``step`` seconds."""
    lab = dict(replica=name, model_name="llama", build="v1")
    for k in range(0, span + 1, step):
        t = NOW - span + k
        b.add("fleethealth_replica_requests_total", lab, 10.0 * k, t)
        b.add("fleethealth_replica_errors_total", lab, err_share * 10.0 * k, t)
        if preempt_per_s is not None:
            b.add("vllm:num_preemptions_total", lab, preempt_per_s * k, t)
    if queue is not None:
        b.add("vllm:num_requests_waiting", lab, queue, NOW - 1)


def _replicas() -> Snapshot:
    b = SnapshotBuilder()
    _replica(b, "burning", 60, 0.05)
    _replica(b, "sparse", 600, 0.05)  # every 10 min: nothing twice inside the 5 min short window
    _replica(b, "queued", 60, 0.0, queue=144, preempt_per_s=0.25)
    _replica(b, "preempted", 60, 0.0, queue=144, preempt_per_s=2.75)
    _replica(b, "storm", 60, 0.0, queue=144, preempt_per_s=6.0)
    return b.build(NOW)


def _detail(t, signal):  # type: ignore[no-untyped-def]
    return next(d for d in t.details if d.signal == signal)


def test_error_slo_burning_5x_scores_by_its_slower_window_pair() -> None:
    """5% errors against a 99% objective is a 5x burn on every window: the 1 h/5 min pair ramps it
    1 - 4/13.4 = 0.70, the 6 h/30 min pair 1 - 4/5 = 0.2; the SLO takes the worse."""
    fh = score_snapshot(_replicas(), POL, NOW, consumer="training")
    t = fh.tuples["burning"]
    d = _detail(t, "error_slo")
    assert d.score == pytest.approx(0.2, abs=1e-9)
    assert d.raw == pytest.approx(5.0) and d.rate == pytest.approx(5.0)  # long and short burn, fastest pair
    assert t.value == pytest.approx(0.2, abs=1e-9) and t.worst == "errors"
    assert t.categories["errors"] == pytest.approx(0.2, abs=1e-9)
    assert t.categories["serving"] is None and t.categories["load"] is None


def test_an_slo_with_its_short_window_missing_scores_by_the_other_pair() -> None:
    """Sampled every 10 min, the 5 min window holds one sample: that pair has no burn rate (not 0, not
    healthy) and the score is the 6 h/30 min pair's alone; the short burn shown is unknown."""
    t = score_snapshot(_replicas(), POL, NOW, consumer="training").tuples["sparse"]
    d = _detail(t, "error_slo")
    assert d.score == pytest.approx(0.2, abs=1e-9)
    assert d.rate is None and d.raw == pytest.approx(5.0)
    assert t.value == pytest.approx(0.2, abs=1e-9) and t.worst == "errors"


def test_replica_lacking_what_its_peers_report_says_so_and_loses_confidence() -> None:
    """The other replicas report queue depth and preemptions: expected of this one too (by peers), so
    its confidence is 1 fresh of 3 expected and the reason names what is missing."""
    t = score_snapshot(_replicas(), POL, NOW, consumer="training").tuples["burning"]
    assert t.confidence == pytest.approx(1 / 3)
    assert t.reason == "missing:queue_depth,preemptions"
    ok = score_snapshot(_replicas(), POL, NOW, consumer="training").tuples["queued"]
    assert ok.confidence == 1.0


@pytest.mark.parametrize(("name", "load", "preempt"), [
    ("queued", (0.5 * 1 + 1.0 * 0.5) / 1.5, 1.0),      # queue 144: ramp(32, 256) = 0.5; 0.25/s preemptions fine
    ("preempted", (0.5 * 1 + 0.5 * 0.5) / 1.5, 0.5),   # 2.75/s: ramp(0.5, 5) = 0.5
    ("storm", 0.0, 0.0),                               # 6/s: past crit, a fresh 0 zeroes the category
])
def test_load_category_is_the_weighted_mean_of_queue_depth_and_preemptions(name: str, load: float,
                                                                          preempt: float) -> None:
    snap = _replicas()
    t = score_snapshot(snap, POL, NOW, consumer="training").tuples[name]
    assert _detail(t, "queue_depth").score == pytest.approx(0.5)
    assert _detail(t, "preemptions").score == pytest.approx(preempt)
    assert t.categories["load"] == pytest.approx(load, abs=1e-12)
    assert t.categories["errors"] == 1.0
    assert t.value == pytest.approx(load, abs=1e-12) and t.reason == "min:load" and t.worst == "load"
    g = score_snapshot(snap, POL, NOW, consumer="serving").tuples[name]
    assert g.value == pytest.approx((1.0 * load) ** 0.5, abs=1e-12)  # gmean of errors and load
    assert g.reason == "gmean:load" and g.worst == "load" and g.confidence == 1.0


def _gpu_fleet() -> Snapshot:
    """Six healthy nodes and node x, whose GPUs each miss or break something."""
    b = fleet()
    for g in range(8):
        lab = gpu_labels("x", g)
        b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, NOW - 5)
        b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, NOW - 500 if g < 4 else NOW - 5)  # stale on 0-3
        b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, NOW - 5)
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, NOW - 5)  # one sample: no rate yet
        if g == 1:
            b.add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", lab, 5, NOW - 5)
        if g == 2:
            b.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", lab, 1, NOW - 5)
        if g == 3:
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 90.0, NOW - 4)
            b.add("DCGM_FI_DEV_ROW_REMAP_PENDING", lab, 1, NOW - 5)
    return b.build(NOW)


def test_gpu_confidence_is_fresh_over_expected_signals() -> None:
    fh = score_snapshot(_gpu_fleet(), POL, NOW)
    # xid, temp fresh; pcie (one sample) and sm_clock (stale) expected: 2 of 4
    g0 = fh.tuples["x/gpu0"]
    assert g0.confidence == 0.5 and g0.value == 1.0
    assert g0.reason == "min:hardware" and g0.worst == "hardware"  # equal categories: the first
    # the fresh clock counts: 3 of 4
    assert fh.tuples["x/gpu4"].confidence == 0.75
    assert fh.tuples["x/gpu4"].categories["performance"] == 1.0


def test_a_counter_seen_once_is_pending_and_named_in_the_reason() -> None:
    """An SBE counter with one sample has no rate yet: expected (its family reports), not fresh, and the
    reason says which signals wait for a second sample. Confidence 2 of 6 (xid, temp fresh; sm_clock,
    pcie_replay, ecc_sbe, ecc_sbe_sustained not yet)."""
    t = score_snapshot(_gpu_fleet(), POL, NOW).tuples["x/gpu1"]
    assert t.value == 1.0
    assert t.reason == "pending:ecc_sbe,ecc_sbe_sustained,pcie_replay"
    assert t.confidence == pytest.approx(1 / 3)


def test_a_gate_decides_value_worst_reason_and_full_confidence() -> None:
    fh = score_snapshot(_gpu_fleet(), POL, NOW)
    t = fh.tuples["x/gpu2"]
    assert t.value == 0.0 and t.confidence == 1.0
    assert t.reason == "gate:row_remap_failure" and t.worst == "memory"
    assert t.categories["memory"] == 0.0 and t.categories["thermal"] == 1.0
    node = fh.tuples["x"]
    assert node.value == 0.0 and node.confidence == 1.0 and node.reason == "gate:row_remap_failure"
    assert node.worst == "memory" and node.worst_member == "x/gpu2"
    assert node.flags == ("row_remap_pending",)
    assert node.categories["thermal"] == 0.5  # the node's category is its worst GPU's


def test_flag_and_ramp_in_min_and_gmean() -> None:
    """gpu3: 90 C is thermal 0.5, a pending row remap is memory 0.8 (a flag), hardware 1: training
    reads 0.5 (thermal), serving the geometric mean (1 * 0.8 * 0.5) ** (1/3). Confidence: xid, temp and
    the remap flag fresh of 5 expected (with sm_clock stale and pcie_replay pending) = 0.6."""
    snap = _gpu_fleet()
    t = score_snapshot(snap, POL, NOW, consumer="training").tuples["x/gpu3"]
    assert t.value == 0.5 and t.reason == "min:thermal" and t.worst == "thermal"
    assert t.categories["memory"] == pytest.approx(0.8) and t.flags == ("row_remap_pending",)
    assert t.confidence == pytest.approx(0.6)
    g = score_snapshot(snap, POL, NOW, consumer="serving").tuples["x/gpu3"]
    assert g.value == pytest.approx(0.4 ** (1 / 3), abs=1e-12)
    assert g.reason == "gmean:thermal" and g.worst == "thermal" and g.confidence == pytest.approx(0.6)


def _nodes() -> Snapshot:
    """Six healthy nodes (n0-n5) and five that each show one roll-up rule (see the test)."""
    b = fleet()
    for n in "abde":
        healthy_node(b, n, gpus=7 if n == "d" else 8)
    b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels("a", 5), 90.0, NOW - 4)   # thermal 0.5
    b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels("a", 6), 87.5, NOW - 4)   # thermal 0.75
    for n in "ab":  # NVSwitch errors on the node's fabric: its own nvlink category, a 0.8 flag
        b.add("fleethealth_kernel_sxid_total", {"Hostname": n}, 0, NOW - 100)
        b.add("fleethealth_kernel_sxid_total", {"Hostname": n}, 2, NOW - 10)
    for g in range(8):  # c: gpu3 entirely stale; gpu5 only its temperature fresh (confidence 1/4)
        lab = gpu_labels("c", g)
        ts = NOW - 500 if g in (3, 5) else NOW - 5
        b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, NOW - 5 if g == 5 else ts)
        b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0 + g, ts)
        b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, ts)
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts - 30)
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts)
    b.add("DCGM_FI_DEV_XID_ERRORS", gpu_labels("e", 2), 79, NOW - 3)  # gated
    b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels("e", 4), 99.0, NOW - 3)   # thermal 0: lower, not gated
    return b.build(NOW)


# node -> (value, confidence, reason, worst category, worst member, flags) for training (min)
NODE_ROLLUP = {
    # the weakest GPU decides and is named; the node's own 0.8 nvlink flag is less bad
    "a": (0.5, 1.0, "min:thermal", "thermal", "a/gpu5", ("nvswitch_sxid",)),
    # the node's own signal is its worst: no GPU decided it
    "b": (0.8, 1.0, "min:nvlink", "nvlink", None, ("nvswitch_sxid",)),
    # an unknown GPU and one below min_confidence (0.5) leave the node unknown, named after the first;
    # confidence adds up the GPUs' signals: 6 x 4 fresh + 0 + 1 of 32 expected
    "c": (None, 25 / 32, "missing:gpu3,gpu5", None, "c/gpu3", ()),
    # 7 GPUs where every peer node has 8: unknown, confidence scaled by 7/8
    "d": (None, 7 / 8, "missing:gpu7", None, None, ()),
    # a gated GPU is named before a lower ungated one; a gate is certain: confidence 1
    "e": (0.0, 1.0, "gate:xid", "hardware", "e/gpu2", ("xid:79",)),
}


@pytest.mark.parametrize("node", sorted(NODE_ROLLUP))
def test_node_roll_up_value_confidence_reason_and_member(node: str) -> None:
    value, conf, reason, worst, member, flags = NODE_ROLLUP[node]
    t = score_snapshot(_nodes(), POL, NOW, consumer="training").tuples[node]
    assert (t.value, t.reason, t.worst, t.worst_member, t.flags) == (value, reason, worst, member, flags)
    assert t.confidence == pytest.approx(conf, abs=1e-12)


def test_node_categories_are_the_minimum_over_its_gpus_and_its_own() -> None:
    fh = score_snapshot(_nodes(), POL, NOW, consumer="training")
    a = fh.tuples["a"].categories
    assert a["thermal"] == 0.5 and a["nvlink"] == pytest.approx(0.8) and a["hardware"] == 1.0
    assert "memory" not in a  # no GPU or node signal of it is fresh
    e = fh.tuples["e"].categories
    assert e["hardware"] == 0.0 and e["thermal"] == 0.0 and e["pcie"] == 1.0
    assert fh.tuples["c/gpu3"].value is None and fh.tuples["c/gpu5"].confidence == 0.25


def test_a_scorer_cycle_after_cycle_and_consumer_after_consumer_rolls_up_the_same() -> None:
    """What the scorer keeps between cycles (sorts, derived scores, per-consumer roll-ups) never changes
    a node's tuple: the same snapshot scored again, for training then serving, reads as scored alone."""
    snap = _nodes()
    s = Scorer()
    for _ in range(3):
        for consumer in ("training", "serving"):
            got = s.score(snap, POL, NOW, consumer=consumer)
            alone = score_snapshot(snap, POL, NOW, consumer=consumer)
            for n in NODE_ROLLUP:
                a, b = got.tuples[n], alone.tuples[n]
                assert (a.value, a.confidence, a.reason, a.worst, a.worst_member, a.flags) == (
                    b.value, b.confidence, b.reason, b.worst, b.worst_member, b.flags)
    serving = s.score(snap, POL, NOW, consumer="serving")
    # serving: gpu a/gpu5 is 0.5 ** (1/4) = 0.84 by geometric mean, above the node's own nvlink 0.8
    assert serving.tuples["a"].value == pytest.approx(0.8) and serving.tuples["a"].reason == "gmean:nvlink"
    assert serving.tuples["a"].worst_member is None
    assert serving.tuples["a/gpu5"].value == pytest.approx(0.5 ** 0.25, abs=1e-12)
    assert s.score(snap, POL, NOW, consumer="training").tuples["a"].worst_member == "a/gpu5"


# replica -> (sampled every s, error share, share of requests slower than the 2 s TTFT threshold)
SLO_REPLICAS = {
    "burning": (60, 0.05, 0.0), "sparse": (600, 0.05, 0.0), "slow": (60, 0.0, 0.04),
    "stale": (60, 0.05, 0.0),  # its last scrape 120 s ago, past max_age_s 90
    "coarse": (60, 0.0, 0.5),  # its histogram has no bucket at the 2 s threshold
}


def _slo_scrape(b: SnapshotBuilder, k: int) -> None:
    t = NOW - 3600 + k
    for name, (step, err, slow) in SLO_REPLICAS.items():
        if k % step or (name == "stale" and k > 3480):
            continue
        lab = dict(replica=name, model_name="llama", build="v1")
        reqs = 10.0 * k
        b.add("fleethealth_replica_requests_total", lab, reqs, t)
        b.add("fleethealth_replica_errors_total", lab, err * reqs, t)
        b.add("vllm:time_to_first_token_seconds_count", lab, reqs, t)
        le = "5.0" if name == "coarse" else "2.0"
        b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": le}, (1 - slow) * reqs, t)
        b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "+Inf"}, reqs, t)


def _slo_snapshots() -> dict[str, Snapshot]:
    """The same hour of scrapes as one snapshot (the row path) and as a history's view (the batched
    counter-matrix path): both must read the same."""
    h = SignalHistory(POL)
    whole = SnapshotBuilder()
    for k in range(0, 3601, 60):
        b = SnapshotBuilder()
        _slo_scrape(b, k)
        _slo_scrape(whole, k)
        h.add(b.build(NOW - 3600 + k))
    return {"rows": whole.build(NOW), "view": h.view(NOW)}


@pytest.fixture(scope="module")
def slo_snaps() -> dict[str, Snapshot]:
    return _slo_snapshots()


@pytest.mark.parametrize("path", ["rows", "view"])
def test_slo_burn_rates_on_rows_and_on_a_history_view(slo_snaps: dict[str, Snapshot], path: str) -> None:
    fh = score_snapshot(slo_snaps[path], POL, NOW, consumer="serving")
    burning = fh.tuples["burning"]
    err = _detail(burning, "error_slo")
    assert err.score == pytest.approx(0.2, abs=1e-9) and err.age_s == 0.0
    assert err.raw == pytest.approx(5.0) and err.rate == pytest.approx(5.0)
    assert _detail(burning, "ttft_slo").score == 1.0 and _detail(burning, "ttft_slo").rate == 0.0
    # serving: geometric mean of serving 1 and errors 0.2
    assert burning.value == pytest.approx(0.2 ** 0.5, abs=1e-9) and burning.reason == "gmean:errors"
    assert burning.confidence == 1.0
    # 4% slower than 2 s: a 4x burn, 1 - 3/5 on the 6 h pair
    slow = fh.tuples["slow"]
    ttft = _detail(slow, "ttft_slo")
    assert ttft.score == pytest.approx(0.4, abs=1e-9) and ttft.raw == pytest.approx(4.0)
    assert ttft.rate == pytest.approx(4.0)
    assert slow.value == pytest.approx(0.4 ** 0.5, abs=1e-9) and slow.worst == "serving"
    # one sample in the 5 min window: that pair unknown, the score the other pair's
    sparse = _detail(fh.tuples["sparse"], "error_slo")
    assert sparse.score == pytest.approx(0.2, abs=1e-9) and sparse.rate is None
    assert sparse.raw == pytest.approx(5.0)
    # requests last counted 120 s ago: stale, the burn still shown, the replica unknown
    stale = fh.tuples["stale"]
    assert _detail(stale, "error_slo").score is None and _detail(stale, "error_slo").age_s == 120.0
    assert _detail(stale, "error_slo").raw == pytest.approx(5.0)
    assert stale.value is None and stale.reason == "no_fresh_data" and stale.confidence == 0.0
    # no bucket at the threshold: the latency SLO cannot be read (not healthy), errors still are
    coarse = fh.tuples["coarse"]
    assert _detail(coarse, "ttft_slo").score is None and _detail(coarse, "ttft_slo").raw is None
    assert _detail(coarse, "error_slo").score == 1.0 and coarse.value == 1.0
    assert coarse.confidence == 0.5


@pytest.mark.parametrize("path", ["rows", "view"])
def test_a_signal_s_own_slo_objective_replaces_the_policy_s(slo_snaps: dict[str, Snapshot], path: str) -> None:
    """error_slo at 95%: 5% errors burn exactly the budget (1x), which scores 1."""
    anchor = "    requests_metric: fleethealth_replica_requests_total\n"
    text = default_policy_text()
    assert text.count(anchor) == 1
    pol = parse_policy(text.replace(anchor, anchor + "    objective: 0.95\n"))
    t = score_snapshot(slo_snaps[path], pol, NOW, consumer="serving").tuples["burning"]
    err = _detail(t, "error_slo")
    assert err.raw == pytest.approx(1.0) and err.score == 1.0 and t.value == 1.0
    # the latency SLO keeps the policy's 99%
    slow = score_snapshot(slo_snaps[path], pol, NOW, consumer="serving").tuples["slow"]
    assert _detail(slow, "ttft_slo").score == pytest.approx(0.4, abs=1e-9)


def test_health_tuple_json_is_what_the_api_serves() -> None:
    """A tuple's JSON: values to 6 places, unknown as null, the worst member, flags and labels only when
    there are some, and each signal's detail on request."""
    d = SignalDetail("gpu_temp", "thermal", "ramp", 90.0, None, None, 0.5, 4.0, 1.0, note="hot",
                     expected_by="own exporter")
    t = HealthTuple("n1/gpu5", "gpu", 0.123456789, 2 / 3, "thermal", "min:thermal",
                    {"thermal": 0.5, "memory": None, "load": 1 / 3}, (d,), {"node": "n1"}, "n1/gpu5", ("xid:13",),
                    NOW)
    assert t.known and not HealthTuple("x", "node", None, 0.0, None, "no_fresh_data").known
    want = {"entity": "n1/gpu5", "kind": "gpu", "value": 0.123457, "confidence": 0.666667, "worst": "thermal",
            "reason": "min:thermal", "categories": {"thermal": 0.5, "memory": None, "load": 0.333333},
            "worst_member": "n1/gpu5", "flags": ["xid:13"], "labels": {"node": "n1"}}
    assert t.to_dict() == want
    assert t.to_dict(with_details=True) == {**want, "details": [{
        "signal": "gpu_temp", "category": "thermal", "shape": "ramp", "raw": 90.0, "rate": None, "z": None,
        "score": 0.5, "age_s": 4.0, "weight": 1.0, "note": "hot", "expected_by": "own exporter"}]}
    bare = HealthTuple("n2", "node", None, 0.0, None, "no_fresh_data")
    assert bare.to_dict() == {"entity": "n2", "kind": "node", "value": None, "confidence": 0.0, "worst": None,
                              "reason": "no_fresh_data", "categories": {}}
    assert bare.ts == 0.0 and bare.details == () and bare.worst_member is None


def test_one_scorer_never_answers_a_new_question_with_a_kept_evaluation() -> None:
    """A scorer reuses its last evaluation only for the same snapshot, policy, time, inventory and
    expectations: a later time (samples gone stale), an inventory naming a silent node, another snapshot
    or policy each read as scored alone."""
    snap = _gpu_fleet()
    s = Scorer()
    assert s.score(snap, POL, NOW, consumer="training").tuples["x/gpu3"].value == 0.5
    # 100 s later every sample is stale (max_age_s 90): unknown, not last call's 0.5
    later = s.score(snap, POL, NOW + 100, consumer="training").tuples["x/gpu3"]
    assert later.value is None and later.reason == "no_fresh_data" and later.ts == NOW + 100
    # an inventory naming a node with no samples: it gets an unknown tuple
    inv = {"node": ["ghost"]}
    ghost = s.score(snap, POL, NOW, consumer="training", inventory=inv).tuples["ghost"]
    assert ghost.value is None and ghost.confidence == 0.0 and ghost.reason == "no_fresh_data"
    assert s.score(snap, POL, NOW, consumer="training", inventory=dict(inv)).tuples.get("ghost") is not None
    assert s.score(snap, POL, NOW, consumer="training").tuples.get("ghost") is None
    # another snapshot: its own scores
    other = s.score(_nodes(), POL, NOW, consumer="training")
    assert other.tuples.get("x/gpu3") is None and other.tuples["a"].value == 0.5
    # another policy (thermal warn 50, crit 70): 60 C is 0.5 now
    text = default_policy_text().replace("    warn: 85\n    crit: 95", "    warn: 50\n    crit: 70")
    pol = parse_policy(text)
    assert s.score(_nodes(), pol, NOW, consumer="training").tuples["n0"].value == pytest.approx(0.5)
    assert s.score(_nodes(), POL, NOW, consumer="training").tuples["n0"].value == 1.0


def test_consumers_and_aggregation_overrides() -> None:
    snap = _gpu_fleet()
    s = Scorer()
    with pytest.raises(ValueError, match="unknown consumer 'router': expected one of training, serving, "
                                         "remediation"):
        s.score(snap, POL, NOW, consumer="router")
    rem = s.score(snap, POL, NOW).tuples["x/gpu3"]  # remediation: min, as training
    assert rem.value == 0.5 and rem.reason == "min:thermal"
    mean = s.score(snap, POL, NOW, consumer="training", aggregation="mean")
    t = mean.tuples["x/gpu3"]
    assert t.value == pytest.approx((1.0 + 0.8 + 0.5) / 3) and t.reason == "mean:thermal"
    assert mean.consumer == "training" and mean.now == NOW
    g = s.score(snap, POL, NOW, consumer="training", aggregation="gmean").tuples["x/gpu3"]
    assert g.value == pytest.approx(0.4 ** (1 / 3)) and g.reason == "gmean:thermal"


def _labelled() -> Snapshot:
    b = SnapshotBuilder()
    for g in range(2):
        lab = dict(gpu=str(g), UUID=f"U{g}", Hostname="h1", modelName="H100", pci_bus_id=f"00:{g}", job="train",
                   DCGM_FI_DRIVER_VERSION="550.1", pool="a")
        b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0 + 35 * g, NOW - 5)
        b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, NOW - 500)
    b.add("fleethealth_node_info", {"Hostname": "h1", "kernel_version": "6.1", "pool": "b"}, 1, NOW - 5)
    lab = dict(replica="h1", model_name="llama", build="v7")  # a replica named like the node
    b.add("vllm:num_requests_waiting", lab, 3, NOW - 5)
    b.add("fleethealth_replica_info", {"replica": "h1", "zone": "z1"}, 1, NOW - 5)
    return b.build(NOW)


def test_result_names_labels_details_and_summary() -> None:
    fh = score_snapshot(_labelled(), POL, NOW)
    # a replica called like a node keeps its own tuple, prefixed by its kind
    assert list(fh.tuples) == ["h1/gpu0", "h1/gpu1", "h1", "replica:h1"] and len(fh) == 4
    assert [t.entity for t in fh] == ["h1/gpu0", "h1/gpu1", "h1", "h1"]
    assert fh.tuples["replica:h1"].kind == "replica" and fh.tuples["h1"].kind == "node"
    assert fh.get("nope") is None and fh.by_kind("rank") == []
    # a GPU's metadata labels come from its samples, the driver also under its plain name
    g0 = fh.tuples["h1/gpu0"]
    assert g0.labels == {"DCGM_FI_DRIVER_VERSION": "550.1", "UUID": "U0", "job": "train", "modelName": "H100",
                         "pci_bus_id": "00:0", "pool": "a", "driver_version": "550.1"}
    # a node's: its first GPU's node-wide labels, then its info metric's (which win: pool b)
    assert fh.tuples["h1"].labels == {"DCGM_FI_DRIVER_VERSION": "550.1", "modelName": "H100", "pool": "b",
                                      "driver_version": "550.1", "Hostname": "h1", "kernel_version": "6.1"}
    assert fh.tuples["replica:h1"].labels == {"build": "v7", "model_name": "llama", "replica": "h1", "zone": "z1"}
    # details: every expected or seen signal, with why a score is missing
    d = {x.signal: x for x in g0.details}
    assert list(d) == ["xid", "gpu_temp", "pcie_replay", "sm_clock"]
    assert (d["gpu_temp"].score, d["gpu_temp"].raw, d["gpu_temp"].age_s, d["gpu_temp"].note) == (1.0, 60.0, 5.0, "")
    assert (d["sm_clock"].score, d["sm_clock"].raw, d["sm_clock"].age_s, d["sm_clock"].note) == (None, None, 500.0,
                                                                                                   "stale")
    assert (d["xid"].score, d["xid"].age_s, d["xid"].note) == (None, None, "missing")
    assert d["gpu_temp"].expected_by == "reporting"
    assert d["xid"].expected_by == "its exporter reports this family (policy: expected)"
    assert g0.confidence == 0.25
    # 95 C is thermal 0 on gpu1: one of two GPUs below 0.7
    assert fh.summary() == {
        "gpu": {"entities": 2, "unknown": 0, "below_0.7": 1, "mean_confidence": 0.25},
        "node": {"entities": 1, "unknown": 0, "below_0.7": 1, "mean_confidence": 0.25},
        "replica": {"entities": 1, "unknown": 0, "below_0.7": 0, "mean_confidence": 1.0},
    }
    assert fh.policy_version == POL.version_tag and fh.now == NOW


def test_a_result_read_after_its_scorer_is_gone_reads_the_same() -> None:
    """A result holds its scorer's memory weakly: read (made lazily, serving) after the scorer is
    dropped, its kinds aggregate with a memory of their own, the same numbers."""
    want = score_snapshot(_replicas(), POL, NOW, consumer="serving").tuples["preempted"]
    s = Scorer()
    fh = s.score(_replicas(), POL, NOW, consumer="serving")
    del s
    gc.collect()
    got = fh.tuples["preempted"]
    assert (got.value, got.reason, got.confidence) == (want.value, want.reason, want.confidence)
    assert got.value == pytest.approx(0.5 ** 0.5)
    assert len(fh.kinds) == 4 and list(fh.kinds) == ["gpu", "node", "replica", "rank"]
    with pytest.raises(KeyError):
        fh.kinds["pod"]


def test_entities_are_named_by_the_policy_s_labels_in_order() -> None:
    """A node is named by the first non-empty of Hostname, node, hostname, instance; a replica by replica,
    pod, instance; a rank by the exporter's own job (exported_job, when a scraper displaced it) and its
    rank; a sample with an empty gpu or rank label is no GPU or rank."""
    b = SnapshotBuilder()
    b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "node": "by-node", "hostname": "lower", "instance": "i:9400"}, 60,
          NOW - 5)
    b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "Hostname": "", "hostname": "lower-only", "instance": "i:9400"}, 60,
          NOW - 5)
    b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "instance": "inst:9400"}, 60, NOW - 5)
    b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "", "Hostname": "no-gpu"}, 60, NOW - 5)
    b.add("vllm:num_requests_waiting", {"pod": "p-1", "instance": "i2"}, 1, NOW - 5)
    b.add("vllm:num_requests_waiting", {"instance": "i3"}, 1, NOW - 5)
    b.add("vllm:num_requests_waiting", {"replica": "", "pod": "p-2"}, 1, NOW - 5)
    for r in range(5):  # rank 4 twice as slow as its four peers
        b.add("fleethealth_rank_compute_seconds", {"job": "scrape", "exported_job": "llm", "rank": str(r),
                                                   "node": "by-node", "gpu": "0", "peer_group": "dp"},
              1.0 + (r == 4), NOW - 3)
    b.add("fleethealth_rank_compute_seconds", {"job": "j2", "rank": "", "node": "by-node", "gpu": "0",
                                               "peer_group": "dp"}, 1.0, NOW - 3)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    assert list(fh.tuples) == [
        "by-node/gpu0", "lower-only/gpu0", "inst:9400/gpu0", "by-node", "lower-only", "inst:9400",
        "p-1", "i3", "p-2", "llm/rank0", "llm/rank1", "llm/rank2", "llm/rank3", "llm/rank4"]
    slow = fh.tuples["llm/rank4"]
    assert slow.value == 0.0 and slow.reason == "min:performance" and slow.kind == "rank"
    d = _detail(slow, "rank_compute_time")
    assert d.note.startswith("peers grouped by the exporter's own job/peer_group (exported_*")
    assert fh.tuples["llm/rank0"].value == 1.0 and _detail(fh.tuples["llm/rank0"], "rank_compute_time").z == 0.0
    # the GPU's rank sample alone in its (scrape job, dp) group: too few peers, not scored
    g = _detail(fh.tuples["by-node/gpu0"], "rank_compute_time")
    assert g.score is None and g.note == "too few peers (< 4) in its group: not scored"
    assert "too_few_peers:rank_compute_time" in fh.tuples["by-node/gpu0"].flags


def test_entities_that_appear_later_in_a_history_are_scored() -> None:
    """A scorer resolves each label set once for the life of a history: a node whose exporter starts
    reporting later is resolved when it appears, and scored by its own samples."""
    h = SignalHistory(POL)
    s = Scorer()
    for k in range(6):
        t = NOW - 150 + 30 * k
        b = SnapshotBuilder()
        for i in range(3 if k < 3 else 4):
            for g in range(8):
                b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels(f"h{i}", g), 60.0 + 30 * (i == 3 and g == 2), t)
        h.add(b.build(t))
        fh = s.score(h.view(t), POL, t, consumer="training")
        assert len(fh.by_kind("node")) == (3 if k < 3 else 4)
    late = fh.tuples["h3"]
    assert late.value == 0.5 and late.worst_member == "h3/gpu2" and late.reason == "min:thermal"
    assert fh.tuples["h0"].value == 1.0


class _Scrapes:
    """Samples recorded once, read two ways: one snapshot (the row path) and a history's view, one
    scrape per timestamp (the engine's view path: gauge rows, counter matrices, Xid layouts)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, str], float, float]] = []

    def add(self, metric: str, labels: dict[str, str], value: float, ts: float) -> None:
        self.rows.append((metric, dict(labels), float(value), float(ts)))

    def both(self, policy: Policy = POL) -> dict[str, Snapshot]:
        whole = SnapshotBuilder()
        by_t: dict[float, list[tuple[str, dict[str, str], float, float]]] = {}
        for r in self.rows:
            whole.add(*r)
            by_t.setdefault(r[3], []).append(r)
        h = SignalHistory(policy)
        for t in sorted(by_t):
            b = SnapshotBuilder()
            for r in by_t[t]:
                b.add(*r)
            h.add(b.build(t))
        return {"rows": whole.build(NOW), "view": h.view(NOW)}


def _signal_fleet() -> dict[str, Snapshot]:
    r = _Scrapes()
    for i in range(6):
        for g in range(8):
            lab = gpu_labels(f"n{i}", g)
            for t in (NOW - 65, NOW - 35, NOW - 5):
                r.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
                r.add("DCGM_FI_DEV_SM_CLOCK", lab, 1881.0 if (i, g) == (2, 3) else 1980.0 + g, t)
                r.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, t)
                r.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, t)
    r.add("DCGM_FI_DEV_GPU_RECOVERY_ACTION", gpu_labels("n0", 0), 2, NOW - 5)  # NODE_REBOOT: a gate
    r.add("DCGM_FI_DEV_GPU_RECOVERY_ACTION", gpu_labels("n0", 1), 3, NOW - 5)  # DRAIN_P2P: a flag only
    r.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu_labels("n0", 2), 1, NOW - 5)
    for link in range(2):  # per-link NVLink counters of one GPU: 1/s and 2/s
        lab = {**gpu_labels("n1", 0), "link": str(link)}
        for k, t in enumerate((NOW - 65, NOW - 35, NOW - 5)):
            r.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", lab, 30 * k * (link + 1), t)
    r.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu_labels("n1", 1), 0, NOW - 65)
    r.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu_labels("n1", 1), 6000, NOW - 5)  # 100/s
    return r.both()


@pytest.fixture(scope="module")
def signal_snaps() -> dict[str, Snapshot]:
    return _signal_fleet()


@pytest.mark.parametrize("path", ["rows", "view"])
def test_gates_flags_counters_and_peers_read_the_same_on_rows_and_views(signal_snaps: dict[str, Snapshot],
                                                                       path: str) -> None:
    fh = score_snapshot(signal_snaps[path], POL, NOW)
    reboot = fh.tuples["n0/gpu0"]
    d = _detail(reboot, "recovery_action")
    assert reboot.value == 0.0 and reboot.reason == "gate:recovery_action"
    assert (d.raw, d.score, d.age_s) == (2.0, 0.0, 5.0)
    assert d.note == "gate fired: DCGM_FI_DEV_GPU_RECOVERY_ACTION=2"
    assert reboot.flags == ("recovery_action:NODE_REBOOT",)
    drain = fh.tuples["n0/gpu1"]  # 3 is not one of the gate's values: flagged, not gated
    assert drain.value == 1.0 and drain.flags == ("recovery_action:DRAIN_P2P",)
    assert _detail(drain, "recovery_action").score == 1.0 and _detail(drain, "recovery_action").note == ""
    remap = _detail(fh.tuples["n0/gpu2"], "row_remap_failure")
    assert remap.note == "gate fired: DCGM_FI_DEV_ROW_REMAP_FAILURE=1" and remap.score == 0.0
    # a GPU's link counters add up: 1/s + 2/s = 3/s, ramp(1, 100): 1 - 2/99; raw is the larger count
    links = _detail(fh.tuples["n1/gpu0"], "nvlink_crc_flit")
    assert links.rate == pytest.approx(3.0) and links.score == pytest.approx(97 / 99)
    assert links.raw == 120.0 and links.age_s == 5.0
    assert fh.tuples["n1/gpu0"].reason == "min:nvlink" and fh.tuples["n1/gpu0"].flags == ()
    # 100/s is the critical rate: 0, and the floor flag the lifecycle's fast path acts on
    storm = fh.tuples["n1/gpu1"]
    assert _detail(storm, "nvlink_crc_flit").rate == pytest.approx(100.0) and storm.value == 0.0
    assert storm.flags == ("floor:nvlink_crc_flit",)
    # a clock 5% below the fleet's median 1983.5 (z far past k_crit): performance 0; the peer signal's
    # rate is its relative shortfall (what decide.chronic prices), negative for a faster GPU
    slow = fh.tuples["n2/gpu3"]
    clk = _detail(slow, "sm_clock")
    assert clk.rate == pytest.approx((1983.5 - 1881) / 1983.5) and clk.z is not None and clk.z > 6
    assert clk.score == 0.0 and slow.reason == "min:performance" and slow.worst == "performance"
    fast = _detail(fh.tuples["n2/gpu4"], "sm_clock")
    assert fast.rate == pytest.approx((1983.5 - 1984) / 1983.5) and fast.score == 1.0
    assert _detail(fh.tuples["n2/gpu4"], "pcie_replay").rate == 0.0


def _cycle_scrape(k: int, t: float) -> Snapshot:
    """Cycle k of a changing fleet: a node joins at 3, a GPU heats at 4, a PCIe storm from 5, n1's
    exporter stops at 4, an Xid 79 at 6, a row remap failure (a metric new to the view) at 5, a DBE
    counter at 6; three replicas, one burning errors."""
    b = SnapshotBuilder()
    for i in range(7 if k >= 3 else 6):
        if i == 1 and k >= 4:
            continue
        for g in range(8):
            lab = gpu_labels(f"n{i}", g)
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 90.0 if (i, g, k >= 4) == (4, 4, True) else 60.0, t)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0 + g, t)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, 79 if (i, g) == (2, 1) and k >= 6 else 0, t)
            storm = (i, g) == (3, 0) and k >= 5
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5 + (6000 * (k - 4) if storm else 0), t)
            if (i, g) == (5, 0) and k >= 5:  # metrics the plan was built without: a gauge, then a counter
                b.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", lab, 1, t)
            if (i, g) == (0, 7) and k >= 6:
                b.add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", lab, k - 6, t)
    for r, err in (("r0", 0.0), ("r1", 0.05), ("r2", 0.0)):
        lab = dict(replica=r, model_name="llama", build="v1")
        reqs = 300.0 * (k + 1)
        b.add("fleethealth_replica_requests_total", lab, reqs, t)
        b.add("fleethealth_replica_errors_total", lab, err * reqs, t)
        b.add("vllm:num_requests_waiting", lab, 144.0 if r == "r2" else 1.0, t)
    return b.build(t)


def test_a_scorer_on_a_changing_history_reads_each_cycle_as_a_fresh_scorer() -> None:
    """What a scorer keeps per layout (the evaluation plan, peer groups, SLO bins, derived scores)
    is used only while it holds: as nodes join, heat, storm, stop and gate, every cycle's tuples equal
    those of a scorer that never saw the earlier cycles."""
    h = SignalHistory(POL)
    s = Scorer()
    seen: dict[int, dict[str, tuple[object, ...]]] = {}
    for k in range(8):
        t = NOW - 210 + 30 * k
        h.add(_cycle_scrape(k, t))
        view = h.view(t)
        for consumer in ("training", "serving"):
            kept = s.score(view, POL, t, consumer=consumer)
            fresh = score_snapshot(view, POL, t, consumer=consumer)
            assert list(kept.tuples) == list(fresh.tuples)
            for key in fresh.tuples:
                a, b = kept.tuples[key], fresh.tuples[key]
                assert (a.value, a.confidence, a.reason, a.worst, a.worst_member, a.flags) == (
                    b.value, b.confidence, b.reason, b.worst, b.worst_member, b.flags), (k, consumer, key)
            if consumer == "training":
                seen[k] = {e: (kept.tuples[e].value, kept.tuples[e].reason)
                           for e in ("n0", "n1", "n2", "n3", "n4", "n5", "r1") if e in kept.tuples}
    assert seen[2]["n4"] == (1.0, "min:hardware") and "n6" not in seen[2]
    assert seen[4]["n4"] == (0.5, "min:thermal")
    assert seen[5]["n3"][1] == "min:pcie" and seen[5]["n3"][0] == 0.0
    assert seen[6]["n2"] == (0.0, "gate:xid")
    assert seen[7]["n1"] == (None, "no_fresh_data")  # its last samples 120 s old by then
    assert seen[7]["r1"][1] == "min:errors"
    assert seen[4]["n5"] == (1.0, "min:hardware") and seen[5]["n5"] == (0.0, "gate:row_remap_failure")
    assert seen[7]["n0"] == (0.0, "gate:ecc_dbe")  # its second sample, one more DBE


def test_an_inventory_gpu_implies_its_node_even_one_the_snapshot_lacks() -> None:
    """The structural tracker declares the GPUs of a node it remembers (``inventory['gpu']``); once all of
    that node's samples have left the view, the GPU's node exists only through it. It scored a crash
    ("gpu without node": the whole cycle lost); now the node and its GPU read unknown, never healthy,
    and a declared GPU of a reporting node makes that node missing it."""
    inv = {"gpu": ["n0/gpu9", "gone/gpu3", "no-slash"], "replica": ["r9"], "pod": ["ignored"]}
    fh = score_snapshot(fleet().build(NOW), POL, NOW, inventory=inv)
    for e in ("gone/gpu3", "gone", "no-slash", "(no-node-label)", "r9", "n0/gpu9"):
        t = fh.tuples[e]
        assert (t.value, t.confidence, t.reason) == (None, 0.0, "no_fresh_data"), e
    assert fh.tuples["gone/gpu3"].kind == "gpu" and fh.tuples["gone"].kind == "node"
    n0 = fh.tuples["n0"]
    assert n0.value is None and n0.reason == "missing:gpu9" and n0.worst_member == "n0/gpu9"
    assert n0.confidence == pytest.approx(32 / 36)  # 8 GPUs x 4 fresh of 9 x 4 expected
    assert fh.tuples["n1"].value == 1.0


# a policy that also reads the request counter over 12 h: the history keeps it in another counter group
# than the error counter (retention), so the view's SLO batch reads the two groups apart
SPLIT_POL = parse_policy(default_policy_text().replace("  - name: queue_depth\n", """  - name: request_rate_12h
    metric: fleethealth_replica_requests_total
    category: load
    shape: ramp
    kind: counter
    rate_window_s: 43200
    warn: 1000
    crit: 2000
    entities: [replica]
    expected: false
  - name: queue_depth
"""))


def _slo_edge_cases(policy: Policy = POL) -> dict[str, Snapshot]:
    """Error SLOs at their edges, an hour of scrapes every minute (10 requests/s each)."""
    r = _Scrapes()
    for k in range(0, 3601, 60):
        t = NOW - 3600 + k

        def rep(name: str, reqs: float | dict[str, float], errs: float | None, t: float = t) -> None:
            lab = dict(replica=name, model_name="llama", build="v1")
            for route, v in (reqs.items() if isinstance(reqs, dict) else [("", reqs)]):
                r.add("fleethealth_replica_requests_total", {**lab, "route": route} if route else lab, v, t)
            if errs is not None:
                r.add("fleethealth_replica_errors_total", lab, errs, t)

        if k % 900 == 0:  # every 15 min: the 30 min window holds exactly two samples, the 5 min one one
            rep("quarter-hourly", 10.0 * k, 0.5 * k)
        rep("overcounted", 10.0 * k, 20.0 * k)  # more errors than requests (two counters out of step)
        rep("two-routes", {"a": 6.0 * k, "b": 4.0 * k}, 0.5 * k)  # requests counted per route
        rep("late-errors", 10.0 * k, 0.5 * (k - 1800) if k >= 1800 else None)  # errors counted from 30 min ago
        rep("zz-no-errors", 10.0 * k, None)  # no error counter at all
    return r.both(policy)


@pytest.mark.parametrize("path", ["rows", "view", "view, counters in two groups"])
def test_error_slo_edges_on_rows_and_views(path: str) -> None:
    pol = SPLIT_POL if path.endswith("two groups") else POL
    fh = score_snapshot(_slo_edge_cases(pol)[path.split(",")[0]], pol, NOW, consumer="serving")

    def err(name: str) -> tuple[float | None, float | None, float | None]:
        d = _detail(fh.tuples[name], "error_slo")
        return d.score, d.raw, d.rate

    score, raw, rate = err("quarter-hourly")  # the 6 h / 30 min pair alone: 5x burn, 0.2
    assert score == pytest.approx(0.2, abs=1e-9) and raw == pytest.approx(5.0) and rate is None
    score, raw, rate = err("overcounted")  # a bad share past 1 counts as 1: burn 1 / (1 - 0.99) = 100
    assert score == 0.0 and raw == pytest.approx(100.0) and rate == pytest.approx(100.0)
    score, raw, rate = err("two-routes")  # 0.5 errors/s of 6 + 4 requests/s
    assert score == pytest.approx(0.2, abs=1e-9) and raw == pytest.approx(5.0) and rate == pytest.approx(5.0)
    assert fh.tuples["two-routes"].categories["errors"] == pytest.approx(0.2, abs=1e-9)
    # errors counted from 30 min ago: 900 errors over the 6 h window's 36,000 requests (2.5x: 1 - 1.5/5),
    # over the hour's 35,400 (its first sample is outside the window); the short windows read 5x
    score, raw, rate = err("late-errors")
    assert score == pytest.approx(0.7, abs=1e-9) and raw == pytest.approx(900 / 35400 / 0.01)
    assert rate == pytest.approx(5.0)
    score, raw, rate = err("zz-no-errors")  # no error samples: no errors, not unknown
    assert (score, raw, rate) == (1.0, 0.0, 0.0) and fh.tuples["zz-no-errors"].value == 1.0


def test_the_families_each_entity_reported_fresh_are_what_the_family_memory_learns() -> None:
    """The controller teaches ``FamilyMemory`` from each scored cycle (what a node's GPUs and each replica
    reported fresh): the result carries the kind's families and which were fresh."""
    fm = FamilyMemory()
    fm.learn(score_snapshot(_nodes(), POL, NOW), NOW)
    assert fm.seen["a"] == {"DCGM": NOW} and fm.seen["c"] == {"DCGM": NOW} and len(fm.seen) == 11
    fm.learn(score_snapshot(_replicas(), POL, NOW + 10, consumer="serving"), NOW + 10)
    assert fm.seen["storm"] == {"vllm": NOW + 10} and fm.seen["sparse"] == {"vllm": NOW + 10}


def test_a_policy_turning_critical_zeroes_off_takes_effect_on_the_same_scorer() -> None:
    """The same signals with critical_zeroes_category off (a reload): a preemption storm at 0 is
    averaged into the load category, (0.5 x 1 + 0 x 0.5) / 1.5, not kept from the last cycle's 0."""
    snap = _replicas()
    s = Scorer()
    assert s.score(snap, POL, NOW, consumer="training").tuples["storm"].categories["load"] == 0.0
    off = POL.model_copy(update={"critical_zeroes_category": False})
    t = s.score(snap, off, NOW, consumer="training").tuples["storm"]
    assert t.categories["load"] == pytest.approx(0.5 / 1.5) and t.value == pytest.approx(0.5 / 1.5)
    assert s.score(snap, POL, NOW, consumer="training").tuples["storm"].categories["load"] == 0.0


def test_a_declared_gpu_without_samples_says_why_each_signal_is_expected() -> None:
    """A GPU declared by inventory (with why) and never sampled: unknown, and each signal its peers carry
    is expected of it "declared by inventory (...)"; its node reads missing it."""
    ex = Expectations(families={"n0": frozenset({"DCGM"})},
                      declared={"n0/gpu9": "nvidia.com/gpu capacity 10", "new/gpu0": "nvidia.com/gpu capacity 1"})
    fh = score_snapshot(fleet().build(NOW), POL, NOW, inventory={"gpu": ["n0/gpu9", "new/gpu0"]}, expectations=ex)
    g9 = fh.tuples["n0/gpu9"]
    assert (g9.value, g9.confidence, g9.reason) == (None, 0.0, "no_fresh_data")
    assert [(d.signal, d.expected_by) for d in g9.details] == [
        (s, "declared by inventory (nvidia.com/gpu capacity 10); its peers (all GPUs) carry it: 48 of 50")
        for s in ("xid", "gpu_temp", "pcie_replay", "sm_clock")]
    assert _detail(fh.tuples["new/gpu0"], "xid").expected_by.startswith("declared by inventory (nvidia.com/gpu "
                                                                       "capacity 1)")
    assert fh.tuples["n0"].reason == "missing:gpu9" and fh.tuples["new"].reason == "no_fresh_data"
    assert _detail(fh.tuples["n0/gpu1"], "xid").expected_by == "reporting"


def test_serving_nodes_read_first_are_rolled_up_from_their_gpus() -> None:
    """The serving consumer's kinds are made on first access: nodes asked for before GPUs are still
    the weakest of their GPUs (the roll-up comes with them), as when GPUs are read first."""
    snap = _nodes()
    nodes_first = score_snapshot(snap, POL, NOW, consumer="serving")
    node = nodes_first.kinds["node"]
    by_name = dict(zip(node.names, node.value.tolist(), strict=True))
    assert by_name["e"] == 0.0 and by_name["a"] == pytest.approx(0.8)
    gpus_first = score_snapshot(snap, POL, NOW, consumer="serving")
    assert gpus_first.kinds["gpu"] is not None
    for n in NODE_ROLLUP:
        a, b = nodes_first.tuples[n], gpus_first.tuples[n]
        assert (a.value, a.reason, a.worst_member, a.confidence) == (b.value, b.reason, b.worst_member, b.confidence)


def test_a_gpu_s_labels_gather_every_series_it_reports() -> None:
    """A GPU's metadata labels come from all its series: a pod label only its clock series carries is
    still the GPU's (and the first value of a label wins)."""
    b = fleet()
    b.add("DCGM_FI_DEV_SM_CLOCK", {**gpu_labels("n0", 0), "pod": "train-0", "namespace": "ml"}, 1980.0, NOW - 2)
    labels = score_snapshot(b.build(NOW), POL, NOW).tuples["n0/gpu0"].labels
    assert labels["pod"] == "train-0" and labels["namespace"] == "ml" and labels["modelName"] == (
        "NVIDIA H100 80GB HBM3")


def test_each_pool_expects_its_own_gpu_count() -> None:
    """The peers rule per pool: 4-GPU nodes of pool small are whole, a 7-GPU node where 4 of its 5
    pool big peers have 8 is missing:gpu7, with the words explain prints; the fleet's first GPU can
    decide its node (index 0 is a GPU like any other)."""
    b = SnapshotBuilder()
    for pool, gpus in (("small", 4), ("big", 8)):
        for i in range(5):
            for g in range(gpus - (pool == "big" and i == 0)):
                lab = {**gpu_labels(f"{pool}{i}", g), "pool": pool}
                hot = (pool, i, g) in (("small", 0, 0), ("big", 1, 0))
                b.add("DCGM_FI_DEV_GPU_TEMP", lab, 90.0 if hot else 60.0, NOW - 5)
                b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, NOW - 5)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    short = fh.tuples["big0"]
    assert (short.value, short.reason, short.worst_member) == (None, "missing:gpu7", None)
    assert short.confidence == pytest.approx(0.5 * 7 / 8)  # temp and xid of 4 expected, times 7 of 8 GPUs
    node = fh.kinds["node"]
    assert node.gpu_count_why == {node.names.index("big0"): "its peers (pool=big): 4 of 5 nodes have 8 GPUs"}
    for name in ("small0", "small1", "big1", "big2"):
        assert fh.tuples[name].reason != "missing:gpu7" and fh.tuples[name].value is not None
    assert fh.tuples["small0"].worst_member == "small0/gpu0" and fh.tuples["small0"].value == 0.5
    assert fh.tuples["big1"].worst_member == "big1/gpu0" and fh.tuples["big1"].value == 0.5


def test_a_node_worse_by_its_own_signal_still_reads_missing_for_an_unknown_gpu() -> None:
    """No GPU decides node solo (its own NVSwitch flag, 0.8, is lower than every GPU): an unknown GPU
    still makes it unknown, named after that GPU. Confidence: its own signal and 7 GPUs x 4 fresh of
    1 + 8 x 4 expected."""
    b = SnapshotBuilder()
    for g in range(8):
        lab = gpu_labels("solo", g)
        ts = NOW - (500 if g == 3 else 5)
        b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, ts)
        b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, ts)
        b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, ts)
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts - 30)
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts)
    b.add("fleethealth_kernel_sxid_total", {"Hostname": "solo"}, 0, NOW - 100)
    b.add("fleethealth_kernel_sxid_total", {"Hostname": "solo"}, 2, NOW - 10)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["solo"]
    assert (t.value, t.reason, t.worst_member) == (None, "missing:gpu3", "solo/gpu3")
    assert t.confidence == pytest.approx(29 / 33) and t.flags == ("nvswitch_sxid",)


@pytest.mark.parametrize("path", ["rows", "view"])
def test_a_replica_restart_is_no_negative_traffic_and_one_without_counters_reads_missing(path: str) -> None:
    """A replica whose counters went back to 0 half an hour ago (a restart) counts no negative traffic;
    a replica reporting only its queue lacks the error SLO its peers carry: missing."""
    r = _Scrapes()
    for k in range(0, 3601, 60):
        t = NOW - 3600 + k
        for name in ("steady", "restarted", "queue-only"):
            lab = dict(replica=name, model_name="llama", build="v1")
            if name == "steady":
                r.add("fleethealth_replica_requests_total", lab, 10.0 * k, t)
                r.add("fleethealth_replica_errors_total", lab, 0.05 * 10.0 * k, t)
            elif name == "restarted":  # 10% errors, then a restart: counters from 0, no errors since
                after = k >= 1800
                r.add("fleethealth_replica_requests_total", lab, 10.0 * (k - 1800 if after else k), t)
                r.add("fleethealth_replica_errors_total", lab, 0.0 if after else 1.0 * k, t)
            r.add("vllm:num_requests_waiting", lab, 1.0, t)
    fh = score_snapshot(r.both()[path], POL, NOW, consumer="serving")
    d = _detail(fh.tuples["steady"], "error_slo")
    assert d.score == pytest.approx(0.2, abs=1e-9) and d.raw == pytest.approx(5.0) and d.rate == pytest.approx(5.0)
    # the hour (from its first sample, 60 s in): 1,680 errors of 17,400 + 17,400 requests across the restart
    # (the step down counts the new value, 0); the last 30 min are clean, so neither pair pages: 1.0
    d = _detail(fh.tuples["restarted"], "error_slo")
    assert d.raw == pytest.approx(1680 / 34800 / 0.01) and d.rate == 0.0 and d.score == 1.0
    q = fh.tuples["queue-only"]
    assert (q.value, q.confidence, q.reason) == (1.0, 0.5, "missing:error_slo")
    d = _detail(q, "error_slo")
    assert (d.score, d.raw, d.age_s) == (None, None, None)
    assert d.expected_by == "its peers (model=llama) carry it: 2 of 3"


@pytest.mark.parametrize("path", ["rows", "view"])
def test_an_slo_s_match_selects_the_error_series_it_counts(path: str) -> None:
    """error_slo with match {code: "5.."}: 5% server errors burn 5x (0.2) whatever the 50% of 404s; the
    default policy, with no match, counts both (55x: 0)."""
    anchor = "    requests_metric: fleethealth_replica_requests_total\n"
    pol = parse_policy(default_policy_text().replace(anchor, anchor + '    match: {code: "5.."}\n'))
    r = _Scrapes()
    for k in range(0, 3601, 60):
        lab = dict(replica="api", model_name="llama", build="v1")
        r.add("fleethealth_replica_requests_total", lab, 10.0 * k, NOW - 3600 + k)
        r.add("fleethealth_replica_errors_total", {**lab, "code": "503"}, 0.5 * k, NOW - 3600 + k)
        r.add("fleethealth_replica_errors_total", {**lab, "code": "404"}, 5.0 * k, NOW - 3600 + k)
    snap = r.both(pol)[path]
    d = _detail(score_snapshot(snap, pol, NOW, consumer="serving").tuples["api"], "error_slo")
    assert d.score == pytest.approx(0.2, abs=1e-9) and d.raw == pytest.approx(5.0)
    d = _detail(score_snapshot(snap, POL, NOW, consumer="serving").tuples["api"], "error_slo")
    assert d.score == 0.0 and d.raw == pytest.approx(55.0)


def test_a_rank_sample_without_a_job_is_no_rank() -> None:
    b = fleet()
    for r in range(5):
        b.add("fleethealth_rank_compute_seconds", {"rank": str(r), "Hostname": "n0", "gpu": str(r), "peer_group": "dp"},
              1.0, NOW - 3)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    assert fh.by_kind("rank") == [] and fh.tuples["n0"].value == 1.0


def test_a_consumer_the_policy_gives_no_aggregation_takes_the_minimum() -> None:
    pol = parse_policy(default_policy_text().replace("  remediation: min\n", ""))
    assert "remediation" not in pol.aggregation
    t = score_snapshot(_gpu_fleet(), pol, NOW, consumer="remediation").tuples["x/gpu3"]
    assert t.value == 0.5 and t.reason == "min:thermal"


@pytest.mark.parametrize("path", ["rows", "view"])
def test_an_xid_gauge_series_of_no_gpu_does_not_hide_a_gpu_s_xid(path: str) -> None:
    """A last-Xid gauge series that belongs to no GPU (no gpu label) is skipped; an Xid 79 on a GPU in the
    same block still gates it, with its flag and note."""
    r = _Scrapes()
    for i in range(2):
        for g in range(8):
            for t in (NOW - 35, NOW - 5):
                r.add("DCGM_FI_DEV_XID_ERRORS", gpu_labels(f"n{i}", g), 79 if (i, g, t) == (1, 2, NOW - 5) else 0, t)
                r.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels(f"n{i}", g), 60.0, t)
    r.add("DCGM_FI_DEV_XID_ERRORS", {"Hostname": "n0"}, 48, NOW - 5)  # no gpu label: no GPU's
    fh = score_snapshot(r.both()[path], POL, NOW)
    t = fh.tuples["n1/gpu2"]
    assert t.value == 0.0 and t.reason == "gate:xid" and t.flags == ("xid:79",)
    assert _detail(t, "xid").note == "Xid 79 gates the GPU (needs reset or reboot)"
    assert _detail(t, "xid").raw == 79.0
    assert fh.tuples["n0"].value == 1.0 and fh.tuples["n1"].reason == "gate:xid"


def test_xid_counter_issues_and_a_gpu_s_freshest_link_age() -> None:
    """A per-Xid counter whose xid label is no number, and one counting an Xid outside NVIDIA's catalog:
    each an input issue naming the snapshot, what is wrong and the text; a GPU's counter age is its
    freshest series' (one NVLink link's exporter lagging does not age the GPU)."""
    b = fleet()
    lab = gpu_labels("n3", 2)
    for xid in ("abc", "9999"):
        b.add("DCGM_EXP_XID_ERRORS_COUNT", {**lab, "xid": xid}, 0, NOW - 60)
        b.add("DCGM_EXP_XID_ERRORS_COUNT", {**lab, "xid": xid}, 1, NOW - 5)
    for link, last in ((0, NOW - 5), (1, NOW - 65)):
        ll = {**gpu_labels("n4", 1), "link": str(link)}
        b.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", ll, 0, last - 60)
        b.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", ll, 60, last)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    issues = [(i.source, i.reason, i.text) for i in fh.issues]
    assert ("<snapshot>", "DCGM_EXP_XID_ERRORS_COUNT: xid label is not a number", "abc") in issues
    assert ("<snapshot>", "unknown Xid 9999: not in NVIDIA's catalog; counted, not scored", "") in issues
    assert fh.tuples["n3/gpu2"].flags == ("xid:9999", "xid_unknown:9999") and fh.tuples["n3/gpu2"].value == 1.0
    d = _detail(fh.tuples["n4/gpu1"], "nvlink_crc_flit")
    assert d.age_s == 5.0 and d.rate == pytest.approx(2.0)  # two links at 1/s each, both fresh (max_age 90)


@pytest.mark.parametrize("path", ["rows", "view"])
def test_a_gpu_reported_twice_reads_its_worst_series_and_xid_counters_gate(path: str) -> None:
    """Two exporters' temperature series for one GPU (60 C, 90 C): the GPU is as hot as the worse, 0.5;
    a per-Xid counter that counted an Xid 48 in the window gates its GPU, on rows and on a view."""
    r = _Scrapes()
    for i in range(2):
        for g in range(8):
            for t in (NOW - 65, NOW - 35, NOW - 5):
                lab = gpu_labels(f"n{i}", g)
                r.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
                r.add("DCGM_EXP_XID_ERRORS_COUNT", {**lab, "xid": "48"}, 1 if (i, g, t) == (1, 4, NOW - 5) else 0, t)
    for t in (NOW - 65, NOW - 35, NOW - 5):
        r.add("DCGM_FI_DEV_GPU_TEMP", {**gpu_labels("n0", 3), "container": "second-exporter"}, 90.0, t)
    fh = score_snapshot(r.both()[path], POL, NOW)
    hot = fh.tuples["n0/gpu3"]
    assert hot.value == 0.5 and _detail(hot, "gpu_temp").raw == 90.0 and hot.reason == "min:thermal"
    gated = fh.tuples["n1/gpu4"]
    assert gated.value == 0.0 and gated.reason == "gate:xid_count" and gated.flags == ("xid:48",)
    assert fh.tuples["n1/gpu5"].value == 1.0
