"""The simulator's output: its row layout, each step's snapshot, and a node's exporter page.

Theory of operation. At construction (``Simulation._build_layout``) every series the fleet can emit gets
one row, block after block (``Block``: one metric over one kind of entity, ``Entities``: the label sets
with each row's owning node, GPU and replica), and its metric name and label set are interned once
(``Interner``: ids never move; snapshots already handed out keep their shorter lists). Xid counters are
the only rows that appear later, one per GPU and Xid when it is first logged.

``emit`` turns a computed step into a ``Snapshot``: the emitted part of the value buffer (or a drawn
step's GPU rows in their place) plus the dynamic Xid rows and one ``up`` per node, with the row arrays of
the whole layout (``full_ids``, rebuilt only when the layout changes and shared read-only by every
snapshot). Rows of a node whose exporter is down, a GPU gone from the bus, a replica gone, a pool on
dcgm-exporter's default field list and the ranks of a drained node are masked out; faults that change
what an exporter serves (frozen values, a skewed clock) adjust the copy, never the fleet.

``render_node`` writes the same rows of one node as dcgm-exporter and vLLM would serve them (text format
0.0.4, each family's samples together, ``# HELP`` and ``# TYPE`` from ``metric_catalog``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fleethealth.agent.exposition import escape_label_value
from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot
from fleethealth.sim.metric_catalog import HELP, ITL, METRIC_TYPES, TTFT

if TYPE_CHECKING:
    from fleethealth.sim.faults import Effects
    from fleethealth.sim.simulation import Simulation


@dataclass(slots=True)
class Block:
    metric: str
    kind: str  # gpu | rank | replica | replica_bucket | node
    start: int
    stop: int
    key: str  # which per-step value array fills this block


@dataclass(slots=True)
class Entities:
    """The exposed label sets of one kind of entity (GPUs, ranks, replicas, ...) with each row's owning
    node, GPU and replica (-1: none); interned and rendered once, on first use, for every metric."""

    labels: list[dict[str, str]]
    node: np.ndarray
    gpu: np.ndarray
    rep: np.ndarray
    sids: np.ndarray | None = None
    rendered: list[str] | None = None


class Interner:
    """Copy-on-write interning: snapshots already handed out keep their (shorter) lists, ids never move."""

    def __init__(self) -> None:
        self.metrics: list[str] = []
        self.labelsets: list[LabelSet] = []
        self._m: dict[str, int] = {}
        self._s: dict[LabelSet, int] = {}
        self.frozen = False

    def metric(self, name: str) -> int:
        ix = self._m.get(name)
        if ix is None:
            if self.frozen:
                self.metrics = [*self.metrics, name]
            else:
                self.metrics.append(name)
            ix = self._m[name] = len(self.metrics) - 1
        return ix

    def series(self, labels: dict[str, str]) -> int:
        key = tuple(sorted(labels.items()))
        ix = self._s.get(key)
        if ix is None:
            if self.frozen:
                self.labelsets = [*self.labelsets, key]
            else:
                self.labelsets.append(key)
            ix = self._s[key] = len(self.labelsets) - 1
        return ix


# exposition label-value escaping: backslash, newline, double quote (one pass, each character mapped once)
def render_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items()) + "}"


def full_ids(sim: Simulation) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Row arrays of the whole layout (static blocks, dynamic Xid counters, then one `up` per node),
    rebuilt only when the layout changes; snapshots share them, so they are never written in place."""
    hit = sim._full_cache
    if hit is not None and hit[0] == sim._layout_version:
        return hit[1]
    f = sim.fleet
    nd = len(sim.xid_counts)
    dyn_s = sim._dyn_series if nd else np.zeros(0, np.int32)
    dyn_n = sim._dyn_node if nd else np.zeros(0, np.int64)
    dyn_g = sim._dyn_gpu if nd else np.zeros(0, np.int64)
    up_nodes = np.arange(f.n_nodes)
    out = (
        np.concatenate([sim.row_metric, np.full(nd, sim.xid_metric, np.int32),
                        np.full(f.n_nodes, sim.up_metric, np.int32)]),
        np.concatenate([sim.row_series, dyn_s, sim.up_series]).astype(np.int32),
        np.concatenate([sim.row_node, dyn_n, up_nodes]),
        np.concatenate([sim.row_gpu, dyn_g, np.full(f.n_nodes, -1)]),
        np.concatenate([sim.row_rep, np.full(nd + f.n_nodes, -1)]),
        f.n_nodes,
    )
    # read-only: the history then knows these very arrays still hold the layout it planned for
    out[0].flags.writeable = False
    out[1].flags.writeable = False
    sim._full_cache = (sim._layout_version, out)
    return out


