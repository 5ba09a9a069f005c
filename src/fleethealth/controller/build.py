"""Assemble a running controller from its config: sources, state store, actuation runner (advise by
default), optional Kubernetes / Alertmanager / evidence actuators, and the HTTP endpoint.

This is the imperative shell: everything with a socket or a file is created here and handed to the loop
behind its small interface, so the loop itself stays testable with fakes.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleethealth.act.ledger import Ledger
from fleethealth.act.outcome import Actuator
from fleethealth.act.router import RouterActuator, WeightBoard, weights_document
from fleethealth.act.runner import ActuationRunner
from fleethealth.controller.config import ControllerConfig
from fleethealth.controller.loop import Clock, Controller
from fleethealth.decide.model import IntentKind
from fleethealth.decide.state import Event
from fleethealth.policy import Policy, load_policy
from fleethealth.signals.snapshot import InputIssue, Snapshot, SnapshotBuilder
from fleethealth.sources.base import Source

log = logging.getLogger("fleethealth.controller")


class FileSource:
    """Exposition or table files re-read every cycle (a textfile-collector directory, a recording).
    Exposition samples without a timestamp are observed at ``now``. Unreadable files are source errors."""

    def __init__(self, paths: Sequence[str], name: str | None = None) -> None:
        self.paths = list(paths)
        self.name = name or "files:" + ",".join(self.paths)

    def _files(self) -> list[Path]:
        out: list[Path] = []
        for p in map(Path, self.paths):
            out.extend(sorted(x for x in p.iterdir() if x.is_file()) if p.is_dir() else [p])
        return out

    def read(self, now: float) -> Snapshot:
        from fleethealth.sources.exposition import parse_exposition
        from fleethealth.sources.tables import InputError, read_table, table_format

        b = SnapshotBuilder()
        for f in self._files():
            try:
                if table_format(f) is not None:
                    snap = read_table(f)
                else:
                    snap = parse_exposition(f.read_bytes(), default_ts=now, source=str(f))
            except InputError as e:
                b.source_errors.append(InputIssue(str(f), 0, str(e)))
                continue
            except OSError as e:
                b.source_errors.append(InputIssue(str(f), 0, f"cannot read: {e.strerror or e}"))
                continue
            b.extend_snapshot(snap)
        return b.build(now)


def ledger_path(state_db: str | None) -> str:
    """The actuation ledger's database: on PostgreSQL the state store's own (every replica shares it);
    with SQLite a file beside the state file."""
    from fleethealth.store.db import is_postgres_url

    if state_db is None or state_db == ":memory:":
        return ":memory:"
    if is_postgres_url(state_db):
        return state_db
    p = Path(state_db.removeprefix("sqlite:///"))
    return str(p.with_name(p.stem + ".actions.db"))


@dataclass
class Assembly:
    config: ControllerConfig
    policy: Policy
    controller: Controller
    runner: ActuationRunner
    board: WeightBoard
    store: Any
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self.closers):
            try:
                c()
            except Exception as e:  # closing is best effort; report and go on
                log.warning("close failed: %s", e)


def build_sources(cfg: ControllerConfig, policy: Policy) -> tuple[list[Source], list[Callable[[], None]]]:
    sources: list[Source] = []
    closers: list[Callable[[], None]] = []
    s = cfg.sources
    if s.prometheus is not None:
        from fleethealth.sources.prometheus import PrometheusSource

        prom = PrometheusSource(
            s.prometheus.url, policy, timeout_s=s.prometheus.timeout_s, headers=s.prometheus.headers,
            extra_metrics=s.prometheus.extra_metrics, matchers=s.prometheus.matchers,
            gauge_mode=s.prometheus.gauge_mode,
        )
        sources.append(prom)
        closers.append(prom.close)
    if s.scrape is not None:
        from fleethealth.sources.scrape import ScrapeSource, ScrapeTarget

        scr = ScrapeSource(
            [ScrapeTarget(t.url, dict(t.labels), t.job,
                          s.scrape.honor_labels if t.honor_labels is None else t.honor_labels)
             for t in s.scrape.targets],
            timeout_s=s.scrape.timeout_s, concurrency=s.scrape.concurrency,
        )
        sources.append(scr)
        closers.append(scr.close)
    for k in s.kernel_logs:
        from fleethealth.sources.kernel_log import KernelLogSource

        sources.append(KernelLogSource(path=k.path, command=k.command, node=k.node))
    if s.files:
        sources.append(FileSource(s.files))
    return sources, closers


def _with_remediation_results(events: Callable[[float], list[Event]],
                              remediator: Any) -> Callable[[float], list[Event]]:
    """Active-test results, then finished node remediations (a reboot's result moves the ladder on). A
    remediator whose resource kind is not installed in the cluster (404) is skipped quietly."""

    def both(now: float) -> list[Event]:
        out = list(events(now))
        try:
            out.extend(remediator.results(now))
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise
        return out

    return both


def _active_test_events(tests: Any) -> Callable[[float], list[Event]]:
    """Finished active-test rounds become events for the decisions layer, each exactly once. A round (the
    tests one RUN_ACTIVE_TEST started) passes only when all its Jobs passed: never one Job's verdict alone."""
    seen: set[tuple[str, str]] = set()

    def poll(now: float) -> list[Event]:
        out = []
        for r in tests.rounds():
            key = (r.entity, r.round)
            if r.verdict not in ("passed", "failed") or key in seen:
                continue
            seen.add(key)
            out.append(Event(now, "active_test", r.entity, passed=r.verdict == "passed", actor=f"job/{r.job}"))
        return out

    return poll


def build(cfg: ControllerConfig, *, clock: Clock | None = None, policy: Policy | None = None,
          node_filter: Callable[[Mapping[str, str]], bool] | None = None) -> Assembly:
    """Everything but the HTTP endpoint and the run loop. Raises PolicyError / StoreError with one line.
    ``node_filter``: which Kubernetes nodes (by their labels) are this controller's (a shard's pools):
    the others are left out of its inventory, and their active-test and remediation results with them."""
    from fleethealth.act.failpoint import Failpoints
    from fleethealth.memory import tune_process_memory

    tune_process_memory()  # a 100k-GPU cycle's arrays would otherwise be faulted in afresh every cycle
    policy = policy or load_policy(cfg.policy)
    failpoints = Failpoints.from_env()
    closers: list[Callable[[], None]] = []
    sources, src_closers = build_sources(cfg, policy)
    closers += src_closers

    store = None
    if cfg.state_db is not None:
        from fleethealth.store import open_store

        store = open_store(cfg.state_db)
        closers.append(store.close)
    ledger = Ledger(ledger_path(cfg.state_db))
    closers.append(ledger.close)

    board = WeightBoard()
    kube = None
    actuators: list[Actuator] = []
    is_leader: Callable[[], bool] | None = None
    elector: Any = None
    events: Callable[[float], list[Event]] | None = None
    gpu_capacity: Callable[[], Mapping[str, int]] | None = None
    inventory: Callable[[], Mapping[str, Sequence[str]] | None] | None = None
    pre: list[Callable[[float], None]] = []
    if cfg.kubernetes is not None:
        from fleethealth.act.active_test import ActiveTests
        from fleethealth.act.inventory import read_inventory
        from fleethealth.act.kube import KubeNodeActuator
        from fleethealth.act.kube_api import Kube, OfficialKubeApi
        from fleethealth.act.lease import LeaseElector

        k = cfg.kubernetes
        api = (OfficialKubeApi.from_host(k.host, k.token, k.verify_ssl) if k.host
               else OfficialKubeApi.from_config(k.kubeconfig, k.context))
        kube = Kube(api)
        tests = ActiveTests(kube, cfg.actuation)
        if k.leader_election:
            elector = LeaseElector(kube, k.identity or f"{socket.gethostname()}-{os.getpid()}", k.lease_name,
                                   k.lease_namespace, lease_duration_s=k.lease_duration_s,
                                   # a standby sees the Lease expire within 2 retry periods: at most half
                                   # a cycle, so take-over stays within the lease duration plus one cycle
                                   retry_period_s=min(k.lease_duration_s / 7.5, cfg.interval_s / 4))
            is_leader = elector.is_leader
            closers.append(elector.release)
            closers.append(elector.stop)  # closed in reverse: stop stepping, then give the Lease up
        node_act = KubeNodeActuator(kube, cfg.actuation, active_tests=tests)
        actuators.append(node_act)
        actuators.append(tests)
        events = _active_test_events(tests)
        if k.node_remediation is not None:
            from fleethealth.act.remediation import NodeRemediator, RemediatorConfig

            nr = k.node_remediation
            node_act.remediator = NodeRemediator(kube, RemediatorConfig(
                via=nr.via, api_version=nr.api_version, kind=nr.kind, plural=nr.plural, namespace=nr.namespace,
                spec=dict(nr.spec), job_template=nr.job_template))
            events = _with_remediation_results(events, node_act.remediator)
        cache: dict[str, Any] = {"at": None, "cap": {}}

        def capacity() -> Mapping[str, int]:
            import time as _t

            if cache["at"] is None or _t.monotonic() - cache["at"] > k.inventory_every_s:
                inv = read_inventory(kube, cfg.actuation, with_events=False)
                cache["cap"] = {n: i.gpu_capacity for n, i in inv.nodes.items()
                                if i.gpu_capacity > 0 and (node_filter is None or node_filter(i.labels))}
                cache["at"] = _t.monotonic()
            return dict(cache["cap"])

        gpu_capacity = capacity

        def known_nodes() -> Mapping[str, Sequence[str]]:
            # Every GPU node Kubernetes knows gets a tuple, unknown if its exporter never reported.
            return {"node": sorted(capacity())}

        inventory = known_nodes
        if node_filter is not None and events is not None:
            every = events

            def own_events(now: float) -> list[Event]:
                mine = set(capacity())  # another shard's node's results are that shard's to take
                return [e for e in every(now) if e.entity.split("/", 1)[0] in mine]

            events = own_events
    if cfg.evidence is not None:
        from fleethealth.act.evidence import EvidenceCollector, EvidenceIndex, PrometheusRange

        index = EvidenceIndex(Path(cfg.evidence.dir) / "index.db")
        prom_range = PrometheusRange(cfg.sources.prometheus.url) if cfg.sources.prometheus else None
        # evidence first: a bundle is captured before a node is drained or quarantined
        actuators.insert(0, EvidenceCollector(cfg.evidence.dir, index, prometheus=prom_range, kube=kube,
                                              window_s=cfg.evidence.window_s))
    actuators.append(RouterActuator(board, kube, cfg.actuation))
    if cfg.alertmanager is not None:
        from fleethealth.act.pager import AlertmanagerPager

        actuators.append(AlertmanagerPager(cfg.alertmanager.url))

    routes: dict[IntentKind, list[Actuator]] = {}
    for a in actuators:
        for kind in getattr(a, "kinds", ()):
            routes.setdefault(kind, []).append(a)
    # Fencing: before every external write, the Lease still held at this leader's epoch and the store's
    # claim still ours (act.fence); a zombie leader writes nothing.
    from fleethealth.act.fence import Fence, Fences, LeaseFence, StoreFence

    fences: list[Fence] = [LeaseFence(elector)] if elector is not None else []
    if store is not None:
        fences.append(StoreFence(store))
    runner = ActuationRunner(routes, ledger, cfg.actuation, is_leader=is_leader, failpoints=failpoints,
                             fence=Fences(fences) if fences else None)

    static_cap = dict(cfg.sources.gpu_capacity)
    if gpu_capacity is not None and static_cap:
        dyn = gpu_capacity

        def merged() -> Mapping[str, int]:
            return {**dyn(), **static_cap}  # the config file wins: an operator's explicit number

        cap_fn: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = merged
    else:
        cap_fn = gpu_capacity or static_cap or None

    ctl = Controller(
        policy, sources, interval_s=cfg.interval_s, clock=clock, store=store, runner=runner,
        history_s=cfg.history_s, gpu_capacity=cap_fn, events=events, inventory=inventory,
        weights=lambda now: weights_document(board.weights, now), is_leader=is_leader, failpoints=failpoints,
    )
    ctl.pre_cycle.extend(pre)
    from fleethealth.act.pager import page_open

    for a in actuators:  # a held page stops being refreshed once its condition is gone from the state
        bind_open = getattr(a, "bind_open", None)
        if callable(bind_open):
            bind_open(lambda intent: page_open(ctl.state, intent))
    if elector is not None:
        elector.on_acquired = ctl.wake
        elector.step()  # the first answer before the first cycle; then its own thread renews
        elector.start()
    return Assembly(cfg, policy, ctl, runner, board, store, closers)
