"""Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it, and the
renewing thread it shares with ``act.shard_leases``.

Expiry (``lease_expiry``): a Lease held by another replica expires at its ``renewTime`` plus its
``leaseDurationSeconds``, brought onto the local monotonic clock, and a standby schedules its attempt for
that moment (``RenewingThread``: the next step is due at the earliest expiry it waits for, not at the next
poll). The holder's wall clock is trusted only to remove the lag of observing a renewal: the expiry is
clamped between [observed + renew deadline, observed + duration], ``observed`` being when this replica saw
the record change (the upper end is client-go's rule, which no clock skew affects). The holder stopped
acting at its renew deadline counted from before its renewal was written, so no earlier than ``observed``
plus that deadline: a skewed clock can never let a replica take a Lease while its holder may still act
(the holder's deadline is taken to be this replica's own, as a fraction of the duration: replicas of one
deployment share their configuration). A missing or unreadable renewTime falls back to client-go's rule. A leader that fails to renew for renew_deadline_s (shorter than the lease duration)
stops acting before anyone else can take over.

``start()`` runs step() on its own thread (``RenewingThread``) every ``retry_period_s`` (client-go's
RetryPeriod), or sooner when the Lease it waits for expires first, apart from the reconcile loop, so a
long cycle never costs the leader its Lease; ``on_acquired`` (the controller's ``wake``) lets the new
leader's first cycle start at once instead of at its next tick. Take-over after a leader dies: its last
renewal plus the lease duration plus the API's latency, then the new leader's first cycle. Without
start(), step() is called by the caller (once per controller interval: a replica that loses the lease
stops within one).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Self

from fleethealth.act.kube_api import Kube, KubeError

log = logging.getLogger("fleethealth.lease")

# How long after the computed expiry a waiting replica tries (the API's write latency is on top): the
# holder's clock and ours agree to a few ms at best, and a try that comes too early costs a retry period.
EXPIRY_MARGIN_S = 0.005


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: Any) -> float | None:
    """A Lease's MicroTime (``2026-12-02T03:44:53.123456Z``, fraction optional) as Unix seconds; None when
    missing or unreadable."""
    if not isinstance(text, str) or not text.endswith("Z"):
        return None
    body = text[:-1]
    try:
        fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in body else "%Y-%m-%dT%H:%M:%S"
        return datetime.strptime(body, fmt).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def lease_expiry(spec: Mapping[str, Any], observed_at: float, now: float, wall_now: float,
                 default_duration_s: float, renew_fraction: float = 2 / 3) -> float:
    """When, on this replica's monotonic clock (``now`` is that clock, ``wall_now`` the wall clock read at
    the same moment), a Lease record first seen here at ``observed_at`` expires: its renewTime plus its
    duration, clamped to [observed_at + renew_fraction * duration, observed_at + duration] (see the module
    docstring: whatever the clocks, never before the holder's renew deadline, ``renew_fraction`` of the
    duration). Pure."""
    duration = float(spec.get("leaseDurationSeconds") or default_duration_s)
    latest = observed_at + duration
    renewed = parse_micro_time(spec.get("renewTime"))
    if renewed is None:
        return latest
    by_renewal = now + (renewed + duration - wall_now)
    return min(latest, max(observed_at + renew_fraction * duration, by_renewal))


class RenewingThread:
    """A daemon thread that calls ``tick()`` until ``stop()``; ``tick`` returns how long to wait before
    the next one (a retry period, or less when a Lease it waits for expires sooner). An exception in a
    tick is logged and the thread goes on after a retry period: a bug must not end the renewals
    silently."""

    retry_period_s: float
    thread_name = "lease-renewer"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> float:
        raise NotImplementedError

    def tick_failed(self) -> None:
        """After a tick raised (the error is logged): bring what others read back in line."""

    def start(self) -> Self:
        """Tick on a daemon thread until stop()."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.tick()
            except Exception:
                log.exception("%s: step failed", self.thread_name)
                self.tick_failed()
                wait = self.retry_period_s
            self._stop.wait(max(0.0, wait))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def running(self) -> bool:
        return self._thread is not None


