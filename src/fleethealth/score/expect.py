"""The expectation model's inputs beside the snapshot: peer groups, what entities reported before, inventory.

Theory of operation
-------------------
What an entity should report comes from three places (README, "Expectation model"):

* **its own past** (prior): the signal families it reported, kept by ``FamilyMemory`` (held by the
  controller, saved in the state store's ``expectations`` table, restored at start and on take-over) and
  handed to the scorer in an ``Expectations``; a family remembered and absent now counts as seen, as it
  does while the history keeps its samples: its policy-expected signals are expected and missing;
* **its peers**: a signal that more than ``expectation.carried_share`` of its peer group carries is
  expected of every member. GPUs group by their node's ``pool`` and their training ``job``, replicas by
  ``pool``, model and ``role`` (``expectation.*_group_by``); a group smaller than
  ``expectation.min_group`` falls back to the pool, a pool that small to the whole kind. Two pools
  with different exporters never mark each other's signals missing;
  The GPU count of a node follows the same idea (``gpu_count_from_peers``): when at least
  ``expectation.gpu_count_min_peers`` nodes of a pool report GPUs and at least
  ``expectation.gpu_count_fraction`` of them have the same count k, a node of that pool with fewer is
  short of GPUs (the node roll-up reads it unknown, ``missing:gpu5``); a heterogeneous pool expects nothing;
* **declared inventory**: entities the controller names (``nvidia.com/gpu`` capacity, ``gpu_capacity``,
  the GPUs a node is known to have had), with the reason it gives (``Expectations.declared``).

``peer_groups`` computes each entity's group on arrays (per label set once, then per entity by the
resolver's maps), kept in the scorer's memory while the entity tables are the same. ``KindExpect`` is
what aggregation reads for one kind; the provenance of every expected signal is a code per (entity,
signal) (``WHY_*``), turned into words only for a tuple that is read (``expected_by``).

``FamilyMemory`` learns, after a cycle, which families each node's GPUs and each replica reported fresh
(columnar: a loop runs only over entities whose families changed, and over all once per ``refresh_s``);
it is bounded (``max_entities``, the least recently seen dropped first) and forgets a family not seen
for ``ttl_s``. Pure apart from its own memory: time is an argument.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fleethealth.policy import Policy
    from fleethealth.score.context import _Ctx
    from fleethealth.score.kept import Kept
    from fleethealth.score.resolve import _KindTable

# Why a signal is expected of an entity (0: it is not); the codes of ``KindScores.expected_by``.
WHY_NONE, WHY_OWN, WHY_FRESH, WHY_PRIOR, WHY_PEERS, WHY_PENDING, WHY_INVENTORY = range(7)
PEER_KINDS = ("gpu", "replica")
# label aliases: a replica's model is vLLM's ``model_name`` or the info metric's ``model``
_ALIASES = {"model": ("model_name", "model"), "role": ("role", "llm-d.ai/role")}


@dataclass(frozen=True)
class Expectations:
    """What the caller knows beyond the snapshot. ``families``: entity (a node, for its GPUs; a replica)
    -> the signal families it reported before (the prior); ``declared``: entity (a GPU ``node/gpuN``, a
    node, a replica) -> why it is expected to exist (inventory: ``nvidia.com/gpu capacity``, ...)."""

    families: Mapping[str, frozenset[str]] = field(default_factory=dict)
    declared: Mapping[str, str] = field(default_factory=dict)


@dataclass
class PeerGroups:
    """One kind's peer groups. Groups are counted at three levels, each a partition of the entities
    (every label's value; the first label's value, the pool; everyone): ``names``/``sizes`` list the
    groups of all levels, ``grp`` is the group each entity is compared with (the finest one of at least
    ``min_group`` members), ``levels`` the partitions (group id per entity, sort order, run starts)."""

    grp: np.ndarray
    names: list[str]
    sizes: np.ndarray
    levels: list[tuple[np.ndarray, int, int]]  # (group id per entity, first id, number of groups)

    def counts(self, seen_t: np.ndarray) -> np.ndarray:
        """Signals x groups: how many members of each group carry each signal (one bincount per signal
        and level; a level of one group is a row sum)."""
        m, n = seen_t.shape
        out = np.zeros((m, len(self.names)), np.int64)
        if n == 0:
            return out
        for part, first, k in self.levels:
            if k == 1:
                out[:, first] = np.count_nonzero(seen_t, axis=1)
                continue
            local = part - first
            for j in range(m):
                out[j, first:first + k] = np.bincount(local, weights=seen_t[j], minlength=k)
        return out


@dataclass
class KindExpect:
    """What aggregation of one kind reads beyond its signals: peer groups, the prior (family -> entities
    that reported it before), declared entities (bool per entity, and why)."""

    groups: PeerGroups | None
    prior: dict[str, np.ndarray]
    declared: np.ndarray | None
    declared_why: dict[int, str]
    carried_share: float = 0.5

    def prior_matrix(self, fams: list[str], n: int) -> np.ndarray | None:
        if not self.prior:
            return None
        out = np.zeros((len(fams), n), bool)
        for fi, f in enumerate(fams):
            m = self.prior.get(f)
            if m is not None:
                out[fi] = m
        return out


def _entity_codes(ctx: _Ctx, kind: str, table: _KindTable, label: str,
                  rows: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
    """Per entity of ``kind``: the id of its value of ``label`` (or an alias), -1 when none of its label
    sets has it; and the values by id. ``rows``: only these label sets count."""
    r = ctx.resolver
    n = len(table.names)
    codes = np.full(n, -1, np.int64)
    values: list[str] = []
    index: dict[str, int] = {}
    if r.labelsets is None or n == 0:
        return codes, values
    for alias in reversed(_ALIASES.get(label, (label,))):  # the first alias wins: written last
        gid = r.group_ids((alias,))
        vals = [v[0] for v in r.group_values((alias,))]
        remap = np.asarray([index.setdefault(v, len(index)) if v else -1 for v in vals] or [-1], np.int64)
        ent = table.entities(r.arr[kind][: gid.size])
        ok = ent >= 0
        if rows is not None:
            ok &= rows[: gid.size]
        code = remap[gid] if gid.size else gid
        ok &= code >= 0
        codes[ent[ok]] = code[ok]
    values = [""] * len(index)
    for v, i in index.items():
        values[i] = v
    return codes, values


def _merge(own: np.ndarray, own_vals: list[str], other: np.ndarray, other_vals: list[str]) -> tuple[np.ndarray, list[str]]:
    """``own`` codes, filled from ``other`` (another kind's, already mapped per entity) where absent."""
    vals = list(own_vals)
    ix = {v: i for i, v in enumerate(vals)}
    remap = np.asarray([ix.setdefault(v, len(ix)) for v in other_vals] or [-1], np.int64)
    vals += [""] * (len(ix) - len(vals))
    for v, i in ix.items():
        vals[i] = v
    filled = np.where((own < 0) & (other >= 0), remap[np.maximum(other, 0)], own)
    return filled, vals


def _groups_from(cols: list[tuple[str, np.ndarray, list[str]]], n: int, min_group: int, everyone: str) -> PeerGroups:
    """Groups by every column's value; an entity whose group is smaller than ``min_group``, or that has
    no value of a finer column, is compared with its first column's group (the pool), and when that is as
    small, with everyone."""
    if not cols or n == 0:
        zero = np.zeros(n, np.int64)
        return PeerGroups(zero, [everyone], np.asarray([n], np.int64), [(zero, 0, 1)] if n else [])
    labels = [name for name, _, _ in cols]
    full = np.stack([c for _, c, _ in cols], axis=1)
    # one int64 key per entity (each column's code + 1 in its own digit): a 1-D unique
    key = np.zeros(n, np.int64)
    for k in range(len(cols)):
        key = key * (len(cols[k][2]) + 1) + (full[:, k] + 1)
    _, first_ix, inv = np.unique(key, return_index=True, return_inverse=True)
    uniq = full[first_ix]
    inv = inv.reshape(-1)
    fvals, finv = np.unique(full[:, 0], return_inverse=True)
    finv = finv.reshape(-1)
    g0, g1 = len(uniq), len(fvals)
    sizes = np.concatenate((np.bincount(inv, minlength=g0), np.bincount(finv, minlength=g1), [n])).astype(np.int64)

    def name_of(row: np.ndarray) -> str:
        return ",".join(f"{labels[k]}={cols[k][2][int(row[k])]}" for k in range(len(cols)) if int(row[k]) >= 0) \
            or everyone

    names = [name_of(u) for u in uniq]
    names += [f"{labels[0]}={cols[0][2][int(v)]}" if int(v) >= 0 else everyone for v in fvals]
    names.append(everyone)
    # an entity without a value of a finer label that others of its pool have (a GPU in no training job
    # beside GPUs in one) is compared with its pool; a label no one in the pool has does not count
    whole = np.ones(n, bool)
    for k in range(1, len(cols)):
        has = full[:, k] >= 0
        pool_has = np.bincount(finv, weights=has, minlength=g1) > 0
        whole &= has | ~pool_has[finv]
    grp = np.where((sizes[inv] >= min_group) & whole, inv,
                   np.where((fvals[finv] >= 0) & (sizes[g0 + finv] >= min_group), g0 + finv, g0 + g1))
    levels = [(inv.astype(np.int64), 0, g0), ((g0 + finv).astype(np.int64), g0, g1),
              (np.full(n, g0 + g1, np.int64), g0 + g1, 1)]
    return PeerGroups(grp.astype(np.int64), names, sizes, levels)


def peer_groups(ctx: _Ctx, tables: dict[str, _KindTable], gpu_node: np.ndarray, policy: Policy,
                kept: Kept) -> dict[str, PeerGroups]:
    """Each GPU's and replica's peer group (see the module docstring), kept while the tables and the
    resolver's label sets are the same."""
    r = ctx.resolver
    hit = kept.peer_groups[0] if kept.peer_groups else None
    if hit is not None and hit[0] is tables and hit[1] == r.n and hit[2] is policy.expectation:
        return hit[3]
    ex = policy.expectation
    out: dict[str, PeerGroups] = {}
    if r.labelsets is None or not r.arr:  # nothing resolved (an empty snapshot): one group per kind
        out = {k: _groups_from([], len(tables[k].names), ex.min_group, f"all {k}s") for k in PEER_KINDS}
        kept.peer_groups[:] = [(tables, r.n, ex, out)]
        return out
    node_t = tables["node"]
    # GPUs: their node's labels (an info metric, any sample naming the node) unless their own say;
    # a GPU's job only from a training rank's samples (a scrape job's ``job`` is no training job)
    gpu_t = tables["gpu"]
    cols: list[tuple[str, np.ndarray, list[str]]] = []
    for label in ex.gpu_group_by:
        rows = (r.arr["rank"] >= 0) if label == "job" else None
        codes, vals = _entity_codes(ctx, "gpu", gpu_t, label, rows)
        if label != "job" and gpu_node.size:
            ncodes, nvals = _entity_codes(ctx, "node", node_t, label)
            codes, vals = _merge(codes, vals, ncodes[gpu_node], nvals)
        cols.append((label, codes, vals))
    out["gpu"] = _groups_from(cols, len(gpu_t.names), ex.min_group, "all GPUs")
    # replicas: their own labels, else their node's (pool)
    rep_t = tables["replica"]
    cols = []
    rep_node = np.full(len(rep_t.names), -1, np.int64)
    if rep_t.names and node_t.names:
        re_ = rep_t.entities(r.arr["replica"])
        ne = node_t.entities(r.arr["node"])
        both = (re_ >= 0) & (ne >= 0)
        rep_node[re_[both]] = ne[both]
    for label in ex.replica_group_by:
        codes, vals = _entity_codes(ctx, "replica", rep_t, label)
        if label == "pool" and node_t.names:
            ncodes, nvals = _entity_codes(ctx, "node", node_t, label)
            via = np.where(rep_node >= 0, ncodes[np.maximum(rep_node, 0)], -1) if rep_node.size else rep_node
            codes, vals = _merge(codes, vals, via, nvals)
        cols.append((label, codes, vals))
    out["replica"] = _groups_from(cols, len(rep_t.names), ex.min_group, "all replicas")
    kept.peer_groups[:] = [(tables, r.n, ex, out)]
    return out


def kind_expect(kind: str, names: list[str], groups: PeerGroups | None, exp: Expectations | None,
                owner_names: list[str] | None, owner_ix: np.ndarray | None, carried_share: float) -> KindExpect:
    """One kind's ``KindExpect``. The prior is kept per owner (a GPU's node: ``owner_names``, and each
    entity's owner ``owner_ix``), looked up once per owner and spread to the entities on arrays."""
    prior: dict[str, np.ndarray] = {}
    declared = None
    why: dict[int, str] = {}
    if exp is not None and names:
        keys = owner_names if owner_names is not None else names
        if exp.families:
            per_owner: dict[str, np.ndarray] = {}
            for o, k in enumerate(keys):
                fams = exp.families.get(k)
                if fams:
                    for f in fams:
                        per_owner.setdefault(f, np.zeros(len(keys), bool))[o] = True
            for f, m in per_owner.items():
                prior[f] = m[owner_ix] if owner_names is not None and owner_ix is not None else m
        if exp.declared:
            declared = np.zeros(len(names), bool)
            hits: list[tuple[int | None, str | None]]
            if len(exp.declared) * 8 < len(names):  # a few declared: find them, not scan every name
                index = {nm: e for e, nm in enumerate(names)}
                hits = [(index.get(nm), d) for nm, d in exp.declared.items()]
            else:
                hits = [(e, exp.declared.get(nm)) for e, nm in enumerate(names)]
            for e, d in hits:
                if e is not None and d is not None:  # a GPU by its own name (node/gpuN)
                    declared[e] = True
                    why[e] = d
    return KindExpect(groups, prior, declared, why, carried_share)


def gpu_count_from_peers(gpus_per_node: np.ndarray, pool_of_node: np.ndarray, pool_names: list[str],
                         min_peers: int, fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The peers rule for a node's GPU count. ``gpus_per_node``: GPUs each node reports (0: none, not a
    peer); ``pool_of_node``: its pool's id (-1: none). A pool of at least ``min_peers`` nodes with GPUs
    where at least ``fraction`` of them have the same count k expects k of each of them; a heterogeneous
    pool expects nothing. Returns, per node, the expected count (0: nothing expected), how many of its
    pool's nodes have that count and how many report GPUs (for the words of ``gpu_count_why``)."""
    n = gpus_per_node.size
    expect = np.zeros(n, np.int64)
    agree = np.zeros(n, np.int64)
    peers = np.zeros(n, np.int64)
    has = (gpus_per_node > 0) & (pool_of_node >= 0)
    if not has.any():
        return expect, agree, peers
    pool, cnt = pool_of_node[has], gpus_per_node[has].astype(np.int64)
    npools = len(pool_names)
    size = np.bincount(pool, minlength=npools)
    # how many nodes of each pool share each count: one unique over (pool, count) keys
    width = int(cnt.max()) + 1
    keys, freq = np.unique(pool * width + cnt, return_counts=True)
    kpool, kcount = keys // width, keys % width
    # per pool, the most common count (the smallest on a tie): sort by pool, frequency desc, count
    order = np.lexsort((kcount, -freq, kpool))
    first = np.ones(order.size, bool)
    first[1:] = kpool[order][1:] != kpool[order][:-1]
    top = order[first]
    mode = np.zeros(npools, np.int64)
    mode_n = np.zeros(npools, np.int64)
    mode[kpool[top]], mode_n[kpool[top]] = kcount[top], freq[top]
    ok = (size >= min_peers) & (mode_n >= fraction * np.maximum(size, 1))
    p = np.maximum(pool_of_node, 0)
    on = (pool_of_node >= 0) & ok[p]
    expect[on], agree[on], peers[on] = mode[p[on]], mode_n[p[on]], size[p[on]]
    return expect, agree, peers


def gpu_count_why(pool: str, agree: int, peers: int, k: int) -> str:
    """Words for why a node is expected to have ``k`` GPUs (the peers rule)."""
    return f"its peers ({pool}): {agree} of {peers} nodes have {k} GPUs"


def expected_by(code: int, kind_expect: KindExpect | None, e: int, j: int, carry: np.ndarray | None) -> str:
    """Words for why signal ``j`` is expected of entity ``e`` (``code``: its ``WHY_*``)."""
    if code == WHY_NONE:
        return ""
    if code == WHY_FRESH:
        return "reporting"
    if code == WHY_OWN:
        return "its exporter reports this family (policy: expected)"
    if code == WHY_PENDING:
        return "needs two samples; its exporter reports (not yet fresh)"
    if code == WHY_PRIOR:
        return "it reported this family before (prior, kept in the state store)"
    peers = ""
    if kind_expect is not None and kind_expect.groups is not None and carry is not None:
        g = int(kind_expect.groups.grp[e])
        peers = (f"its peers ({kind_expect.groups.names[g]}) carry it: "
                 f"{int(carry[j, g])} of {int(kind_expect.groups.sizes[g])}")
    if code == WHY_INVENTORY:
        what = kind_expect.declared_why.get(e, "declared") if kind_expect is not None else "declared"
        return f"declared by inventory ({what})" + (f"; {peers}" if peers else "")
    return peers or "its peers carry it"


class FamilyMemory:
    """Which signal families each node's GPUs and each replica reported: learned after every cycle,
    saved in the state store (``rows``), restored after a restart (``restore``). Bounded; see the
    module docstring."""

    WHAT = "families"

    def __init__(self, ttl_s: float = 86400.0, refresh_s: float = 3600.0, max_entities: int = 200_000) -> None:
        self.ttl_s, self.refresh_s, self.max_entities = ttl_s, refresh_s, max_entities
        self.seen: dict[str, dict[str, float]] = {}  # entity -> family -> last seen fresh
        self._dirty: set[str] = set()
        self._last: dict[str, tuple[list[str], np.ndarray, list[str]]] = {}  # kind -> (names, mask, fams)
        self._raw: dict[str, tuple[list[str], list[str], np.ndarray]] = {}  # kind -> the scores' own
        self._swept = -np.inf
        self._expect: tuple[float, Expectations] | None = None
        self.version = 0

    def learn(self, health: Any, now: float) -> None:
        """Take the families reported fresh in a scored cycle (a ``FleetHealth``)."""
        sweep = now - self._swept >= self.refresh_s
        for kind in PEER_KINDS:
            ks = health.kinds.get(kind)
            if ks is None or ks.fam_fresh is None or not ks.names:
                continue
            mask, fams = ks.fam_fresh, ks.fams
            raw = self._raw.get(kind)
            if not sweep and raw is not None and raw[0] is ks.names and raw[1] == fams and np.array_equal(raw[2], mask):
                continue  # the steady state: the same families fresh as last cycle
            self._raw[kind] = (ks.names, list(fams), mask.copy())
            names = list(ks.names)
            if kind == "gpu":
                node = health.kinds["node"]
                gn = ks.member_of
                if gn is None:
                    continue
                nn = len(node.names)
                nmask = np.zeros((len(fams), nn), bool)
                for f in range(len(fams)):  # a node reported a family when any of its GPUs did
                    nmask[f] = np.bincount(gn, weights=mask[f], minlength=nn)[:nn] > 0
                mask, names = nmask, list(node.names)
            last = self._last.get(kind)
            if not sweep and last is not None and last[0] == names and last[2] == fams and np.array_equal(last[1], mask):
                continue
            if sweep or last is None or last[0] != names or last[2] != fams:
                changed = np.flatnonzero(mask.any(axis=0)).tolist()
            else:
                changed = np.flatnonzero((mask != last[1]).any(axis=0)).tolist()
            for e in changed:
                fs = [fams[f] for f in np.flatnonzero(mask[:, e]).tolist()]
                if not fs:
                    continue
                have = self.seen.setdefault(names[e], {})
                new = any(f not in have for f in fs)
                for f in fs:
                    have[f] = now
                if new or sweep:
                    self._dirty.add(names[e])
            self._last[kind] = (names, mask.copy(), list(fams))
        if sweep:
            self._swept = now
            self._forget(now)
        if self._dirty:
            self.version += 1
            self._expect = None

    def _forget(self, now: float) -> None:
        for ent in list(self.seen):
            fams = {f: t for f, t in self.seen[ent].items() if now - t <= self.ttl_s}
            if fams != self.seen[ent]:
                self._dirty.add(ent)
                if fams:
                    self.seen[ent] = fams
                else:
                    del self.seen[ent]
        if len(self.seen) > self.max_entities:
            by_age = sorted(self.seen, key=lambda e: max(self.seen[e].values()))
            for ent in by_age[: len(self.seen) - self.max_entities]:
                del self.seen[ent]
                self._dirty.add(ent)

    def expectations(self, now: float, declared: Mapping[str, str] | None = None) -> Expectations:
        """The prior for the scorer: families seen within ``ttl_s`` (the same object while nothing changed,
        so that the scorer's kept work holds)."""
        hit = self._expect
        if hit is not None and now - hit[0] < self.refresh_s and (declared or {}) == hit[1].declared:
            return hit[1]
        fams = {e: frozenset(f for f, t in d.items() if now - t <= self.ttl_s) for e, d in self.seen.items()}
        made = Expectations({e: f for e, f in fams.items() if f}, dict(declared or {}))
        self._expect = (now, made)
        return made

    def rows(self) -> dict[tuple[str, str], str]:
        """What changed since the last call, for ``save_expectations``: JSON per entity, ``""`` deletes."""
        out = {(e, self.WHAT): (json.dumps({"families": self.seen[e]}, sort_keys=True) if e in self.seen else "")
               for e in sorted(self._dirty)}
        self._dirty.clear()
        return out

    def undo_rows(self, rows: Mapping[tuple[str, str], str]) -> None:
        """Rows the store did not take: saved with the next call."""
        self._dirty.update(e for e, _ in rows)

    def restore(self, rows: Mapping[tuple[str, str], str]) -> list[str]:
        """The store's rows back (a restart, a take-over); returns the entities whose row was unreadable."""
        bad: list[str] = []
        for (ent, what), value in rows.items():
            if what != self.WHAT:
                continue
            try:
                d = json.loads(value)["families"]
                fams = {str(f): float(t) for f, t in d.items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                bad.append(ent)
                continue
            have = self.seen.setdefault(ent, {})
            for f, t in fams.items():
                have[f] = max(t, have.get(f, -np.inf))
        self._expect = None
        self.version += 1
        return bad
