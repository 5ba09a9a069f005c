"""Issue 14, the peers rule for a node's GPU count (QA finding 8, second half): a node whose exporter lists
7 GPUs while the other nodes of its pool list 8 is short of a GPU. With no inventory and no past (a
one-shot ``score`` or ``replay``, a controller's first cycle) its peers say what it should have: at least
``expectation.gpu_count_min_peers`` nodes of the pool report GPUs and at least
``expectation.gpu_count_fraction`` of them have the same count k. The node reads unknown,
``missing:gpu5`` (the indices absent from 0..k-1), its confidence scaled by 7/8, and explain names the
peers. A heterogeneous pool, a pool too small and another pool's count expect nothing. The batched
engine, the row path and the scalar reference agree."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fleethealth.cli.cmd_score import explain_tree
from fleethealth.policy import Policy, PolicyError, default_policy, default_policy_text, parse_policy
from fleethealth.score.engine import FleetHealth, score_snapshot
from fleethealth.score.reference import RefHealth, score_reference
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

POL = default_policy()
T0 = 1_800_000_000.0


def _scrape(t: float, fleet: dict[str, tuple[str, list[int]]]) -> Snapshot:
    """``fleet``: node -> (pool, GPU indices its exporter lists); every GPU healthy."""
    b = SnapshotBuilder()
    for node, (pool, gpus) in fleet.items():
        for g in gpus:
            lab = {"Hostname": node, "gpu": str(g), "UUID": f"GPU-{node}-{g}", "pool": pool,
                   "modelName": "NVIDIA H100 80GB HBM3"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, t)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5.0, t)
    return b.build(t)


def _scored(fleet: dict[str, tuple[str, list[int]]], pol: Policy = POL) -> tuple[list[FleetHealth], dict[str, RefHealth]]:
    """Four scrapes 15 s apart: the batched (history view) and row-path results, and the reference."""
    h = SignalHistory(pol)
    rows = SnapshotBuilder()
    for i in range(4):
        snap = _scrape(T0 + 15 * i, fleet)
        h.add(snap)
        rows.extend_snapshot(snap)
    now = T0 + 46
    view = h.view(now)
    assert view.index is not None
    batched = score_snapshot(view, pol, now)
    plain = score_snapshot(dataclasses.replace(view, index=None), pol, now)
    return [batched, plain], score_reference(rows.build(now), pol, now)


EIGHT = list(range(8))


def _uniform(short: list[int]) -> dict[str, tuple[str, list[int]]]:
    fleet = {f"node-{n:02d}": ("train-a", EIGHT) for n in range(6)}
    fleet["node-04"] = ("train-a", short)
    return fleet


def _agree(fhs: list[FleetHealth], ref: dict[str, RefHealth], nodes: list[str]) -> None:
    for node in nodes:
        r = ref[node]
        for fh in fhs:
            t = fh.tuples[node]
            assert (t.value, t.reason) == (r.value, r.reason), (node, t, r)
            assert t.confidence == pytest.approx(r.confidence)


def test_a_node_short_of_a_gpu_in_a_uniform_pool_reads_unknown_naming_it() -> None:
    fhs, ref = _scored(_uniform([0, 1, 2, 3, 4, 6, 7]))
    for fh in fhs:
        t = fh.tuples["node-04"]
        assert t.value is None and t.reason == "missing:gpu5"
        assert t.confidence == pytest.approx(7 / 8)
        assert t.worst_member is None  # none of the GPUs it reports decided it
        other = fh.tuples["node-02"]
        assert other.value == 1.0 and other.confidence == 1.0 and other.reason != "missing:gpu5"
        text = str(explain_tree(t, fh).label) + "".join(str(c.label) for c in _walk(explain_tree(t, fh)))
        assert "its peers (pool=train-a): 5 of 6 nodes have 8 GPUs" in text
    _agree(fhs, ref, [f"node-{n:02d}" for n in range(6)])


def _walk(tree: object) -> list[Any]:
    out: list[Any] = []
    for c in getattr(tree, "children", []):
        out.append(c)
        out.extend(_walk(c))
    return out


def test_the_last_gpus_absent_name_each_of_them() -> None:
    fhs, ref = _scored(_uniform([0, 1, 2, 3, 4, 5]))
    assert fhs[0].tuples["node-04"].reason == "missing:gpu6,gpu7"
    assert fhs[0].tuples["node-04"].confidence == pytest.approx(6 / 8)
    _agree(fhs, ref, ["node-04", "node-00"])


def test_a_heterogeneous_pool_expects_no_count() -> None:
    counts = [8, 8, 8, 4, 4, 7]  # no count shared by 80% of the pool
    fleet = {f"node-{n:02d}": ("mixed", list(range(c))) for n, c in enumerate(counts)}
    fhs, ref = _scored(fleet)
    for fh in fhs:
        for n in range(6):
            t = fh.tuples[f"node-{n:02d}"]
            assert t.value == 1.0 and t.confidence == 1.0, t
    _agree(fhs, ref, [f"node-{n:02d}" for n in range(6)])


def test_a_pool_below_the_minimum_of_peers_and_another_pools_count_expect_nothing() -> None:
    fleet = {f"a-{n}": ("train-a", EIGHT) for n in range(5)}
    fleet |= {f"b-{n}": ("infer-b", list(range(4))) for n in range(5)}  # a pool of 4-GPU nodes: not short
    fleet |= {"c-0": ("tiny", EIGHT), "c-1": ("tiny", EIGHT), "c-2": ("tiny", list(range(7)))}  # 3 < 4 peers
    fhs, ref = _scored(fleet)
    for fh in fhs:
        for node in ("b-0", "b-4", "c-2", "a-0"):
            t = fh.tuples[node]
            assert t.value == 1.0 and t.confidence == 1.0, t
    _agree(fhs, ref, ["a-0", "b-0", "c-2"])


def test_the_policy_tunes_the_rule() -> None:
    text = default_policy_text() + "\nexpectation:\n  gpu_count_min_peers: 2\n  gpu_count_fraction: 0.6\n"
    pol = parse_policy(text)
    fleet = {"c-0": ("tiny", EIGHT), "c-1": ("tiny", EIGHT), "c-2": ("tiny", list(range(7)))}
    fhs, ref = _scored(fleet, pol)
    assert fhs[0].tuples["c-2"].reason == "missing:gpu7"
    _agree(fhs, ref, ["c-0", "c-2"])


@pytest.mark.parametrize("key,value", [("gpu_count_fraction", "0.5"), ("gpu_count_min_peers", "1")])
def test_a_bad_value_names_its_key_and_line(key: str, value: str) -> None:
    text = default_policy_text() + f"\nexpectation:\n  {key}: {value}\n"
    with pytest.raises(PolicyError) as e:
        parse_policy(text, "mine.yaml")
    msg = str(e.value)
    assert f"expectation.{key}" in msg
    line = int(msg.split("mine.yaml:")[1].split(":")[0])
    assert text.splitlines()[line - 1].strip().startswith(key)
