"""Shards beyond one controller: which pools a shard reads, which replica holds which shard, and what the
fleet-wide telemetry-loss freeze counts. Pure: no I/O, no clock (times are arguments); the Lease I/O is
``act.lease.ShardLeases`` and the process that runs the shards is ``controller.sharded``.

Theory of operation
- A shard is a named set of pools (``pools: [a, b]``), a pool-label matcher (``matcher: 'pool=~"gpu-.*"'``),
  or the rest (``rest: true``: every series no other shard selects, those without a pool label too). It
  reads only its series from the Prometheus-compatible store through one more label matcher on every
  selector (``shard_matcher``: ``pool=~"a|b"``). Budgets, freezes and failure domains are per pool, so a
  shard decides alone; its state lives in its own part of the store (a PostgreSQL schema per shard).
- One Kubernetes Lease per shard, and one per replica (membership). ``plan`` is what a replica does in
  one step with every Lease it observed: renew what it holds; take a free shard (never held, released, or
  expired: its holder stopped renewing for the lease duration) when it holds fewer than its fair share
  ``ceil(shards / live replicas)`` and it is the shard's preferred taker (the highest rendezvous hash
  among live replicas that have room), or, whoever has room or not, once the shard has been free for
  ``grace_s`` (the replicas it would go to are missing: a shard is never left without a holder); give up
  a shard when it holds more than its fair share and another live replica has room (a replica that just
  joined gets its share; the released shard is free at once).
- The fleet-wide freeze: each shard's holder publishes, after every decided cycle, its counts of entities
  in service and of those at low confidence (``Publication``, in its Lease's annotations). Every shard
  adds the other shards' counts to its own before applying ``fleet.low_confidence_fraction``
  (``peer_counts``), so a telemetry loss in one shard freezes remediation in all. A publication that has
  not changed for ``stale_after_s`` (its holder is gone or stuck) counts as all low confidence, with the
  last size it published: a shard nobody decides for is unknown, never healthy.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*$')


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard: exactly one of ``pools``, ``matcher`` or ``rest``."""

    name: str
    pools: tuple[str, ...] = ()
    matcher: str = ""
    rest: bool = False


def _alternation(values: Sequence[str]) -> str:
    return "|".join(re.escape(v) for v in sorted(set(values)))


def _quoted(regex: str) -> str:
    return regex.replace("\\", "\\\\").replace('"', '\\"')


_NEGATED = {"=": "!=", "!=": "=", "=~": "!~", "!~": "=~"}


def parse_matcher(text: str) -> tuple[str, str, str] | None:
    """(label, operator, value unquoted) of one PromQL label matcher, or None."""
    m = _MATCHER.match(text)
    if m is None:
        return None
    name, op = m.group(1), m.group(2)
    quoted = text.strip()[text.strip().index('"') + 1:-1]
    return name, op, re.sub(r"\\(.)", r"\1", quoted)


def shard_matcher(spec: ShardSpec, all_specs: Sequence[ShardSpec], label: str = "pool") -> str:
    """The PromQL label matchers that select this shard's series (``pool=~"a|b"``). The rest shard is
    every other shard negated, ANDed (``pool!~"a|b",pool!~"gpu-.*"``; a ``!~`` also matches series
    without the label); a matcher shard's own text is used as is."""
    if spec.matcher:
        return spec.matcher.strip()
    if spec.rest:
        named = [p for s in all_specs if s is not spec and not s.rest for p in s.pools]
        parts = [f'{label}!~"{_quoted(_alternation(named))}"'] if named else []
        for s in all_specs:
            pm = parse_matcher(s.matcher) if s.matcher and s is not spec else None
            if pm is not None:
                parts.append(f'{pm[0]}{_NEGATED[pm[1]]}"{_quoted(pm[2])}"')
        return ",".join(parts)
    return f'{label}=~"{_quoted(_alternation(spec.pools))}"'


def valid_matcher(text: str) -> bool:
    """One PromQL label matcher (``name op "value"``) whose regex, if any, compiles."""
    pm = parse_matcher(text)
    if pm is None:
        return False
    if pm[1] in ("=~", "!~"):
        try:
            re.compile(pm[2])
        except re.error:
            return False
    return True


def matches(matcher: str, labels: Mapping[str, str]) -> bool:
    """Whether a series (or a node) with these labels is selected by one PromQL label matcher (an absent
    label reads as "", as in PromQL; regexes are anchored)."""
    pm = parse_matcher(matcher)
    if pm is None:
        return False
    name, op, value = pm
    have = labels.get(name, "")
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    hit = re.fullmatch(value, have) is not None
    return hit if op == "=~" else not hit


def owns(spec: ShardSpec, all_specs: Sequence[ShardSpec], labels: Mapping[str, str], label: str = "pool") -> bool:
    """Whether a node with these (Kubernetes) labels belongs to this shard, by the same rule as its
    matcher: for keeping what Kubernetes lists (inventory, node capacity) to the shard's own nodes."""
    if spec.matcher:
        return matches(spec.matcher, labels)
    if spec.rest:
        return not any(owns(s, all_specs, labels, label) for s in all_specs if s is not spec and not s.rest)
    return labels.get(label, "") in spec.pools


# -- assignment -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LeaseView:
    """What a replica observed of one shard's Lease: its holder when live (None when free: never
    created, released, or expired) and, when free, for how long it has been seen free."""

    holder: str | None
    free_for_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Plan:
    renew: tuple[str, ...] = ()
    acquire: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    fair_share: int = 0


