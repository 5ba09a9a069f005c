"""The decider's fast path (``Decider(policy)``: objects reused for unchanged rows, steady entities'
verdicts remembered, steady replicas stepped in one go, flag-free passes skipped) answers exactly as the
plain path (``Decider(policy, fast=False)``: every entity every cycle): same transitions, intents and
state, cycle by cycle, on columnar FleetHealth-like inputs (where the reuse happens) and on the real
engine's output. The input state is never modified."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.decide.decider import Decider
from fleethealth.decide.loop import DecisionLoop
from fleethealth.decide.state import DecisionState, Event
from fleethealth.policy import default_policy
from fleethealth.score.health import HealthTuple
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

POL = default_policy()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CATS = ["hardware", "performance", "thermal"]
NODES = ["n1", "n2", "n3", "n4"]
REPLICAS = ["r1", "r2"]
GPUS = [f"{n}/gpu{g}" for n in NODES for g in range(2)]
NODE_LABELS = {n: {"pool": "p1" if i < 3 else "p2", "tp_group": "tp1" if i < 2 else f"tp{i}",
                   "driver_version": "550" if i < 3 else "535"} for i, n in enumerate(NODES)}
REPLICA_LABELS = {r: {"node": NODES[i], "build": "b1", "pool": "serve"} for i, r in enumerate(REPLICAS)}


@dataclass
class KS:
    """The columns of the engine's KindScores that the decider reads."""

    kind: str
    names: list[str]
    value: np.ndarray
    confidence: np.ndarray
    worst: np.ndarray
    reason: list[str]
    flags: dict[int, list[str]]
    categories: list[str] = field(default_factory=lambda: list(CATS))
    worst_member: dict[int, str] = field(default_factory=dict)


class Meta:
    def __init__(self, kinds: dict[str, KS], drivers: dict[str, str] | None = None) -> None:
        self.kinds = kinds
        self.drivers = drivers or {}

    def labels(self, kind: str, i: int) -> dict[str, str]:
        name = self.kinds[kind].names[i]
        out = dict(NODE_LABELS.get(name) or REPLICA_LABELS.get(name) or {"node": name.split("/")[0], "job": "j1"})
        if name in self.drivers:
            out["driver_version"] = self.drivers[name]  # a rollout: the node's metadata changed
        return out


class Health:
    """A columnar FleetHealth stand-in (the engine's own is exercised below)."""

    def __init__(self, kinds: dict[str, KS], now: float, drivers: dict[str, str] | None = None) -> None:
        self.kinds = kinds
        self.now = now
        self.meta = Meta(kinds, drivers)

    def _tuple(self, ks: KS, i: int) -> HealthTuple:
        v = float(ks.value[i])
        w = int(ks.worst[i])
        return HealthTuple(entity=ks.names[i], kind=ks.kind, value=None if v != v else v,  # type: ignore[arg-type]
                           confidence=float(ks.confidence[i]), worst=ks.categories[w] if w >= 0 else None,
                           reason=ks.reason[i], labels=self.meta.labels(ks.kind, i),
                           worst_member=ks.worst_member.get(i), flags=tuple(ks.flags.get(i, ())), ts=self.now)

    def by_kind(self, kind: str) -> list[HealthTuple]:
        ks = self.kinds.get(kind)
        return [] if ks is None else [self._tuple(ks, i) for i in range(len(ks.names))]

    @property
    def tuples(self) -> dict[str, HealthTuple]:
        return {t.entity: t for k in self.kinds for t in self.by_kind(k)}

    def get(self, name: str) -> HealthTuple | None:
        return self.tuples.get(name)


row = st.tuples(
    st.one_of(st.none(), st.sampled_from([0.05, 0.3, 0.55, 0.72, 0.8, 0.95, 1.0]), st.floats(0.0, 1.0)),
    st.sampled_from([0.2, 0.6, 0.9, 1.0]),
    st.sampled_from(["min:hardware", "min:performance", "gate:xid", "min:thermal:overload"]),
    st.sampled_from([(), (), (), ("row_remap_pending",), ("recovery_action:DRAIN_AND_RESET",),
                     ("recovery_action:GPU_RESET",), ("xid:13",), ("xid:31",)]),
)
# per cycle and entity: None = the same row as last cycle (what a steady fleet looks like), else a new one
cycle = st.fixed_dictionaries({
    "rows": st.dictionaries(st.sampled_from(NODES + REPLICAS + GPUS[:3]), row, max_size=3),
    "serving": st.dictionaries(st.sampled_from(REPLICAS), st.tuples(st.floats(0.0, 1.0), st.sampled_from([0.3, 1.0])),
                               max_size=1),
    "absent": st.sets(st.sampled_from(NODES + REPLICAS), max_size=1),
    "events": st.lists(st.tuples(st.sampled_from(["active_test", "reset", "ack"]), st.sampled_from(NODES + REPLICAS),
                                 st.booleans(), st.sampled_from(["READY", "QUARANTINED"])), max_size=1),
    "dt": st.sampled_from([15.0, 60.0, 60.0, 300.0, 900.0]),
    "no_key": st.sampled_from([False, False, True]),  # no labels_key: labels asked for every row
    "rollout": st.sampled_from([None, None, None, ("n1", "560"), ("n4", "560"), ("n1", "550"), ("r1", "x")]),
})


