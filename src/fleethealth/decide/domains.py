"""Failure domains: nodes of one rack, NVLink / NVL72 domain, switch, power or cooling zone that go bad
together are one event, not many faults. Pure; a mixin of ``Decider`` (reads ``self.policy``).

Theory of operation
-------------------
A rack whose cooling fails, a power shelf that browns out, a switch that drops packets: every node
behind it looks unhealthy at once, and each one alone would be quarantined. Draining them one per budget
window takes the whole domain out over hours and pages for every budget and tensor-parallel group it
hits, while the fix (the cooling, the power, the switch) is one ticket for the facility. The rule
treats the domain like a suspect driver version (``decide.safety``'s version correlation):

* Each cycle (``_domains``), for every node label named in ``policy.domains.labels`` (``rack``,
  ``nvlink_domain``, ...), the nodes that went bad within ``window_s`` are counted per label value.
  A *member* is a node whose observation is usable and unhealthy (a gate, or a value below
  ``lifecycle.degraded_below``) and that is either still in service (READY) or entered its current
  state within ``window_s`` (so a node broken for days does not make a new event with two fresh
  ones). Not members: a confirmed hard gate (a GPU off the bus, a DBE: that is hardware and is
  handled as such, inside a domain event too), FAILED nodes (a human's), and nodes whose version
  label is suspect this cycle (the version correlation explains them). A node the app-Xid
  attribution blames (distinct jobs crashing on it) is a member: an Xid storm across a domain goes to
  the jobs and the domain, not to each node.
* A domain with at least ``min_nodes`` members that are at least ``fraction`` of its nodes is an
  event, unless a wider domain's event holds all its members (a cooling zone over two hot racks is one
  event, the zone's) or a domain named earlier in ``labels`` has exactly the same members (an NVL72 rack
  that is also its NVLink domain is paged once, as the rack): one incident (``decide.incidents``, key ``domain:<label>=<value>``, reason
  ``domain_correlation``: one firing page, an update when the membership changes, one resolution
  ``incident_clear_s`` after it stops holding) with its evidence: which nodes, which reasons, its size,
  and the action taken. While the incident is open, every member is kept as a member even past
  ``window_s`` (a three-hour cooling failure stays one event), and a node of the domain counts as
  unhealthy while its score is below ``lifecycle.ready_above``, not only ``degraded_below`` (the
  lifecycle's hysteresis: a rack still warm just above ``degraded_below`` is one incident, not resolved
  and then found too late, its nodes DEGRADED for longer than ``window_s``, and drained one by one).
* A version every node runs (no contrast) is not the suspect when one domain holds all the unhealthy
  nodes (``one_domain``, asked by ``SafetyRules._versions``): the domain explains them, and pages.
* While a domain's incident is open, the safety vetoes (``SafetyRules._veto``) hold every signal-driven
  quarantine or drain of a node in that domain (reason ``domain:<label>=<value>``), confirmed hard
  gates excepted, and only while the event explains the node's worst reason (``policy.domains.explains``:
  the signal categories or signals each label's event causes, e.g. a rack's cooling: thermal, clocks,
  performance; a node of a hot rack whose PCIe link storms is decided as outside the event); the held
  node gets ``policy.domains.action``: ``no_new_work`` (the soft fallback's
  NO_NEW_WORK) or ``hold`` (nothing: the node keeps its work, as during a telemetry freeze).

Cost: a pass over the nodes' observations to count unhealthy ones; the per-domain grouping runs only
when at least ``min_nodes`` nodes are unhealthy or a domain incident is open.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from fleethealth.decide.cycle import Cycle, is_hard_gate_reason
from fleethealth.decide.lifecycle import Observation
from fleethealth.decide.model import State
from fleethealth.decide.state import EntityLifecycle
from fleethealth.policy import Policy

INCIDENT_PREFIX = "domain:"
REASON = "domain_correlation"
EVIDENCE_NODES = 20  # nodes listed by name in a page (the count is always there)


def domain_key(label: str, value: str) -> str:
    """The incident key and the veto's reason for one domain: ``domain:rack=rack-02``."""
    return f"{INCIDENT_PREFIX}{label}={value}"


def quiet_hold(why: str, policy: Policy) -> bool:
    """A hold that changes nothing on the node: a telemetry freeze, or a domain hold whose policy action
    is ``hold``. Other holds get the soft fallback (NO_NEW_WORK, a lowered weight)."""
    return why.startswith("frozen") or (why.startswith(INCIDENT_PREFIX) and policy.domains.action == "hold")


