"""The reconcile loop: every interval, read the sources, fold them into the rolling history, add the
structural signals, score, decide, persist, and hand the intents to the actuation runner.

Theory of operation
- One cycle at a time, on one thread. ``cycle(now)`` is the whole step and takes the time as an argument,
  so tests drive cycles directly with a fake clock; ``run()`` only schedules cycles on a Clock.
- Ticks are aligned to ``start + k * interval``. A cycle that takes longer than the interval is an
  overrun: counted, logged, and the ticks it ran over are skipped (the next cycle starts at the next
  tick in the future). Cycles never stack and never run concurrently.
- A source that fails (or, against its contract, raises) is recorded with its error; its entities get
  no fresh samples and go stale in the scorer: lower confidence, value unknown, never healthy. The
  decisions layer then refuses to remediate on them, and a fleet-wide drop freezes remediation.
- A read that could not read some metrics (a source's ``unread_metrics``: the Prometheus source's failed
  or partial queries; everything, for a source that raised) supports no absence conclusion
  (``AbsenceHold``): the structural tracker counts a node's GPUs among its fresh samples while ``up``
  says the node is alive, so GPU queries failing (or, before Prometheus died, read one scrape older than
  ``up``) would read as every GPU gone, a hard gate. While GPU metrics are unread, a node's
  ``gpus_missing`` (and, while anything is unread, ``series_vanished``) is not emitted above what it last
  was: the node goes stale, unknown; a GPU that really fell off is counted when the reads work again
  (its Xid 79 and kernel-log gates, where their queries answer, do not wait for that). A GPU query that
  fails on every read keeps new GPU absence unseen for as long: the source reads partial with its error
  every cycle, and ``fleethealth_absence_held`` counts what is held back.
- After each cycle the controller publishes an immutable ``Published`` record (a single reference swap),
  which the HTTP endpoint reads without locks.
- Commit, then act: the cycle's state, transitions and intents are committed in one transaction (the
  intents ``pending``: the outbox), and only then does the runner drain the store's pending intents
  (``ActuationRunner.drain``), once at start-up and after every commit. A process killed in between
  (``FLEETHEALTH_FAILPOINT=after-commit`` does it on purpose) finds them pending when it, or the replica
  that takes over, starts again.
- Leadership (``is_leader``): only the Lease holder decides, commits and acts. A standby reads its sources,
  scores (its read endpoints show the fleet; its lifecycle states are those it last loaded) and keeps its
  history warm, so its first cycle as leader scores on a full window; on taking over it reloads the state
  from the store (the last leader's last commit) and drains the outbox.
- What nodes are expected to report by their past (the structural tracker's memory: the most GPUs each
  node has had, and their ids) is saved to the store after a committed cycle whenever it changed, and
  read back at start and on taking over: a GPU that fell off the bus before a restart, or while the
  controller was down, is still expected (``gpus_missing``), and its GPU is shown unknown, never dropped.
- Warm-up: the first cycle after start only fills the history and scores (shown, not decided): every
  counter rate and burn rate needs a second sample, and deciding on one scrape would read the whole fleet
  as low confidence (a fleet freeze and page on every restart, or every node held). ``warm_up = False``
  (``run --once``) decides at once.
- A locked, busy or unreachable store (``StoreError``) is one line in the log and a skipped cycle: the
  state stays at the last commit, nothing acts on a decision that was not saved, the next tick tries again.
- Fencing: taking over claims the store (``claim``) before loading it; a deposed leader that still
  believes it leads gets ``StoreFenced`` on its next commit and skips, so it never overwrites the new
  leader's state (and, skipping, never acts).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.ma  # noqa: F401  (np.unique imports it on its first call: at start, not in the first cycle)

from fleethealth.act.failpoint import Failpoints
from fleethealth.decide.loop import DecisionLoop
from fleethealth.decide.model import Intent, Transition
from fleethealth.decide.state import DecisionState, Event
from fleethealth.policy import Policy
from fleethealth.score.engine import FleetHealth, Scorer
from fleethealth.score.expect import FamilyMemory
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot
from fleethealth.sources.base import Source
from fleethealth.sources.structural import GPUS_MISSING, SERIES_VANISHED, StructuralTracker
from fleethealth.store.base import StoreError

log = logging.getLogger("fleethealth.controller")


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall clock; ``sleep`` wakes early when ``stop`` is set."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop or threading.Event()

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.stop.wait(max(0.0, seconds))


class IntentSink(Protocol):
    """The actuation runner (fleethealth.act.runner.ActuationRunner) or anything shaped like it."""

    def submit_all(self, intents: Sequence[Intent]) -> Sequence[Any]: ...

    def retry_due(self) -> Sequence[Any]: ...

    def drain(self, outbox: Any) -> Sequence[Any]: ...


@dataclass(slots=True)
class SourceStatus:
    name: str
    last_attempt: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    errors_total: int = 0
    reads_total: int = 0
    last_read_s: float = 0.0
    last_samples: int = 0
    last_errors: int = 0  # errors in the last read (one per failed endpoint, query or file)
    last_data: bool = False  # the last read returned signal samples (beyond per-target up/duration)

    @property
    def up(self) -> bool:
        """Down when the last read failed outright; a read where some endpoints failed but data came
        back is up and ``partial`` (those endpoints' entities go stale one by one)."""
        return self.last_attempt is not None and (self.last_errors == 0 or self.last_data)

    @property
    def partial(self) -> bool:
        return self.up and self.last_errors > 0

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "name": self.name, "up": self.up, "partial": self.partial, "last_errors": self.last_errors,
            "last_success": self.last_success,
            "age_s": None if self.last_success is None else round(now - self.last_success, 3),
            "last_error": self.last_error, "errors_total": self.errors_total, "reads_total": self.reads_total,
            "last_read_s": round(self.last_read_s, 6), "last_samples": self.last_samples,
        }


