"""A sharded replica: ``fleethealth run`` with a ``shards`` section. Several replicas share the fleet; each
holds some shards through one Kubernetes Lease per shard (``act.shard_leases``) and runs one controller
process per shard it holds (the imperative shell around ``controller.shards``).

Theory of operation
- A shard's controller is the ordinary one (``controller.build``), given the shard's part of everything:
  its Prometheus selectors carry the shard's label matcher (``pool=~"a|b"``), so it reads only its pools
  from the store (Prometheus, Thanos, Mimir, VictoriaMetrics); its Kubernetes inventory and active-test
  results are only its pools' nodes; its state, outbox, ledger and fencing token live in the shard's own
  part of the database (PostgreSQL: schema ``fleethealth_shard_<name>`` of the one database every replica
  shares; SQLite: a file per shard), so two shards never write the same row, and a deposed holder of a
  shard is fenced off by the new holder's claim exactly as a deposed leader is; before every external
  write its runner checks the shard's Lease is still held at the epoch it took it (``ShardLeaseFence``).
- The Leases are renewed on a thread of the replica's process; each shard's controller runs in a process
  of its own (spawned ahead as a spare with the libraries imported, so a take-over does not wait for an
  interpreter's start), because a shard's cycle holds the interpreter for seconds at a time (decoding the
  store's answer), which would starve the renewals, and because shards then use a core each. The two
  share a few numbers (``slots``): the Lease deadline, the peers' counts in, the shard's counts out.
- A shard's controller decides and acts only while the replica's Lease deadline for it is ahead on the
  shared monotonic clock (``is_leader``); when the Lease is lost (another replica took it, or this one
  could not renew) its process is told to stop, and it dies with the replica if the replica is killed. Taking a shard
  starts a controller for it: it claims the shard's store, loads the last holder's state, drains its
  outbox, and decides on its first cycle (no warm-up: its first read of the store covers the whole rate
  window, so rates have their samples).
- The fleet-wide telemetry-loss freeze: after each decided cycle the shard's counts of entities in
  service and at low confidence (the decision's ``confidence_counts``) are published in the shard's Lease
  (renewed every retry period); before each cycle the other shards' counts (a stale shard's as all low
  confidence) are handed to the shard's decider through its public input (``DecisionLoop.fleet_peers``,
  ``Decider.decide(fleet_peers=...)``), which adds them to its own before applying
  ``fleet.low_confidence_fraction``. So every shard
  freezes when the fleet's share crosses the threshold, whichever shard lost its telemetry.
- On ``listen`` a replica serves ``/healthz`` (503 while a shard it holds has not completed a cycle for
  three intervals), ``/metrics`` (per shard: held here, cycles, last cycle's CPU, the published counts
  and whether each shard's publication is stale as seen here) and, for the shards it holds, the
  one-controller API (``/api/v1/shards/<shard>/<endpoint>`` or ``/api/v1/<endpoint>?pool=<pool>``:
  reads and the authenticated, audited writes, served by the shard's process); a shard held elsewhere
  is answered with one line naming its holder (``controller.shard_api``). A shard's log lines carry its
  name.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import secrets
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from fleethealth.controller.config import ControllerConfig
from fleethealth.controller.shards import Publication, ShardSpec, owns, shard_matcher
from fleethealth.policy import Policy, load_policy

log = logging.getLogger("fleethealth.shards")


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
        # %20, not +, for the space: libpq decodes percent-escapes only
        return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(q, quote_via=quote), parts.fragment))
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


# -- one shard's controller in its own process ------------------------------------------------------------
# The shared slots between a replica and a shard's process (multiprocessing.Array of doubles).
(HELD_UNTIL, PEERS_TOTAL, PEERS_LOW, OWN_TOTAL, OWN_LOW, OWN_TS, STOP, CYCLES, LAST_CPU, LAST_TS, EPOCH,
 API_PORT) = range(12)
N_SLOTS = 12


def kube_client(cfg: ControllerConfig) -> Any:
    from fleethealth.act.kube_api import Kube, OfficialKubeApi

    k = cfg.kubernetes
    assert k is not None
    return Kube(OfficialKubeApi.from_host(k.host, k.token, k.verify_ssl) if k.host
                else OfficialKubeApi.from_config(k.kubeconfig, k.context))


class ShardLeaseFence:
    """act.fence's Lease check for a shard's process: before every external write, the replica's deadline
    for the shard ahead and the shard's Lease (one GET) held by this replica at the epoch it took it at.
    It puts no epoch on node writes: different shards' Leases count their epochs apart, and a node moved
    to another shard's pool must not look newer than that shard's writes."""

    epoch = None

    def __init__(self, kube: Any, namespace: str, name: str, identity: str, slots: Any) -> None:
        self.kube, self.namespace, self.name, self.identity, self.slots = kube, namespace, name, identity, slots

    def check(self) -> str | None:
        from fleethealth.act.kube_api import KubeError

        if self.slots[STOP] or time.monotonic() >= self.slots[HELD_UNTIL]:
            return f"{self.identity} does not hold the Lease {self.namespace}/{self.name} (renew deadline passed)"
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
        except KubeError as err:
            return f"cannot confirm the Lease {self.namespace}/{self.name}: {err.status} {err.reason}".strip()
        spec = lease.get("spec") or {}
        holder, epoch = spec.get("holderIdentity") or "", int(spec.get("leaseTransitions") or 0)
        if holder != self.identity or epoch != int(self.slots[EPOCH]):
            return (f"the Lease {self.namespace}/{self.name} is held by {holder or 'no one'} at epoch {epoch}, "
                    f"not by {self.identity} at epoch {int(self.slots[EPOCH])}")
        return None


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the replica that started it dies (a SIGKILLed replica must not
    leave a shard's controller behind; it would stop deciding at its Lease deadline anyway)."""
    import contextlib
    import ctypes
    import signal as _signal

    # not Linux: the Lease deadline and the parent check still stop it acting
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(_signal.SIGKILL))  # PR_SET_PDEATHSIG


