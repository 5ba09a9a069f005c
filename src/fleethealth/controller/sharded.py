"""A sharded replica: ``fleethealth run`` with a ``shards`` section. Several replicas share the fleet; each
holds some shards through one Kubernetes Lease per shard (``act.shard_leases``) and runs one controller
per shard it holds (the imperative shell around ``controller.shards``).

Theory of operation
- A shard's controller is the ordinary one (``controller.build``), given the shard's part of everything:
  its Prometheus selectors carry the shard's label matcher (``pool=~"a|b"``), so it reads only its pools
  from the store (Prometheus, Thanos, Mimir, VictoriaMetrics); its Kubernetes inventory and active-test
  results are only its pools' nodes; its state, outbox, ledger and fencing token live in the shard's own
  part of the database (PostgreSQL: schema ``fleethealth_shard_<name>`` of the one database every replica
  shares; SQLite: a file per shard), so two shards never write the same row, and a deposed holder of a
  shard is fenced off by the new holder's claim exactly as a deposed leader is.
- It decides and acts only while this replica holds the shard's Lease (``is_leader``); when the Lease
  is lost (another replica took it, or this one could not renew) its controller stops. Taking a shard
  starts a controller for it: it claims the shard's store, loads the last holder's state, drains its
  outbox; its first cycle fills the history (rates need two samples) and decisions resume on the next.
- The fleet-wide telemetry-loss freeze: after each decided cycle the shard's counts of entities in
  service and at low confidence are published in the shard's Lease (renewed every retry period); before
  each cycle the other shards' counts (a stale shard's as all low confidence) are handed to the shard's
  decider, which adds them to its own before applying ``fleet.low_confidence_fraction``. So every shard
  freezes when the fleet's share crosses the threshold, whichever shard lost its telemetry.
- On ``listen`` a replica serves ``/healthz`` (503 while a shard it holds has not completed a cycle for
  three intervals) and ``/metrics`` (per shard: held here, cycles, last cycle's CPU, the published counts
  and whether each shard's publication is stale as seen here). The per-entity API (``/api/v1/*``) of the
  one-controller mode is not served here yet. Log lines carry the shard (thread ``shard-<name>``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fleethealth.controller.config import ControllerConfig
from fleethealth.controller.shards import Publication, ShardSpec, owns_pool, shard_matcher
from fleethealth.decide.decider import Decider
from fleethealth.policy import Policy, load_policy

log = logging.getLogger("fleethealth.shards")


# -- the freeze's counts, in and out of a shard's decider ------------------------------------------------
@dataclass(slots=True)
class FleetCounts:
    """What the shard's decider adds to its own confidence counts (``peers``: the other shards' in service
    and low confidence) and what it counted itself in its last decided cycle (``own``)."""

    peers: tuple[int, int] = (0, 0)
    own: tuple[int, int] | None = None


def shard_decider(counts: FleetCounts) -> type[Decider]:
    """A Decider whose fleet-wide confidence counts include the other shards'. A class per shard (the
    controller makes a fresh decider of the same type on taking over, and it must see the same counts)."""

    class ShardDecider(Decider):
        def _confidence_counts(self, c: Any, obs: Mapping[str, Any]) -> tuple[int, int]:
            total, low = super()._confidence_counts(c, obs)
            counts.own = (total, low)
            peers_total, peers_low = counts.peers
            return total + peers_total, low + peers_low

    return ShardDecider


# -- a shard's part of the configuration ---------------------------------------------------------------
def schema_name(shard: str) -> str:
    return "fleethealth_shard_" + shard.replace("-", "_")


def shard_state_db(state_db: str | None, shard: str) -> str | None:
    """PostgreSQL: the same database, the shard's own schema (``options=-c search_path=...``); SQLite: a
    file per shard beside the configured one; ``:memory:`` and None as they are."""
    from fleethealth.store.db import is_postgres_url

    if state_db is None or state_db == ":memory:":
        return state_db
    if is_postgres_url(state_db):
        parts = urlsplit(state_db)
        q = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
        q.append(("options", f"-c search_path={schema_name(shard)}"))
        return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(q), parts.fragment))
    path = state_db.removeprefix("sqlite:///")
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{shard}.{ext}" if dot and "/" not in ext else f"{path}.{shard}"


def shard_specs(cfg: ControllerConfig) -> list[ShardSpec]:
    assert cfg.shards is not None
    return [ShardSpec(s.name, tuple(s.pools), s.matcher, s.rest) for s in cfg.shards.shards]


def shard_config(cfg: ControllerConfig, spec: ShardSpec, specs: Sequence[ShardSpec]) -> ControllerConfig:
    """The controller config of one shard: its matcher on the Prometheus source, its state database, no
    Lease of its own (the shard's Lease is held by the replica), no HTTP endpoint."""
    assert cfg.shards is not None and cfg.sources.prometheus is not None and cfg.kubernetes is not None
    prom = cfg.sources.prometheus
    matcher = shard_matcher(spec, specs, cfg.shards.label)
    matchers = ",".join(m for m in (prom.matchers, matcher) if m)
    sources = cfg.sources.model_copy(update={"prometheus": prom.model_copy(update={"matchers": matchers})})
    return cfg.model_copy(update={
        "sources": sources, "state_db": shard_state_db(cfg.state_db, spec.name), "listen": None, "shards": None,
        "kubernetes": cfg.kubernetes.model_copy(update={"leader_election": False}),
    })


def ensure_schema(state_db: str | None, shard: str) -> None:
    """Create the shard's schema in the shared PostgreSQL database (idempotent)."""
    from fleethealth.store.db import PgConn, is_postgres_url

    if state_db is None or not is_postgres_url(state_db):
        return
    conn = PgConn(state_db)
    try:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema_name(shard)}")
    finally:
        conn.close()