@dataclass(slots=True)
class CycleReport:
    ts: float
    duration_s: float
    stage_s: dict[str, float]
    samples: int
    source_errors: list[InputIssue]
    transitions: list[Transition]
    intents: list[Intent]
    actions: list[Any]
    overran: bool = False
    stage_cpu_s: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    skipped: str = ""  # why decide/commit/act did not run (standby, store busy); "" when they did

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts, "duration_s": round(self.duration_s, 6),
            "stage_s": {k: round(v, 6) for k, v in self.stage_s.items()}, "samples": self.samples,
            "cpu_s": round(self.cpu_s, 6), "stage_cpu_s": {k: round(v, 6) for k, v in self.stage_cpu_s.items()},
            "source_errors": [str(e) for e in self.source_errors],
            "transitions": len(self.transitions), "intents": len(self.intents), "overran": self.overran,
            "skipped": self.skipped,
        }


@dataclass(frozen=True, slots=True)
class Published:
    """What the HTTP endpoint shows: the last completed cycle (immutable once published)."""

    ts: float
    health: FleetHealth | None
    state: DecisionState
    report: CycleReport | None
    sources: tuple[dict[str, Any], ...]
    counters: Mapping[str, Any]
    recent_intents: tuple[dict[str, Any], ...]
    recent_transitions: tuple[dict[str, Any], ...]
    weights: Mapping[str, Any] = field(default_factory=dict)