class LeaseElector(RenewingThread):
    def __init__(self, kube: Kube, identity: str, name: str = "fleethealth-controller",
                 namespace: str = "fleethealth-system", lease_duration_s: float = 15.0,
                 renew_deadline_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, retry_period_s: float | None = None,
                 on_acquired: Callable[[], None] | None = None, labels: Mapping[str, str] | None = None,
                 annotations: Callable[[], Mapping[str, str]] | None = None) -> None:
        super().__init__()
        self.kube = kube
        # Lease metadata a sharded replica writes with each renewal (controller.shards: the shard-set label
        # its replicas list by, and the shard's published confidence counts)
        self.labels = dict(labels or {})
        self.annotations = annotations
        self.identity = identity
        self.name = name
        self.namespace = namespace
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s if renew_deadline_s is not None else lease_duration_s * 2 / 3
        self.clock = clock
        self.wall = wall
        self._observed: tuple[str | None, str | None, str | None] | None = None
        self._observed_at = 0.0
        self._last_renew: float | None = None
        self.transitions = 0
        self.retry_period_s = retry_period_s if retry_period_s is not None else max(0.05, lease_duration_s / 7.5)
        self.on_acquired = on_acquired
        self._leading = False
        self._expires_at: float | None = None  # when the Lease another replica holds expires (local clock)
        # The fencing epoch: the Lease's leaseTransitions when this replica took it (it only grows, one per
        # change of holder), so a write carrying a lower epoch comes from a deposed leader (act.fence).
        self.epoch: int | None = None

    thread_name = "lease-elector"

    def start(self) -> LeaseElector:
        """Step on a daemon thread every retry period (or at the expiry it waits for) until stop()."""
        super().start()
        return self

    def tick(self) -> float:
        self._changed(self.step())
        return self.next_step_in()

    def tick_failed(self) -> None:
        self._changed(self.is_leader())

    def _changed(self, leading: bool) -> None:
        if leading and not self._leading:
            log.warning("%s holds the Lease %s/%s now", self.identity, self.namespace, self.name)
            if self.on_acquired is not None:
                self.on_acquired()
        elif self._leading and not leading:
            log.warning("%s lost the Lease %s/%s", self.identity, self.namespace, self.name)
        self._leading = leading

    def next_step_in(self) -> float:
        """Seconds until the next step is due: a retry period, or sooner when the Lease another replica
        holds expires first (then just after its expiry)."""
        wait = self.retry_period_s
        if self._expires_at is not None and not self.is_leader():
            wait = min(wait, self._expires_at + EXPIRY_MARGIN_S - self.clock())
        return max(0.0, wait)

    def expiry(self, lease: Mapping[str, Any], now: float) -> float:
        """When the Lease as listed expires on this replica's clock (``lease_expiry``), noting the record
        as observed."""
        return lease_expiry(lease.get("spec") or {}, self.observe(lease, now), now, self.wall(),
                            self.lease_duration_s, self.renew_deadline_s / self.lease_duration_s)

    def renewed_ago(self) -> float | None:
        """Seconds since this replica last renewed the Lease (None: it does not hold it)."""
        return None if self._last_renew is None else max(0.0, self.clock() - self._last_renew)

    def is_leader(self) -> bool:
        return self._last_renew is not None and self.clock() - self._last_renew < self.renew_deadline_s

    def held_until(self) -> float:
        """When this replica stops leading unless it renews first (its clock; 0.0 when not leading): what a
        process acting for it (a shard's controller) checks before each decision and action."""
        return 0.0 if self._last_renew is None else self._last_renew + self.renew_deadline_s

    def step(self, lease: dict[str, Any] | None = None) -> bool:
        """Acquire or renew once; returns whether this replica leads now. ``lease``: the Lease as just
        listed (ShardLeases lists them all at once), sparing a GET."""
        # API unreachable or a lost race: leadership lapses by itself at the renew deadline.
        with contextlib.suppress(KubeError):
            self._try(lease)
        return self.is_leader()

    def observe(self, lease: Mapping[str, Any], now: float | None = None) -> float:
        """Note the Lease's record as seen (listed by someone else): expiry counts from when it last
        changed here, whether or not this replica ever tried to take it. Returns that time."""
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock() if now is None else now
        return self._observed_at

    def _metadata(self, lease: dict[str, Any] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        old = (lease or {}).get("metadata") or {}
        labels = {**(old.get("labels") or {}), **self.labels}
        annotations = dict(old.get("annotations") or {})
        if self.annotations is not None:
            annotations.update(self.annotations())
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        return meta

    def _spec(self, acquire_time: str | None, transitions: int) -> dict[str, Any]:
        now = micro_time(self.wall())
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration_s)),
                "acquireTime": acquire_time or now, "renewTime": now, "leaseTransitions": transitions}

    def _try(self, listed: dict[str, Any] | None = None) -> None:
        now = self.clock()
        try:
            lease = listed if listed is not None else self.kube.get_lease(self.namespace, self.name)
        except KubeError as e:
            if not e.not_found:
                raise
            self.kube.create_lease(self.namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": self._metadata(), "spec": self._spec(None, 0)})
            self.epoch = 0
            self._won(now)
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        expires = self.expiry(lease, now)
        held_by_other = bool(holder) and holder != self.identity
        if held_by_other and expires > now:
            self._last_renew = None  # someone else leads and their lease is live
            self._expires_at = expires
            return
        self._expires_at = None
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire = spec.get("acquireTime") if holder == self.identity else None
        if holder != self.identity:
            transitions += 1
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": self._metadata(lease),
                "spec": self._spec(acquire, transitions)}
        try:
            self.kube.replace_lease(self.namespace, self.name, body)  # 409 if another replica raced us
        except KubeError as e:
            if e.status == 409:
                self._last_renew = None
                return
            raise
        if holder != self.identity:
            self.transitions += 1
        self.epoch = transitions
        self._won(now)

    def _won(self, now: float) -> None:
        self._last_renew = now

    def release(self) -> None:
        """Give the lease up on clean shutdown so a standby takes over at once."""
        if not self.is_leader():
            return
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["leaseDurationSeconds"] = 1
                self.kube.replace_lease(self.namespace, self.name, lease)
        except KubeError:
            pass
        self._last_renew = None