def shard_main(cfg_data: dict[str, Any], slots: Any, parent: int, log_level: int, identity: str,
               assignment: Any, api_secret: str = "") -> None:
    """A shard's process: started as a spare (libraries imported, policy loaded) that waits on
    ``assignment`` (a Pipe end) for (shard, Lease name); then its controller, deciding and acting only
    while ``slots[HELD_UNTIL]`` (the replica's Lease deadline on the shared monotonic clock) is ahead,
    stopping when ``slots[STOP]`` is set or the replica is gone. A spare makes a take-over cost the
    Lease's expiry and one cycle, not an interpreter's start."""
    _die_with_parent()
    import fleethealth.score.scorer  # noqa: F401  (imported while spare: the take-over does not wait)
    import fleethealth.sources.prometheus  # noqa: F401
    from fleethealth.controller.build import build

    if api_secret:
        import uvicorn  # noqa: F401  (with FastAPI, seconds to import: done while spare)

        import fleethealth.controller.api  # noqa: F401
        import fleethealth.controller.security  # noqa: F401
        import fleethealth.controller.shard_api  # noqa: F401

    cfg = ControllerConfig.model_validate(cfg_data)
    specs = shard_specs(cfg)
    policy = load_policy(cfg.policy)
    label = cfg.shards.label if cfg.shards is not None else "pool"
    while not assignment.poll(0.5):
        if slots[STOP] or os.getppid() != parent:
            return
    got = assignment.recv()
    if got is None:
        return
    shard, lease = got
    spec = next(s for s in specs if s.name == shard)
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s [{shard}]: %(message)s")
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, log_level))
    while True:
        if slots[STOP] or os.getppid() != parent:
            return
        try:
            ensure_schema(cfg.state_db, shard)
            asm = build(shard_config(cfg, spec, specs), policy=policy,
                        node_filter=lambda labels: owns(spec, specs, labels, label))
            break
        except Exception as e:  # the store or Prometheus not reachable yet: the Lease is kept, retried
            log.error("shard %s: cannot start its controller: %s: %s", shard, type(e).__name__, e)
            time.sleep(cfg.interval_s)
    ctl = asm.controller
    # No warm-up cycle: a shard reads a Prometheus-compatible store, whose first read covers the whole
    # rate window (the history the last holder read too), so a shard taken over decides on its first cycle
    ctl.warm_up = False

    def holds() -> bool:
        return not slots[STOP] and time.monotonic() < slots[HELD_UNTIL]

    ctl.is_leader = holds
    asm.runner.is_leader = holds
    # fencing: the shard's Lease (not the replica's, which has none) and the shard's store claim
    from fleethealth.act.fence import Fences, StoreFence

    assert cfg.kubernetes is not None
    fence = Fences([ShardLeaseFence(kube_client(cfg), cfg.kubernetes.lease_namespace, lease, identity, slots),
                    *([StoreFence(asm.store)] if asm.store is not None else [])])
    asm.runner.fence = fence
    for a in {id(a): a for route in asm.runner.routes.values() for a in route}.values():
        bind = getattr(a, "bind_fence", None)
        if callable(bind):
            bind(fence)

    def peers(now: float) -> None:  # the decider's public input for the fleet-wide freeze (Decider.decide)
        ctl.loop.fleet_peers = (int(slots[PEERS_TOTAL]), int(slots[PEERS_LOW]))

    def report(rep: Any) -> None:
        own = ctl.loop.confidence_counts  # this cycle's own counts, without the peers'
        if not rep.skipped and own is not None:
            slots[OWN_TOTAL], slots[OWN_LOW], slots[OWN_TS] = float(own[0]), float(own[1]), float(rep.ts)
        slots[CYCLES] += 1
        slots[LAST_CPU], slots[LAST_TS] = rep.cpu_s, rep.ts
        if api_secret and not api_started.is_set():  # after the first cycle: it competes for no CPU with it
            api_started.set()
            threading.Thread(target=serve_api, name="shard-api", daemon=True).start()

    def serve_api() -> None:  # the shard's /api/v1, which the replica's listener forwards to (shard_api)
        from fleethealth.controller.shard_api import serve_shard_api

        try:
            slots[API_PORT] = float(serve_shard_api(asm, api_secret).port)
        except Exception as e:  # no API is no reason to stop deciding: the replica answers 503 for it
            log.error("shard %s: cannot serve its API: %s: %s", shard, type(e).__name__, e)

    api_started = threading.Event()
    ctl.pre_cycle.append(peers)
    ctl.on_cycle = report

    def watch() -> None:
        while not (slots[STOP] or os.getppid() != parent):
            time.sleep(0.2)
        ctl.stop()

    threading.Thread(target=watch, name="shard-watch", daemon=True).start()
    log.warning("shard %s: controller started, reading %s", shard,
                ", ".join(getattr(s, "matchers", "") or s.name for s in ctl.sources))
    try:
        ctl.run()
    finally:
        asm.close()
        log.warning("shard %s: controller stopped", shard)


