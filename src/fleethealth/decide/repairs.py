"""The decider's repair passes: pending row remaps, Xid 154 recovery actions, the repair ladder, OOMs.
Pure; a mixin of ``Decider`` (reads ``self.policy`` and ``self.fast``).

* Pending row remap (flag ``row_remap_pending`` or a ``policy.xid.reset_xids`` flag, ``_row_remaps``):
  the policy's ladder for it (``when: flag:row_remap_pending``, default ``row-remap``) runs *in place*,
  no state change: reset at the next safe point, the remap must clear, else reboot, else a page with
  what was tried; without such a ladder, one SCHEDULE_RESET. A GPU that needs such a reset
  ``lifecycle.max_row_remaps`` times within ``recovery_window_s`` pages for repair
  (``_recurring_remaps``; the reset still goes ahead): one incident per GPU (``row_remap:<gpu>``), updated
  at each later remap, resolved when its count falls below the limit or a human returns the node
  (``ack`` to READY, ``_remap_incidents``).
* A ladder step is entered held (``_release``): the decider lets it act once the ``tp_peers_handled``
  precondition holds (the other nodes of its ``tp_group`` drained or out of service, or a ``handover``
  event for the node) and the pool's repair budget (``remediation.budget`` per ``budgets.window_s``) has
  room, spending it (ledger key ``repair:<action>:<pool>``). Otherwise it waits with the reason in the
  ladder's progress (``describe`` shows it): an unmet precondition escalates after the step's
  ``timeout_s``; an exhausted budget pages once (``budget_exhausted``) and waits.
* Xid 154 recovery actions ride on the lifecycle (``decide.decider``'s transition): GPU_RESET and
  NODE_REBOOT with the gate's quarantine, DRAIN_AND_RESET and DRAIN_P2P by moving the entity to
  DRAINING. On a fresh isolation, the first repair ladder (``decide.ladder``) that covers the fault
  replaces that plain reset / entry test (``_start_repair``).
* Ladders in progress (``_repairs``): executor results (``reset`` events) and verification results
  (``active_test``) go to the ladder, not straight to the lifecycle; timeouts escalate; the ladder's
  verdicts come back as lifecycle events (verified: an active-test pass; exhausted: a ``repair``
  failure, to FAILED). While remediation is frozen or the node's data is unusable, results are still
  recorded but no timeout fires.
* CUDA OOM events (``_oom``, classified by ``decide.oom``): the small actions pass through (not while
  frozen); a device fault becomes a gate on the replica's and its node's lifecycles, so budgets and
  freezes apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleethealth.decide import incidents, ladder
from fleethealth.decide.cycle import REMEDIATION_KINDS, Cycle
from fleethealth.decide.lifecycle import ISOLATED_STATES, Observation
from fleethealth.decide.model import IntentKind, State, Tier
from fleethealth.decide.state import EntityLifecycle, Event
from fleethealth.policy import Policy
from fleethealth.repair_policy import Ladder
from fleethealth.score.health import HealthTuple

# a tensor-parallel peer in one of these states runs no work of the group: it is handled
REMAP_INCIDENT = "row_remap:"  # incident key prefix of a GPU paged for recurring row remaps
TP_HANDLED_STATES = frozenset({State.DRAINING, State.QUARANTINED, State.FAILED})


class Repairs:
    """Row remaps, recurring remaps, repair ladders and OOM classification."""

    policy: Policy
    fast: bool

    def _repairs(self, c: Cycle, obs: Mapping[str, Observation | None], node_flags: Mapping[str, set[str]],
                 ev_by_entity: dict[str, list[Event]]) -> None:
        """Advance every repair ladder in progress (``decide.ladder``): executor results (``reset``
        events) and verification results (``active_test``) go to the ladder, not straight to the
        lifecycle; timeouts escalate; the ladder's verdicts come back as lifecycle events (verified: an
        active-test pass; exhausted: a ``repair`` failure, to FAILED). While remediation is frozen or the
        node's data is unusable, results are still recorded but no timeout fires."""
        self._remap_incidents(c, ev_by_entity)
        rem = self.policy.remediation
        lc = self.policy.lifecycle
        # only the few entities with a ladder running do any work (replacing a value while iterating is safe)
        running = [(eid, es) for eid, es in c.s.entities.items() if es.repair is not None]
        for eid, es in running:
            rep = es.repair
            if rep is None or rep.get("phase") in ("verified", "exhausted", "stopped"):
                continue
            lad = ladder.ladder_of(rem, rep)
            if lad is None or not rem.enabled:  # the policy no longer has it: the lifecycle decides alone
                c.mut(eid).repair = None
                continue
            evs = ev_by_entity.get(eid, [])
            keep: list[Event] = []
            intents: list[ladder.StepIntent] = []
            verdict: str | None = None
            for e in evs:
                r: ladder.LadderStep | None = None
                if verdict is None and e.kind == "reset" and e.passed is not None:
                    detail = str(e.payload.get("detail") or e.payload.get("reason") or "")
                    r = ladder.on_result(lad, rep, bool(e.passed), c.now, detail)
                elif verdict is None and e.kind == "active_test" and e.passed is not None:
                    r = ladder.on_test(lad, rep, bool(e.passed), c.now)
                    if r is None:
                        if e.passed:
                            keep.append(e)  # a pass from elsewhere still lets the node out
                        continue  # a failure outside verification: the ladder goes on
                elif e.kind == "reset":
                    continue  # the ladder owns reset results while it runs
                elif e.kind == "handover":
                    rep = {**rep, "handover": e.ts}  # its TP peers' work was handed over
                    continue
                if r is None:
                    keep.append(e)
                    continue
                rep, verdict = r.repair or rep, r.verdict
                intents += r.intents
            o = obs.get(eid)
            usable = o is not None and o.usable(lc)
            if verdict is None and not c.s.frozen and usable:
                # timeouts are read on usable data only, like the drain timeout: nothing escalates on unknown
                r = ladder.on_tick(lad, rep, c.now, node_flags.get(eid, set()), True)
                rep, verdict = r.repair or rep, r.verdict
                intents += r.intents
            for si in intents:
                c.emit(si.kind, eid, f"repair:{lad.name}", si.params, si.tier)
            if verdict is None:
                rep, verdict = self._release(c, eid, lad, rep, usable, f"repair:{lad.name}")
            if rep is not es.repair:
                c.mut(eid).repair = rep
            inplace = bool(rep.get("inplace"))
            if verdict == ladder.VERIFIED and inplace:
                c.mut(eid).reset_scheduled = False  # the remap cleared: the node never left service
            elif verdict == ladder.VERIFIED:
                keep.append(Event(c.now, "active_test", eid, passed=True, actor=f"repair:{lad.name}"))
            elif verdict == ladder.EXHAUSTED and inplace:
                c.mut(eid).reset_scheduled = False
                summ = ladder.summary(rep)
                c.emit(IntentKind.PAGE, eid, f"repair:{lad.name}:exhausted",
                       {"severity": "page", "action": "replace", "repair": summ,
                        "summary": f"{eid}: {rep.get('reason')} survived "
                                   f"{', '.join(h['action'] for h in summ['history'] if h.get('action') != 'replace')}"
                                   "; replace or repair the GPU"})
            elif verdict == ladder.EXHAUSTED:
                keep.append(Event(c.now, "repair", eid, passed=False, actor=f"repair:{lad.name}"))
            if keep != evs:
                if keep:
                    ev_by_entity[eid] = keep
                else:
                    ev_by_entity.pop(eid, None)
                    # the entity still needs a step this cycle when its ladder moved
                    if rep is not es.repair or intents:
                        ev_by_entity[eid] = []

    def _start_repair(self, c: Cycle, es: EntityLifecycle, flags: set[str], reason: str) -> bool:
        """On a fresh isolation of a node, start the first ladder that covers its fault. True: started
        (its first step replaces the plain reset / entry test)."""
        from fleethealth.signals.xid import xid_bucket

        if es.kind != "node" or ladder.isolating(es.repair):
            return False
        lad = ladder.match(self.policy.remediation, flags, reason, xid_bucket)
        if lad is None:
            return False
        when = set(lad.when)
        trig = sorted(f for f in flags if ladder.tokens([f], xid_bucket) & when)
        gpus = sorted(g.entity for g in c.gpu_by_node.get(es.entity, []) if set(g.flags) & set(trig))
        r = ladder.begin(lad, c.now, reason, trig, gpus, self.policy.lifecycle.active_test)
        es.repair = r.repair
        for si in r.intents:
            c.emit(si.kind, es.entity, f"repair:{lad.name}", si.params, si.tier)
        if r.repair is not None:
            es.repair, _ = self._release(c, es.entity, lad, r.repair, True, f"repair:{lad.name}")
        return True

    def _release(self, c: Cycle, eid: str, lad: Ladder, rep: dict[str, Any], usable: bool,
                 reason: str) -> tuple[dict[str, Any], str | None]:
        """Let a held ladder step act when its ``tp_peers_handled`` precondition holds and the pool's
        repair budget has room (spent here); else it waits, with why. Returns the progress and a verdict
        (a wait past the step's timeout escalates, possibly to the end of the ladder)."""
        verdict: str | None = None
        for _ in range(len(lad.steps) + 1):
            if not ladder.held(rep):
                break
            st = ladder.step_of(lad, rep)
            if st is None:
                break
            es = c.s.entities[eid]
            why: str | None = None
            times_out = False
            if "tp_peers_handled" in st.requires:
                why = _tp_unhandled(c, es, rep)
                times_out = why is not None and usable and not c.s.frozen
            if why is None and c.s.frozen:
                why = "remediation frozen (fleet confidence)"
            if why is None:
                why = self._repair_budget(c, es, st.action)
            if why is None:
                r = ladder.release(lad, rep, c.now)
                rep = r.repair or rep
                for si in r.intents:
                    c.emit(si.kind, eid, reason, si.params, si.tier)
                break
            r = ladder.hold(lad, rep, c.now, why, times_out)
            rep, verdict = r.repair or rep, r.verdict
            if verdict is not None:
                break
        return rep, verdict

    def _repair_budget(self, c: Cycle, es: EntityLifecycle, action: str) -> str | None:
        """Spend one of the pool's repair actions of this kind (``remediation.budget``), or say why not
        (one ``budget_exhausted`` incident per pool and action while it holds)."""
        allowed = getattr(self.policy.remediation.budget, action, None)
        if allowed is None:
            return None
        pool = es.labels.get("pool", "default")
        key = f"repair:{action}:{pool}"
        window = self.policy.budgets.window_s
        used = self._ledger_counts(c, window).get(key, 0)
        if used >= allowed:
            c.incident(f"budget:{key}", f"pool/{pool}", "budget_exhausted",
                       {"pool": pool, "kind": es.kind, "used": used, "allowed": allowed, "wanted": es.entity,
                        "window_s": window, "budget": f"repair:{action}"}, sig=used)
            return f"repair budget: {used} of {allowed} {action} in pool {pool} within {window:g} s"
        c.s.ledger.append((c.now, key, es.entity))
        return None

    def _ledger_counts(self, c: Cycle, window_s: float) -> dict[str, int]:
        """Ledger key -> its entries within ``window_s`` of now: the ledger counted once per cycle and
        extended as the cycle appends to it (as ``SafetyRules._spent``: a fleet-wide flag storm holds a
        repair step on every gated node, and counting the whole ledger per step grew with the square of
        the fleet). Rebuilt when the ledger list, now or the window is another, or the ledger shrank."""
        ledger = c.s.ledger
        ix: tuple[list[Any], float, float, int, dict[str, int]] | None = getattr(self, "_ledger_ix", None)
        if ix is None or ix[0] is not ledger or ix[1] != c.now or ix[2] != window_s or ix[3] > len(ledger):
            ix = (ledger, c.now, window_s, 0, {})
        counts = ix[4]
        for ts, k, _ in ledger[ix[3]:]:
            if c.now - ts < window_s:
                counts[k] = counts.get(k, 0) + 1
        self._ledger_ix = (ledger, c.now, window_s, len(ledger), counts)
        return counts

    def _row_remaps(self, c: Cycle, obs: Mapping[str, Observation | None], node_flags: Mapping[str, set[str]],
                    gpu_by_node: Mapping[str, list[HealthTuple]]) -> None:
        p = self.policy
        reset_flags = {"row_remap_pending"} | {f"xid:{x}" for x in p.xid.reset_xids}
        if self.fast:
            # only a flagged node or one with a reset outstanding has anything to do here
            todo: Iterable[str] = sorted({eid for eid, es in c.s.entities.items() if es.reset_scheduled}
                                         | {eid for eid in node_flags if eid in c.s.entities})
        else:
            todo = sorted(c.s.entities)
        for eid in todo:
            es = c.s.entities[eid]
            o = obs.get(eid)
            if es.kind != "node" or o is None or o.value is None:
                continue
            nf = node_flags.get(eid)
            flags = nf & reset_flags if nf else set()
            if not flags:
                if o.usable(p.lifecycle) and es.reset_scheduled and not ladder.running(es.repair):
                    c.mut(eid).reset_scheduled = False
                continue
            if es.reset_scheduled or ladder.running(es.repair) or c.s.frozen or es.state in ISOLATED_STATES \
                    or not o.usable(p.lifecycle):
                continue
            gpus = sorted(g.entity for g in gpu_by_node.get(eid, []) if set(g.flags) & reset_flags)
            es = c.mut(eid)
            es.reset_scheduled = True
            self._recurring_remaps(c, es, gpus)
            # the policy's ladder for it, in place: reset at the next safe point, verified by the remap clearing
            lad = ladder.match(p.remediation, flags, "")
            if lad is not None:
                r = ladder.begin(lad, c.now, "row_remap_pending", sorted(flags), gpus, p.lifecycle.active_test)
                if r.repair is not None:
                    es.repair, _ = self._release(c, eid, lad, {**r.repair, "inplace": True}, True,
                                                 "row_remap_pending")
                    continue
            c.emit(IntentKind.SCHEDULE_RESET, eid, "row_remap_pending",
                   {"action": "GPU_RESET", "when": "next_safe_point", "drain": True, "gpus": gpus,
                    "flags": sorted(flags)}, Tier.NODE)

    def _recurring_remaps(self, c: Cycle, es: EntityLifecycle, gpus: list[str]) -> None:
        """A GPU whose memory needs row-remap resets again and again is failing: at the
        ``lifecycle.max_row_remaps``-th within ``recovery_window_s``, page for repair (the reset still
        goes ahead). A node-level remap (no GPU named) counts for the node."""
        lc = self.policy.lifecycle
        es.remaps = [r for r in es.remaps if c.now - float(r[0]) < lc.recovery_window_s] + [[c.now, list(gpus)]]
        for g in gpus or [es.entity]:
            times = [float(r[0]) for r in es.remaps if g in r[1] or (not r[1] and g == es.entity)]
            if len(times) >= lc.max_row_remaps:
                # one incident per GPU (decide.incidents): fired at the limit, updated at each later remap,
                # resolved once the count falls below the limit (_remap_incidents) or the node is repaired
                c.incident(f"{REMAP_INCIDENT}{g}", g, "recurring:row_remap",
                           {"node": es.entity, "gpu": g, "remaps": len(times),
                            "first": min(times), "window_s": lc.recovery_window_s, "action": "repair",
                            "summary": f"{g}: {len(times)} row-remap resets in {lc.recovery_window_s / 86400:g} "
                                       "days; its memory keeps failing, schedule a repair (RMA)"}, sig=len(times))

    def _remap_incidents(self, c: Cycle, ev_by_entity: Mapping[str, list[Event]]) -> None:
        """Keep each open recurring-remap incident open while its GPU still has ``max_row_remaps`` resets
        within ``recovery_window_s``; a human's ``ack`` to READY (the node back from its repair) forgets the
        node's remaps, so its incidents resolve (``incident_clear_s`` later, one resolved page)."""
        for eid, evs in ev_by_entity.items():
            es = c.s.entities.get(eid)
            if es is not None and es.remaps and any(
                    e.kind == "ack" and str(e.to).upper() == "READY" for e in evs):
                c.mut(eid).remaps = []
        lc = self.policy.lifecycle
        for key, rec in c.s.incidents.items():
            if not key.startswith(REMAP_INCIDENT):
                continue
            g = key[len(REMAP_INCIDENT):]
            es = c.s.entities.get(str(rec["params"].get("node", "")))
            if es is None:
                continue
            n = sum(1 for r in es.remaps if c.now - float(r[0]) < lc.recovery_window_s
                    and (g in r[1] or (not r[1] and g == es.entity)))
            if n >= lc.max_row_remaps:
                incidents.refresh(c.s.incidents, key, c.now)

    def _oom(self, c: Cycle, e: Event) -> str | None:
        """Classify a CUDA OOM with ``decide.oom``. The small actions (reject, limit concurrency, rebuild a
        fragmented worker) pass through (the rebuild not while frozen); a device fault instead becomes a
        gate on the replica's and its node's lifecycles, so budgets and freezes apply. Returns the node
        (or replica) to gate, if any."""
        from fleethealth.decide import oom

        fields: dict[str, Any] = {"ts": e.ts, "entity": e.entity}
        for k, v in e.payload.items():
            fields[k] = tuple(v) if isinstance(v, list) else v
        try:
            ev = oom.OomEvent(**fields)
        except TypeError as err:
            c.emit(IntentKind.PAGE, e.entity, "oom:unreadable_event", {"severity": "ticket", "error": str(err)})
            return None
        produced = oom.oom_intents(ev, c.now, policy_version=c.version)
        if any(it.kind == IntentKind.QUARANTINE for it in produced):
            return e.entity
        if any(it.kind == IntentKind.LIMIT_CONCURRENCY for it in produced) and e.entity in c.s.entities:
            c.mut(e.entity).overload_until = c.now + self.policy.lifecycle.overload_hold_s
        for it in produced:
            if c.s.frozen and it.kind in REMEDIATION_KINDS:
                continue
            c.emit(it.kind, it.entity or e.entity, it.reason, dict(it.params), it.tier, it.soft)
        return None


def _tp_unhandled(c: Cycle, es: EntityLifecycle, rep: Mapping[str, Any]) -> str | None:
    """Why the node's tensor-parallel peers (the other nodes of its ``tp_group``) are not handled yet:
    a peer still in service; None when every one is drained or out of service, or a ``handover`` event
    said their work was handed over."""
    g = es.labels.get("tp_group")
    if not g or rep.get("handover") is not None:
        return None
    busy = sorted(o.entity for o in c.s.entities.values()
                  if o.kind == "node" and o.entity != es.entity and o.labels.get("tp_group") == g
                  and o.state not in TP_HANDLED_STATES)
    if not busy:
        return None
    more = f" and {len(busy) - 3} more" if len(busy) > 3 else ""
    return (f"tp_peers_handled: {len(busy)} peer(s) of tp_group {g} still in service "
            f"({', '.join(busy[:3])}{more}); drain them or send a handover event")
