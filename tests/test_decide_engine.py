"""Decisions on real scores: the seed's worked example over time, and ByteDance's straggler traces
(/work/shared/data/stragglers) through SignalHistory -> score_snapshot -> Decider (DecisionLoop)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from fleethealth.decide.loop import DecisionLoop
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import Policy, default_policy
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

# shared/ lies beside the checkout (CI puts a copy there); a developer's is /work/shared
_SHARED = next((p for p in (Path(__file__).resolve().parents[1].parent / "shared", Path("/work/shared")) if p.is_dir()),
               Path("/work/shared"))
STRAGGLERS = _SHARED / "data" / "stragglers"
MODEL = "NVIDIA H100 80GB HBM3"


def _quantiles(n: int, center: float, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """n values whose median and MAD are exactly those of a normal(center, sigma), in random order."""
    nd = NormalDist(center, sigma)
    v = np.array([nd.inv_cdf((i + 0.5) / n) for i in range(n)])
    rng.shuffle(v)
    return v


def _dcgm(b: SnapshotBuilder, node: str, gpu: int, t: float, clock: float = 1980.0, temp: float = 60.0) -> None:
    lab = {"Hostname": node, "gpu": str(gpu), "modelName": MODEL, "UUID": f"GPU-{node}-{gpu}"}
    b.add("DCGM_FI_DEV_SM_CLOCK", lab, clock, t)
    b.add("DCGM_FI_DEV_GPU_TEMP", lab, temp, t)
    b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
    b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 0.0, t)


# ---- the seed's worked example ------------------------------------------------------------------
def _seed_scrape(t: float, rng: np.random.Generator, compute37: float, clock37: float) -> Snapshot:
    """64 nodes x 8 GPUs; rank compute median 1.82 s, MAD 0.01 s; SM clock 1980 MHz, MAD ~9.9 MHz."""
    b = SnapshotBuilder()
    comp = _quantiles(512, 1.82, 0.01 / 0.6745, rng)
    clk = _quantiles(512, 1980.0, 9.87 / 0.6745, rng)
    for n in range(64):
        node = f"node-{n:02d}"
        for g in range(8):
            r = n * 8 + g
            c, k = (compute37, clock37) if n == 37 else (comp[r], clk[r])
            b.add("fleethealth_rank_compute_seconds",
                  {"job": "pretrain", "rank": str(r), "node": node, "gpu": str(g), "peer_group": "stage0"}, c, t)
            _dcgm(b, node, g, t, clock=k, temp=64.0 if n == 37 else 60.0)
    return b.build(t)


def test_seed_worked_example_flagged_then_quarantined_after_the_dwell() -> None:
    rng = np.random.default_rng(37)
    # the seed's example as the seed wrote it: without pricing chronic slowness (decide.chronic), which
    # escalates this node on day one (tests/test_chronic.py)
    pol = default_policy()
    loop = DecisionLoop(pol.model_copy(update={"chronic": pol.chronic.model_copy(update={"enabled": False})}))
    times = list(range(0, 1801, 60)) + list(range(7200, 86400, 7200))
    values = []
    for t in times:  # day one: 1.86 s compute (z ~2.7), SM clock 3% low (z ~4.1)
        res = loop.cycle(_seed_scrape(t, rng, 1.86, 1920.0), float(t))
        n37 = res.health.get("node-37")
        values.append(n37.value)
        assert res.decision.transitions == []
    assert loop.state.entities["node-37"].state == State.READY
    assert loop.state.entities["node-37"].flagged
    assert np.median(values) == pytest.approx(0.82, abs=0.03)
    assert min(values) > 0.7
    assert all(e.state == State.READY for e in loop.state.entities.values())
    # a day later: compute drifts to 1.95 s (z ~8.8) as the clogged fan throttles the clocks further
    trs = []
    intents = []
    for t in range(86400, 86400 + 601, 60):
        res = loop.cycle(_seed_scrape(t, rng, 1.95, 1850.0), float(t))
        if t == 86400:
            n37 = res.health.get("node-37")
            assert n37.value == pytest.approx(0.0, abs=1e-9) and n37.reason == "min:performance"
            gpu = res.health.get(n37.worst_member or "node-37/gpu0")
            z = [d.z for d in gpu.details if d.signal == "rank_compute_time"]
            assert z and z[0] == pytest.approx(8.8, abs=0.5)
        trs += res.decision.transitions
        intents += res.decision.intents
    assert [(x.entity, x.to_state, x.ts - 86400) for x in trs] == [
        ("node-37", State.DEGRADED, 120), ("node-37", State.QUARANTINED, 300)]
    assert trs[-1].reason == "min:performance" and trs[-1].value == 0.0
    q = [i for i in intents if i.kind == IntentKind.QUARANTINE]
    assert [i.entity for i in q] == ["node-37"]
    kinds = [i.kind for i in intents if i.entity == "node-37"]
    assert kinds.index(IntentKind.CAPTURE_EVIDENCE) < kinds.index(IntentKind.QUARANTINE)


# ---- straggler traces -----------------------------------------------------------------------------
def _trace(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(step, rank, stage, compute seconds) per rank and step: forward + backward compute."""
    pq = pytest.importorskip("pyarrow.parquet")
    path = STRAGGLERS / f"trace-{name}.parquet"
    if not path.exists():
        pytest.skip(f"{path} not present")
    t = pq.read_table(path, columns=["rank", "stage", "step", "optype", "duration"])
    op = np.asarray(t.column("optype").combine_chunks().dictionary_decode().to_pylist(), dtype=object)
    keep = (op == "forward-compute") | (op == "backward-compute")
    rank = t.column("rank").to_numpy()[keep].astype(np.int64)
    stage = t.column("stage").to_numpy()[keep].astype(np.int64)
    step = t.column("step").to_numpy()[keep].astype(np.int64)
    dur = t.column("duration").to_numpy()[keep].astype(np.float64)
    key = step * 100_000 + rank
    uk, inv = np.unique(key, return_inverse=True)
    total = np.bincount(inv, weights=dur)
    st = np.zeros(uk.size, np.int64)
    st[inv] = stage
    return uk // 100_000, uk % 100_000, st, total


