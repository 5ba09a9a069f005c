"""ActuationRunner: turns intents into side effects, safely.

Theory of operation
- Advise by default: every intent is recorded in the ledger as ``advised`` and logged; nothing changes.
- Enforcement is per intent kind (config.enforce) and only in ``enforce`` mode.
- Kill switch: config.kill_switch, or kill() at run time (persisted in the ledger so a restart and other
  replicas sharing the database honour it). Checked before every attempt, so actuation stops at once.
- Idempotent: the ledger is keyed by (intent.key, actuator). An action that reached ``applied`` (or gave
  up as ``failed``) is never attempted again, also after a restart; replaying intents is harmless.
- Retries: a retryable failure (timeout, 5xx, 409, 429) is retried with exponential backoff, a few
  attempts inline, then on later calls of retry_due(); every attempt is recorded, none is lost.
- Leadership: with is_leader given, a replica that is not the leader records nothing and does nothing.
- Order: an intent kind may route to several actuators (e.g. evidence before quarantine); they run in
  the order given, each with its own ledger entry, and one's failure does not block the next.
- The outbox: ``drain(store)`` takes every intent the state store holds as ``pending`` (committed with
  the cycle's state, in commit order), submits it, and marks it in the store once every actuator on its
  route has settled: ``applied``, ``failed`` (a terminal failure or retries used up; logged as an error
  with the reason and counted in ``status()``), ``advised`` or ``unrouted``. Anything still under way
  (retrying, waiting on backoff, held by the breaker, killed, not the leader) stays pending and is drained
  again next cycle, so a crash between commit and act, or a failover, loses nothing. A key the ledger has
  settled is never attempted again (``duplicate``); the only re-apply is after a process died between an
  actuator's call and its ledger record (the ledger says ``started``), and the actuators are idempotent
  (they write the difference from what is there, name Jobs and bundles by the key), so it changes nothing.
- Fencing (act.fence): with a ``fence``, every external write is preceded by its check (the Lease still
  held at this leader's epoch, the store's claim still ours). A refused write is ``fenced``: nothing is
  attempted or recorded, the intent stays pending for the new leader, and the log gets one line per
  episode (``fenced_total`` counts refusals). Actuators that write objects carry the epoch in them
  (``bind_fence``: the node actuator's ``leader-epoch`` annotation) and refuse an object a newer leader
  wrote (``StaleEpoch``, also ``fenced``).
- Heartbeats: once per cycle (``retry_due``) the leader asks each actuator with a ``heartbeat()`` (the
  pager: firing pages re-sent before Alertmanager's endsAt) to refresh what it keeps alive, behind the
  same fence. A heartbeat is no intent: nothing in the ledger or the outbox.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleethealth.act.config import ActuationConfig
from fleethealth.act.failpoint import Failpoints
from fleethealth.act.fence import Fence, Fenced
from fleethealth.act.ledger import FINAL_STATUSES, Ledger, intent_from_dict
from fleethealth.act.outcome import Actuator, Outcome
from fleethealth.decide.model import Intent, IntentKind, Tier
from fleethealth.store.base import StoreError

log = logging.getLogger("fleethealth.act")

KILL_SETTING = "kill_switch"
ISOLATING = (IntentKind.QUARANTINE, IntentKind.DRAIN)
# What an intent's actuator results settle it as in the outbox (anything else: still pending).
SETTLED = {"applied": "applied", "failed": "failed", "advised": "advised", "unrouted": "unrouted"}


class Outbox(Protocol):
    """The state store's side of the outbox (fleethealth.store.sqlite.SqliteStore and PostgresStore)."""

    def intents(self, since: float | None = None, status: str | None = None) -> list[dict[str, Any]]: ...

    def mark_intent(self, key: str, status: str, outcome: str | None = None) -> bool: ...


@dataclass(frozen=True, slots=True)
class ActionResult:
    key: str
    kind: str
    entity: str
    actuator: str
    # advised | applied | retrying | failed | killed | duplicate | waiting | not_leader | unrouted | breaker
    # | fenced
    status: str
    attempts: int = 0
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "intent": self.kind, "entity": self.entity, "actuator": self.actuator,
                "status": self.status, "attempts": self.attempts, "error": self.error, "detail": self.detail}


