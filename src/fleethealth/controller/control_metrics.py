"""The control plane's own figures for ``/metrics``: leadership and fencing, the outbox, the state store.

Theory of operation: the controller's ``/metrics`` already says what the fleet looks like; these say
whether the controller can still act on it. Every figure is read at render time from the objects that
hold it (the Lease elector behind the runner's fence, the runner's counters, the store's ``stats`` and one
``GROUP BY`` over the outbox), so there is no second copy to keep in sync; ``render_metrics`` renders them
once per cycle, not per scrape. A store that cannot answer leaves its outbox figures out for that render
(and counts in ``fleethealth_store_errors_total``); it never breaks the scrape.

=============================================  =======  ====================================================
metric                                          type     meaning
=============================================  =======  ====================================================
``fleethealth_leader``                          gauge    1 on the replica that decides and acts
``fleethealth_leader_epoch``                    gauge    the fencing epoch (the Lease's leaseTransitions)
``fleethealth_lease_renew_age_seconds``         gauge    since this replica last renewed the Lease
``fleethealth_takeovers_total``                 counter  times this replica took over as leader
``fleethealth_actuation_fenced_total``          counter  actuator writes refused: the lease was lost
``fleethealth_outbox_intents``                  gauge    intents per outbox status (pending, applied, ...)
``fleethealth_outbox_oldest_pending_age_s...``  gauge    age of the oldest pending intent (0: none)
``fleethealth_outbox_settled_total``            counter  intents this replica marked settled / ``failed``
``fleethealth_store_commit_seconds``            gauge    the last cycle commit's duration
``fleethealth_store_commit_seconds_total``      counter  with ``fleethealth_store_commits_total``: the mean
``fleethealth_store_busy_total``                counter  commits refused: the database was locked/busy
``fleethealth_store_errors_total``              counter  cycles skipped on any store error (busy included)
=============================================  =======  ====================================================
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("fleethealth.controller.metrics")

Family = tuple[str, str, str, list[tuple[dict[str, Any], float]]]
OUTBOX_STATUSES = ("pending", "applied", "failed", "advised", "unrouted")


def _elector(runner: Any) -> Any:
    """The Lease elector behind the runner's fence (None without leader election)."""
    from fleethealth.act.fence import Fences, LeaseFence

    fence = getattr(runner, "fence", None)
    fences = fence.fences if isinstance(fence, Fences) else [fence]
    return next((f.elector for f in fences if isinstance(f, LeaseFence)), None)


def control_plane_families(controller: Any, runner: Any, now: float) -> Iterator[Family]:
    counters = controller.published.counters
    yield ("fleethealth_leader", "gauge", "1 on the replica that holds the Lease and acts (0: standby).",
           [({}, 1.0 if counters.get("leader") else 0.0)])
    yield ("fleethealth_takeovers_total", "counter", "Times this replica took over as leader.",
           [({}, float(counters.get("takeovers_total", 0)))])
    yield ("fleethealth_store_errors_total", "counter",
           "Cycles whose state store was busy, unreachable or fenced (the cycle was skipped).",
           [({}, float(counters.get("store_errors_total", 0)))])
    elector = _elector(runner)
    if elector is not None:
        if elector.is_leader() and elector.epoch is not None:
            yield ("fleethealth_leader_epoch", "gauge",
                   "Fencing epoch of this leader (the Lease's leaseTransitions when it took it).",
                   [({}, float(elector.epoch))])
        age = elector.renewed_ago()
        if age is not None:
            yield ("fleethealth_lease_renew_age_seconds", "gauge", "Seconds since this replica renewed the Lease.",
                   [({}, age)])
    if runner is not None:
        yield ("fleethealth_actuation_fenced_total", "counter",
               "Actuator writes refused because this replica no longer held its lease.",
               [({}, float(getattr(runner, "fenced_total", 0)))])
        yield ("fleethealth_outbox_settled_total", "counter", "Outbox intents this replica settled, by result.",
               [({"result": "any"}, float(getattr(runner, "outbox_settled_total", 0))),
                ({"result": "failed"}, float(getattr(runner, "outbox_failed_total", 0)))])
    store = getattr(getattr(controller, "loop", None), "store", None)
    if store is None:
        return
    stats = getattr(store, "stats", None)
    if isinstance(stats, dict):
        yield ("fleethealth_store_commits_total", "counter", "Cycle commits to the state store.",
               [({}, float(stats.get("commits_total", 0)))])
        yield ("fleethealth_store_commit_seconds", "gauge", "Duration of the last cycle commit.",
               [({}, float(stats.get("commit_seconds_last", 0.0)))])
        yield ("fleethealth_store_commit_seconds_total", "counter", "Time spent in cycle commits.",
               [({}, float(stats.get("commit_seconds_total", 0.0)))])
        yield ("fleethealth_store_busy_total", "counter",
               "Commits refused because another writer held the database (busy/locked past the timeout).",
               [({}, float(stats.get("busy_total", 0)))])
        yield ("fleethealth_store_fenced_total", "counter",
               "Commits refused because another controller claimed the store.",
               [({}, float(stats.get("fenced_total", 0)))])
    summary = getattr(store, "outbox_summary", None)
    if not callable(summary):
        return
    from fleethealth.store.base import StoreError

    try:
        out = summary(now)
    except StoreError as e:
        log.warning("outbox figures left out of /metrics: %s", e)
        return
    counts = out["counts"]
    yield ("fleethealth_outbox_intents", "gauge", "Intents in the outbox by status (pending: not yet settled).",
           [({"status": s}, float(counts.get(s, 0))) for s in sorted(set(OUTBOX_STATUSES) | set(counts))])
    oldest = out["oldest_pending_age_s"]
    yield ("fleethealth_outbox_oldest_pending_age_seconds", "gauge",
           "Age of the oldest pending intent (0 when none is pending).", [({}, 0.0 if oldest is None else oldest)])