class FailureDomains:
    """Domain events: detection, incidents and the veto's lookup."""

    policy: Policy

    def _domains(self, c: Cycle, obs: Mapping[str, Observation | None],
                 suspects: Mapping[tuple[str, str], str]) -> None:
        """Find this cycle's domain events, assert their incidents and fill ``c.domains`` (label, value)
        -> veto reason for every domain whose incident is open."""
        p = self.policy
        dm = p.domains
        lc = p.lifecycle
        ents = c.s.entities
        open_domains = [k for k in c.s.incidents if k.startswith(INCIDENT_PREFIX)]
        if not dm.labels:
            return
        minc, deg = lc.min_confidence, lc.degraded_below
        # An open event keeps a node while its score is below ready_above (the lifecycle's own way back),
        # so a rack still warm just above degraded_below is not resolved, then found again too late (its
        # nodes DEGRADED for longer than window_s are no new event) and drained one per budget window.
        keep = lc.ready_above if open_domains else deg
        open_set = frozenset(open_domains)
        unhealthy: list[str] = []
        below = max(keep, deg)  # what reads at or above both is unhealthy only by a gate
        for eid, o in obs.items():
            if o is None or not (o.gate or (o.value is not None and o.value < below)):
                continue  # nearly every entity, every cycle: no dict look-up for its kind
            if (o.value is not None and o.confidence >= minc and ents[eid].kind == "node"
                    and (o.gate or o.value < deg
                         or (o.value < keep and self._in_open_domain(ents[eid], open_set)))):
                unhealthy.append(eid)
        if len(unhealthy) < dm.min_nodes and not open_domains:
            return
        vlabels = p.attribution.version_labels
        members: dict[tuple[str, str], list[str]] = defaultdict(list)
        for eid in unhealthy:
            es = ents[eid]
            o = obs[eid]
            assert o is not None
            if not self._domain_member(c, es, o, open_domains):
                continue
            if any((lab, es.labels[lab]) in suspects for lab in vlabels if lab in es.labels):
                continue  # a suspect version explains it
            for label in dm.labels:
                v = es.labels.get(label)
                if v:
                    members[(label, v)].append(eid)
        if not members and not open_domains:
            return
        size: dict[tuple[str, str], int] = defaultdict(int)
        for es in ents.values():
            if es.kind != "node":
                continue
            for label in dm.labels:
                v = es.labels.get(label)
                if v and (label, v) in members:
                    size[(label, v)] += 1
        firing = {d: frozenset(nodes) for d, nodes in members.items()
                  if len(nodes) >= dm.min_nodes and len(nodes) >= dm.fraction * size[d]}
        rank = {label: i for i, label in enumerate(dm.labels)}
        for (label, v), nodes in sorted(members.items()):
            mine = firing.get((label, v))
            if mine is None or any(
                    mine < other or (mine == other and rank[o[0]] < rank[label])
                    for o, other in firing.items() if o != (label, v)):
                continue  # a wider domain explains these nodes, or one named earlier in the policy has them all
            n, total = len(nodes), size[(label, v)]
            key = domain_key(label, v)
            nodes.sort()
            reasons = sorted({obs[e].reason for e in nodes if obs[e] is not None})  # type: ignore[union-attr]
            c.incident(key, f"domain/{label}={v}", REASON, {
                "domain_label": label, "domain": v, "nodes": nodes[:EVIDENCE_NODES], "n_nodes": n,
                "domain_size": total, "signals": reasons[:10], "action": dm.action, "page_kind": "domain",
                "summary": (f"{label} {v}: {n} of {total} nodes unhealthy together ({', '.join(reasons[:3])}"
                            f"{', ...' if len(reasons) > 3 else ''}); the domain is the suspect (cooling, power, "
                            f"switch, fabric): its nodes are held, not drained ({dm.action})"),
            }, sig=nodes)
        for key in c.s.incidents:
            if key.startswith(INCIDENT_PREFIX):
                label, _, v = key[len(INCIDENT_PREFIX):].partition("=")
                c.domains[(label, v)] = key

    def _in_open_domain(self, es: EntityLifecycle, open_set: frozenset[str]) -> bool:
        return any(es.labels.get(label) and domain_key(label, es.labels[label]) in open_set
                   for label in self.policy.domains.labels)

    def _domain_member(self, c: Cycle, es: EntityLifecycle, o: Observation, open_domains: list[str]) -> bool:
        """An unhealthy node that belongs to a domain event: not a confirmed hard gate (hardware), not a
        human's (FAILED), and gone bad recently (still READY, or in its state since within window_s), or
        in a domain whose incident is already open."""
        if es.state == State.FAILED or (o.gate and is_hard_gate_reason(o.reason, self.policy)):
            return False
        if es.state == State.READY or c.now - es.since <= self.policy.domains.window_s:
            return True
        return any(es.labels.get(label) and domain_key(label, es.labels[label]) in open_domains
                   for label in self.policy.domains.labels)


