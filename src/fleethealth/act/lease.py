"""Leader election through a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Expiry is judged on the local clock from when this replica last *observed* the record change, so clock
skew between replicas does not matter. A leader that fails to renew for renew_deadline_s (shorter than
the lease duration) stops acting before anyone else can take over; with step() called once per
controller interval, a replica that loses the lease stops within one interval.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fleethealth.act.kube_api import Kube, KubeError


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(self, kube: Kube, identity: str, name: str = "fleethealth-controller",
                 namespace: str = "fleethealth-system", lease_duration_s: float = 15.0,
                 renew_deadline_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.kube = kube
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

    def is_leader(self) -> bool:
        return self._last_renew is not None and self.clock() - self._last_renew < self.renew_deadline_s

    def step(self) -> bool:
        """Acquire or renew once; returns whether this replica leads now."""
        # API unreachable or a lost race: leadership lapses by itself at the renew deadline.
        with contextlib.suppress(KubeError):
            self._try()
        return self.is_leader()

    def _spec(self, acquire_time: str | None, transitions: int) -> dict[str, Any]:
        now = micro_time(self.wall())
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(round(self.lease_duration_s)),
                "acquireTime": acquire_time or now, "renewTime": now, "leaseTransitions": transitions}

    def _try(self) -> None:
        now = self.clock()
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
        except KubeError as e:
            if not e.not_found:
                raise
            self.kube.create_lease(self.namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None, 0)})
            self._won(now)
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        held_by_other = bool(holder) and holder != self.identity
        if held_by_other and self._observed_at + duration > now:
            self._last_renew = None  # someone else leads and their lease is live
            return
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire = spec.get("acquireTime") if holder == self.identity else None
        if holder != self.identity:
            transitions += 1
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease["metadata"]["resourceVersion"]},
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
