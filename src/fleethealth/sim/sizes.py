"""A scenario at another fleet size: the same pools, jobs, topology and faults on more or fewer nodes.

Theory of operation
-------------------
``resize(scenario, nodes)`` scales every pool by ``nodes / total`` and keeps what the scenario's targets
mean. Pure: it reads the scenario, builds the old and the new fleet (``build_fleet``, cheap) to resolve
names, and returns a new validated ``Scenario``; nothing is simulated.

* Pools: each pool's size is scaled and rounded to whole racks (and whole NVLink domains) when it was made
  of whole ones, else to its pipeline depth, never below one rack (or one pipeline). Rack, NVLink-domain and
  zone boundaries then stay where they were relative to each pool's first node, so "rack-02 of train-a"
  is still a rack of train-a. Jobs with an explicit size scale by their pool's factor (whole pipelines);
  the last one takes what is left, as it would have; a job of whole racks keeps whole racks.
* Targets: a node keeps its position in its pool (``node-37``, the 38th node of train-a, is the 38th node
  of the resized train-a; names are re-derived, so at 128 nodes and more it is ``node-037``). When a
  smaller pool has no such position, the node keeps its place inside its rack and moves to the pool's
  last rack. A GPU target keeps its GPU. A domain (``rack:``, ``nvlink_domain:``, ``switch:``,
  ``power_zone:``, ``cooling_zone:``) is the domain of its first node's new place. A replica keeps its
  slot on its node's new place. ``pool:``, ``job:`` and ``build:`` name the same things at every size.
* The name stays the scenario's (so its targets and its place in the scenario table stay); the description
  says the size.

A target that cannot keep its meaning (a domain the smaller fleet no longer has) is a ``ValueError`` with the
target named, never a silently different scenario.
"""

from __future__ import annotations

import math
from typing import Any

from fleethealth.sim.fleet import DOMAIN_PREFIX, Fleet, build_fleet
from fleethealth.sim.scenario import FleetSpec, PoolSpec, Scenario

DOMAIN_KINDS = ("rack", *DOMAIN_PREFIX)


def _pool_unit(spec: FleetSpec, pool: PoolSpec) -> int:
    """The granule a pool's size is rounded to: whole racks (and NVLink domains) when the pool is made
    of them, else its pipeline depth (or tensor-parallel group)."""
    pp = max([j.pp for j in pool.jobs] + [pool.tp_group_nodes or 1])
    whole = spec.nodes_per_rack
    if spec.topology.nvlink_domain_nodes:
        whole = math.lcm(whole, spec.topology.nvlink_domain_nodes)
    if pool.nodes % whole == 0:
        return math.lcm(whole, pp)
    return pp


def _resized_pools(spec: FleetSpec, nodes: int) -> list[dict[str, Any]]:
    total = sum(p.nodes for p in spec.pools)
    factor = nodes / total
    pools: list[dict[str, Any]] = []
    for p in spec.pools:
        unit = _pool_unit(spec, p)
        n = max(unit, round(p.nodes * factor / unit) * unit)
        d = p.model_dump()
        d["nodes"] = n
        if p.jobs:
            r = n / p.nodes
            jobs = []
            left = n
            for k, j in enumerate(p.jobs):
                jd = j.model_dump()
                if j.nodes is not None:
                    if k == len(p.jobs) - 1:
                        jd["nodes"] = left
                    else:
                        ju = unit if j.nodes % unit == 0 else j.pp  # a job of whole racks stays so
                        jd["nodes"] = max(ju, round(j.nodes * r / ju) * ju)
                    if jd["nodes"] < 1 or jd["nodes"] > left:
                        raise ValueError(f"pool {p.name} at {n} nodes: job {j.name} cannot keep its share "
                                         f"({j.nodes} of {p.nodes} nodes); try a larger size")
                    left -= jd["nodes"]
                jobs.append(jd)
            d["jobs"] = jobs
        pools.append(d)
    return pools


class _NodeMap:
    """Old node id -> new node id, by position in the pool."""

    def __init__(self, old: Fleet, new: Fleet) -> None:
        self.old, self.new = old, new
        self.old_first = {p: old.node_pool.index(p) for p in dict.fromkeys(old.node_pool)}
        self.new_first = {p: new.node_pool.index(p) for p in dict.fromkeys(new.node_pool)}
        self.new_size = {p: new.node_pool.count(p) for p in self.new_first}

    def __call__(self, n: int) -> int:
        pool = self.old.node_pool[n]
        pos = n - self.old_first[pool]
        size = self.new_size[pool]
        if pos >= size:  # the smaller pool has no such place: same place in the pool's last rack
            npr = self.new.spec.nodes_per_rack
            last_rack = max(0, (size - 1) // npr) * npr
            pos = min(size - 1, last_rack + pos % npr)
        return self.new_first[pool] + pos


def _map_target(t: str, old: Fleet, new: Fleet, nmap: _NodeMap) -> str:
    kind, _, name = t.partition(":") if ":" in t else ("", "", t)
    if kind in ("pool", "job", "build"):
        return t
    if kind == "":
        node, sep, gpu = name.partition("/gpu")
        return new.nodes[nmap(old.node_index(node))] + (sep + gpu if sep else "")
    if kind in DOMAIN_KINDS:
        members = old.domain_nodes(kind, name)
        if not members:
            raise ValueError(f"target {t!r} matches nothing in this fleet")
        first = nmap(members[0])
        value = new.node_labels(first).get(kind)
        if value is None:
            raise ValueError(f"target {t!r}: the resized fleet has no {kind} label")
        return f"{kind}:{value}"
    if kind == "replica":
        r = old.replica_by_name(name)
        slot = [x.index for x in old.replicas if x.node == r.node].index(r.index)
        mine = [x for x in new.replicas if x.node == nmap(r.node)]
        if slot >= len(mine):
            raise ValueError(f"target {t!r}: its node has no replica slot {slot} in the resized fleet")
        return f"replica:{mine[slot].name}"
    raise ValueError(f"target {t!r}: cannot resize a target of kind {kind!r}")


def resize(sc: Scenario, nodes: int) -> Scenario:
    """``sc`` on a fleet of about ``nodes`` nodes (pools rounded to whole racks or pipelines; the exact
    count is in the result's ``fleet``), every fault on the same place of the same pool."""
    if nodes < 1:
        raise ValueError(f"--nodes must be at least 1, got {nodes}")
    old = build_fleet(sc.fleet, sc.seed)
    data = sc.model_dump()
    data["fleet"]["pools"] = _resized_pools(sc.fleet, nodes)
    spec = FleetSpec.model_validate(data["fleet"])
    new = build_fleet(spec, sc.seed)
    nmap = _NodeMap(old, new)
    for f in data["faults"]:
        mapped = [_map_target(t, old, new, nmap) for t in ([f["target"]] if isinstance(f["target"], str)
                                                             else f["target"])]
        f["target"] = mapped[0] if isinstance(f["target"], str) else mapped
    data["description"] = (f"{sc.description} (resized from {old.n_nodes} to {new.n_nodes} nodes)").strip()
    return Scenario.model_validate(data)