def one_domain(entities: Mapping[str, EntityLifecycle], nodes: Iterable[str], labels: list[str]) -> str | None:
    """``label=value`` of a failure domain that holds every one of ``nodes`` (None: none does, or there are
    no nodes). The version correlation asks this of a version every node runs: with no contrast between
    versions, a domain that holds all the bad nodes explains them better (a power zone that browns out in
    a small fleet is half the fleet on one driver, but it is the zone)."""
    names = list(nodes)
    if not names:
        return None
    for label in labels:
        first = entities[names[0]].labels.get(label) if names[0] in entities else None
        if first and all(n in entities and entities[n].labels.get(label) == first for n in names):
            return f"{label}={first}"
    return None


def reason_item(reason: str) -> str | None:
    """What a worst reason is about, for ``policy.domains.explains``: the signal of ``gate:<signal>`` and
    ``floor:<signal>``, ``app_xid`` for the app-Xid attribution's blame, the category of ``<how>:<category>``
    (None: a reason without one, which every domain explains)."""
    head, sep, rest = reason.partition(":")
    if not sep or not rest:
        return None
    if head == "attribution":
        return rest.partition(":")[0]
    return rest


def unexplained(policy: Policy, label: str, reasons: Iterable[str]) -> list[str]:
    """The node's evidence an event of a ``label`` domain does not explain: the items (``reason_item``) of
    its reasons (the node's worst, its unhealthy GPUs', its ``floor:`` flags) that the label's ``explains``
    entries do not cover (a category or signal named, or a signal of a category named; ``app_xid`` also
    covers the hardware category of a node the app-Xid attribution blames). A label with no entry
    explains all."""
    items = policy.domains.explains.get(label)
    if items is None:
        return []
    named = set(items)
    cats = named | {s.category for s in policy.signals if s.name in named}
    category_of = {s.name: s.category for s in policy.signals}
    out: list[str] = []
    for reason in reasons:
        item = reason_item(reason)
        if reason.startswith("attribution:") and item in named:
            cats.add("hardware")
        if item is not None and item not in named and item not in cats and category_of.get(item) not in cats \
                and item not in out:
            out.append(item)
    return out


def node_evidence(c: Cycle, es: EntityLifecycle, policy: Policy) -> list[str]:
    """The reasons a domain event must explain to hold a node: its worst reason, the reasons of its GPUs
    scored below ``lifecycle.degraded_below`` this cycle (a PCIe storm on one GPU of a node whose worst
    category is its slowed rank), and its ``floor:<signal>`` flags (a counter at its critical rate)."""
    deg = policy.lifecycle.degraded_below
    out = [es.last_reason]
    out.extend(g.reason for g in c.gpu_by_node.get(es.entity, ()) if g.value is not None and g.value < deg)
    out.extend(f for f in c.node_flags.get(es.entity, ()) if f.startswith("floor:"))
    return out


def domain_hold(c: Cycle, es: EntityLifecycle, policy: Policy) -> str | None:
    """The open domain incident that holds this node's remediation, if any: one of the node's domains
    whose event explains its evidence (``node_evidence``, ``unexplained``). A node with evidence no open
    event of its domains explains (a PCIe replay storm on one node of a rack that lost its cooling) is
    decided as outside the event."""
    if not c.domains:
        return None
    evidence: list[str] | None = None
    for label in policy.domains.labels:
        v = es.labels.get(label)
        if v is not None:
            why = c.domains.get((label, v))
            if why is not None:
                if evidence is None:
                    evidence = node_evidence(c, es, policy)
                if not unexplained(policy, label, evidence):
                    return why
    return None