def _columns(kind: str, names: list[str], rows: dict[str, Any]) -> KS:
    vals, confs, worst, reasons, flags = [], [], [], [], {}
    for i, n in enumerate(names):
        v, c, r, f = rows[n]
        vals.append(np.nan if v is None else v)
        confs.append(0.0 if v is None else c)
        worst.append(-1 if v is None else CATS.index(r.split(":")[1]) if r.startswith("min:") else 0)
        reasons.append("no_fresh_data" if v is None else r)
        if f:
            flags[i] = list(f)
    return KS(kind, names, np.array(vals), np.array(confs), np.array(worst, np.int64), reasons, flags)


@SETTINGS
@given(script=st.lists(cycle, min_size=1, max_size=40), keyless=st.booleans())
def test_fast_decider_answers_as_the_plain_one_on_columnar_health(script: list[dict[str, Any]], keyless: bool) -> None:
    """``keyless``: no cycle has a labels_key (a custom scorer, or a history that cannot tell)."""
    fast, plain = Decider(POL), Decider(POL, fast=False)
    sf, sp = DecisionState(), DecisionState()
    rows: dict[str, Any] = {n: (1.0, 1.0, "min:hardware", ()) for n in NODES + REPLICAS + GPUS}
    serving: dict[str, Any] = {r: (1.0, 1.0) for r in REPLICAS}
    drivers: dict[str, str] = {}
    t = 1_000.0
    for step in script:
        t += step["dt"]
        if step["rollout"] is not None:
            drivers[step["rollout"][0]] = step["rollout"][1]
        rows.update(step["rows"])
        serving.update(step["serving"])
        kinds = {
            "node": _columns("node", [n for n in NODES if n not in step["absent"]], rows),
            "replica": _columns("replica", [r for r in REPLICAS if r not in step["absent"]], rows),
            "gpu": _columns("gpu", GPUS, rows),
        }
        sk = _columns("replica", [r for r in REPLICAS if r not in step["absent"]],
                      {r: (serving[r][0], serving[r][1], "min:performance", ()) for r in REPLICAS})
        # the set of series: who is present, and which driver series they carry
        key = None if keyless or step["no_key"] else (tuple(kinds["node"].names + kinds["replica"].names),
                                           tuple(sorted(drivers.items())))
        events = [Event(t, k, e, passed=p, to=to) for k, e, p, to in step["events"]]
        before = sf.to_dict()
        df = fast.decide(sf, Health(kinds, t, dict(drivers)), t, events, Health({"replica": sk}, t), labels_key=key)
        dp = plain.decide(sp, Health(kinds, t, dict(drivers)), t, events, Health({"replica": sk}, t), labels_key=key)
        assert sf.to_dict() == before  # the input state is not modified
        assert [x.to_dict() for x in df.transitions] == [x.to_dict() for x in dp.transitions]
        assert [x.to_dict() for x in df.intents] == [x.to_dict() for x in dp.intents]
        assert df.state.to_dict() == dp.state.to_dict()
        sf, sp = df.state, dp.state


def _scrape(at: float, temps: dict[str, float], missing: set[str], slo_bad: bool) -> Snapshot:
    b = SnapshotBuilder()
    for n, temp in temps.items():
        b.add("fleethealth_node_info", {"node": n, "pool": "train-a", "tp_group": f"tp-{n}"}, 1.0, at)
        if n in missing:
            continue
        for g in range(2):
            lab = {"Hostname": n, "gpu": str(g), "UUID": f"GPU-{n}-{g}", "DCGM_FI_DRIVER_VERSION": "550"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, temp + g, at)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0 if temp < 85 else 1200.0, at)
    for r in ("rep-a", "rep-b"):
        lab = {"replica": r, "node": "n0", "build": "b1"}
        b.add("vllm:num_requests_running", lab, 4.0, at)
        b.add("vllm:num_requests_waiting", lab, 40.0 if slo_bad and r == "rep-a" else 0.0, at)
        b.add("vllm:kv_cache_usage_perc", lab, 0.5, at)
    return b.build(at)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(st.tuples(st.dictionaries(st.sampled_from(["n0", "n1", "n2"]), st.sampled_from([50.0, 95.0])),
                                 st.sets(st.sampled_from(["n0", "n1", "n2"]), max_size=1), st.booleans(),
                                 st.integers(1, 6)), min_size=1, max_size=8))
def test_fast_loop_answers_as_the_plain_loop_on_the_engine(script: list[Any]) -> None:
    """The real engine and history: runs of identical scrapes (where rows are reused) broken by changes."""
    fast, plain = DecisionLoop(POL), DecisionLoop(POL)
    plain.decider = Decider(POL, fast=False)
    temps = {"n0": 50.0, "n1": 50.0, "n2": 50.0}
    t = 0.0
    for change, missing, slo_bad, repeat in script:
        temps.update(change)
        for _ in range(repeat):
            t += 60.0
            a = fast.cycle(_scrape(t, temps, missing, slo_bad), t)
            b = plain.cycle(_scrape(t, temps, missing, slo_bad), t)
            assert [x.to_dict() for x in a.decision.transitions] == [x.to_dict() for x in b.decision.transitions]
            assert [x.to_dict() for x in a.decision.intents] == [x.to_dict() for x in b.decision.intents]
            assert a.decision.state.to_dict() == b.decision.state.to_dict()