def emit(sim: Simulation, t: float, eff: Effects | None, any_out: bool) -> Snapshot:
    """The snapshot of the step just computed (the buffer's emitted rows, dynamic Xid rows, `up`)."""
    metric, series, row_node, row_gpu, row_rep, n_up = full_ids(sim)
    node_up = sim._all_up
    errors: list[InputIssue] = []
    keep: np.ndarray | None = None
    if eff is not None and any(
            (gone := eff.get(name)) is not None and np.count_nonzero(gone)
            for name in ("node_down", "gpu_gone", "replica_gone")):
        node_up = ~eff.node_down
        gpu_ok = np.append(~eff.gpu_gone, True)
        rep_ok = np.append(~eff.replica_gone, True)
        keep = node_up[row_node] & gpu_ok[row_gpu] & rep_ok[row_rep]
        keep[-n_up:] = True  # `up` itself is always there: 0 for a target that failed its scrape
        for n, why in sorted(eff.node_reason.items()):
            errors.append(InputIssue(f"target {sim._instance(n)}", 0, why))
    if sim._field_keep is not None:
        fk = np.ones(len(row_node), bool)
        fk[: sim.n_static] = sim._field_keep
        keep = fk if keep is None else keep & fk
    if any_out:
        # the ranks of a drained node are gone: the job runs on without them
        gone = np.zeros(len(row_node), bool)
        gone[: sim.n_static] = sim.row_is_rank & sim.node_out[sim.row_node]
        keep = ~gone if keep is None else keep & ~gone
    # a fresh array per step: snapshots handed out stay as they were
    emitted = sim._buf[: sim.n_static]
    if sim._gpu_rows is not None:
        lo, hi = sim._gpu_span
        values = np.concatenate((emitted[:lo], *sim._gpu_rows, emitted[hi:], sim._all_up_values))
        sim._gpu_rows = None
    elif sim.xid_counts:
        values = np.concatenate((emitted, np.asarray(sim.xid_counts), node_up), dtype=np.float64)
    elif node_up is sim._all_up:
        values = np.concatenate((emitted, sim._all_up_values))
    else:
        values = np.concatenate((emitted, node_up), dtype=np.float64)
    sim._keep = keep
    sim._values = values
    if keep is not None:
        metric, series, values = metric[keep], series[keep], values[keep]
    ts = np.empty(len(values))
    ts.fill(t)
    if eff is not None:
        # exporter faults (frozen values, a skewed clock) change what is served, not the fleet
        adjusting = [f for f in sim.faults if getattr(f, "adjusts_output", False) and f.started
                     and not f.stopped and f.active(t)]
        if adjusting:
            rn = row_node if keep is None else row_node[keep]
            for fault in adjusting:
                fault.adjust_output(sim, t, values, ts, rn)  # type: ignore[attr-defined]
    snap = Snapshot(
        at=t, metrics=sim.intern.metrics, labelsets=sim.intern.labelsets, metric_ids=metric,
        series_ids=series, values=values, ts=ts, source_errors=errors,
    )
    sim.last = snap
    return snap


def node_rows(sim: Simulation, n: int) -> np.ndarray:
    hit = sim._node_rows_cache.get(n)
    if hit is not None and hit[0] == sim._layout_version:
        return hit[1]
    rows = np.nonzero(sim.row_node == n)[0]
    if sim.xid_counts:
        dyn = np.nonzero(sim._dyn_node == n)[0] + len(sim.row_node)
        rows = np.concatenate([rows, dyn])
    sim._node_rows_cache[n] = (sim._layout_version, rows)
    return rows


def render_node(sim: Simulation, node: str, t: float | None = None) -> str:
    """The node's exporter page at ``t`` in the classic text format 0.0.4 (``vllm:`` names kept).
    Raises ``LookupError`` if the node's exporter is down at that time."""
    if t is not None:
        sim.advance_to(t)
    if sim._values is None:
        sim.step()
    n = sim.fleet.node_index(node)
    assert sim._values is not None
    rows = node_rows(sim, n)
    if sim._keep is not None:
        if not sim._keep[rows].any():
            raise LookupError(f"{node}: exporter down")
        rows = rows[sim._keep[rows]]
    metric = np.concatenate([sim.row_metric, np.full(len(sim.xid_counts), sim.xid_metric, np.int32)])
    # group by family so that each family's samples are contiguous, as the format requires
    fam_names = [metric_family(m) for m in sim.intern.metrics]
    order = sorted(range(len(rows)), key=lambda i: (fam_names[metric[rows[i]]], i))
    vals = sim._values
    out: list[str] = []
    cur = None
    for i in order:
        r = int(rows[i])
        fam = fam_names[metric[r]]
        if fam != cur:
            cur = fam
            out.append(f"# HELP {fam} {HELP.get(fam, fam)}")
            out.append(f"# TYPE {fam} {METRIC_TYPES.get(fam, 'gauge')}")
        out.append(f"{sim.row_prefix[r]} {format_value(float(vals[r]))}")
    return "\n".join(out) + "\n"


def metric_family(metric: str) -> str:
    for suf in ("_bucket", "_sum", "_count"):
        if metric.endswith(suf) and metric[: -len(suf)] in (TTFT, ITL):
            return metric[: -len(suf)]
    return metric


def format_value(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)