class ActuationRunner:
    def __init__(
        self,
        actuators: Mapping[IntentKind, Sequence[Actuator]] | Sequence[Actuator],
        ledger: Ledger,
        config: ActuationConfig | str | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        is_leader: Callable[[], bool] | None = None,
        on_result: Callable[[ActionResult], None] | None = None,
        failpoints: Failpoints | None = None,
        fence: Fence | None = None,
    ) -> None:
        if config is None:
            config = ActuationConfig()
        elif isinstance(config, str):
            # The shorthand "enforce" means every kind; a config object names the kinds one by one.
            config = ActuationConfig(mode=config, enforce=frozenset(IntentKind) if config == "enforce"  # type: ignore[arg-type]
                                     else frozenset())
        self.config = config
        if isinstance(actuators, Mapping):
            self.routes = {IntentKind(k): list(v) for k, v in actuators.items()}
        else:
            # A plain list: each actuator serves the kinds it declares, in list order (evidence first).
            self.routes = {}
            for a in actuators:
                for kind in getattr(a, "kinds", ()):
                    self.routes.setdefault(IntentKind(kind), []).append(a)
        self.ledger = ledger
        self.clock = clock
        self.sleep = sleep
        self.is_leader = is_leader or (lambda: True)
        self.on_result = on_result
        self.failpoints = failpoints or Failpoints()
        self.outbox_failed_total = 0
        self.outbox_settled_total = 0
        self.fence = fence
        self.fenced_total = 0  # writes refused because the lease was lost
        self._fenced_why: str | None = None  # the refusal already logged (one line per episode)
        self._bind()

    def _bind(self) -> None:
        """Wire actuators to each other's facilities so safety never depends on wiring by hand: long
        actions (drains) stop on the kill switch or lost leadership; pages link the latest evidence."""
        acts = {id(a): a for route in self.routes.values() for a in route}.values()
        links = [getattr(a, "link") for a in acts if callable(getattr(a, "link", None))]  # noqa: B009
        for a in acts:
            bind_stop = getattr(a, "bind_stop", None)
            if callable(bind_stop):
                bind_stop(self.should_stop)
            bind_evidence = getattr(a, "bind_evidence", None)
            if callable(bind_evidence) and links:
                bind_evidence(links[0])
            bind_fence = getattr(a, "bind_fence", None)
            if callable(bind_fence) and self.fence is not None:
                bind_fence(self.fence)
            bind_recall = getattr(a, "bind_recall", None)
            if callable(bind_recall):
                bind_recall(self._recall_for(a.name))

    def _recall_for(self, actuator: str) -> Callable[[], list[Intent]]:
        """The intents ``actuator`` applied, oldest first (what a pager must keep firing after a restart)."""
        def recall() -> list[Intent]:
            try:
                recs = [r for r in self.ledger.actions(status="applied", limit=100_000) if r.actuator == actuator]
            except StoreError as e:
                log.error("cannot recall what %s applied: %s", actuator, e)
                return []
            out: list[Intent] = []
            for r in sorted(recs, key=lambda r: (float(r.intent.get("ts", 0.0)), r.first_ts)):
                try:
                    out.append(intent_from_dict(r.intent))
                except (KeyError, ValueError, TypeError):
                    continue
            return out
        return recall

    # -- fencing -------------------------------------------------------------------------------------
    def fenced(self) -> str | None:
        """Why this replica must not write now (None: it may). Logged once per episode."""
        if self.fence is None:
            return None
        why = self.fence.check()
        if why is None:
            if self._fenced_why is not None:
                log.warning("actuation fence holds again (epoch %s)", self.fence.epoch)
            self._fenced_why = None
            return None
        self.fenced_total += 1
        if why != self._fenced_why:
            log.warning("not acting: %s; pending intents stay for the leader", why)
        self._fenced_why = why
        return why

    # -- kill switch ---------------------------------------------------------------------------------
    def kill(self, reason: str = "") -> None:
        """Stop all actuation now (persisted; resume() lifts it unless the config flag is set)."""
        self.ledger.set_setting(KILL_SETTING, json.dumps({"reason": reason, "ts": self.clock()}))
        log.warning("actuation kill switch engaged: %s", reason)

    def resume(self) -> None:
        self.ledger.set_setting(KILL_SETTING, None)

    @property
    def killed(self) -> bool:
        return self.config.kill_switch or self.ledger.get_setting(KILL_SETTING) is not None

    def should_stop(self) -> bool:
        """For long-running actuators (drain): stop when killed or no longer leader."""
        return self.killed or not self.is_leader()

    def enforces(self, kind: IntentKind) -> bool:
        return self.config.mode == "enforce" and kind in self.config.enforce

    # -- main entry points ---------------------------------------------------------------------------
    def submit(self, intent: Intent) -> list[ActionResult]:
        """Record the intent and, where enforced, carry it out."""
        if not self.is_leader():
            return [self._emit(intent, "-", "not_leader")]
        routes = self.routes.get(intent.kind, [])
        if not routes:
            return [self._emit(intent, "-", "unrouted")]
        results = []
        for act in routes:
            results.append(self._submit_one(intent, act))
        return results

    def submit_all(self, intents: Sequence[Intent]) -> list[ActionResult]:
        out: list[ActionResult] = []
        for it in intents:
            out.extend(self.submit(it))
        return out

    def drain(self, outbox: Outbox) -> list[ActionResult]:
        """Carry out every pending intent of the outbox (the store), oldest first; mark each one that
        settled. Call at start-up and once per cycle, after the cycle's commit."""
        if not self.is_leader():
            return []
        try:
            rows = outbox.intents(status="pending")
        except StoreError as e:
            log.error("outbox not drained this cycle: %s", e)
            return []
        if rows and self.fenced() is not None:  # asked only when there is something to write
            return []
        out: list[ActionResult] = []
        for row in rows:
            try:
                intent = intent_from_dict(row)
            except (KeyError, ValueError, TypeError) as e:
                self._settle(outbox, row["key"], "failed", {"-": f"unreadable intent: {type(e).__name__}: {e}"})
                continue
            if intent.key != row["key"]:
                self._settle(outbox, row["key"], "failed", {"-": f"stored intent rebuilds to key {intent.key}"})
                continue
            results = self.submit(intent)
            out.extend(results)
            status = self._outcome(results)
            if status is not None:
                self._settle(outbox, intent.key, status,
                             {r.actuator: r.error or r.detail.get("previous") or r.status for r in results},
                             intent)
        return out

    @staticmethod
    def _outcome(results: Sequence[ActionResult]) -> str | None:
        """What the intent settles as, or None while any actuator is still under way."""
        got = [r.detail.get("previous", "") if r.status == "duplicate" else r.status for r in results]
        if any(g not in SETTLED for g in got):
            return None
        for st in ("failed", "applied", "advised"):
            if st in got:
                return st
        return "unrouted"

    def _settle(self, outbox: Outbox, key: str, status: str, why: dict[str, Any],
                intent: Intent | None = None) -> None:
        try:
            outbox.mark_intent(key, status, json.dumps(why, sort_keys=True, default=str))
        except StoreError as e:  # stays pending: drained (as a duplicate) and marked next cycle
            log.error("intent %s not marked %s in the outbox: %s", key, status, e)
            return
        self.outbox_settled_total += 1
        if status == "failed":
            self.outbox_failed_total += 1
            what = f"{intent.kind} {intent.entity}" if intent is not None else key
            log.error("intent %s (key %s) FAILED for good, needs a human: %s", what, key,
                      "; ".join(f"{a}: {e}" for a, e in why.items()))

    def retry_due(self) -> list[ActionResult]:
        """Try again every action whose backoff has elapsed (call once per controller cycle)."""
        if not self.is_leader():
            self._forget_held()
            return []
        now = self.clock()
        out: list[ActionResult] = []
        due = self.ledger.due(now)
        if due and self.fenced() is not None:
            return out
        for rec in due:
            intent = intent_from_dict(rec.intent)
            act = next((a for a in self.routes.get(intent.kind, []) if a.name == rec.actuator), None)
            if act is None:
                continue
            if self.killed:  # stays 'retrying' in the ledger: resumed later, never lost
                out.append(self._emit(intent, act.name, "killed", attempts=rec.attempts, record=False))
                continue
            if not self.enforces(intent.kind):
                continue
            held = self._breaker(intent, now)
            if held is not None:
                out.append(self._hold(intent, act.name, held, rec.attempts, now))
                continue
            out.append(self._attempt(intent, act, rec.attempts))
        self._heartbeats()
        return out

    def _heartbeats(self) -> None:
        """Refresh what actuators keep alive (firing pages), as the fenced leader; failures are logged by
        the actuator and retried next cycle."""
        for a in self._actuators():
            beat = getattr(a, "heartbeat", None)
            if not callable(beat):
                continue
            try:
                beat(fenced=self.fenced)  # the fence is asked only when something is due
            except Exception:  # a heartbeat bug must not stop the cycle's actuation
                log.exception("heartbeat of %s failed", a.name)

    def _forget_held(self) -> None:
        for a in self._actuators():
            forget = getattr(a, "forget_held", None)
            if callable(forget):
                forget()

    def _actuators(self) -> list[Actuator]:
        return list({id(a): a for route in self.routes.values() for a in route}.values())

    def status(self) -> dict[str, Any]:
        kill = self.ledger.get_setting(KILL_SETTING)
        counts = self.ledger.counts()
        return {
            "mode": self.config.mode, "enforce": sorted(str(k) for k in self.config.enforce),
            "killed": self.killed, "kill": json.loads(kill) if kill else None,
            "kill_switch_config": self.config.kill_switch, "leader": self.is_leader(), "actions": counts,
            "outbox": {"settled_total": self.outbox_settled_total, "failed_total": self.outbox_failed_total},
            "fenced_total": self.fenced_total, "fenced": self._fenced_why,
            "epoch": None if self.fence is None else self.fence.epoch,
        }

    # -- internals -----------------------------------------------------------------------------------
    def _submit_one(self, intent: Intent, act: Actuator) -> ActionResult:
        rec = self.ledger.get(intent.key, act.name)
        if rec is not None and rec.status in FINAL_STATUSES:
            return self._emit(intent, act.name, "duplicate", attempts=rec.attempts,
                              detail={"previous": rec.status}, record=False)
        now = self.clock()
        if self.killed:
            return self._emit(intent, act.name, "killed", attempts=rec.attempts if rec else 0,
                              record=rec is None or rec.status in ("advised", "killed"))
        if not self.enforces(intent.kind):
            return self._emit(intent, act.name, "advised")
        if rec is not None and rec.status == "retrying" and rec.next_ts is not None and rec.next_ts > now:
            return self._emit(intent, act.name, "waiting", attempts=rec.attempts,
                              detail={"next_ts": rec.next_ts}, record=False)
        held = self._breaker(intent, now)
        if held is not None:
            return self._hold(intent, act.name, held, rec.attempts if rec else 0, now)
        return self._attempt(intent, act, rec.attempts if rec else 0)

    def _hold(self, intent: Intent, actuator: str, why: str, attempts: int, now: float) -> ActionResult:
        # Held, not dropped: due again when the breaker's window may have room (retry_due picks it up).
        self.ledger.record_status(intent, actuator, "breaker", now, error=why,
                                  next_ts=now + min(self.config.breaker_window_s, self.config.backoff_max_s))
        return self._emit(intent, actuator, "breaker", attempts=attempts, error=why, record=False)

    def _breaker(self, intent: Intent, now: float) -> str | None:
        """Why this isolation must wait, or None. Counts distinct entities, so a retried drain or the
        evidence step of the same quarantine never trips it."""
        limit = self.config.breaker_max_entities
        if limit is None or intent.kind not in ISOLATING or intent.tier in (Tier.POD, Tier.INSTANCE):
            return None
        recent = self.ledger.entities_acted([str(k) for k in ISOLATING], now - self.config.breaker_window_s)
        if intent.entity in recent or len(recent) < limit:
            return None
        return (f"circuit breaker: {len(recent)} entities isolated in the last "
                f"{self.config.breaker_window_s:.0f}s (limit {limit})")

    def _backoff(self, n: int) -> float:
        return float(min(self.config.backoff_max_s, self.config.backoff_initial_s * (2 ** max(0, n - 1))))

    def _attempt(self, intent: Intent, act: Actuator, done: int) -> ActionResult:
        cfg = self.config
        tries = 0
        while True:
            if self.killed:
                return self._emit(intent, act.name, "killed", attempts=done, record=done == 0)
            if not self.is_leader():
                return self._emit(intent, act.name, "not_leader", attempts=done, record=False)
            why = self.fenced()
            if why is not None:  # nothing written, nothing recorded: pending for the new leader
                return ActionResult(intent.key, str(intent.kind), intent.entity, act.name, "fenced", done, why)
            prev = self.ledger.get(intent.key, act.name)
            if prev is not None and prev.status == "started":
                # the process (or the leader before a failover) died between this call and its record
                log.warning("re-applying %s %s on %s: the last call's result was never recorded",
                            intent.kind, intent.entity, act.name)
            self.ledger.record_status(intent, act.name, "started", self.clock(),
                                      detail={"attempt": done + tries + 1})
            try:
                outcome = act.apply(intent)
            except Fenced as e:  # the object carries a newer leader's epoch: this one must not touch it
                self.fenced_total += 1
                log.warning("not acting on %s %s: %s", intent.kind, intent.entity, e)
                self.ledger.record_status(intent, act.name, "fenced", self.clock(), error=str(e))
                return ActionResult(intent.key, str(intent.kind), intent.entity, act.name, "fenced", done, str(e))
            except Exception as e:  # an actuator bug must not lose the intent: record it, retry later
                log.exception("actuator %s raised on %s", act.name, intent.key)
                outcome = Outcome.failure(f"{type(e).__name__}: {e}", retry=True)
            if outcome.ok:
                self.failpoints.hit("after-apply")
            tries += 1
            now = self.clock()
            n = done + tries
            if outcome.ok:
                self.ledger.record_attempt(intent, act.name, outcome, now, "applied")
                return self._emit(intent, act.name, "applied", n, detail=outcome.detail, record=False)
            # "in_progress": the actuator is making progress under its own deadline (a drain waiting on
            # disruption budgets): not a failure, so it does not use up max_attempts.
            in_progress = bool(outcome.detail.get("in_progress"))
            if not outcome.retry or (n >= cfg.max_attempts and not in_progress):
                self.ledger.record_attempt(intent, act.name, outcome, now, "failed")
                return self._emit(intent, act.name, "failed", n, outcome.error, outcome.detail, record=False)
            wait = self._backoff(n)
            self.ledger.record_attempt(intent, act.name, outcome, now, "retrying", next_ts=now + wait)
            if tries >= cfg.attempts_per_cycle or in_progress:
                return self._emit(intent, act.name, "retrying", n, outcome.error, outcome.detail, record=False)
            self.sleep(wait)

    def _emit(self, intent: Intent, actuator: str, status: str, attempts: int = 0, error: str = "",
              detail: dict[str, Any] | None = None, record: bool = True) -> ActionResult:
        if record and status in ("advised", "killed", "unrouted"):
            self.ledger.record_status(intent, actuator, status, self.clock(), error=error, detail=detail)
        res = ActionResult(key=intent.key, kind=str(intent.kind), entity=intent.entity, actuator=actuator,
                           status=status, attempts=attempts, error=error, detail=detail or {})
        log.info("%s", json.dumps({"actuation": res.to_dict(), "reason": intent.reason}, default=str))
        if self.on_result is not None:
            self.on_result(res)
        return res
