"""Fencing for actuator calls: a leader that lost its Lease (or its claim on the state store) writes nothing.

Theory of operation
- Leader election alone does not stop a *zombie*: a leader paused (GC, a slow disk, a network partition)
  past its renew deadline still believes it leads for the moment it wakes up, and its next actuator call
  would land after a new leader took over. Idempotent actions make a double apply harmless, not a stale
  one (a zombie could re-cordon a node the new leader just released).
- So the runner asks its ``Fence`` right before every external write (each actuator call, each page
  heartbeat) and refuses the write when the fence says the caller no longer holds its lease:
  - ``LeaseFence``: reads the Lease from the API server (one GET) and requires this replica as holder with
    the epoch (``leaseTransitions``) it took the Lease at, and its own renew deadline not passed. An API
    that cannot answer is a refusal too (fail closed: the write waits, the intent stays pending).
  - ``StoreFence``: the state store's fencing token (``claim``) is still this controller's.
  Both are checked when both exist (``Fences``).
- A refused call is not a failure: nothing is recorded as attempted, the intent stays ``pending`` in the
  outbox, and the new leader (whose take-over drains the outbox) applies it. One line in the log per
  refusal episode, not one per intent.
- Conditional writes: the Kubernetes node actuator also carries the epoch into what it writes
  (the annotation ``<prefix>/leader-epoch``) with the node's ``resourceVersion`` as a precondition, and
  refuses to write over a node whose annotation shows a newer epoch (``StaleEpoch``), so even a zombie
  that passed the check just before losing its Lease cannot undo a newer leader's write.
- The epoch is a plain integer (``None`` without leader election: a lone replica has nothing to fence).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger("fleethealth.act.fence")

EPOCH_ANNOTATION = "leader-epoch"  # under the actuation label prefix: fleethealth.io/leader-epoch


class Fenced(Exception):
    """This caller no longer holds its lease: the write was not made."""


class StaleEpoch(Fenced):
    """The object carries a newer leader's epoch than the caller's."""


class Fence(Protocol):
    def check(self) -> str | None:
        """None while the caller holds its lease, else a one-line reason (fail closed)."""
        ...

    @property
    def epoch(self) -> int | None: ...


def stale_epoch(have: Any, mine: int | None) -> bool:
    """Whether an object's recorded epoch (an annotation value) is newer than ``mine`` (pure)."""
    if mine is None or have is None:
        return False
    try:
        return int(str(have)) > mine
    except ValueError:
        return False  # not ours to judge: an unreadable annotation is overwritten like any other difference


class LeaseFence:
    """The Lease held by ``elector`` (act.lease.LeaseElector) at the epoch it took it."""

    def __init__(self, elector: Any) -> None:
        self.elector = elector

    @property
    def epoch(self) -> int | None:
        return self.elector.epoch if self.elector.is_leader() else None

    def check(self) -> str | None:
        from fleethealth.act.kube_api import KubeError

        e = self.elector
        if not e.is_leader() or e.epoch is None:
            return f"{e.identity} does not hold the Lease {e.namespace}/{e.name} (renew deadline passed)"
        try:
            lease = e.kube.get_lease(e.namespace, e.name)
        except KubeError as err:
            return f"cannot confirm the Lease {e.namespace}/{e.name}: {err.status} {err.reason}".strip()
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        epoch = int(spec.get("leaseTransitions") or 0)
        if holder != e.identity or epoch != e.epoch:
            return (f"the Lease {e.namespace}/{e.name} is held by {holder or 'no one'} at epoch {epoch}, "
                    f"not by {e.identity} at epoch {e.epoch}")
        return None


class StoreFence:
    """The state store's fencing token (``store.claim``), when the store has one."""

    def __init__(self, store: Any) -> None:
        self.store = store

    @property
    def epoch(self) -> int | None:
        return None

    def check(self) -> str | None:
        from fleethealth.store.base import StoreError

        holds = getattr(self.store, "holds_fence", None)
        if holds is None:
            return None
        try:
            return None if holds() else "another controller claimed the state store after this one"
        except StoreError as err:
            return f"cannot confirm the state store's fencing token: {err}"


class Fences:
    """Every fence must hold; the epoch is the first one that has one."""

    def __init__(self, fences: Sequence[Fence]) -> None:
        self.fences = list(fences)

    @property
    def epoch(self) -> int | None:
        return next((f.epoch for f in self.fences if f.epoch is not None), None)

    def check(self) -> str | None:
        for f in self.fences:
            why = f.check()
            if why is not None:
                return why
        return None


class Unfenced:
    """No election, no claim: a lone replica always holds."""

    epoch = None

    def check(self) -> str | None:
        return None


def epoch_of(fence: Fence | None) -> Callable[[], int | None]:
    return (lambda: None) if fence is None else (lambda: fence.epoch)
