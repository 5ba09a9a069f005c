"""Many Leases for one replica: one coordination.k8s.io/v1 Lease per shard plus one per replica
(membership), stepped together on one thread (the I/O half of ``controller.shards``).

Theory of operation
- Every ``retry_period_s`` a step: renew this replica's membership Lease, LIST every Lease of the shard
  set (label ``fleethealth.io/shard-set``) in one call, note each record's expiry
  (``act.lease.lease_expiry``: its renewTime plus its duration, never before the renew deadline counted
  from when the record last changed here, so clock skew never lets it take a shard whose holder may still
  act), and hand what it saw to the pure ``controller.shards.plan``: take the ones the plan gives (first:
  a take-over waits for no other write), renew the shards held, release the ones beyond the fair share
  once their controller has stopped (kept and told to stop until then: a shard's last commit lands before
  its next holder's first). Each shard Lease is a ``LeaseElector`` (same acquire/renew/409 rules as the
  single-leader case), stepped with the Lease just listed.
- A renewal also writes the shard's publication (its confidence counts) into the Lease's annotations,
  and every listed shard's annotation goes into the ``PeerBook`` (the fleet-wide freeze).
- ``on_acquired(shard)`` / ``on_lost(shard)`` run on this thread when holding changes, ``after_step`` after
  every step; ``holds(shard)`` and the elector's ``held_until()`` are what the shard's controller and
  actuation runner check before deciding and acting (renew deadline rule: a holder that could not renew
  for 2/3 of the lease duration stops before anyone else may take over).
- Take-over after a holder dies: its shards' records stop changing. The next step is not left to the
  retry period: it is due just after the earliest expiry this replica waits for (another replica's shard
  or membership Lease, or a free shard's grace), so the dead holder's membership and shards read free here
  at their last renewTime plus the lease duration (plus ``EXPIRY_MARGIN_S`` and one LIST), and the preferred
  replica with room takes one in that same step; anyone after ``grace_s`` more. Renewals go on every retry
  period (``RenewingThread``, shared with the single-leader ``LeaseElector``). Failures of the API are
  logged; holdings lapse by themselves at the deadline.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fleethealth.act.kube_api import Kube, KubeError
from fleethealth.act.lease import EXPIRY_MARGIN_S, LeaseElector, RenewingThread, parse_micro_time
from fleethealth.controller.shards import PUBLICATION_ANNOTATION, LeaseView, PeerBook, Plan, plan

log = logging.getLogger("fleethealth.shards")

SET_LABEL = "fleethealth.io/shard-set"
ROLE_LABEL = "fleethealth.io/role"


def lease_name(prefix: str, kind: str, name: str) -> str:
    """A valid Lease name (DNS subdomain) for a shard or a member."""
    safe = re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.") or "x"
    return f"{prefix}-{kind}-{safe}"[:253]


class ShardLeases(RenewingThread):
    def __init__(self, kube: Kube, identity: str, shards: Sequence[str], *, prefix: str = "fleethealth",
                 namespace: str = "fleethealth-system", lease_duration_s: float = 15.0,
                 retry_period_s: float | None = None, grace_s: float | None = None,
                 stale_after_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 publication: Callable[[str], str | None] | None = None,
                 on_acquired: Callable[[str], None] | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 after_step: Callable[[], None] | None = None,
                 on_release: Callable[[str], None] | None = None,
                 drained: Callable[[str], bool] | None = None) -> None:
        super().__init__()
        self.kube = kube
        self.identity = identity
        self.shards = list(shards)
        self.prefix = prefix
        self.namespace = namespace
        self.lease_duration_s = lease_duration_s
        self.retry_period_s = retry_period_s if retry_period_s is not None else max(0.05, lease_duration_s / 7.5)
        self.grace_s = grace_s if grace_s is not None else 2 * self.retry_period_s
        self.clock = clock
        self.publication = publication
        self.on_acquired = on_acquired
        self.on_lost = on_lost
        self.after_step = after_step  # each step's end, under the lock: hand deadlines and counts on
        self.on_release = on_release  # a shard to give up: stop deciding for it
        self.drained = drained  # whether its controller has stopped (then the Lease is released)
        self.peers = PeerBook(stale_after_s if stale_after_s is not None else 3 * lease_duration_s)
        self._labels = {SET_LABEL: prefix}
        self.wall = wall
        self.member = LeaseElector(kube, identity, lease_name(prefix, "member", identity), namespace,
                                   lease_duration_s=lease_duration_s, clock=clock, wall=wall,
                                   retry_period_s=self.retry_period_s, labels={**self._labels, ROLE_LABEL: "member"})
        self.electors: dict[str, LeaseElector] = {
            s: LeaseElector(kube, identity, lease_name(prefix, "shard", s), namespace,
                            lease_duration_s=lease_duration_s, clock=clock, wall=wall,
                            retry_period_s=self.retry_period_s,
                            labels={**self._labels, ROLE_LABEL: "shard"}, annotations=self._annotations(s))
            for s in self.shards}
        self._others: dict[str, LeaseElector] = {}  # other replicas' member Leases, as observed
        self._free_since: dict[str, float] = {}
        self._held: set[str] = set()
        self._holders: dict[str, str | None] = {}  # each shard's live holder as last listed
        self.last_plan = Plan()
        self.lock = threading.Lock()  # held while stepping; readers of the PeerBook take it too
        self._due: float | None = None  # the earliest expiry or grace end this replica waits for (its clock)

    def _annotations(self, shard: str) -> Callable[[], dict[str, str]]:
        def get() -> dict[str, str]:
            text = self.publication(shard) if self.publication is not None else None
            return {PUBLICATION_ANNOTATION: text} if text else {}
        return get

    # -- reads ---------------------------------------------------------------------------------------
    def holds(self, shard: str) -> bool:
        e = self.electors.get(shard)
        return e is not None and e.is_leader()

    def holder(self, shard: str) -> str | None:
        """The shard's holder as last listed (its Lease's holderIdentity while live); None: free or unknown."""
        if self.holds(shard):
            return self.identity
        return self._holders.get(shard)

    def held(self) -> list[str]:
        return sorted(s for s in self.shards if self.holds(s))

    def peer_counts(self, shard: str) -> tuple[int, int]:
        with self.lock:
            return self.peers.peer_counts(shard, self.shards, self.clock())

    def stale(self) -> list[str]:
        with self.lock:
            return self.peers.stale(self.shards, self.clock())

    # -- one step ----------------------------------------------------------------------------------------
    def _list(self) -> list[dict[str, Any]]:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        return list(self.kube.api.request("GET", path, query={"labelSelector": f"{SET_LABEL}={self.prefix}"})
                    .get("items", []))

    def _live(self, e: LeaseElector, lease: dict[str, Any], now: float) -> str | None:
        """The Lease's holder while its record is live as seen here (``lease_expiry``), else None; another
        replica's live record's expiry becomes a moment the next step is due."""
        expires = e.expiry(lease, now)
        holder = (lease.get("spec") or {}).get("holderIdentity") or None
        if not holder or expires <= now:
            return None
        if holder != self.identity:
            self._wake_at(expires)
        return holder

    def _wake_at(self, t: float) -> None:
        self._due = t if self._due is None else min(self._due, t)

    def next_step_in(self) -> float:
        """Seconds until the next step: a retry period (the renewals), or just after the earliest expiry
        or grace end this replica waits for when that comes first."""
        wait = self.retry_period_s
        if self._due is not None:
            wait = min(wait, self._due + EXPIRY_MARGIN_S - self.clock())
        return max(0.0, wait)

    def step(self) -> Plan:
        with self.lock:
            return self._step()

    def _step(self) -> Plan:
        # The membership first, so a replica's membership always expires before its shards (a survivor
        # then finds room for them at their expiry); not again in a step scheduled soon after the last
        # one (an expiry's), where the write would only delay the take.
        ago = self.member.renewed_ago()
        if ago is None or ago >= self.retry_period_s / 2:
            self.member.step()
        now = self.clock()
        self._due = None
        try:
            items = self._list()
        except KubeError as err:
            log.error("cannot list the shard Leases: %s", err)
            items = []
            listed_ok = False
        else:
            listed_ok = True
        by_name: dict[str, dict[str, Any]] = {str((it.get("metadata") or {}).get("name")): it for it in items}
        members = [self.identity]
        for name, it in by_name.items():
            labels = (it.get("metadata") or {}).get("labels") or {}
            if labels.get(ROLE_LABEL) != "member" or name == self.member.name:
                continue
            other = self._others.get(name)
            if other is None:
                other = self._others[name] = LeaseElector(
                    self.kube, "?", name, self.namespace, lease_duration_s=self.lease_duration_s, clock=self.clock,
                    wall=self.wall, retry_period_s=self.retry_period_s)
            holder = self._live(other, it, now)
            if holder:
                members.append(holder)
        views: dict[str, LeaseView] = {}
        for s, el in self.electors.items():
            lease = by_name.get(el.name)
            holder = self._live(el, lease, now) if lease is not None else None
            if holder == self.identity and not el.is_leader():
                holder = None  # past this replica's own renew deadline: treat as free, take it again
            if lease is not None:
                ann = ((lease.get("metadata") or {}).get("annotations") or {}).get(PUBLICATION_ANNOTATION)
                self.peers.observe(s, ann, now)
            if holder is None:
                self._free_since.setdefault(s, now)
                if not self.electors[s].is_leader() and self._free_since[s] + self.grace_s > now:
                    # when anyone may take it (once past, the retry period paces the tries: a take that
                    # failed must not be retried in a tight loop)
                    self._wake_at(self._free_since[s] + self.grace_s)
            else:
                self._free_since.pop(s, None)
            views[s] = LeaseView(holder, now - self._free_since.get(s, now))
        if listed_ok:
            self._holders = {s: v.holder for s, v in views.items()}
        if not listed_ok:  # without a view of the others only renew what is held (never take blindly)
            p = Plan(renew=tuple(s for s in self.shards if self.electors[s].is_leader()))
        else:
            p = plan(self.identity, self.shards, views, members, self.grace_s)
        # A shard is given up only once its controller has stopped (``drained``): until then it is kept
        # (renewed) and told to stop (``on_release``), so its last commit lands before anyone else's first.
        keep = []
        for s in p.release:
            if self.drained is None or self.drained(s):
                log.warning("%s gives shard %s up (holds more than its share of %d)", self.identity, s, p.fair_share)
                self.electors[s].release()
            else:
                if self.on_release is not None:
                    self.on_release(s)
                keep.append(s)
        for s in p.acquire:  # takes first: a take-over waits for no other write
            listed = by_name.get(self.electors[s].name)
            if self.electors[s].step(listed) and listed is not None:
                spec = listed.get("spec") or {}
                renewed = parse_micro_time(spec.get("renewTime"))
                if spec.get("holderIdentity") and renewed is not None:  # a take-over, not a first claim
                    log.warning("%s takes shard %s from %s, %.3f s after its last renewal (lease %s s)",
                                self.identity, s, spec["holderIdentity"], self.wall() - renewed,
                                spec.get("leaseDurationSeconds"))
        for s in (*p.renew, *keep):
            self.electors[s].step(by_name.get(self.electors[s].name))
        self.last_plan = p
        self._notify()
        if self.after_step is not None:
            self.after_step()
        return p

    def _notify(self) -> None:
        now_held = {s for s in self.shards if self.holds(s)}
        for s in sorted(now_held - self._held):
            log.warning("%s holds shard %s now", self.identity, s)
            if self.on_acquired is not None:
                self.on_acquired(s)
        for s in sorted(self._held - now_held):
            log.warning("%s lost shard %s", self.identity, s)
            if self.on_lost is not None:
                self.on_lost(s)
        self._held = now_held

    # -- the thread (act.lease.RenewingThread) --------------------------------------------------------
    thread_name = "shard-leases"

    def start(self) -> ShardLeases:
        super().start()
        return self

    def tick(self) -> float:
        self.step()
        return self.next_step_in()

    def tick_failed(self) -> None:
        with self.lock:
            self._notify()

    def release_all(self) -> None:
        """Clean shutdown: give every shard (and the membership) up, so others take over at once."""
        with self.lock:
            for e in self.electors.values():
                e.release()
            self.member.release()
            self._notify()
