"""The engine's batched steady-state path equals the plain one.

On a history's view the engine evaluates every signal of a kind together (gauges gathered at once,
counters read off the matrices, ramp / gate / flag shapes as one 2-D operation, peer medians off a
padded groups x width sort, cached peer groups, SLO bucket choices) and keeps what depends only on
which series exist from one cycle to the next. The row path (the same view without its index) is the
reference: values within 1e-12, identical reasons, worst categories, flags, notes and explanations,
whatever the fleet does (gates firing, flags, resets, stale and vanished exporters, several series per
entity, peer outliers, SLO burns), for each consumer and cycle after cycle.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.score import shapes
from fleethealth.score.engine import KINDS, FleetHealth, Scorer, forget_evaluations, score_snapshot
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder

POLICY = default_policy()
NODES, GPUS, REPLICAS = 4, 4, 3
T0 = 1_700_000_000.0
FIELDS = ("value", "confidence", "sub", "cat", "raw", "rate", "age", "z")


# --------------------------------------------------------------------------------------------------
# Peer medians off a padded layout == the sorting definition
# --------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.floats(-1e6, 1e6)), min_size=1, max_size=120),
    st.sampled_from(["higher", "lower"]),
    st.sampled_from([0.0, 0.01, 0.5]),
    st.sampled_from([0.001, 0.0, 0.1]),
    st.booleans(),
)
def test_laid_out_peer_z_equals_the_sorting_definition(rows: list[tuple[int, float]], worse_if: str,
                                                       min_rel_dev: float, mad_floor_rel: float,
                                                       repeat: bool) -> None:
    raw_groups = np.array([r[0] for r in rows], np.int64)
    values = np.array([r[1] for r in rows], np.float64)
    if repeat:  # ties and identical peers (MAD 0)
        values = np.round(values / 1e5) * 1e5
    present = np.unique(raw_groups)
    groups = np.searchsorted(present, raw_groups)
    n_groups = int(present.size)
    layout = shapes.PeerLayout(groups, n_groups)
    kw: dict[str, Any] = {"worse_if": worse_if, "min_rel_dev": min_rel_dev, "mad_floor_rel": mad_floor_rel}
    want = shapes.peer_robust_z(values, groups, n_groups, **kw)
    got = shapes.peer_robust_z_laid_out(values, layout, **kw)
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b, equal_nan=True)


# --------------------------------------------------------------------------------------------------
# A small fleet driven by hypothesis, scored through a history
# --------------------------------------------------------------------------------------------------
def _gpu_labels(n: int, g: int) -> dict[str, str]:
    return {"Hostname": f"n{n}", "gpu": str(g), "UUID": f"GPU-{n}-{g}", "modelName": "H100" if n < 3 else "A100"}


step = st.fixed_dictionaries({
    "dt": st.sampled_from([15.0, 15.0, 30.0, 60.0, 200.0]),
    "dead": st.lists(st.integers(0, NODES - 1), max_size=2),  # exporters that do not answer this scrape
    "hot": st.lists(st.tuples(st.integers(0, NODES * GPUS - 1), st.floats(60, 110)), max_size=3),
    "slow": st.lists(st.tuples(st.integers(0, NODES * GPUS - 1), st.floats(0.5, 1.3)), max_size=3),
    "gate": st.lists(st.tuples(st.integers(0, NODES * GPUS - 1), st.sampled_from(
        ["recovery", "remap_fail", "remap_pending", "retired", "xid79", "xid13", "xid0", "dbe", "reset"])), max_size=3),
    "errors": st.lists(st.floats(0, 0.5), min_size=REPLICAS, max_size=REPLICAS),
    "slow_share": st.lists(st.floats(0.5, 1.0), min_size=REPLICAS, max_size=REPLICAS),
    "ranks": st.booleans(),
    "view": st.booleans(),
})


class _Fleet:
    def __init__(self, seed: int = 0) -> None:
        self.t = T0
        n = NODES * GPUS
        self.ecc_sbe = np.zeros(n)
        self.ecc_dbe = np.zeros(n)
        self.pcie = np.zeros(n)
        self.nvl = np.zeros((n, 2))
        self.xid = np.zeros(n)
        self.req = np.zeros(REPLICAS)
        self.err = np.zeros(REPLICAS)
        self.fast = np.zeros(REPLICAS)
        self.rng = np.random.default_rng(seed)

    def scrape(self, s: dict[str, Any]) -> Any:
        self.t += s["dt"]
        t, rng = self.t, self.rng
        b = SnapshotBuilder()
        hot, slow = dict(s["hot"]), dict(s["slow"])
        gates: dict[int, list[str]] = {}
        for i, kind in s["gate"]:
            gates.setdefault(i, []).append(kind)
        for node in range(NODES):
            if node in s["dead"]:
                continue
            for g in range(GPUS):
                i = node * GPUS + g
                lab = _gpu_labels(node, g)
                gk = gates.get(i, [])
                b.add("DCGM_FI_DEV_GPU_TEMP", lab, hot.get(i, 55.0 + rng.random()), t)
                b.add("DCGM_FI_DEV_MEMORY_TEMP", lab, 60.0 + rng.random(), t)
                b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0 * slow.get(i, 1.0) + rng.integers(0, 3), t)
                b.add("DCGM_FI_DEV_GPU_RECOVERY_ACTION", lab, float(1 + i % 4) if "recovery" in gk else 0.0, t)
                b.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", lab, 1.0 if "remap_fail" in gk else 0.0, t)
                b.add("DCGM_FI_DEV_ROW_REMAP_PENDING", lab, 1.0 if "remap_pending" in gk else 0.0, t)
                if g % 2:
                    b.add("DCGM_FI_DEV_RETIRED_PENDING", lab, 1.0 if "retired" in gk else 0.0, t)
                for code, kind in ((79.0, "xid79"), (13.0, "xid13"), (0.0, "xid0")):
                    if kind in gk:
                        self.xid[i] = code
                b.add("DCGM_FI_DEV_XID_ERRORS", lab, self.xid[i], t)
                if "reset" in gk:
                    self.ecc_sbe[i] = self.pcie[i] = 0.0
                # single-bit ECC: about one an hour (a steady 0-1 a scrape would be memory wearing out)
                self.ecc_sbe[i] += rng.integers(0, 2) * 0.01
                self.ecc_dbe[i] += 1.0 if "dbe" in gk else 0.0
                self.pcie[i] += rng.integers(0, 40)
                self.nvl[i] += rng.integers(0, 2, 2)
                b.add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", lab, self.ecc_sbe[i], t)
                b.add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", lab, self.ecc_dbe[i], t)
                b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, self.pcie[i], t)
                # per-link counters: two series of one GPU (a sum per entity, not one column each)
                for link in range(2 if i == 5 else 1):
                    b.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", {**lab, "link": str(link)},
                          self.nvl[i, link], t)
                if i == 6:  # a second temperature series for one GPU (another exporter): the worst counts
                    b.add("DCGM_FI_DEV_GPU_TEMP", {**lab, "pci_bus_id": "0000:99:00.0"}, 70.0 + rng.random(), t)
                if s["ranks"]:
                    b.add("fleethealth_rank_compute_seconds",
                          {"job": "train", "rank": str(i), "node": f"n{node}", "gpu": str(g),
                           "peer_group": f"stage{i % 3}", "Hostname": f"n{node}"},
                          1.82 * slow.get(i, 1.0) + 0.01 * rng.random(), t)
            b.add("fleethealth_node_gpus_missing", {"node": f"n{node}"}, float(node == 1 and len(gates) > 1), t)
        for r in range(REPLICAS):
            lab = {"replica": f"r{r}", "node": f"n{r}", "model_name": "llama", "build": "v1"}
            new = float(rng.integers(50, 150))
            self.req[r] += new
            self.err[r] += round(new * s["errors"][r])
            self.fast[r] += round(new * s["slow_share"][r])
            b.add("fleethealth_replica_requests_total", lab, self.req[r], t)
            b.add("fleethealth_replica_errors_total", lab, self.err[r], t)
            b.add("vllm:time_to_first_token_seconds_count", lab, self.req[r], t)
            b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "2.0"}, self.fast[r], t)
            b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "+Inf"}, self.req[r], t)
            b.add("vllm:num_requests_waiting", lab, float(rng.integers(0, 300)), t)
        return b.build(t)


def _same(a: FleetHealth, b: FleetHealth, where: str) -> None:
    for kind in KINDS:
        ka, kb = a.kinds[kind], b.kinds[kind]
        assert ka.names == kb.names, (where, kind)
        for f in FIELDS:
            x, y = np.asarray(getattr(ka, f), float), np.asarray(getattr(kb, f), float)
            assert x.shape == y.shape, (where, kind, f)
            assert np.array_equal(np.isnan(x), np.isnan(y)), (where, kind, f)
            assert np.allclose(x, y, rtol=1e-12, atol=1e-12, equal_nan=True), (where, kind, f)
        assert list(ka.reason) == list(kb.reason), (where, kind)
        assert {k: v for k, v in ka.flags.items() if v} == {k: v for k, v in kb.flags.items() if v}, (where, kind)
        assert ka.notes == kb.notes, (where, kind)
        assert dict(ka.worst_member) == dict(kb.worst_member), (where, kind)
        assert list(ka.categories) == list(kb.categories), (where, kind)
        assert np.array_equal(ka.worst, kb.worst) and np.array_equal(ka.expected, kb.expected), (where, kind)
    ta, tb = list(a), list(b)
    assert [t.entity for t in ta] == [t.entity for t in tb]
    for u, w in zip(ta, tb, strict=True):
        assert (u.reason, u.worst, u.flags, u.worst_member, u.labels) == (w.reason, w.worst, w.flags, w.worst_member,
                                                                          w.labels)
        assert [d.signal for d in u.details] == [d.signal for d in w.details]
        assert [d.note for d in u.details] == [d.note for d in w.details], u.entity


def _score_all(view: Any, now: float, inventory: dict[str, list[str]],
               scorer: Scorer | None = None) -> list[FleetHealth]:
    """The three consumers of one cycle; with ``scorer``, what it kept from earlier cycles in play."""
    score = scorer.score if scorer is not None else score_snapshot
    return [score(view, POLICY, now, c, inventory, aggregation=agg)
            for c, agg in (("remediation", None), ("serving", None), ("training", "mean"))]


@settings(max_examples=30, deadline=None)
@given(st.lists(step, min_size=2, max_size=14))
def test_batched_path_equals_the_row_path_cycle_after_cycle(steps: list[dict[str, Any]]) -> None:
    fleet = _Fleet()
    h = SignalHistory(POLICY)
    inventory = {"node": [f"n{i}" for i in range(NODES)] + ["n-spare"]}
    scorer = Scorer()  # one stream, as production: what it keeps from earlier cycles is in play
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k, s in enumerate(steps):
            h.add(fleet.scrape(s))
            if not (s["view"] or k == len(steps) - 1):
                continue
            now = fleet.t + 1.0
            view = h.view(now)
            assert view.index is not None
            fast = _score_all(view, now, inventory, scorer)
            plain_view = dataclasses.replace(view, index=None)
            plain = _score_all(plain_view, now, inventory)
            for c, (f, p) in enumerate(zip(fast, plain, strict=True)):
                _same(f, p, f"cycle {k} consumer {c}")
    forget_evaluations()


def test_the_fleet_exercises_gates_flags_peers_and_slos() -> None:
    """The generator above reaches the paths it is meant to compare (not a vacuous equality)."""
    fleet = _Fleet()
    h = SignalHistory(POLICY)
    base = {"dt": 15.0, "dead": [], "hot": [], "slow": [], "gate": [], "errors": [0.0] * REPLICAS,
            "slow_share": [1.0] * REPLICAS, "ranks": True, "view": False}
    for _ in range(8):
        h.add(fleet.scrape(base))
    h.add(fleet.scrape({**base, "hot": [(2, 90.0)], "slow": [(3, 0.9)], "errors": [0.3, 0.0, 0.0],
                        "gate": [(0, "recovery"), (4, "xid79"), (8, "remap_pending"), (9, "dbe")]}))
    now = fleet.t + 1.0
    view = h.view(now)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        forget_evaluations()
        fast = _score_all(view, now, {"node": ["n0"]})
        forget_evaluations()
        plain = _score_all(dataclasses.replace(view, index=None), now, {"node": ["n0"]})
    for f, p in zip(fast, plain, strict=True):
        _same(f, p, "scripted")
    fh = fast[0]
    assert fh.tuples["n0/gpu0"].reason == "gate:recovery_action"
    assert fh.tuples["n1/gpu0"].reason == "gate:xid"
    assert "row_remap_pending" in fh.tuples["n2/gpu0"].flags
    assert fh.tuples["n2/gpu1"].reason == "gate:ecc_dbe"
    hot = fh.tuples["n0/gpu2"]
    assert hot.worst == "thermal" and hot.value is not None and 0.0 < hot.value < 1.0
    assert fh.tuples["n0/gpu3"].worst == "performance"
    burning = fh.tuples["r0"]
    assert burning.worst == "errors" and burning.value is not None and burning.value < 1.0
    assert fh.kinds["rank"].names and not np.isnan(fh.kinds["rank"].z).all()


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(step, step), min_size=2, max_size=8))
def test_two_fleets_scored_alternately_keep_nothing_of_each_other(steps: list[tuple[dict[str, Any], ...]]) -> None:
    """What the engine keeps between calls (plans, peer groups, derived scores, the roll-up) is found by
    identity and checked by equality: two histories of one policy scored turn about (as a backtest's
    lanes are) each still equal the row path."""
    fleets, hists = [_Fleet(1), _Fleet(2)], [SignalHistory(POLICY), SignalHistory(POLICY)]
    inventory = {"node": [f"n{i}" for i in range(NODES)]}
    shared = Scorer()  # one scorer for both streams (harder than a scorer per lane, as the product has)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k, pair in enumerate(steps):
            for fleet, h, s in zip(fleets, hists, pair, strict=True):
                h.add(fleet.scrape(s))
                now = fleet.t + 1.0
                view = h.view(now)
                fast = _score_all(view, now, inventory, shared)
                plain = _score_all(dataclasses.replace(view, index=None), now, inventory)
                for c, (f, p) in enumerate(zip(fast, plain, strict=True)):
                    _same(f, p, f"step {k} consumer {c}")
    forget_evaluations()


def test_serving_kinds_made_on_first_access_equal_made_at_once() -> None:
    """The serving consumer's kinds are aggregated when first read: in any order, the same scores as
    all read at once; GPUs and nodes come together, so changing a GPU score afterwards (as the
    no-confidence baseline does) never reaches its node."""
    fleet = _Fleet(3)
    h = SignalHistory(POLICY)
    base = {"dt": 15.0, "dead": [], "hot": [(5, 93.0)], "slow": [], "gate": [(9, "xid79")],
            "errors": [0.2, 0.0, 0.0], "slow_share": [1.0] * REPLICAS, "ranks": True, "view": False}
    for _ in range(6):
        h.add(fleet.scrape(base))
    now = fleet.t + 1.0
    view = h.view(now)
    scorer = Scorer()  # the serving calls share the kept evaluation, as a controller cycle's do
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = scorer.score(view, POLICY, now, "serving")
        list(ref.kinds.values())
        for order in (["replica", "node", "gpu", "rank"], ["node", "rank", "replica", "gpu"], ["gpu"]):
            fh = scorer.score(view, POLICY, now, "serving")
            for kind in order:
                fh.kinds[kind]
            fh.kinds["gpu"].value[:] = 1.0  # a caller's change after the fact
            assert np.array_equal(fh.kinds["node"].value, ref.kinds["node"].value, equal_nan=True)
            assert fh.kinds["node"].reason == ref.kinds["node"].reason
            for kind in ("replica", "rank"):
                assert np.array_equal(fh.kinds[kind].value, ref.kinds[kind].value, equal_nan=True)
            assert [t.entity for t in fh] == [t.entity for t in ref]
        # the remediation consumer's scores are made inside the call, whatever is read later
        rem = scorer.score(view, POLICY, now, "remediation")
        assert all(kind in rem.kinds._done for kind in KINDS)  # type: ignore[attr-defined]
        scorer.forget_evaluations()
        again = scorer.score(view, POLICY, now, "serving")
        _same(again, ref, "after forget_evaluations")
