"""A read-only signal (``score: false``): read by the decisions, never scored.

``gpu_util`` (DCGM_FI_DEV_GPU_UTIL) is read for ``chronic:idle`` evidence. A field that says nothing
about health must not move anything scored: not the serving consumer's geometric mean (one more category
at 1.0 raised it), not confidence (one more fresh field raised it; an exporter without it must not lower
it), not reasons or worst categories, not explain. Its fresh raw value per GPU stays readable.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.decide import chronic
from fleethealth.policy import Policy, PolicyError, default_policy_text, parse_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.score.reference import score_reference
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

MODEL = "NVIDIA H100 80GB HBM3"
NOW = 1000.0


def _without_gpu_util() -> Policy:
    """The shipped policy with its gpu_util entry cut out (everything else as shipped)."""
    text = default_policy_text()
    cut = re.sub(r"\n  - name: gpu_util\n(    .*\n)+", "\n", text)
    assert cut != text
    pol = parse_policy(cut, "no-util.yaml")
    assert "gpu_util" not in {s.name for s in pol.signals}
    return pol


WITH = parse_policy(default_policy_text(), "default.yaml")
WITHOUT = _without_gpu_util()


def _snap(util: bool, hot_node: int = 1, some_util: bool = False) -> Snapshot:
    """4 nodes x 8 GPUs; node-``hot_node``'s GPUs run hot (a thermal category well below 1) and, with
    ``util``, every GPU serves DCGM_FI_DEV_GPU_UTIL (``some_util``: only node-00's)."""
    b = SnapshotBuilder()
    for n in range(4):
        node = f"node-{n:02d}"
        for g in range(8):
            lab = {"Hostname": node, "gpu": str(g), "modelName": MODEL, "UUID": f"GPU-{node}-{g}"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 90.0 if n == hot_node else 60.0, NOW - 5)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, NOW - 5)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, NOW - 5)
            if util or (some_util and n == 0):
                b.add("DCGM_FI_DEV_GPU_UTIL", lab, 3.0 if n == 2 else 95.0, NOW - 5)
    return b.build(NOW)


def _tuples(pol: Policy, snap: Snapshot, consumer: str) -> dict[str, tuple[float | None, float, str | None, str]]:
    fh = score_snapshot(snap, pol, NOW, consumer)
    return {t.entity: (t.value, t.confidence, t.worst, t.reason) for t in fh}


@pytest.mark.parametrize("consumer", ["serving", "remediation", "training"])
def test_a_read_only_signal_moves_no_score_confidence_or_reason(consumer: str) -> None:
    base = _tuples(WITHOUT, _snap(util=False), consumer)
    hot = base["node-01/gpu0"]
    assert hot[0] is not None and hot[0] < 1.0 and hot[2] == "thermal"  # a bad category: it matters
    for snap in (_snap(util=True), _snap(util=False), _snap(util=False, some_util=True)):
        assert _tuples(WITH, snap, consumer) == base  # bit for bit: value, confidence, worst, reason


def test_explain_shows_no_read_only_signal_and_no_category_for_it() -> None:
    fh = score_snapshot(_snap(util=True), WITH, NOW, "serving")
    for t in fh:
        assert "activity" not in t.categories and "" not in t.categories
        assert "gpu_util" not in {d.signal for d in t.details}
        assert "activity" not in (t.reason or "")


def test_its_fresh_raw_value_is_read_per_gpu_and_nothing_is_shaped() -> None:
    fh = score_snapshot(_snap(util=True), WITH, NOW)
    ks = fh.kinds["gpu"]
    j = next(k for k, s in enumerate(ks.signals) if s.name == "gpu_util")
    res = ks.results[j]
    names = list(ks.names)
    assert res.raw[names.index("node-02/gpu3")] == 3.0 and res.raw[names.index("node-00/gpu0")] == 95.0
    assert np.isnan(res.sub).all() and np.isnan(res.z).all()  # no shape, no peer statistics
    assert not ks.expected[:, j].any()
    # idle evidence reads it: node-02's GPUs are all below chronic.idle_util_below, node-00's are busy
    node_names = list(fh.kinds["node"].names)
    assert chronic.idle_evidence(fh, WITH, node_names.index("node-02"))
    assert not chronic.idle_evidence(fh, WITH, node_names.index("node-00"))
    # stale: no evidence
    stale = score_snapshot(_snap(util=True), WITH, NOW + 3600)
    assert not chronic.idle_evidence(stale, WITH, node_names.index("node-02"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3), st.sampled_from([float("nan"), 0.0, 100.0])),
                min_size=32, max_size=32),
       st.lists(st.floats(0, 600), min_size=32, max_size=32), st.sampled_from(["serving", "remediation"]))
def test_whatever_it_reads_nothing_scored_moves(utils: list[float | None], ages: list[float], consumer: str) -> None:
    """Any utilisation values (absent, NaN, out of range), fresh or stale, per GPU: every tuple is
    bit for bit the policy's without the signal."""
    b = SnapshotBuilder()
    for n in range(4):
        node = f"node-{n:02d}"
        for g in range(8):
            lab = {"Hostname": node, "gpu": str(g), "modelName": MODEL, "UUID": f"GPU-{node}-{g}"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 90.0 if n == 1 else 60.0, NOW - 5)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0 - 40 * (g == 3), NOW - 5)
            u = utils[n * 8 + g]
            if u is not None:
                b.add("DCGM_FI_DEV_GPU_UTIL", lab, u, NOW - ages[n * 8 + g])
    snap = b.build(NOW)
    assert _tuples(WITH, snap, consumer) == _tuples(WITHOUT, snap, consumer)


@pytest.mark.parametrize("how", ["min", "gmean"])
def test_the_reference_scorer_agrees(how: str) -> None:
    consumer = "serving" if how == "gmean" else "remediation"
    snap = _snap(util=True)
    ref = score_reference(snap, WITH, NOW, how)
    fast = {t.entity: t for t in score_snapshot(snap, WITH, NOW, consumer) if t.kind == "gpu"}
    for name, r in ref.items():
        if name in fast:
            t = fast[name]
            assert r.value == pytest.approx(t.value) and r.confidence == pytest.approx(t.confidence)
            assert r.worst == t.worst


@pytest.mark.parametrize("extra", ["category: activity", "shape: ramp", "warn: 101", "weight: 2",
                                   "expected: true", "kind: counter"])
def test_a_read_only_signal_refuses_what_would_score_it(extra: str) -> None:
    key = extra.split(":")[0]
    text = default_policy_text().replace(
        "  - name: gpu_util\n", f"  - name: gpu_util\n    {extra}\n", 1)
    line = text.splitlines().index("  - name: gpu_util") + 2  # the error names the key and its line
    with pytest.raises(PolicyError, match=rf"p\.yaml:{line}: signals\[\d+\]\(gpu_util\)\.{key}: "):
        parse_policy(text, "p.yaml")


def test_a_scored_signal_still_needs_a_shape_and_a_category() -> None:
    for drop in ("shape", "category"):
        text = re.sub(rf"(  - name: gpu_temp\n(?:    .*\n)*?)    {drop}: .*\n", r"\1", default_policy_text(), count=1)
        with pytest.raises(PolicyError, match=drop):
            parse_policy(text, "p.yaml")