def _straggler_scrapes(name: str, every: float = 30.0) -> Iterator[tuple[float, Snapshot]]:
    """One training step per scrape; rank r on node r // 8, GPU r % 8; peers = same pipeline stage."""
    steps, ranks, stages, comp = _trace(name)
    nodes = sorted({int(r) // 8 for r in ranks.tolist()})
    for k, s in enumerate(np.unique(steps).tolist()):
        t = 1_767_000_000.0 + k * every
        b = SnapshotBuilder()
        sel = steps == s
        for r, stg, c in zip(ranks[sel].tolist(), stages[sel].tolist(), comp[sel].tolist(), strict=True):
            b.add("fleethealth_rank_compute_seconds",
                  {"job": name, "rank": str(r), "node": f"node-{r // 8:02d}", "gpu": str(r % 8),
                   "peer_group": f"stage{stg}"}, c, t)
        for n in nodes:
            for g in range(8):
                _dcgm(b, f"node-{n:02d}", g, t)
        yield t, b.build(t)


def _policy_small_peer_groups() -> Policy:
    # The traces record every 4th rank of AR (16 of 64): a pipeline stage has 4 recorded peers, fewer
    # than the default min_peers of 5.
    return default_policy().model_copy(update={"peer": default_policy().peer.model_copy(update={"min_peers": 4})})


def _run(name: str) -> tuple[DecisionLoop, list, list]:
    loop = DecisionLoop(_policy_small_peer_groups())
    trs, intents = [], []
    for t, snap in _straggler_scrapes(name):
        res = loop.cycle(snap, t)
        trs += res.decision.transitions
        intents += res.decision.intents
    return loop, trs, intents


def test_ar_trace_quarantines_the_node_with_the_persistently_slow_rank_and_no_other() -> None:
    loop, trs, intents = _run("AR")
    q = [i.entity for i in intents if i.kind == IntentKind.QUARANTINE]
    assert q == ["node-00"]  # rank 0 (stage 0) computes ~45 s where its stage peers take ~19 s
    assert loop.state.entities["node-00"].state == State.QUARANTINED
    assert all(e.state == State.READY for k, e in loop.state.entities.items() if k != "node-00")
    assert not [i for i in intents if i.kind == IntentKind.PAGE]
    first = [x for x in trs if x.to_state == State.QUARANTINED][0]
    assert first.ts - 1_767_000_000.0 == 300.0  # quarantine_dwell_s after the first scrape


@pytest.mark.parametrize("name", ["ST", "SE"])
def test_traces_without_a_faulty_worker_quarantine_nothing(name: str) -> None:
    loop, trs, intents = _run(name)
    assert not [i for i in intents if i.kind in (IntentKind.QUARANTINE, IntentKind.DRAIN, IntentKind.PAGE)]
    assert not [x for x in trs if x.to_state == State.QUARANTINED]
    assert len(loop.state.entities) == {"ST": 1, "SE": 16}[name]


def test_light_tuples_carry_what_the_engines_full_tuples_say() -> None:
    """The decider reads the engine's columns directly (no per-signal details); it must see the same
    value, confidence, reason, worst category, labels and flags as the engine's own tuples."""
    from fleethealth.decide.decider import _light_tuples
    from fleethealth.score.engine import score_snapshot

    rng = np.random.default_rng(3)
    snap = _seed_scrape(60.0, rng, 1.95, 1850.0)
    b = SnapshotBuilder()
    b.extend_snapshot(snap)
    b.add("fleethealth_node_info", {"node": "node-01", "pool": "a", "tp_group": "g0", "driver_version": "550"}, 1, 60)
    fh = score_snapshot(b.build(60.0), default_policy(), 60.0)
    light = {t.entity: t for t in _light_tuples(fh, "node")}
    full = {t.entity: t for t in fh.by_kind("node")}
    assert light.keys() == full.keys() and len(full) == 64
    for k, f in full.items():
        lt = light[k]
        assert (lt.value, lt.confidence, lt.reason, lt.worst, lt.labels, lt.flags, lt.worst_member) == (
            f.value, f.confidence, f.reason, f.worst, f.labels, f.flags, f.worst_member)
    assert light["node-01"].labels.get("pool") == "a"