class AbsenceHold:
    """No absence conclusion from a read that could not read everything (see the module docstring).

    Keeps the absence values last emitted per node: the last derived snapshot while reads are complete
    (nothing copied on the hot path), a dict while some are not (an outage: a loop over the derived rows).
    """

    def __init__(self, gpu_metric_prefix: str) -> None:
        self.gpu_metric_prefix = gpu_metric_prefix
        self._last: Snapshot | dict[tuple[str, LabelSet], float] | None = None
        self.held = 0  # samples held back by the last cycle

    def _last_values(self) -> dict[tuple[str, LabelSet], float]:
        last = self._last
        if isinstance(last, dict):
            return last
        if last is None:
            return {}
        return {(last.metrics[m], last.labelsets[s]): v for m, s, v in
                zip(last.metric_ids.tolist(), last.series_ids.tolist(), last.values.tolist(), strict=True)}

    def apply(self, derived: Snapshot, unread: Collection[str]) -> Snapshot:
        """``derived`` without the absence samples that rose while metrics they rest on were unread."""
        self.held = 0
        if not unread:
            self._last = derived
            return derived
        gpu_unread = "*" in unread or any(m.startswith(self.gpu_metric_prefix) for m in unread)
        held_metrics = {SERIES_VANISHED, GPUS_MISSING} if gpu_unread else {SERIES_VANISHED}
        last = self._last_values()
        keep = np.ones(len(derived), bool)
        for i, (m, s, v) in enumerate(zip(derived.metric_ids.tolist(), derived.series_ids.tolist(),
                                          derived.values.tolist(), strict=True)):
            key = (derived.metrics[m], derived.labelsets[s])
            if key[0] in held_metrics and v > last.get(key, 0.0):
                keep[i] = False  # missing data, not absence: the node's last value stands until it is stale
            else:
                last[key] = v
        self._last = last
        self.held = int((~keep).sum())
        if not self.held:
            return derived
        return Snapshot(
            at=derived.at, metrics=derived.metrics, labelsets=derived.labelsets,
            metric_ids=derived.metric_ids[keep], series_ids=derived.series_ids[keep],
            values=derived.values[keep], ts=derived.ts[keep],
            issues=list(derived.issues), source_errors=list(derived.source_errors),
        )


def _has_signal_samples(snap: Snapshot) -> bool:
    if len(snap) == 0:
        return False
    synthetic = [i for i, m in enumerate(snap.metrics) if m in ("up", "scrape_duration_seconds")]
    return not bool(np.isin(snap.metric_ids, synthetic).all()) if synthetic else True