@dataclass
class ShardRun:
    shard: str  # "" while a spare
    slots: Any
    proc: Any
    assignment: Any  # the replica's end of the spare's Pipe
    started_at: float = field(default_factory=time.time)


class ShardedReplica:
    """One replica of a sharded controller (see the module docstring): the Leases on a thread of this
    process, each held shard's controller in a process of its own (a shard's cycle holds the interpreter
    for seconds at a time; the Leases must be renewed meanwhile, and shards use a core each).
    ``run()`` blocks until ``request_stop()``."""

    def __init__(self, cfg: ControllerConfig, *, policy: Policy | None = None, kube: Any = None) -> None:
        from fleethealth.act.shard_leases import ShardLeases

        if cfg.shards is None or cfg.kubernetes is None:
            raise ValueError("a sharded replica needs the 'shards' and 'kubernetes' sections")
        self.cfg = cfg
        self.policy = policy or load_policy(cfg.policy)  # validated here: a bad policy fails the start
        self.specs = shard_specs(cfg)
        k = cfg.kubernetes
        if kube is None:
            kube = kube_client(cfg)
        self.identity = k.identity or f"{socket.gethostname()}-{os.getpid()}"
        self._runs: dict[str, ShardRun] = {}
        self._spare: ShardRun | None = None  # a started process waiting for the next shard taken
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._mp = multiprocessing.get_context("spawn")  # never fork a process that runs threads
        # what this replica's listener shows its shards' APIs to vouch for the caller's address
        self._api_secret = secrets.token_hex(16) if cfg.listen else ""
        sh = cfg.shards
        retry = min(k.lease_duration_s / 7.5, cfg.interval_s / 4)
        self.leases = ShardLeases(
            kube, self.identity, [s.name for s in self.specs], prefix=sh.lease_prefix, namespace=k.lease_namespace,
            lease_duration_s=k.lease_duration_s, retry_period_s=retry, grace_s=sh.grace_s,
            stale_after_s=sh.stale_after_s if sh.stale_after_s is not None
            else k.lease_duration_s + 3 * cfg.interval_s,
            publication=self._publication, on_acquired=self._acquired, on_lost=self._lost,
            after_step=self._share, on_release=self._stop_shard, drained=self._drained)
        from fleethealth.controller.shard_api import ShardApiRouter, httpx_forward

        self.router = ShardApiRouter(self.identity, self.specs, sh.label, self._api_secret, self.leases.holds,
                                     self.leases.holder, self._api_port, httpx_forward(), cfg.api.max_body_bytes)

    def _api_port(self, shard: str) -> int:
        run = self._runs.get(shard)
        return 0 if run is None else int(run.slots[API_PORT])

    # -- lease callbacks (on the lease thread, under its lock: quick) ----------------------------------
    def _acquired(self, shard: str) -> None:
        with self._lock:
            if self._stopped.is_set() or shard in self._runs:
                return
            run, self._spare = self._spare or self._new_spare(), None
            e = self.leases.electors[shard]
            run.slots[HELD_UNTIL], run.slots[EPOCH] = e.held_until(), float(e.epoch or 0)
            run.shard, run.started_at = shard, time.time()
            run.assignment.send((shard, e.name))
            self._runs[shard] = run
            self._spare = self._new_spare()  # the next take-over's

    def _new_spare(self) -> ShardRun:
        slots = self._mp.Array("d", N_SLOTS)
        mine, theirs = self._mp.Pipe()
        proc = self._mp.Process(target=shard_main, name="shard-spare", daemon=True,
                                args=(self.cfg.model_dump(), slots, os.getpid(),
                                      logging.getLogger().getEffectiveLevel(), self.identity, theirs,
                                      self._api_secret))
        proc.start()
        return ShardRun("", slots, proc, mine)

    def _lost(self, shard: str) -> None:
        with self._lock:
            run = self._runs.pop(shard, None)
        if run is not None:
            run.slots[HELD_UNTIL] = 0.0
            run.slots[STOP] = 1.0
            threading.Thread(target=self._reap, args=(run,), daemon=True).start()

    def _stop_shard(self, shard: str) -> None:
        """A shard this replica is giving up: its controller stops after the cycle it is in."""
        run = self._runs.get(shard)
        if run is not None:
            run.slots[STOP] = 1.0

    def _drained(self, shard: str) -> bool:
        run = self._runs.get(shard)
        return run is None or not run.proc.is_alive()

    def _reap(self, run: ShardRun) -> None:
        run.proc.join(30)
        if run.proc.is_alive():
            log.error("shard %s: controller did not stop in 30 s; killed", run.shard)
            run.proc.kill()
            run.proc.join(5)

    def _share(self) -> None:
        """After each Lease step: each shard process's deadline and the other shards' counts."""
        with self._lock:
            runs = list(self._runs.values())
        for r in runs:
            e = self.leases.electors[r.shard]
            r.slots[HELD_UNTIL] = e.held_until()
            total, low = self.leases.peers.peer_counts(r.shard, self.leases.shards, self.leases.clock())
            r.slots[PEERS_TOTAL], r.slots[PEERS_LOW] = float(total), float(low)

    def _publication(self, shard: str) -> str | None:
        run = self._runs.get(shard)
        if run is None or run.slots[OWN_TS] <= 0:
            return None
        return Publication(int(run.slots[OWN_TOTAL]), int(run.slots[OWN_LOW]), run.slots[OWN_TS]).to_annotation()

    # -- what it serves ---------------------------------------------------------------------------------
    def health(self, now: float) -> tuple[bool, str]:
        """Unhealthy while a shard held here has not completed a cycle for three intervals (a stuck
        controller's Lease is still renewed by this process, so the probe is what replaces it)."""
        with self._lock:
            runs = list(self._runs.values())
        late = [r.shard for r in runs
                if now - max(r.slots[LAST_TS], r.started_at) > 3 * self.cfg.interval_s + 30.0 or not r.proc.is_alive()]
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
            r = runs.get(s.name)
            if r is not None:
                if r.slots[OWN_TS] > 0:
                    lines.append(f"fleethealth_shard_in_service{lab} {int(r.slots[OWN_TOTAL])}")
                    lines.append(f"fleethealth_shard_low_confidence{lab} {int(r.slots[OWN_LOW])}")
                lines.append(f"fleethealth_shard_cycles_total{lab} {int(r.slots[CYCLES])}")
                lines.append(f"fleethealth_shard_last_cycle_cpu_seconds{lab} {r.slots[LAST_CPU]:.6f}")
        return "\n".join(lines) + "\n"

    def serve(self, host: str, port: int) -> Any:
        """/healthz, /metrics and the shards' /api/v1 (``controller.shard_api``) on a daemon thread; returns
        the server (``shutdown()`` stops it)."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        replica = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith("/api/v1/") or self.path.startswith("/api/v1?"):
                    return self._api("GET")
                if self.path == "/healthz":
                    ok, why = replica.health(time.time())
                    code, body, ctype = (200 if ok else 503), why + "\n", "text/plain"
                elif self.path == "/metrics":
                    code, body, ctype = 200, replica.metrics_text(), "text/plain; version=0.0.4"
                else:
                    code, body, ctype = 404, "not found\n", "text/plain"
                self._reply(code, body.encode(), {"Content-Type": ctype})

            def do_POST(self) -> None:  # noqa: N802
                if not self.path.startswith("/api/v1/"):
                    return self._reply(404, b"not found\n", {"Content-Type": "text/plain"})
                self._api("POST")

            def _api(self, method: str) -> None:
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    n = -1
                if n < 0 or n > replica.router.max_body_bytes:
                    return self._reply(413 if n > 0 else 400, b'{"detail": "bad or too large Content-Length"}',
                                       {"Content-Type": "application/json"})
                body = self.rfile.read(n) if n else b""
                code, data, headers = replica.router.route(method, self.path, dict(self.headers.items()), body,
                                                           f"{self.client_address[0]}:{self.client_address[1]}")
                self._reply(code, data, headers)

            def _reply(self, code: int, data: bytes, headers: Mapping[str, str]) -> None:
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        httpd = ThreadingHTTPServer((host, port), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, name="shard-http", daemon=True).start()
        return httpd

    # -- the process ----------------------------------------------------------------------------------------
    def start(self) -> ShardedReplica:
        with self._lock:
            self._spare = self._new_spare()
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
            if self._spare is not None:
                runs.append(self._spare)
                self._spare = None
        for r in runs:
            r.slots[HELD_UNTIL] = 0.0
            r.slots[STOP] = 1.0
        for r in runs:
            self._reap(r)
        self.leases.release_all()
