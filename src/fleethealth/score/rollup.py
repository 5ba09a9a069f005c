"""The node roll-up: a node is the weakest of its GPUs and its node-wide signals.

Theory of operation
-------------------
Per node, each category is the minimum over its GPUs' and its own (never averaged away); confidence adds
up the expected and fresh signals of the node and its GPUs; a gated GPU gates its node; the tuple names
the worst GPU (gated first, then lowest value) and takes its reason when it is worse than the node's own.
An expected GPU that is unknown (its samples stale, or known only from the inventory or the structural
tracker's memory) makes an ungated node unknown with reason ``missing:gpuN``: a node is never the healthy
minimum of the GPUs that remain. A GPU whose confidence is below ``lifecycle.min_confidence`` counts as
unknown here (one fresh gauge left of a GPU whose DCGM fields vanished, as an Xid 79 looks on a real
exporter): the node's confidence adds up its GPUs' signals, so one such GPU of eight would otherwise
leave its node healthy at confidence 0.88. A node reporting fewer GPUs than its pool's common count
(``expect.gpu_count_from_peers``: the peers rule of the expectation model) is unknown too, ``missing:gpu5``
(``_short_of_gpus``), with no inventory and no past needed.
Reductions over each node's GPUs are one stable sort by node and ``reduceat``, never a loop. The sort is
kept while the GPU -> node map is the same array, and the consumer-independent and per-consumer parts are
kept while they are made from the same derived scores (in the scorer's memory).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fleethealth.score.aggregate import KindScores
from fleethealth.score.expect import gpu_count_from_peers, gpu_count_why
from fleethealth.score.health import REASON_NO_FRESH_DATA

if TYPE_CHECKING:
    from fleethealth.policy import Expectation
    from fleethealth.score.kept import Kept


class _WorstMembers(Mapping[int, str]):
    """node index -> name of the GPU that decided it; an index array, names looked up on access."""

    def __init__(self, n: int, names: list[str]) -> None:
        self.ix = np.full(n, -1, np.int64)
        self.names = names

    def __getitem__(self, i: int) -> str:
        g = int(self.ix[i]) if 0 <= i < self.ix.size else -1
        if g < 0:
            raise KeyError(i)
        return self.names[g]

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self.ix >= 0).tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self.ix >= 0))


def _roll_up_nodes(gpu: KindScores, node: KindScores, gpu_node: np.ndarray,
                   shared: dict[str, Any] | None, kept: Kept, min_confidence: float = 0.0,
                   expectation: Expectation | None = None) -> None:
    """A node is the weakest of its GPUs and its node-wide signals (min; never averaged away).

    Reductions over each node's GPUs are one stable sort by node and ``reduceat``, never a loop. What
    does not depend on the consumer (categories, confidence, flags) is computed once per evaluation and
    kept in ``shared``; each consumer gets copies of what it may change."""
    nn = len(node.names)
    if gpu_node.size == 0 or nn == 0:
        return
    hit = kept.roll_up[0] if kept.roll_up else None  # (one read: another thread may replace it)
    if hit is not None and hit[0] is gpu_node:  # the GPUs of each node: as last cycle while tables are
        _, go, starts, present = hit
    else:
        go = np.argsort(gpu_node, kind="stable")
        gn = gpu_node[go]
        starts = np.flatnonzero(np.concatenate(([True], gn[1:] != gn[:-1])))
        present = gn[starts]  # node index of each GPU group
        kept.roll_up[:] = [(gpu_node, go, starts, present)]
    gated_gpu = gpu.gated if gpu.gated is not None else np.zeros(len(gpu.names), bool)
    g_from, n_from = gpu._made_from, node._made_from
    fixed = shared.get("fixed") if shared is not None else None
    last_a = kept.roll_up_a[0] if kept.roll_up_a else None
    if fixed is None and g_from is not None and n_from is not None and last_a is not None and (
            last_a[0] is g_from[0] and last_a[1] is n_from[0] and last_a[2] is gpu_node):
        # categories, confidence and gates from the same derived scores as last cycle's: as then
        cat_names, cmap, cat, conf, node_gated, gate_any = last_a[3]
        fixed = (cat_names, cmap, cat, conf, node_gated, gate_any, _node_flags(gpu, node, gpu_node))
        if shared is not None:
            shared["fixed"] = fixed
    if fixed is None:
        # per category: min over GPUs and the node's own
        cat_names = list(node.categories)
        gpu_cat_to_node = []
        n_own = len(cat_names)
        for cname in gpu.categories:
            if cname not in cat_names:
                cat_names.append(cname)
            gpu_cat_to_node.append(cat_names.index(cname))
        cmap = np.asarray(gpu_cat_to_node, np.int64)
        # a NaN column per GPU-only category
        cat = np.full((nn, len(cat_names)), np.nan)
        cat[:, :n_own] = node.cat
        if cmap.size:
            gmin = np.fmin.reduceat(gpu.cat[go], starts, axis=0)
            cat[np.ix_(present, cmap)] = np.fmin(cat[np.ix_(present, cmap)], gmin)
        # confidence: share of expected signals fresh over the node's GPUs and its own signals
        n_exp = node.n_expected.copy()
        n_fresh = node.n_fresh.copy()
        n_exp[present] += np.add.reduceat(gpu.n_expected[go], starts)
        n_fresh[present] += np.add.reduceat(gpu.n_fresh[go], starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            conf = np.where(n_exp > 0, n_fresh / np.maximum(n_exp, 1), 0.0)
        node_gated = node.gated if node.gated is not None else np.zeros(nn, bool)
        any_gpu_gate = np.zeros(nn, bool)
        any_gpu_gate[present] = np.logical_or.reduceat(gated_gpu[go], starts)
        gate_any = node_gated | any_gpu_gate
        part_a = (cat_names, cmap, cat, np.where(gate_any, 1.0, conf), node_gated.copy(), gate_any)
        for a in part_a[1:]:
            a.setflags(write=False)  # shared by consumers (and cycles, below)
        fixed = (*part_a, _node_flags(gpu, node, gpu_node))
        if shared is not None:
            shared["fixed"] = fixed
        if g_from is not None and n_from is not None:
            kept.roll_up_a[:] = [(g_from[0], n_from[0], gpu_node, part_a)]
    cat_names, cmap, cat, conf, node_gated, gate_any, flags = fixed
    node.categories[:] = cat_names
    node.cat = cat
    node.confidence = conf.copy()
    node.flags = {e: list(f) for e, f in flags.items()}
    # the per-consumer part: as last cycle's when made from the same scores
    key_c = (g_from[1] if g_from is not None else None, n_from[1] if n_from is not None else None)
    last_c = kept.roll_up_c.get(id(key_c[0]))
    if (key_c[0] is not None and key_c[1] is not None and last_c is not None and last_c[0] is key_c[0]
            and last_c[1] is key_c[1] and last_c[2] is cat and last_c[3] is gpu_node
            and last_c[4][4] == min_confidence):
        value, reason, worst, members_ix, _ = last_c[4]
        node.value, node.reason, node.worst = value.copy(), list(reason), worst.copy()
        if members_ix is not None:
            members = _WorstMembers(nn, gpu.names)
            members.ix[:] = members_ix
            node.worst_member = members
        _short_of_gpus(gpu, node, gpu_node, gate_any, expectation)
        return
    # value: min over known GPU values and the node's own value
    own = node.value.copy()
    v = node.value.copy()
    v[present] = np.fmin(v[present], np.fmin.reduceat(gpu.value[go], starts))
    # worst GPU per node: gated first, then lowest value
    gv = np.where(np.isnan(gpu.value), np.inf, gpu.value)
    order = np.lexsort((~gated_gpu, gv, gpu_node))
    first = np.ones(order.size, bool)
    first[1:] = gpu_node[order][1:] != gpu_node[order][:-1]
    best = order[first]  # worst gpu index for each node present
    ni = gpu_node[best]
    gval = gpu.value[best]
    take = ~node_gated[ni] & ~np.isnan(gval)
    with np.errstate(invalid="ignore"):
        take &= gated_gpu[best] | np.isnan(own[ni]) | (gval < own[ni])
    node.worst = np.array(node.worst)
    if take.any():
        tb, tn = best[take], ni[take]
        reasons = np.array(node.reason, dtype=object)
        reasons[tn] = np.array(gpu.reason, dtype=object)[tb]
        node.reason = reasons.tolist()
        gw = gpu.worst[tb]
        node.worst[tn] = np.where(gw >= 0, cmap[np.maximum(gw, 0)] if cmap.size else -1, -1)
        members = _WorstMembers(nn, gpu.names)
        members.ix[tn] = tb
        node.worst_member = members
    node.value = np.where(gate_any, 0.0, v)
    for i in np.flatnonzero(np.isnan(node.value)).tolist():
        node.reason[i] = REASON_NO_FRESH_DATA
        node.worst[i] = -1
    _missing_gpus(gpu, node, gpu_node, gated_gpu, gate_any, min_confidence)
    if key_c[0] is not None and key_c[1] is not None:
        wm = node.worst_member
        made = (node.value.copy(), list(node.reason), node.worst.copy(),
                wm.ix.copy() if isinstance(wm, _WorstMembers) else None, min_confidence)
        if len(kept.roll_up_c) > 8:
            kept.roll_up_c.clear()
        kept.roll_up_c[id(key_c[0])] = (key_c[0], key_c[1], cat, gpu_node, made)
    _short_of_gpus(gpu, node, gpu_node, gate_any, expectation)


def _short_of_gpus(gpu: KindScores, node: KindScores, gpu_node: np.ndarray, gate_any: np.ndarray,
                   expectation: Expectation | None) -> None:
    """The peers rule for the GPU count (``expect.gpu_count_from_peers``): a node reporting fewer GPUs than
    its pool's common count k is unknown, ``missing:gpu5`` (the indices absent from 0..k-1; ``gpus(7/8)``
    when its GPU ids are not numbers), its confidence scaled by the share of GPUs it reports; a gated node
    stays gated, a node with no fresh data stays so (its confidence scaled alike)."""
    groups = gpu.expect.groups if gpu.expect is not None else None
    if expectation is None or groups is None or len(groups.levels) < 2 or gpu_node.size == 0:
        return
    nn = len(node.names)
    have = np.bincount(gpu_node, minlength=nn)[:nn]
    reporting = have[have > 0]
    if reporting.size == 0 or int(reporting.min()) == int(reporting.max()):
        return  # every node reports as many GPUs: that is any pool's common count, none is short of it
    part, first, npools = groups.levels[1]
    pool_of_node = np.full(nn, -1, np.int64)
    pool_of_node[gpu_node[::-1]] = part[::-1] - first  # the pool of each node's first GPU
    k, agree, peers = gpu_count_from_peers(have, pool_of_node, groups.names[first:first + npools],
                                           expectation.gpu_count_min_peers, expectation.gpu_count_fraction)
    short = (have > 0) & (have < k) & ~gate_any
    if not short.any():
        return
    idx = np.flatnonzero(short)
    conf = node.confidence.copy()
    conf[idx] = conf[idx] * have[idx] / k[idx]
    node.confidence = conf
    value, worst, reason = node.value.copy(), np.array(node.worst), list(node.reason)
    ids: dict[int, list[str]] = {}
    for g in np.flatnonzero(short[gpu_node]).tolist():  # only the GPUs of short nodes (a few)
        ids.setdefault(int(gpu_node[g]), []).append(gpu.names[g].rsplit("/", 1)[-1])
    why = dict(node.gpu_count_why)
    for i in idx.tolist():
        kk = int(k[i])
        why[i] = gpu_count_why(groups.names[first + int(pool_of_node[i])], int(agree[i]), int(peers[i]), kk)
        if not np.isnan(value[i]) or reason[i].startswith("missing:"):
            lost = missing_gpu_ids(ids.get(i, []), kk)
            before = reason[i][len("missing:"):].split(",") if reason[i].startswith("missing:") else []
            reason[i] = "missing:" + ",".join(before + [x for x in lost if x not in before])
            value[i] = np.nan
            worst[i] = -1
            if isinstance(node.worst_member, _WorstMembers):
                node.worst_member.ix[i] = -1  # no GPU it reports decided it
    node.value, node.worst, node.reason, node.gpu_count_why = value, worst, reason, why


def missing_gpu_ids(present: list[str], k: int) -> list[str]:
    """The GPUs absent from ``gpu0..gpu{k-1}`` (``present``: the node's GPU ids, ``gpuN``), or
    ``gpus(n/k)`` when an id is not a number."""
    nums = [p[3:] for p in present]
    if not all(p.startswith("gpu") and x.isdigit() for p, x in zip(present, nums, strict=True)):
        return [f"gpus({len(present)}/{k})"]
    got = {int(x) for x in nums}
    return [f"gpu{i}" for i in range(k) if i not in got]


def _missing_gpus(gpu: KindScores, node: KindScores, gpu_node: np.ndarray, gated_gpu: np.ndarray,
                  gate_any: np.ndarray, min_confidence: float = 0.0) -> None:
    """An expected GPU that is unknown (no fresh data, or confidence below ``min_confidence``: most of its
    expected signals gone; not gated) leaves its node unknown, never a healthy minimum over the GPUs that
    remain: reason ``missing:gpu4`` (its GPUs, in order). A node none of whose GPUs is known stays
    ``no_fresh_data`` (or, all of them low confidence, its own low confidence); a gated node stays gated
    (a gate is certain evidence)."""
    with np.errstate(invalid="ignore"):
        unknown = (np.isnan(gpu.value) | (gpu.confidence < min_confidence)) & ~gated_gpu
    if not unknown.any():
        return
    nn = len(node.names)
    n_unknown = np.bincount(gpu_node[unknown], minlength=nn)
    partial = (n_unknown > 0) & (n_unknown < np.bincount(gpu_node, minlength=nn)) & ~gate_any
    if not partial.any():
        return
    value = node.value.copy()
    worst = np.array(node.worst)
    reason = list(node.reason)
    by_node: dict[int, list[str]] = {}
    members = node.worst_member if isinstance(node.worst_member, _WorstMembers) else _WorstMembers(nn, gpu.names)
    for g in np.flatnonzero(unknown & partial[gpu_node]).tolist():
        i = int(gpu_node[g])
        if i not in by_node:
            members.ix[i] = g  # the node is named after its first missing GPU, not a healthy one
        by_node.setdefault(i, []).append(gpu.names[g].rsplit("/", 1)[-1])
    for i, names in by_node.items():
        value[i] = np.nan
        worst[i] = -1
        reason[i] = "missing:" + ",".join(names)
    node.worst_member = members
    node.value, node.worst, node.reason = value, worst, reason


def _node_flags(gpu: KindScores, node: KindScores, gpu_node: np.ndarray) -> dict[int, list[str]]:
    """Node flags: its own and the union of its GPUs' flags."""
    flags = {e: list(f) for e, f in node.flags.items()}
    for g, fl in gpu.flags.items():
        i = int(gpu_node[g])
        lst = flags.setdefault(i, [])
        for f in fl:
            if f not in lst:
                lst.append(f)
    return flags
