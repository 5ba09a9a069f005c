"""Recurring faults: a node that keeps coming back with the same fault is handed to a human for repair
instead of being released again. Pure.

Theory of operation
-------------------
A flaky NVLink, a GPU that overheats every afternoon, a link that retrains under load: each episode ends
with the node passing its active test (the fault is quiet while the test runs) and going back to work,
until it fails the job again. ``lifecycle.max_recoveries`` catches that only after the third release, a
week apart at most; the time in between is lost work every time.

* An *episode* is one isolation (an entry into QUARANTINED or DRAINING from a state that was not
  isolated: a relapse from RECOVERING is a new episode) or one DEGRADED spell. A spell that escalates
  into an isolation is one episode (the isolation replaces the spell). Each is remembered on the
  entity (``EntityLifecycle.episodes``: ``[ts, family, gpus, kind]``, in the lifecycle's JSON, so a
  restart keeps it), pruned to ``policy.recurring.window_s``.
* The *family* of an episode is the signal behind it (``family_of``): ``xid:<N>`` for an Xid gate
  (the Xid the node flagged, e.g. ``xid:74``, an NVLink error), the signal's policy ``family`` (or its
  name) for another gate, the category for a score (``min:interconnect`` -> ``interconnect``), and
  ``app_xid`` for attribution. ``gpus``: the node's flagged GPUs and its worst member, so a page can
  say which GPU keeps failing.
* When an isolation is the ``recurring.max_episodes``-th episode of its family within the window, the
  node goes on to FAILED with reason ``recurring:<family>`` in the same cycle (``escalates_now``: the
  decider takes the lifecycle's ``recurring`` rule right after the isolation's own intents, so the node
  is cordoned and its evidence captured, but no active test or repair ladder is started that could only
  release it into its next episode), and the FAILED page carries the episodes (count, first, per GPU) and
  asks for a repair. The lifecycle's ``recurring`` condition (``escalation``) still holds for an
  isolated node on later cycles (a state restored from before this rule). Degraded spells count
  towards the limit but never escalate by themselves: FAILED takes a node out of service, and only an
  isolation has passed the budgets that guard capacity.
* A human's release of a FAILED node (``ack`` to READY) is taken as a repair: the node's episodes are
  forgotten. ``max_episodes: 0`` turns the rule off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from fleethealth.decide.lifecycle import RULES, Cond, Rule
from fleethealth.decide.model import State
from fleethealth.decide.state import EntityLifecycle
from fleethealth.policy import Policy

ISOLATION, DEGRADED_SPELL = "isolation", "degraded"
EPISODE_ISOLATIONS: frozenset[State] = frozenset({State.QUARANTINED, State.DRAINING})
REASON_PREFIX = "recurring:"


SCORE_HEADS = frozenset({"min", "mean", "gmean", "floor"})  # reasons that name a category or signal next


def family_of(reason: str, flags: Iterable[str], policy: Policy) -> str:
    """The signal family an episode is about, from its reason and the node's flags: ``xid:<N>`` for an
    Xid-shaped gate (the lowest non-application Xid flagged), a gate signal's ``family`` or its name,
    ``app_xid`` for attribution, the category or signal after a score's aggregation (``min:thermal``), and
    the reason's head otherwise."""
    head, _, rest = reason.partition(":")
    if head == "gate" and rest:
        spec = next((s for s in policy.signals if s.name == rest), None)
        if spec is not None and spec.shape == "xid":
            app = {f"xid:{x}" for x in policy.xid.app_xids}
            xids = [f for f in flags if f.startswith("xid:") and f[4:].isdigit() and f not in app]
            if xids:
                return min(xids, key=lambda f: int(f[4:]))
        return spec.family if spec is not None and spec.family else rest
    if head == "attribution":
        return "app_xid"
    if head in SCORE_HEADS and rest:
        return rest.split(":")[0]
    return head or "unknown"


def record(es: EntityLifecycle, src: State, dst: State, now: float, src_since: float, family: str,
           gpus: Iterable[str], policy: Policy) -> None:
    """Remember the episode a transition from ``src`` (entered at ``src_since``) to ``dst`` starts, if it
    starts one (``es`` is the decider's copy)."""
    if policy.recurring.max_episodes <= 0:
        return
    if dst in EPISODE_ISOLATIONS and src not in EPISODE_ISOLATIONS:
        kind = ISOLATION
    elif dst == State.DEGRADED and src != State.DEGRADED:
        kind = DEGRADED_SPELL
    else:
        return
    kept = [e for e in es.episodes if now - float(e[0]) < policy.recurring.window_s]
    if kind == ISOLATION and src == State.DEGRADED and kept and kept[-1][3] == DEGRADED_SPELL \
            and float(kept[-1][0]) >= src_since:
        kept.pop()  # the spell that escalated into this isolation: one episode
    es.episodes = kept + [[now, family, sorted(set(gpus)), kind]]


def forget(es: EntityLifecycle) -> None:
    """A human released the node from FAILED: a repair; its history starts again."""
    es.episodes = []


def _current(es: EntityLifecycle, now: float, policy: Policy) -> tuple[str, list[list[Any]]] | None:
    """The family of the latest isolation and its episodes within the window."""
    if not es.episodes:
        return None
    last = es.episodes[-1]
    if last[3] != ISOLATION:
        return None
    fam = str(last[1])
    same = [e for e in es.episodes if e[1] == fam and now - float(e[0]) < policy.recurring.window_s]
    return fam, same


def escalation(es: EntityLifecycle, now: float, policy: Policy) -> str | None:
    """``recurring:<family>`` when the isolation in progress is the max_episodes-th episode of its
    family within the window (the lifecycle's ``recurring`` condition), else None."""
    limit = policy.recurring.max_episodes
    if limit <= 0:
        return None
    cur = None if es.state not in EPISODE_ISOLATIONS else _current(es, now, policy)
    if cur is None or len(cur[1]) < limit:
        return None
    return REASON_PREFIX + cur[0]


def escalates_now(es: EntityLifecycle, src: State, dst: State, now: float, policy: Policy) -> Rule | None:
    """The lifecycle rule to FAILED when the isolation ``src -> dst`` just recorded (``es`` already in
    ``dst``) is the max_episodes-th of its family: the decider takes it in the same cycle, so no active
    test or repair ladder is started for a node that is handed to a human anyway. None otherwise."""
    if dst not in EPISODE_ISOLATIONS or src in EPISODE_ISOLATIONS or src == State.FAILED:
        return None
    if escalation(es, now, policy) is None:
        return None
    return next((r for r in RULES if r.src == dst and r.cond == Cond.RECURRING), None)


def page_params(es: EntityLifecycle, now: float, policy: Policy) -> dict[str, Any]:
    """What the FAILED page says about the episodes: how many, since when, which GPUs, and what to do."""
    cur = _current(es, now, policy)
    if cur is None:
        return {}
    fam, same = cur
    per_gpu = Counter(g for e in same for g in e[2])
    days = policy.recurring.window_s / 86400.0
    worst = ", ".join(f"{g} ({n})" for g, n in sorted(per_gpu.items(), key=lambda x: (-x[1], x[0]))[:4])
    return {
        "episodes": len(same), "first": min(float(e[0]) for e in same), "window_s": policy.recurring.window_s,
        "family": fam, "gpus": dict(sorted(per_gpu.items())), "action": "repair",
        "summary": (f"{es.entity}: {len(same)} episode{'' if len(same) == 1 else 's'} of {fam} in {days:g} days"
                    + (f", on {worst}" if worst else "")
                    + "; it passes its tests between episodes, so it is not released again: schedule a repair"),
    }