class Controller:
    def __init__(
        self,
        policy: Policy,
        sources: Sequence[Source],
        *,
        interval_s: float = 15.0,
        clock: Clock | None = None,
        store: Any = None,
        runner: IntentSink | None = None,
        history_s: float = 3600.0,
        gpu_capacity: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None,
        inventory: Callable[[], Mapping[str, Sequence[str]] | None] | None = None,
        events: Callable[[float], Sequence[Event]] | None = None,
        weights: Callable[[float], Mapping[str, Any]] | None = None,
        keep_recent: int = 2000,
        is_leader: Callable[[], bool] | None = None,
        failpoints: Failpoints | None = None,
    ) -> None:
        self.policy = policy
        self.sources = list(sources)
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        self.clock: Clock = clock or SystemClock(self.stop_event)
        self.runner = runner
        # The per-cycle core shared with `replay` and `backtest`: history -> score -> decide -> persist
        # (``store``: fleethealth.store.StateStore; None keeps the state in memory only).
        self._scorer = Scorer()  # what the engine keeps between cycles: this controller's stream alone
        self.loop = DecisionLoop(policy, store=store, scorer=self._score,
                                 history=SignalHistory(policy, memory_s=history_s))
        self.history = self.loop.history
        self._inventory_now: Mapping[str, Sequence[str]] | None = None
        self._score_s = 0.0
        self._score_cpu_s = 0.0
        self.structural = StructuralTracker(
            node_labels=policy.node_labels, max_age_s=policy.freshness.max_age_s,
            future_skew_s=policy.freshness.future_skew_s,
        )
        self.absence_hold = AbsenceHold(self.structural.gpu_metric_prefix)
        self._unread: set[str] = set()  # metrics some source could not (fully) read this cycle
        self._capacity = gpu_capacity
        # What each node is expected to have by its past (the tracker's memory) lives in the store too,
        # so a restart (or a standby taking over) still expects a GPU that fell off the bus before.
        self._memory_saved: dict[str, tuple[int, list[str]]] = {}
        self._memory_version = -1
        # ... and which signal families each node's GPUs and each replica reported (the prior), and why
        # GPUs that report nothing are expected (declared: capacity, or the node's past)
        self.families = FamilyMemory()
        self._declared: dict[str, str] = {}
        self._restore_expectations()
        self._inventory = inventory
        self._events = events
        self._weights = weights
        self._pending_events: list[Event] = []
        self._wants_bus_map = any(hasattr(s, "set_bus_map") for s in self.sources)
        self._bus_map: dict[tuple[str, str], str] = {}
        self._cycle_snaps: list[Snapshot] = []
        self._events_lock = threading.Lock()
        self.source_status = {s.name: SourceStatus(s.name) for s in self.sources}
        self.cycles_total = 0
        self.targets_down = 0
        self.slowest_scrape_s = 0.0
        self.overruns_total = 0
        self.skipped_ticks_total = 0
        self.cycle_seconds_sum = 0.0
        self.last_cycle_s = 0.0
        self.intents_total: dict[str, int] = {}
        self.transitions_total: dict[tuple[str, str], int] = {}
        self.recent_intents: deque[dict[str, Any]] = deque(maxlen=keep_recent)
        self.recent_transitions: deque[dict[str, Any]] = deque(maxlen=keep_recent)
        self.published = Published(
            ts=0.0, health=None, state=self.loop.state, report=None, sources=(), counters={}, recent_intents=(),
            recent_transitions=(),
        )
        self.on_cycle: Callable[[CycleReport], None] | None = None
        self.is_leader = is_leader or (lambda: True)
        self.failpoints = failpoints or Failpoints()
        self._leading: bool | None = None  # as of the last cycle; None before the first
        self._wake = threading.Event()  # set by wake(): run the next cycle now (a standby just took over)
        self._queued = 0  # how many of the events taken this cycle came from the store's inbox
        self.store_errors_total = 0
        self.takeovers_total = 0
        self._history_warm = False  # the history holds a scrape from before this cycle
        self.warm_up = True  # the first cycle after start only fills the history (False: decide at once)
        self.last_takeover_ts: float | None = None
        # Edge work due before each cycle (leader-election renewals, inventory refresh); failures are logged.
        self.pre_cycle: list[Callable[[float], None]] = []

    # -- inputs from outside the loop (HTTP API: human acks, active-test results) --------------------
    def add_event(self, event: Event) -> None:
        """An operator's event (ack, active-test result): into the store's inbox when it has one, so the
        leader takes it whichever replica it was posted to; else (or if the store fails) kept here."""
        store = self.loop.store
        if store is not None and hasattr(store, "put_event"):
            try:
                store.put_event(event.to_dict())
                return
            except StoreError as e:
                log.error("event kept in memory, the store's inbox failed: %s", e)
        with self._events_lock:
            self._pending_events.append(event)

    def _take_events(self, now: float) -> list[Event]:
        store = self.loop.store
        queued: list[Event] = []
        if store is not None and hasattr(store, "pending_events"):
            try:  # removed from the inbox by this cycle's commit, not before
                queued = [Event.from_dict(d) for d in store.pending_events()]
            except StoreError as e:
                log.error("inbox not read this cycle: %s", e)
            except (KeyError, ValueError, TypeError) as e:
                log.error("inbox holds an unreadable event, ignored: %s", e)
        with self._events_lock:
            out, self._pending_events = self._pending_events, []
        if self._events is not None:
            try:
                out.extend(self._events(now))
            except Exception as e:  # an event feed is an edge: its failure must not stop the loop
                log.error("event source failed: %s", e)
        self._queued = len(queued)
        return queued + out

    # -- one cycle ---------------------------------------------------------------------------------
    def _read_sources(self, now: float) -> tuple[int, list[InputIssue]]:
        samples = 0
        errors: list[InputIssue] = []
        self._unread = set()
        # Kernel-log sources map PCI bus ids to GPU indices through the exporters' labels, so they read
        # after every other source, with the map of what was just read (and remembered from before).
        ordered = sorted(self.sources, key=lambda s: hasattr(s, "set_bus_map"))
        mapped = False
        for src in ordered:
            if hasattr(src, "set_bus_map") and not mapped:
                self._refresh_bus_map()
                mapped = True
            if hasattr(src, "set_bus_map"):
                src.set_bus_map(self._bus_map)
            st = self.source_status[src.name]
            t0 = time.perf_counter()
            try:
                snap = src.read(now)
            except Exception as e:  # the Source contract says never raise; a bug there must not stop us
                log.exception("source %s raised", src.name)
                snap = Snapshot.empty(now)
                snap.source_errors.append(InputIssue(src.name, 0, f"source raised {type(e).__name__}: {e}"))
                self._unread.add("*")  # what it covers is unknown: nothing it covers was read
            else:
                self._unread.update(getattr(src, "unread_metrics", ()))
            st.last_read_s = time.perf_counter() - t0
            st.last_attempt = now
            st.reads_total += 1
            st.last_samples = len(snap)
            samples += len(snap)
            own = list(snap.source_errors)
            st.last_errors = len(own)
            st.last_data = _has_signal_samples(snap)
            if own:
                st.errors_total += 1
                more = f" (+{len(own) - 3} more)" if len(own) > 3 else ""
                st.last_error = "; ".join(f"{e.source}: {e.reason}" for e in own[:3])[:500] + more
                log.warning("source %s: %s", src.name, st.last_error)
            else:
                st.last_error = None
            if st.up:
                st.last_success = now
            errors.extend(own)
            self.history.add(snap)
            if not hasattr(src, "set_bus_map") and self._wants_bus_map:
                self._cycle_snaps.append(snap)
        return samples, errors

    def _refresh_bus_map(self) -> None:
        from fleethealth.sources.kernel_log import bus_map_from_snapshot

        for snap in self._cycle_snaps:
            self._bus_map.update(bus_map_from_snapshot(snap))
        self._cycle_snaps = []

    def _capacity_now(self) -> Mapping[str, int] | None:
        if self._capacity is None:
            return None
        if callable(self._capacity):
            try:
                return self._capacity()
            except Exception as e:
                log.error("gpu capacity lookup failed: %s", e)
                return None
        return self._capacity

    @property
    def state(self) -> DecisionState:
        return self.loop.state

    def _score(self, view: Snapshot, policy: Policy, now: float, consumer: str) -> FleetHealth:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self._scorer.score(view, policy, now, consumer=consumer, inventory=self._inventory_now,
                                      expectations=self.families.expectations(now, self._declared))
        finally:
            self._score_s += time.perf_counter() - t0
            self._score_cpu_s += time.thread_time() - c0

    def cycle(self, now: float | None = None) -> CycleReport:
        """One reconcile step as of ``now`` (default: the clock)."""
        t_start, c_start = time.perf_counter(), time.thread_time()
        now = self.clock.now() if now is None else now
        stage: dict[str, float] = {}
        cpu: dict[str, float] = {}  # CPU seconds of the loop's thread: wall time lies on a shared machine
        for hook in self.pre_cycle:
            try:
                hook(now)
            except Exception as e:
                log.error("pre-cycle hook failed: %s", e)

        t0, c0 = time.perf_counter(), time.thread_time()
        samples, errors = self._read_sources(now)
        stage["read"], cpu["read"] = time.perf_counter() - t0, time.thread_time() - c0

        # Structural signals need the whole picture (the node's other series, its history), so they are
        # derived from the history view and fed into the cycle as one more snapshot.
        t0, c0 = time.perf_counter(), time.thread_time()
        view = self.history.view(now)
        structural = self.structural.observe(view, now, self._capacity_now())
        self.targets_down = len(structural.targets_down)
        self.slowest_scrape_s = max(structural.scrape_seconds.values(), default=0.0)
        derived = self.absence_hold.apply(structural.snapshot, self._unread)
        if self.absence_hold.held:
            log.info("%d absence sample(s) held: metrics unread this cycle (%s)", self.absence_hold.held,
                     ", ".join(sorted(self._unread)[:5]) + (" ..." if len(self._unread) > 5 else ""))
        derived.source_errors = errors + derived.source_errors  # the view above consumed them
        # The history keeps every input issue it was given; a long-running loop only needs the recent ones.
        if len(self.history.issues) > 5000:
            del self.history.issues[:-1000]
        self._inventory_now = None
        if self._inventory is not None:
            try:
                self._inventory_now = self._inventory()
            except Exception as e:
                log.error("inventory lookup failed: %s", e)
        # GPUs a node is known to have had and that do not all report now: shown, unknown, never dropped
        short = self.structural.expected_gpus(structural)
        self._declared = _declared_gpus(short, structural.gpus_expected, self._capacity_now())
        if short:
            inv = {k: list(v) for k, v in (self._inventory_now or {}).items()}
            inv.setdefault("gpu", []).extend(f"{nm}/gpu{g}" for nm, gs in short.items() for g in gs)
            self._inventory_now = inv
        stage["structural"], cpu["structural"] = time.perf_counter() - t0, time.thread_time() - c0

        t0, c0 = time.perf_counter(), time.thread_time()
        self._score_s = self._score_cpu_s = 0.0
        leading = self.is_leader()
        skipped = "" if leading else "standby: another replica holds the Lease"
        if leading and self._leading is not True:
            skipped = self._take_over(now)
        self._leading = leading and not skipped
        if not skipped and not self._history_warm and self.warm_up:
            # The first scrape after start only fills the history: every counter rate and burn rate needs a
            # second sample, so deciding now would read the whole fleet as low confidence (a fleet freeze
            # and a page, or every node held) on every restart.
            skipped = "warming up: the first scrape only fills the history (rates need two samples)"
        decision = None
        health = self.published.health
        self._history_warm = True
        if skipped:
            self.history.add(derived)  # a standby keeps its history warm for the day it takes over
            # and scores, so its read endpoints (the Service sends readers to either pod) show the fleet
            health = self._score(self.history.view(now), self.policy, now, "remediation")
        else:
            events = self._take_events(now)
            try:
                result = self.loop.cycle(derived, now, events)
            except StoreError as e:
                # Not saved, so not acted on: the state stays at the last commit and the next tick retries.
                with self._events_lock:  # the inbox's stay there (the commit that removes them failed)
                    self._pending_events[:0] = events[self._queued:]
                self.store_errors_total += 1
                skipped = f"state store: {e}"
                log.error("cycle at %.3f skipped, its decisions not saved: %s", now, e)
            else:
                decision, health = result.decision, result.health
                if health is not None:
                    self.families.learn(health, now)
                self._save_expectations(now)
        core, core_cpu = time.perf_counter() - t0, time.thread_time() - c0
        stage["score"], cpu["score"] = self._score_s, self._score_cpu_s
        stage["decide_persist"], cpu["decide_persist"] = core - self._score_s, core_cpu - self._score_cpu_s

        t0, c0 = time.perf_counter(), time.thread_time()
        actions: list[Any] = []
        transitions = decision.transitions if decision is not None else []
        intents = decision.intents if decision is not None else []
        for tr in transitions:
            log.info("transition %s %s -> %s (%s)", tr.entity, tr.from_state, tr.to_state, tr.reason)
        for it in intents:
            log.info("intent %s %s (%s) key=%s", it.kind, it.entity, it.reason, it.key)
        if intents:
            self.failpoints.hit("after-commit")  # committed, not yet acted on: the outbox's test point
        if decision is not None:
            actions = self._act(intents)
        stage["act"], cpu["act"] = time.perf_counter() - t0, time.thread_time() - c0

        duration = time.perf_counter() - t_start
        report = CycleReport(now, duration, stage, samples, list(derived.source_errors), transitions,
                             intents, actions, overran=duration > self.interval_s,
                             stage_cpu_s=cpu, cpu_s=time.thread_time() - c_start, skipped=skipped)
        self._account(report, health)
        return report

    def _take_over(self, now: float) -> str:
        """Becoming the leader (or starting as one): resume from the store, the last leader's last commit.
        Returns why the cycle must be skipped, or ""."""
        store = self.loop.store
        if store is None:
            return ""
        try:
            if hasattr(store, "claim"):  # first claim (fences off the old leader's writes), then load
                store.claim(f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}")
            loaded = store.load()
        except StoreError as e:
            self.store_errors_total += 1
            log.error("cannot take over, state store: %s", e)
            return f"state store: {e}"
        self.loop.state = loaded if loaded is not None else DecisionState()
        self._restore_expectations()
        # whatever the decider kept from states it decided on before (a leader regaining the Lease) is
        # not about this state: start it afresh
        self.loop.decider = type(self.loop.decider)(self.policy)
        if self._leading is not None:  # a standby taking over (not the first cycle of a lone replica)
            self.takeovers_total += 1
            self.last_takeover_ts = now
            last = self.loop.state.last_ts
            log.warning("took over as leader; resuming from the state committed at %s",
                        "nothing (fresh store)" if last is None else f"{last:.3f}")
        return ""

    def _restore_expectations(self) -> None:
        """The tracker's memory back from the store (``gpus`` rows: the most GPUs and their ids)."""
        store = self.loop.store
        if store is None or not hasattr(store, "expectations"):
            return
        try:
            rows = store.expectations()
        except StoreError as e:
            log.error("cannot read what nodes are expected to report, state store: %s", e)
            return
        for entity in self.families.restore(rows):
            log.error("state store: unreadable signal families of %s", entity)
        mem: dict[str, tuple[int, list[str]]] = {}
        for (entity, what), value in rows.items():
            if what == "gpus":
                try:
                    d = json.loads(value)
                    mem[entity] = (int(d["count"]), [str(g) for g in d.get("ids", [])])
                except (ValueError, KeyError, TypeError):
                    log.error("state store: unreadable expectation of %s: %r", entity, value[:80])
        self.structural.restore(mem)
        self._memory_saved.update(mem)

    def _save_expectations(self, now: float) -> None:
        """After a committed cycle: what the tracker learned of nodes since it last saved (only when its
        memory may have changed)."""
        store = self.loop.store
        tr = self.structural
        if store is None or not hasattr(store, "save_expectations"):
            return
        fam_rows = self.families.rows()
        if tr.memory_version == self._memory_version and not fam_rows:
            return
        mem = tr.memory()
        rows = {(nm, "gpus"): json.dumps({"count": n, "ids": ids}) for nm, (n, ids) in mem.items()
                if self._memory_saved.get(nm) != (n, ids)}
        rows.update({(nm, "gpus"): "" for nm in self._memory_saved if nm not in mem})
        rows.update(fam_rows)
        try:
            if rows:
                store.save_expectations(rows, now)
        except StoreError as e:  # kept in memory; saved with the next cycle that reaches the store
            log.error("what nodes are expected to report not saved: %s", e)
            self.families.undo_rows(fam_rows)
            return
        self._memory_saved = mem
        self._memory_version = tr.memory_version

    def _act(self, intents: Sequence[Intent]) -> list[Any]:
        """Hand the committed intents to the runner: the store's whole outbox when there is a store,
        else (no store: nothing survives a restart anyway) this cycle's intents."""
        if self.runner is None:
            return []
        store = self.loop.store
        try:
            if store is not None and hasattr(store, "mark_intent"):
                out = list(self.runner.drain(store))
            else:
                out = list(self.runner.submit_all(intents))
            return out + list(self.runner.retry_due())
        except StoreError as e:  # the ledger's database is locked or gone: pending, drained next cycle
            log.error("actuation skipped this cycle: %s", e)
        except Exception:  # an actuator bug must not stop the loop; the ledger has the details
            log.exception("actuation failed")
        return []

    def drain_outbox(self) -> list[Any]:
        """What start-up does before the first cycle: carry out what a previous run committed and never
        acted on (only as leader; a standby drains when it takes over)."""
        if self.loop.store is None or not self.is_leader():
            return []
        return self._act([])

    def _account(self, report: CycleReport, health: FleetHealth | None) -> None:
        self.cycles_total += 1
        self.last_cycle_s = report.duration_s
        self.cycle_seconds_sum += report.duration_s
        if report.overran:
            self.overruns_total += 1
            log.warning("cycle took %.3f s, longer than the %.3f s interval", report.duration_s, self.interval_s)
        for it in report.intents:
            k = str(it.kind)
            self.intents_total[k] = self.intents_total.get(k, 0) + 1
            self.recent_intents.append(it.to_dict())
        for tr in report.transitions:
            key = (str(tr.from_state), str(tr.to_state))
            self.transitions_total[key] = self.transitions_total.get(key, 0) + 1
            self.recent_transitions.append(tr.to_dict())
        weights: Mapping[str, Any] = {}
        if self._weights is not None:
            try:
                weights = dict(self._weights(report.ts))
            except Exception as e:
                log.error("weights lookup failed: %s", e)
        self.published = Published(
            ts=report.ts, health=health, state=self.state, report=report,
            sources=tuple(s.to_dict(report.ts) for s in self.source_status.values()),
            counters={
                "cycles_total": self.cycles_total, "overruns_total": self.overruns_total,
                "skipped_ticks_total": self.skipped_ticks_total, "cycle_seconds_sum": self.cycle_seconds_sum,
                "last_cycle_s": self.last_cycle_s, "intents_total": dict(self.intents_total),
                "transitions_total": dict(self.transitions_total), "interval_s": self.interval_s,
                "targets_down": self.targets_down, "slowest_scrape_s": self.slowest_scrape_s,
                "store_errors_total": self.store_errors_total, "takeovers_total": self.takeovers_total,
                "leader": bool(self._leading), "absence_held": self.absence_hold.held,
            },
            recent_intents=tuple(self.recent_intents), recent_transitions=tuple(self.recent_transitions),
            weights=weights,
        )
        if self.on_cycle is not None:
            self.on_cycle(report)

    # -- scheduling ----------------------------------------------------------------------------------
    def run(self, max_cycles: int | None = None) -> None:
        """Run cycles on the clock until ``stop()`` (or ``max_cycles``)."""
        start = self.clock.now()
        for hook in self.pre_cycle:  # leader election first: only the leader drains
            try:
                hook(start)
            except Exception as e:
                log.error("pre-cycle hook failed: %s", e)
        try:
            self.drain_outbox()
        except Exception:
            log.exception("start-up drain of the outbox failed")
        tick = 0
        done = 0
        while not self.stop_event.is_set():
            due = start + tick * self.interval_s
            now = self.clock.now()
            if now < due:
                woken = self._sleep(due - now)
                if self.stop_event.is_set():
                    break
                if woken:  # leadership just came: the first cycle as leader now, ticks aligned from here
                    start, tick = self.clock.now(), 0
            try:
                self.cycle()
            except Exception:
                # A bug in scoring or deciding is reported and retried next tick rather than killing the
                # process: the last published state stays visible and /healthz turns unhealthy.
                log.exception("cycle failed")
            done += 1
            if max_cycles is not None and done >= max_cycles:
                break
            after = self.clock.now()
            next_tick = max(tick + 1, math.floor((after - start) / self.interval_s) + 1)
            skipped = next_tick - tick - 1
            if skipped > 0:
                self.skipped_ticks_total += skipped
                log.warning("skipped %d tick(s) after an overrun", skipped)
            tick = next_tick

    def wake(self) -> None:
        """Start the next cycle now rather than at its tick (the Lease elector calls it on taking over)."""
        self._wake.set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep until the next tick; True when wake() cut it short."""
        if not isinstance(self.clock, SystemClock):
            self.clock.sleep(seconds)
            return False
        woken = self._wake.wait(max(0.0, seconds)) and not self.stop_event.is_set()
        self._wake.clear()
        return woken

    def stop(self) -> None:
        self.stop_event.set()
        self._wake.set()
        if isinstance(self.clock, SystemClock):
            self.clock.stop.set()  # a clock shared with another controller wakes too


def _declared_gpus(short: Mapping[str, Sequence[str]], expected: Mapping[str, int],
                   capacity: Mapping[str, int] | None) -> dict[str, str]:
    """Why each GPU of a node short of GPUs is expected (shown by explain): the node's declared capacity
    when that says so, else the node's own past (kept in the state store)."""
    out: dict[str, str] = {}
    for nm, gpus in short.items():
        n = int(expected.get(nm, 0))
        cap = int((capacity or {}).get(nm, 0))
        why = (f"GPU capacity {cap} (nvidia.com/gpu or gpu_capacity)" if cap and cap >= n
               else f"the node had {n} GPUs (prior, kept in the state store)")
        for g in gpus:
            out[f"{nm}/gpu{g}"] = why
    return out
