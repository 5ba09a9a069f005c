"""The decider's safety rules: what keeps a scorer bug, a metrics outage or a bad rollout from draining
a cluster. Pure; a mixin of ``Decider`` (reads ``self.policy`` and ``self.fast``).

* Presence (``_absences``): an entity the engine stopped reporting still counts for fleet confidence for
  ``ABSENT_GRACE_S`` (a metrics outage), and is forgotten after ``FORGET_AFTER_S`` if it holds nothing.
* Fleet-wide confidence (``_fleet_confidence``): when at least ``fleet.low_confidence_fraction`` of the
  (at least ``fleet.min_entities``) lifecycle entities in service are unknown, silent or below
  ``min_confidence`` together, the problem is telemetry: one FLEET_ALERT, remediation frozen (no
  signal-driven move to a worse state, no drain, no quarantine, no reset), router weights and scheduler
  holds kept as they were, until confidence returns (a resolving FLEET_ALERT). Events (test results,
  humans) still apply. Entities that never had a usable observation (warm-up) do not count.
* Budgets per pool (label ``pool``, ``_veto``): at most max(quarantine_min_per_hour, floor(fraction *
  pool size)) quarantines per ``budgets.window_s``; never more than ``max_per_tp_group`` nodes of one
  ``tp_group`` in QUARANTINED or DRAINING (FAILED is a human's and does not count), except a node with
  evidence of its own (``_own_fault``: a reason no other member of its group reads) while
  a group-mate is already isolated: the group's job is down already, so it costs no capacity; a group
  degrading together is still held. A confirmed hard gate
  (reason ``gate:<signal>`` for a signal in ``budgets.hard_gates``, or an Xid 154 drain-and-reset,
  ``_hard_gate``) takes a node that is already out of service: it spends a separate, larger budget
  (``hard_gate_*``: a fleet-wide burst of bogus gates still stops there) and skips the TP rule. The
  longest-waiting entity gets a freed budget first (the decider's order, ``blocked_since``). Exhausted:
  one incident and a soft fallback (``_soft_fallback``: NO_NEW_WORK for a node, a lowered weight for a
  replica) instead of the quarantine, retried every cycle. A human approves a held quarantine with an
  ``ack`` event (``to`` QUARANTINED): the table's rule then fires unvetoed.
* Attribution (``_app_xids``): application Xids (``policy.xid.app_xids``, flags ``xid:N``) are charged
  to the job (GPU label ``job``) with one ticket-severity incident per job; the node is blamed (a hard
  gate) only when ``attribution.app_xid_distinct_jobs`` distinct jobs hit it within
  ``app_xid_window_s``.
* Version correlation (``_versions``): a version label value (driver, build, kernel) shared by at least
  ``version_min_entities`` unhealthy entities and at least ``version_fraction`` of all unhealthy ones,
  and over-represented against the rest of the fleet (its unhealthy rate more than twice that of the
  other versions; or, when every entity runs it, at least ``version_fraction`` of them unhealthy), is
  suspect: one incident about it, and no entity carrying it is quarantined, except on physical evidence
  or its own stall. It stays suspect while that incident is open (until it has not correlated for
  ``budgets.incident_clear_s``), so a gap in its victims' gates does not let the next one through.
* Physical evidence (``_physical_evidence``): a gated node with an Xid of ``attribution.physical_xids``
  flagged (79 off the bus, 48 DBE, 95/140 uncorrectable ECC, 64 remap failure) or gated by a signal of
  ``attribution.physical_gates`` (a GPU missing, a DBE counter, a failed remap) is dead hardware whatever
  software it runs: no suspect version, domain or TP group holds it, and it spends its own budget
  (``budgets.physical_*``, ledger ``physical:``), so the gates a bad driver raised before its version was
  suspect (Xid 119, which the catalog cannot tell from a dead GPU) cannot use up what a dead GPU needs.
* Version holds (``_version_holds``, ``_version_release``): when a version incident opens, the nodes of
  that version isolated shortly before (``attribution.version_hold_lookback_s``) by evidence it explains
  (not physical) are tied to it (``EntityLifecycle.version_hold``): their repair ladder stops with the
  reason, failed tests and repairs no longer fail them, the page names them; when the incident resolves
  each gets an active test (a FAILED one back to QUARANTINED first, lifecycle ``version_cleared``).
* A node's own stall (``_own_stalls``): a node of a suspect version whose performance category
  (``chronic.categories``) is below ``quarantine_below`` while fewer than ``version_min_entities`` nodes of
  the version read below ``degraded_below`` on it is decided on that reading (``min:<category>``, the rate
  budget), which the version veto does not hold: a hang is one node's; many stalling together, the version's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from fleethealth.decide import incidents, ladder, recurring
from fleethealth.decide.cycle import (
    ABSENT_GRACE_S,
    FORGET_AFTER_S,
    FORGETTABLE_STATES,
    WORSE_STATES,
    Cycle,
    budget_key,
    is_hard_gate_reason,
)
from fleethealth.decide.domains import domain_hold, one_domain, quiet_hold
from fleethealth.decide.lifecycle import (
    ISOLATED_STATES,
    REMEDIATION_TARGETS,
    SIGNAL_CONDS,
    Cond,
    Observation,
    Rule,
)
from fleethealth.decide.model import IntentKind, State, Tier
from fleethealth.decide.state import EntityLifecycle
from fleethealth.decide.tuples import LIFECYCLE_KINDS, node_of
from fleethealth.policy import Policy
from fleethealth.score.health import HealthTuple

# named in a transition's detail when the isolation spent the physical budget (backtest.metrics charges it)
PHYSICAL_BUDGET_NOTE = "budget:physical"


class SafetyRules:
    """Budgets, TP-group veto, fleet confidence freeze, version correlation and app-Xid attribution."""

    policy: Policy
    fast: bool

    def _absences(self, c: Cycle, present: Mapping[str, HealthTuple]) -> None:
        """Track entities the engine no longer reports at all; forget those gone for FORGET_AFTER_S that
        hold nothing (never an isolated, degraded or held one: no quarantine is ever forgotten)."""
        for eid in list(c.s.entities):
            es = c.s.entities[eid]
            if eid in present:
                if es.absent_since is not None:
                    c.mut(eid).absent_since = None
            elif es.absent_since is None:
                c.mut(eid).absent_since = c.now
            elif (c.now - es.absent_since >= FORGET_AFTER_S and es.state in FORGETTABLE_STATES
                  and not es.no_new_work and not es.blocked):
                del c.s.entities[eid]

    def _fleet_confidence(self, c: Cycle, obs: Mapping[str, Observation | None],
                          peers: tuple[int, int] = (0, 0)) -> tuple[int, int]:
        """Returns this decider's own (counted, low) before ``peers`` (other shards' in service and low
        confidence, ``Decider.decide``'s ``fleet_peers``) are added to them for the threshold.
        Entities out of service do not count (their telemetry may rightly be gone), nor do ones gone
        for longer than ABSENT_GRACE_S (scaled down, decommissioned), nor ones that never had a usable
        observation (a controller's first cycles: rates and burn rates need two samples, so a whole fleet
        reads low confidence at start; that is warm-up, not a telemetry outage, and nothing acts on it
        anyway), except while frozen: a freeze ends when data returns, never because the silent entities
        were forgotten by the history."""
        p = self.policy
        if self.fast:
            total, n_low = self._confidence_counts(c, obs)
        else:
            def usable(eid: str) -> bool:
                o = obs.get(eid)
                return o is not None and o.usable(p.lifecycle)

            counted = [eid for eid, es in c.s.entities.items()
                       if es.state != State.STARTING and es.state not in ISOLATED_STATES
                       and (es.absent_since is None or c.s.frozen or c.now - es.absent_since < ABSENT_GRACE_S)
                       and (es.last_known_ts is not None or c.s.frozen or usable(eid))]
            low = [eid for eid in counted if not usable(eid)]
            total, n_low = len(counted), len(low)
        own = (total, n_low)
        total, n_low = total + peers[0], n_low + peers[1]
        frac = n_low / total if total else 0.0
        frozen = total >= p.fleet.min_entities and frac >= p.fleet.low_confidence_fraction
        if frozen and not c.s.frozen:
            c.s.frozen, c.s.frozen_since = True, c.now
            c.emit(IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_low",
                   {"state": "firing", "low": n_low, "total": total, "fraction": round(frac, 4),
                    "remediation": "frozen"})
        elif not frozen and c.s.frozen:
            c.s.frozen, c.s.frozen_since = False, None
            c.emit(IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_restored",
                   {"state": "resolved", "low": n_low, "total": total, "fraction": round(frac, 4),
                    "remediation": "resumed"})
        return own

    def _confidence_counts(self, c: Cycle, obs: Mapping[str, Observation | None]) -> tuple[int, int]:
        """``_fleet_confidence``'s two counts in one pass: entities counted, and those without a usable
        observation."""
        minc = self.policy.lifecycle.min_confidence
        frozen, now = c.s.frozen, c.now
        total = low = 0
        for eid, es in c.s.entities.items():
            st = es.state
            if st == State.STARTING or st in ISOLATED_STATES:
                continue
            if es.absent_since is not None and not frozen and not now - es.absent_since < ABSENT_GRACE_S:
                continue
            o = obs.get(eid)
            bad = o is None or o.value is None or not o.confidence >= minc  # Observation.usable, inlined
            if bad and es.last_known_ts is None and not frozen:
                continue  # never usable yet (a fresh start, counters seen once): warming up, not an outage
            total += 1
            low += bad
        return total, low

    def _app_xids(self, c: Cycle, life: list[HealthTuple], gpus: list[HealthTuple]) -> dict[str, str]:
        """Charge application Xids to jobs; return the nodes that distinct jobs keep hitting."""
        p = self.policy
        app = {f"xid:{x}" for x in p.xid.app_xids}
        win = p.attribution.app_xid_window_s
        # GPU tuples know their job; a node tuple is used only when none of its GPUs said anything.
        hits: list[tuple[str, str, str]] = []  # node, job, flag
        seen_nodes: set[str] = set()
        for g in gpus:
            for f in g.flags:
                if f in app:
                    n = node_of(g)
                    hits.append((n, g.labels.get("job", "") or "unknown", f))
                    seen_nodes.add(n)
        for t in life:
            if t.kind == "node" and t.entity not in seen_nodes:
                for f in t.flags:
                    if f in app:
                        hits.append((t.entity, t.labels.get("job", "") or "unknown", f))
        jobs: dict[str, set[str]] = defaultdict(set)
        job_xids: dict[str, set[str]] = defaultdict(set)
        for n, job, f in hits:
            c.s.app_xids.setdefault(n, {})[job] = c.now
            jobs[job].add(n)
            job_xids[job].add(f)
        for n in list(c.s.app_xids):
            kept = {j: ts for j, ts in c.s.app_xids[n].items() if c.now - ts <= win}
            if kept:
                c.s.app_xids[n] = kept
            else:
                del c.s.app_xids[n]
        for job in sorted(jobs):
            # the nodes it hit within the window, not only this cycle's: a job that crashes again starts
            # with one GPU's Xid 13 a cycle before the Xid 45 cleanup, and its ticket must not shrink to 1
            seen = {n for n, js in c.s.app_xids.items() if job in js}
            key = f"job:{job}"
            xids = sorted(job_xids[job] | set(c.s.incidents.get(key, {}).get("xids", ())))  # all it logged
            c.incident(key, f"job/{job}", "app_xid:job",
                       {"severity": "ticket", "job": job, "xids": xids,
                        "nodes": sorted(seen)[:20], "n_nodes": len(seen),
                        "domains": self._job_domains(c, seen)},
                       sig=[len(seen), xids])
            c.s.incidents[key]["xids"] = xids
        for job in sorted({j for js in c.s.app_xids.values() for j in js} - set(jobs)):
            incidents.refresh(c.s.incidents, f"job:{job}", c.now)  # still inside its window: still open
        out: dict[str, str] = {}
        for n, js in c.s.app_xids.items():
            if len(js) >= p.attribution.app_xid_distinct_jobs:
                out[n] = f"attribution:app_xid:{len(js)}_jobs"
        return out

    def _job_domains(self, c: Cycle, nodes: set[str]) -> list[str]:
        """The failure domains (decide.domains) a job's Xid storm covers: ``label=value`` shared by at
        least ``domains.min_nodes`` of the nodes it hit (Xid 45 across an NVL72 rack when a job is killed
        reads as that rack's, on the job's ticket)."""
        count: dict[str, int] = defaultdict(int)
        for n in nodes:
            es = c.s.entities.get(n)
            if es is None:
                continue
            for label in self.policy.domains.labels:
                v = es.labels.get(label)
                if v:
                    count[f"{label}={v}"] += 1
        return sorted(k for k, n in count.items() if n >= self.policy.domains.min_nodes)

    def _versions(self, c: Cycle, obs: Mapping[str, Observation | None]) -> dict[tuple[str, str], str]:
        """Version label values that failures correlate with: (label, value) -> page reason."""
        p = self.policy
        a = p.attribution
        lc = p.lifecycle
        out: dict[tuple[str, str], str] = {}
        kinds: Iterable[str] = LIFECYCLE_KINDS
        if self.fast:
            # a kind with fewer unhealthy entities than version_min_entities has nothing to say: count
            # them in one pass before building anything
            n_bad: dict[str, int] = defaultdict(int)
            minc, deg = lc.min_confidence, lc.degraded_below
            ents = c.s.entities
            for eid, o in obs.items():
                if (o is not None and o.value is not None and o.confidence >= minc
                        and (o.gate or o.value < deg)):
                    n_bad[ents[eid].kind] += 1
            kinds = [k for k in LIFECYCLE_KINDS if n_bad[k] >= a.version_min_entities]
        for kind in kinds:
            usable = {eid: o for eid, o in obs.items()
                      if o is not None and o.usable(lc) and c.s.entities[eid].kind == kind}
            bad = {eid for eid, o in usable.items() if o.gate or (o.value is not None and o.value < lc.degraded_below)}
            if len(bad) < a.version_min_entities:
                continue
            for label in a.version_labels:
                pop: dict[str, int] = defaultdict(int)
                nbad: dict[str, int] = defaultdict(int)
                for eid in usable:
                    v = c.s.entities[eid].labels.get(label)
                    if v is None:
                        continue
                    pop[v] += 1
                    if eid in bad:
                        nbad[v] += 1
                total_pop = sum(pop.values())
                for v, k in sorted(nbad.items()):
                    if k < a.version_min_entities or k / len(bad) < a.version_fraction:
                        continue
                    rate = k / pop[v]
                    other_pop = total_pop - pop[v]
                    if other_pop > 0:
                        other_rate = (sum(nbad.values()) - k) / other_pop
                        if not rate > 2 * other_rate:
                            continue
                    elif rate < a.version_fraction or (kind == "node" and one_domain(
                            c.s.entities, (e for e in bad if c.s.entities[e].labels.get(label) == v),
                            p.domains.labels)):
                        continue  # every node runs it: no contrast; a domain holding all the bad ones explains them
                    out[(label, v)] = f"version:{label}={v}"
                    key = f"version:{kind}:{label}={v}"
                    held = self._version_holds(c, key, label, v) if kind == "node" else []
                    named = {"held": held[:20], "n_held": len(held),
                             "failed_held": [e for e in held if c.s.entities[e].state == State.FAILED][:20],
                             "on_resolve": "held nodes get an active test"} if held else {}
                    c.incident(key, f"version/{label}={v}", "version_correlation",
                               {"label": label, "value": v, "kind": kind, "unhealthy": k,
                                "unhealthy_total": len(bad), "population": pop[v], **named},
                               sig=[k, len(held)] if held else k)  # JSON-safe: the store keeps it
        # A version stays suspect while its incident is open (until it has not correlated for
        # incident_clear_s), not only on cycles it correlates: the ladder's first resets clear its victims'
        # gates for a while, and the next victim must not be quarantined in that gap (not asserted here,
        # so the incident still resolves).
        for key, rec in c.s.incidents.items():
            if key.startswith("version:") and rec.get("reason") == "version_correlation":
                prm = rec.get("params", {})
                label, value = prm.get("label"), prm.get("value")
                if isinstance(label, str) and isinstance(value, str):
                    out.setdefault((label, value), f"version:{label}={value}")
        self._version_retests(c)
        return out

    def _version_holds(self, c: Cycle, key: str, label: str, value: str) -> list[str]:
        """Tie to the version incident ``key`` the isolated nodes whose evidence it explains, and return
        every node it holds. Explained: the node carries ``label=value``, was isolated (its last isolation
        episode, else since its state) before the incident opened and at most
        ``attribution.version_hold_lookback_s`` before, and neither that isolation nor its flags now are
        physical evidence. A node isolated while the incident was open passed the version veto on its own
        evidence (physical, its own stall, a human) and is never tied. A tied node's repair ladder stops
        (reason ``version incident <key>``); it is not failed by tests or ladders while tied, and it is
        retested when the incident resolves (``_version_release``)."""
        a = self.policy.attribution
        rec = c.s.incidents.get(key)
        opened = c.now if rec is None else float(rec["opened"])
        physical = self._physical_families()
        held: list[str] = []
        for eid, es in c.s.entities.items():
            if es.kind != "node" or es.labels.get(label) != value or es.state not in ISOLATED_STATES:
                continue
            if es.version_hold == key:
                held.append(eid)
                continue
            if es.version_hold is not None and es.version_hold in c.s.incidents:
                continue  # another open version incident holds it
            iso = next((e for e in reversed(es.episodes) if e[3] == recurring.ISOLATION), None)
            ts = es.since if iso is None else float(iso[0])
            if not (opened - a.version_hold_lookback_s <= ts < opened):
                continue
            if (iso is not None and str(iso[1]) in physical) or self._physical_evidence(c, es) is not None:
                continue
            es = c.mut(eid)
            es.version_hold = key
            if es.repair is not None and es.repair.get("phase") in ("acting", "verifying") \
                    and not es.repair.get("inplace"):
                es.repair = ladder.stop(es.repair, c.now, f"version incident {key}")
            held.append(eid)
        return sorted(held)

    def _physical_families(self) -> frozenset[str]:
        """The episode families (``decide.recurring.family_of``) of physical evidence: its Xids and its
        gate signals (by name and by policy family)."""
        a = self.policy.attribution
        gates = set(a.physical_gates)
        fams = {s.family for s in self.policy.signals if s.name in gates and s.family}
        return frozenset({f"xid:{x}" for x in a.physical_xids} | gates | fams)

    def _version_release(self, c: Cycle, es: EntityLifecycle) -> str | None:
        """The node no longer runs the version that holds it (rolled back or upgraded: its label changed),
        or that version's incident is gone: the incident key it was held for (the caller retests the node
        and lets the normal path decide), or None while it is still held (it runs the version and the
        incident is open, or another open version incident on a label value it carries, which then holds
        it). A node still on the version when its incident is about to resolve is retested under the hold
        first (``_version_retests``)."""
        key = es.version_hold
        if key is None:
            return None
        label, value = version_of(key)
        if key in c.s.incidents and es.labels.get(label) == value:
            return None
        for other, rec in c.s.incidents.items():
            p = rec.get("params", {})
            if (other.startswith("version:node:") and p.get("label") is not None
                    and es.labels.get(str(p["label"])) == p.get("value")):
                es.version_hold = other
                return None
        return key

    def _version_retests(self, c: Cycle) -> None:
        """A version incident that has not correlated for ``budgets.incident_clear_s`` would resolve at the
        end of this cycle. Its victims' gates may have cleared only because they are held and idle while the
        driver is still bad, so the nodes it holds that still run the version (QUARANTINED or FAILED) are
        retested first, under the hold: the incident stays open (no resolved page) while their tests are out
        (at most another ``incident_clear_s``), a FAILED one goes back to QUARANTINED for it (``version_cleared``).
        A failed retest is more evidence for the version (``_version_test_result``); when every retest has
        passed, or none is left to run, the incident resolves. Rounds back off: round k+1 starts at least
        ``incident_clear_s * 2**k`` (at most 8x) after round k was sent, so a driver that stays bad for hours
        costs a held node a test every 15, 30, 60, then 120 min, not one per ``incident_clear_s``."""
        if c.s.frozen:
            return
        clear_s = self.policy.budgets.incident_clear_s
        for key, rec in c.s.incidents.items():
            if not key.startswith(VERSION_NODE) or c.now - float(rec["seen"]) < clear_s:
                continue
            pending = [str(e) for e in rec.get("retesting", [])]
            if pending and c.now - float(rec.get("retest_sent", c.now)) < clear_s:
                incidents.refresh(c.s.incidents, key, c.now)  # its retests are still out
                continue
            label, value = version_of(key)
            todo = sorted(eid for eid, es in c.s.entities.items()
                          if es.version_hold == key and es.labels.get(label) == value
                          and es.state in (State.QUARANTINED, State.FAILED) and eid not in pending)
            if not todo:
                rec.pop("retesting", None)
                rec.pop("retest_sent", None)
                continue  # nothing left to ask: it resolves
            rounds = int(rec.get("retest_rounds", 0))
            due = float(rec.get("retest_sent", c.now)) + clear_s * min(2 ** rounds, 8)
            if rounds and c.now < due:
                # the last round failed: wait longer each time; kept open so that it comes due exactly then
                rec["seen"] = min(c.now, due - clear_s)
                continue
            rec["retesting"], rec["retest_sent"], rec["retest_rounds"] = todo, c.now, rounds + 1
            incidents.refresh(c.s.incidents, key, c.now)
            for eid in todo:
                if c.s.entities[eid].state == State.QUARANTINED:
                    c.emit(IntentKind.RUN_ACTIVE_TEST, eid, f"version_retest:{key}",
                           {"tests": list(self.policy.lifecycle.active_test)}, Tier.NODE)

    def _version_retesting(self, c: Cycle, es: EntityLifecycle) -> bool:
        """The node is being retested under its version hold (``_version_retests``)."""
        rec = c.s.incidents.get(es.version_hold or "")
        return rec is not None and es.entity in rec.get("retesting", [])

    def _version_test_result(self, c: Cycle, es: EntityLifecycle, passed: bool) -> None:
        """An active test's result on a node a version holds. Failed while the node still runs the version:
        evidence for the version, not the node (the driver fails it): the node stays held and QUARANTINED,
        and the version incident is updated (``retest_failed`` names the nodes; reopened if it had resolved),
        which also keeps it open another ``incident_clear_s``; no page of the node's own. Passed: the node
        takes the normal path (RECOVERING ends the hold)."""
        key = es.version_hold
        if key is None:
            return
        label, value = version_of(key)
        rec = c.s.incidents.get(key)
        if rec is not None and es.entity in rec.get("retesting", []):
            rec["retesting"] = [e for e in rec["retesting"] if e != es.entity]
        if passed or es.labels.get(label) != value:
            return
        prm = {k: v for k, v in (rec or {}).get("params", {}).items() if k != "severity"} or {
            "label": label, "value": value, "kind": "node"}
        failed = sorted({*(rec or {}).get("retest_failed", []), es.entity})
        prm.update({"retest_failed": failed[:20], "n_retest_failed": len(failed),
                    "on_resolve": "held nodes still on this version are retested; a failed retest keeps it open"})
        c.incident(key, f"version/{label}={value}" if rec is None else str(rec["entity"]),
                   "version_correlation", prm, sig=["retest_failed", len(failed)])
        c.s.incidents[key]["retest_failed"] = failed  # the record's params are the firing page's

    def _own_stalls(self, c: Cycle, obs: dict[str, Observation | None], health: Any,
                    by_id: Mapping[str, HealthTuple], suspects: Mapping[tuple[str, str], str]) -> None:
        """A node of a suspect version whose own ranks stall (a performance category, ``chronic.categories``,
        below ``lifecycle.quarantine_below``) while fewer than ``attribution.version_min_entities`` of that
        version's nodes read below ``degraded_below`` on it is a node's fault, not the version's: a hang
        costs its whole job, and a driver that hangs nodes hangs many together (then the version holds them).
        Its observation becomes that category's reading (``min:<category>``, ``own_stall``), which the version
        veto does not hold and which spends the rate budget; a gate on it (a bad driver's Xid 119) no longer
        decides it. Physical evidence keeps its own path. Runs only while a version is suspect."""
        if not suspects:
            return
        p = self.policy
        lc = p.lifecycle
        low: dict[str, tuple[float, str]] = {}
        for eid, worst in _performance_lows(health, by_id, p.chronic.categories, lc.degraded_below).items():
            es = c.s.entities.get(eid)
            o = obs.get(eid)
            if (es is not None and es.kind == "node" and o is not None and o.usable(lc)
                    and any(es.labels.get(label) == value for label, value in suspects)):
                low[eid] = worst
        slow: dict[tuple[str, str], int] = defaultdict(int)
        for eid in low:
            for label, value in suspects:
                if c.s.entities[eid].labels.get(label) == value:
                    slow[(label, value)] += 1
        for eid, (v, cat) in sorted(low.items()):
            es = c.s.entities[eid]
            o = obs[eid]
            assert o is not None
            if v >= lc.quarantine_below or es.state in ISOLATED_STATES or o.own_stall:
                continue
            if any(slow[(label, val)] >= p.attribution.version_min_entities for label, val in suspects
                   if es.labels.get(label) == val):
                continue  # many nodes of the version stall together: the version's
            if o.gate and self._physical_evidence(c, es) is not None:
                continue
            obs[eid] = Observation(v, o.confidence, f"min:{cat}", own_stall=True)

    def _own_fault(self, c: Cycle, es: EntityLifecycle, group: str) -> bool:
        """Whether the node's evidence is its own, not its tensor-parallel group's: no other member of the
        group (in service or isolated) reads the same reason below ``lifecycle.degraded_below`` (a hang of
        its own ranks while the others read healthy, behind a mate that lost a GPU). Asked only when a
        group-mate is already isolated: the group's job is down already, so isolating this node too costs
        no capacity; a reading the members share (the group degrading together, two nodes gated alike at
        once) is still held."""
        deg = self.policy.lifecycle.degraded_below
        return not any(
            o.entity != es.entity and o.kind == "node" and o.labels.get("tp_group") == group
            and o.last_value is not None and o.last_value < deg and o.last_reason == es.last_reason
            for o in c.s.entities.values())

    def _veto(self, c: Cycle, es: EntityLifecycle, rule: Rule, suspects: Mapping[tuple[str, str], str],
              approved: bool = False, observation: Observation | None = None) -> str | None:
        """Why this remediation may not happen now (None: it may). ``approved``: a human acknowledged
        (``ack`` to QUARANTINED) a quarantine that budgets, TP groups, versions or a freeze held back.
        ``observation``: the entity's observation this cycle (its own stall passes a version hold)."""
        if approved and rule.dst in REMEDIATION_TARGETS:
            return None
        signal_driven = rule.cond in SIGNAL_CONDS or rule.cond in (Cond.HARD_GATE, Cond.DRAIN_RESET)
        if c.s.frozen and signal_driven and rule.dst in WORSE_STATES:
            return "frozen:fleet_confidence"  # the telemetry itself is in doubt
        if rule.dst not in REMEDIATION_TARGETS:
            return None
        if es.state in ISOLATED_STATES or rule.cond in (Cond.HUMAN_QUARANTINE, Cond.HUMAN_READY):
            return None  # already out of service, or a human said so
        if (es.kind == "replica" and es.overload_until is not None and c.now < es.overload_until
                and rule.cond in SIGNAL_CONDS):
            # the smallest tier that fits: overload was answered at the instance (concurrency limit)
            return "held:overload"
        p = self.policy
        physical, hard = self._budget_class(c, es, rule)
        if not physical and not (observation is not None and observation.own_stall):
            # A suspect version holds hard gates too: a bad driver raises reset-class Xids (119 GSP
            # timeouts) on healthy GPUs, and the catalog cannot tell those from a GPU that really fell off
            # the bus; only physical evidence (a GPU off the bus, a DBE, a failed remap) is not the
            # version's doing.
            for label in p.attribution.version_labels:
                v = es.labels.get(label)
                if v is not None and (label, v) in suspects:
                    return suspects[(label, v)]
        b = p.budgets
        if es.kind == "node" and not hard:
            # a domain event (decide.domains): the domain is the suspect, its nodes are held, not drained
            held = domain_hold(c, es, p)
            if held is not None:
                return held
            # a confirmed hard gate's node already costs its group its capacity: isolating it costs nothing
            g = es.labels.get("tp_group")
            if g:
                # isolations that still cost the group capacity: FAILED is a human's and does not count
                isolated = sum(1 for o in c.s.entities.values() if o.entity != es.entity and o.kind == "node"
                               and o.labels.get("tp_group") == g and o.state in REMEDIATION_TARGETS)
                if isolated >= b.max_per_tp_group and not (isolated and self._own_fault(c, es, g)):
                    c.incident(f"tp_group:{g}", f"tp_group/{g}", "tp_group_limit",
                               {"tp_group": g, "isolated": isolated, "wanted": es.entity,
                                "limit": b.max_per_tp_group}, sig=isolated)
                    return f"tp_group:{g}"
        pool = es.labels.get("pool", "default")
        key = budget_key(es.kind, pool, hard, physical)
        if c.pool_sizes is None:
            c.pool_sizes = defaultdict(int)
            for o in c.s.entities.values():
                c.pool_sizes[f"{o.kind}:{o.labels.get('pool', 'default')}"] += 1
        size = c.pool_sizes[f"{es.kind}:{pool}"]
        if physical:
            allowed = max(b.physical_min_per_hour, math.floor(b.physical_fraction_per_hour * size))
        elif hard:
            allowed = max(b.hard_gate_min_per_hour, math.floor(b.hard_gate_fraction_per_hour * size))
        else:
            allowed = max(b.quarantine_min_per_hour, math.floor(b.quarantine_fraction_per_hour * size))
        # Distinct entities: isolating the same node again (a relapse) spends nothing new.
        spent = self._spent(c, b.window_s).get(key, set())
        used = len(spent)
        if es.entity not in spent and used >= allowed:
            c.incident(f"budget:{es.kind}:{pool}", f"pool/{pool}", "budget_exhausted",
                       {"pool": pool, "kind": es.kind, "used": used, "allowed": allowed, "pool_size": size,
                        "wanted": es.entity, "window_s": b.window_s,
                        "budget": "physical" if physical else "hard_gate" if hard else "rate"},
                       sig=used)
            return f"budget:{pool}" + (":physical" if physical else ":hard_gate" if hard else "")
        return None

    def _spent(self, c: Cycle, window_s: float) -> dict[str, set[str]]:
        """Ledger key -> the entities that spent it within ``window_s`` of now: the ledger indexed once per
        cycle and extended as the cycle appends to it (a fleet-wide flag storm gates every node, and a scan
        of the whole ledger per gated node cost seconds). Rebuilt when the ledger list, now or the window
        is another, or the ledger shrank (it is only pruned into a new list at a cycle's start)."""
        ledger = c.s.ledger
        ix: tuple[list[Any], float, float, int, dict[str, set[str]]] | None = getattr(self, "_spent_ix", None)
        if ix is None or ix[0] is not ledger or ix[1] != c.now or ix[2] != window_s or ix[3] > len(ledger):
            ix = (ledger, c.now, window_s, 0, {})
        by_key = ix[4]
        for ts, k, e in ledger[ix[3]:]:
            if c.now - ts < window_s:
                by_key.setdefault(k, set()).add(e)
        self._spent_ix = (ledger, c.now, window_s, len(ledger), by_key)
        return by_key

    def _budget_class(self, c: Cycle, es: EntityLifecycle, rule: Rule) -> tuple[bool, bool]:
        """(physical, hard) of a remediation: which budget it spends and which vetoes it skips. Physical
        evidence (``_physical_evidence``) is also hard. A score-dwell rule on a node whose reason is a
        confirmed hard gate is the same evidence by another path: it spends the same budget, so a node
        that budget held is not quarantined minutes later on the rate budget beside it (budgets must not
        add up). The veto and the ledger (``Decider._transition``) both ask here."""
        physical = self._physical_evidence(c, es) is not None
        hard = physical or self._hard_gate(rule, es.last_reason) or (
            rule.cond in SIGNAL_CONDS and is_hard_gate_reason(es.last_reason, self.policy))
        return physical, hard

    def _physical_evidence(self, c: Cycle, es: EntityLifecycle) -> str | None:
        """What says a gated node's hardware is dead whatever software it runs: its gate signal when it is
        one of ``attribution.physical_gates`` (``gate:gpus_missing``), else the lowest of
        ``attribution.physical_xids`` flagged on the node or its GPUs this cycle (``xid:79``); None for
        any other node. Only a gate counts: a node gated by a bad driver's Xid 119 has no physical
        evidence, one whose GPU also logged Xid 79 has."""
        reason = es.last_reason
        if es.kind != "node" or not reason.startswith("gate:"):
            return None
        a = self.policy.attribution
        if reason[5:] in a.physical_gates:
            return reason
        flags = c.node_flags.get(es.entity)
        if flags:
            for x in sorted(a.physical_xids):
                if f"xid:{x}" in flags:
                    return f"xid:{x}"
        return None

    def _hard_gate(self, rule: Rule, reason: str) -> bool:
        """A confirmed hard gate: the hardware is already out of service (a GPU off the bus, a DBE, a
        catalog action that needs a reset or reboot), not a score's judgement or an inference."""
        if rule.cond == Cond.DRAIN_RESET:
            return True
        return rule.cond == Cond.HARD_GATE and is_hard_gate_reason(reason, self.policy)

    def _soft_fallback(self, c: Cycle, es: EntityLifecycle, why: str, o: Observation | None) -> None:
        if es.blocked == why:
            return
        if es.blocked is None:
            es.blocked_since = c.now
        es.blocked = why
        if quiet_hold(why, self.policy):
            return  # a metrics outage, or a domain held without changing its work: no action at all
        if es.kind == "node":
            es.no_new_work = True
            c.emit(IntentKind.NO_NEW_WORK, es.entity, f"held:{why}", {"instead_of": "quarantine"}, Tier.NODE, soft=True)
        else:
            cur = 1.0 if es.weight is None else es.weight
            val = cur if o is None or o.value is None else min(cur, o.value)
            w = round(max(self.policy.router.min_weight, val * 0.5), 2)
            es.weight = w
            c.emit(IntentKind.SET_WEIGHT, es.entity, f"held:{why}", {"weight": w, "instead_of": "quarantine"},
                   Tier.INSTANCE, soft=True)


VERSION_NODE = "version:node:"


def version_of(key: str) -> tuple[str, str]:
    """The (label, value) of a node version incident's key ``version:node:<label>=<value>``."""
    label, _, value = key.removeprefix(VERSION_NODE).partition("=")
    return label, value


def version_hold_summary(es: EntityLifecycle, open_incidents: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """What an operator needs about a node's version hold (``describe``, ``/api/v1/states``, the node page):
    the incident holding it, the version, since when, whether a retest under the hold is out or failed, and
    what releases it. None when no version holds the node."""
    key = es.version_hold
    if key is None:
        return None
    label, value = version_of(key)
    rec = open_incidents.get(key) or {}
    retesting = es.entity in rec.get("retesting", [])
    failed = es.entity in rec.get("retest_failed", [])
    runs = es.labels.get(label) == value
    if not runs:
        releases = f"it no longer runs {label}={value}: retested now, then the normal path"
    elif retesting:
        releases = "its retest under the hold passing (a failure keeps it held: evidence for the version)"
    else:
        releases = (f"a rollback or upgrade of {label} on it (retested at once), or the version not correlating "
                    "for incident_clear_s (retested under the hold first; released if the test passes)")
    return {"incident": key, "version": f"{label}={value}", "opened": rec.get("opened"),
            "incident_open": bool(rec), "retesting": retesting, "retest_failed": failed, "releases": releases}


def _performance_lows(health: Any, by_id: Mapping[str, HealthTuple], cats: Iterable[str],
                      below: float) -> dict[str, tuple[float, str]]:
    """Nodes whose lowest category of ``cats`` reads below ``below``: node -> (value, category). From the
    engine's columnar node scores in one numpy pass when ``health`` has them (the decider's light tuples
    carry no category map), else from the tuples' own categories."""
    kinds = getattr(health, "kinds", None)
    ks = kinds.get("node") if kinds is not None else None
    matrix, names = getattr(ks, "cat", None), getattr(ks, "categories", None)
    if ks is not None and matrix is not None and names is not None:
        idx = [i for i, k in enumerate(names) if k in set(cats)]
        if not idx or not len(ks.names):
            return {}
        sub = np.asarray(matrix, dtype=float)[:, idx]
        filled = np.where(np.isnan(sub), np.inf, sub)
        arg = np.argmin(filled, axis=1)
        low = filled[np.arange(len(arg)), arg]
        return {ks.names[r]: (float(low[r]), names[idx[int(arg[r])]])
                for r in np.nonzero(low < below)[0].tolist()}
    out: dict[str, tuple[float, str]] = {}
    for eid, t in by_id.items():
        if t.kind != "node":
            continue
        worst = min(((v, k) for k in cats if (v := t.categories.get(k)) is not None), default=None)
        if worst is not None and worst[0] < below:
            out[eid] = worst
    return out