def rendezvous(member: str, shard: str) -> int:
    """Highest-random-weight hash: each shard prefers a stable, spread-out order of replicas."""
    return int.from_bytes(hashlib.blake2b(f"{shard}\0{member}".encode(), digest_size=8).digest(), "big")


def fair_share(n_shards: int, n_members: int) -> int:
    return math.ceil(n_shards / max(1, n_members))


def plan(me: str, shards: Sequence[str], leases: Mapping[str, LeaseView], members: Sequence[str],
         grace_s: float) -> Plan:
    """One replica's step (see the module docstring). ``members``: live replicas (this one included
    whether or not its own membership Lease is visible yet)."""
    live = sorted(set(members) | {me})
    cap = fair_share(len(shards), len(live))
    held: dict[str, list[str]] = {m: [] for m in live}
    for s in shards:
        v = leases.get(s)
        if v is not None and v.holder is not None:
            held.setdefault(v.holder, []).append(s)
    mine = sorted(held.get(me, []), key=lambda s: rendezvous(me, s), reverse=True)
    renew = list(mine)
    release: list[str] = []
    room = {m: cap - len(held[m]) for m in live}
    if len(mine) > cap and any(room[m] > 0 for m in live if m != me):
        # keep the shards this replica ranks highest; the rest go to replicas with room
        spare = sum(max(0, room[m]) for m in live if m != me)
        n_out = min(len(mine) - cap, spare)
        release = mine[len(mine) - n_out:]
        renew = mine[:len(mine) - n_out]
    acquire: list[str] = []
    count = len(renew)
    free = [s for s in shards if (leases.get(s) or LeaseView(None)).holder is None]
    for s in sorted(free, key=lambda s: rendezvous(me, s), reverse=True):
        v = leases.get(s) or LeaseView(None)
        takers = [m for m in live if room.get(m, 0) > 0]
        preferred = max(takers, key=lambda m: rendezvous(m, s)) if takers else None
        if (preferred == me and count < cap) or v.free_for_s >= grace_s:
            acquire.append(s)
            count += 1
            room[me] = room.get(me, 0) - 1
    return Plan(tuple(sorted(renew)), tuple(acquire), tuple(sorted(release)), cap)


# -- the fleet-wide confidence --------------------------------------------------------------------
PUBLICATION_ANNOTATION = "fleethealth.io/confidence"


@dataclass(frozen=True, slots=True)
class Publication:
    """A shard's counts as of one decided cycle (``cycle_ts``: the cycle's time, which makes every
    publication differ from the last, so a stuck holder shows as unchanged)."""

    in_service: int
    low_confidence: int
    cycle_ts: float

    def to_annotation(self) -> str:
        return json.dumps({"in_service": self.in_service, "low_confidence": self.low_confidence,
                           "cycle_ts": self.cycle_ts}, sort_keys=True)

    @staticmethod
    def from_annotation(text: str | None) -> Publication | None:
        """None for a missing or unreadable annotation (bad input never crashes, never reads healthy:
        the caller counts an unreadable shard like a stale one)."""
        if not text:
            return None
        try:
            d: Any = json.loads(text)
            total, low = int(d["in_service"]), int(d["low_confidence"])
            ts = float(d["cycle_ts"])
        except (ValueError, KeyError, TypeError):
            return None
        if total < 0 or not 0 <= low <= total or not math.isfinite(ts):
            return None
        return Publication(total, low, ts)


@dataclass(slots=True)
class Observed:
    """A publication as this replica last saw it change, on its own clock (``seen_at``)."""

    publication: Publication | None
    seen_at: float
    last_size: int = 0  # the last in-service count this shard published, kept when it goes unreadable


@dataclass(slots=True)
class PeerBook:
    """What one replica remembers of every shard's publication. ``observe`` takes the annotation text
    and this replica's monotonic time; staleness is judged from when the text last changed here, so
    clock skew between replicas never matters (as with the Lease itself)."""

    stale_after_s: float
    seen: dict[str, Observed] = field(default_factory=dict)
    _raw: dict[str, str | None] = field(default_factory=dict)

    def observe(self, shard: str, annotation: str | None, now: float) -> None:
        if shard in self._raw and self._raw[shard] == annotation:
            return
        self._raw[shard] = annotation
        pub = Publication.from_annotation(annotation)
        old = self.seen.get(shard)
        size = pub.in_service if pub is not None else (old.last_size if old is not None else 0)
        self.seen[shard] = Observed(pub, now, size)

    def peer_counts(self, me: str, shards: Sequence[str], now: float) -> tuple[int, int]:
        """The other shards' (in service, low confidence), a stale or unreadable one as all low with the
        last size it published (0 if it never published: nothing is known of its size)."""
        total = low = 0
        for s in shards:
            if s == me:
                continue
            o = self.seen.get(s)
            if o is None:
                continue
            if o.publication is None or now - o.seen_at > self.stale_after_s:
                total += o.last_size
                low += o.last_size
            else:
                total += o.publication.in_service
                low += o.publication.low_confidence
        return total, low

    def stale(self, shards: Sequence[str], now: float) -> list[str]:
        return [s for s in shards if (o := self.seen.get(s)) is not None
                and (o.publication is None or now - o.seen_at > self.stale_after_s)]