# -- one shard's controller on its own thread -------------------------------------------------------------
@dataclass
class ShardRun:
    shard: str
    counts: FleetCounts = field(default_factory=FleetCounts)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    assembly: Any = None
    started_at: float = field(default_factory=time.time)


class ShardedReplica:
    """One replica of a sharded controller (see the module docstring). ``run()`` blocks until ``stop()``."""

    def __init__(self, cfg: ControllerConfig, *, policy: Policy | None = None, kube: Any = None) -> None:
        from fleethealth.act.kube_api import Kube, OfficialKubeApi
        from fleethealth.act.shard_leases import ShardLeases

        if cfg.shards is None or cfg.kubernetes is None:
            raise ValueError("a sharded replica needs the 'shards' and 'kubernetes' sections")
        self.cfg = cfg
        self.policy = policy or load_policy(cfg.policy)
        self.specs = shard_specs(cfg)
        k = cfg.kubernetes
        if kube is None:
            api = (OfficialKubeApi.from_host(k.host, k.token, k.verify_ssl) if k.host
                   else OfficialKubeApi.from_config(k.kubeconfig, k.context))
            kube = Kube(api)
        self.identity = k.identity or f"{socket.gethostname()}-{os.getpid()}"
        self._publications: dict[str, str] = {}
        self._runs: dict[str, ShardRun] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        sh = cfg.shards
        retry = min(k.lease_duration_s / 7.5, cfg.interval_s / 4)
        self.leases = ShardLeases(
            kube, self.identity, [s.name for s in self.specs], prefix=sh.lease_prefix, namespace=k.lease_namespace,
            lease_duration_s=k.lease_duration_s, retry_period_s=retry, grace_s=sh.grace_s,
            stale_after_s=sh.stale_after_s if sh.stale_after_s is not None
            else k.lease_duration_s + 3 * cfg.interval_s,
            publication=self._publications.get, on_acquired=self._acquired, on_lost=self._lost)

    # -- lease callbacks (on the lease thread: quick) -------------------------------------------------
    def _acquired(self, shard: str) -> None:
        with self._lock:
            if self._stopped.is_set() or shard in self._runs:
                return
            run = self._runs[shard] = ShardRun(shard)
            run.thread = threading.Thread(target=self._run_shard, args=(run,), name=f"shard-{shard}", daemon=True)
            run.thread.start()

    def _lost(self, shard: str) -> None:
        with self._lock:
            run = self._runs.pop(shard, None)
        if run is not None:
            run.stop.set()
            if run.assembly is not None:
                run.assembly.controller.stop()

    # -- a shard's controller ------------------------------------------------------------------------------
    def _build(self, run: ShardRun) -> Any:
        from fleethealth.controller.build import build

        spec = next(s for s in self.specs if s.name == run.shard)
        scfg = shard_config(self.cfg, spec, self.specs)
        ensure_schema(self.cfg.state_db, spec.name)
        label = self.cfg.shards.label if self.cfg.shards is not None else "pool"
        asm = build(scfg, policy=self.policy,
                    node_filter=lambda labels: owns_pool(spec, self.specs, labels.get(label)))
        ctl = asm.controller
        shard = run.shard

        def holds() -> bool:
            return not run.stop.is_set() and self.leases.holds(shard)

        ctl.is_leader = holds
        asm.runner.is_leader = holds
        ctl.loop.decider = shard_decider(run.counts)(self.policy)

        def peers(now: float) -> None:
            run.counts.peers = self.leases.peer_counts(shard)

        def publish(report: Any) -> None:
            own = run.counts.own
            if not report.skipped and own is not None:
                self._publications[shard] = Publication(own[0], own[1], float(report.ts)).to_annotation()

        ctl.pre_cycle.append(peers)
        ctl.on_cycle = publish
        return asm

    def _run_shard(self, run: ShardRun) -> None:
        while not run.stop.is_set():
            try:
                run.assembly = self._build(run)
                break
            except Exception as e:  # the store or Prometheus not reachable yet: the Lease is kept, retried
                log.error("shard %s: cannot start its controller: %s: %s", run.shard, type(e).__name__, e)
                run.stop.wait(self.cfg.interval_s)
        asm = run.assembly
        if asm is None:
            return
        if run.stop.is_set():
            asm.close()
            return
        log.warning("shard %s: controller started, reading %s", run.shard,
                    ", ".join(getattr(s, "matchers", "") or s.name for s in asm.controller.sources))
        try:
            asm.controller.run()
        except Exception:
            log.exception("shard %s: controller failed", run.shard)
        finally:
            asm.close()
            log.warning("shard %s: controller stopped", run.shard)

    # -- what it serves ---------------------------------------------------------------------------------
    def health(self, now: float) -> tuple[bool, str]:
        """Unhealthy while a shard held here has not completed a cycle for three intervals (a stuck
        controller keeps its Lease renewed by the lease thread, so the probe is what replaces it)."""
        late = []
        with self._lock:
            runs = list(self._runs.values())
        for r in runs:
            asm = r.assembly
            last = asm.controller.published.ts if asm is not None else 0.0
            started = r.started_at
            if now - max(last, started) > 3 * self.cfg.interval_s + 30.0:
                late.append(r.shard)
        if late:
            return False, f"no cycle completed lately in shard(s) {', '.join(late)}"
        return True, "ok"

    def metrics_text(self) -> str:
        held = set(self.held())
        stale = set(self.leases.stale())
        lines = ["# TYPE fleethealth_shard_held gauge", "# TYPE fleethealth_shard_publication_stale gauge",
                 "# TYPE fleethealth_shard_cycles_total counter", "# TYPE fleethealth_shard_last_cycle_cpu_seconds gauge",
                 "# TYPE fleethealth_shard_in_service gauge", "# TYPE fleethealth_shard_low_confidence gauge",
                 f"fleethealth_shard_fair_share {self.leases.last_plan.fair_share}"]
        with self._lock:
            runs = dict(self._runs)
        for s in self.specs:
            lab = f'{{shard="{s.name}"}}'
            lines.append(f"fleethealth_shard_held{lab} {int(s.name in held)}")
            lines.append(f"fleethealth_shard_publication_stale{lab} {int(s.name in stale)}")
            pub = Publication.from_annotation(self._publications.get(s.name))
            if pub is not None and s.name in held:
                lines.append(f"fleethealth_shard_in_service{lab} {pub.in_service}")
                lines.append(f"fleethealth_shard_low_confidence{lab} {pub.low_confidence}")
            r = runs.get(s.name)
            ctl = r.assembly.controller if r is not None and r.assembly is not None else None
            if ctl is not None:
                rep = ctl.published.report
                lines.append(f"fleethealth_shard_cycles_total{lab} {ctl.cycles_total}")
                lines.append(f"fleethealth_shard_last_cycle_cpu_seconds{lab} {rep.cpu_s if rep else 0.0}")
        return "\n".join(lines) + "\n"

    def serve(self, host: str, port: int) -> Any:
        """/healthz and /metrics on a daemon thread; returns the server (``shutdown()`` stops it)."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        replica = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/healthz":
                    ok, why = replica.health(time.time())
                    code, body, ctype = (200 if ok else 503), why + "\n", "text/plain"
                elif self.path == "/metrics":
                    code, body, ctype = 200, replica.metrics_text(), "text/plain; version=0.0.4"
                else:
                    code, body, ctype = 404, "not found\n", "text/plain"
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        httpd = ThreadingHTTPServer((host, port), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, name="shard-http", daemon=True).start()
        return httpd

    # -- the process ----------------------------------------------------------------------------------------
    def start(self) -> ShardedReplica:
        self.leases.step()
        self.leases.start()
        return self

    def run(self) -> None:
        """Until ``request_stop()`` (a signal handler may call it), then a clean ``stop()``."""
        self.start()
        self._stopped.wait()
        self.stop()

    def request_stop(self) -> None:
        self._stopped.set()

    def held(self) -> list[str]:
        return self.leases.held()

    def stop(self) -> None:
        """Stop every shard's controller, then give the Leases up so other replicas take over at once."""
        self._stopped.set()
        self.leases.stop()
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for r in runs:
            r.stop.set()
            if r.assembly is not None:
                r.assembly.controller.stop()
        for r in runs:
            if r.thread is not None:
                r.thread.join(30)
        self.leases.release_all()
