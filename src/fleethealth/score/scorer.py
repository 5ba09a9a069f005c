"""The scorer: a whole fleet snapshot -> one health tuple per GPU, node, replica and rank.

Theory of operation
-------------------
``Scorer`` is the engine's entry point for a stream of snapshots (a controller, a backtest arm or lane,
a GPU service): the caller creates one per stream and calls ``score`` once per cycle and consumer. It
owns everything the engine keeps between cycles (``Kept``, score/kept.py, with its bounds), so two
streams in one process never share a slot and dropping the scorer frees what it kept. A scorer is
meant for one caller at a time (one thread). ``score_snapshot`` is the stateless entry point: a fresh
scorer per call (one-shot commands, tests), the same numbers.

One call, by stage (each a room of score/):

1. Resolve (resolve.py): label sets -> entity keys, once per label set for the life of the stream.
2. Entities (context.py): which GPUs, nodes, replicas and ranks exist this cycle; kept while the
   history's shape token says the set of series is unchanged.
3. Evaluate (plan.py, signals.py, slo.py, kernels.py): every policy signal for every entity kind, on
   arrays, into signals x entities matrices; on a history's view through the layout plan.
4. Aggregate (aggregate.py): gates, weighted means per category, the consumer's cross-category function,
   confidence; then the node roll-up (rollup.py).
5. Result (result.py): ``FleetHealth``, columnar, kinds made on first access, tuples built lazily.

The evaluation (1-3) does not depend on the consumer: a second consumer's call on the same snapshot,
policy, time and inventory reuses it. Pure: no I/O, no clock; ``now`` is an argument.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fleethealth.policy import Policy, SignalSpec
from fleethealth.score.aggregate import _Base
from fleethealth.score.context import _Ctx, _entity_tables, _Mats, _SignalResult
from fleethealth.score.expect import Expectations, KindExpect, kind_expect, peer_groups
from fleethealth.score.kept import Kept
from fleethealth.score.plan import _Plan
from fleethealth.score.resolve import KINDS, _KindTable
from fleethealth.score.result import FleetHealth, _Kinds, _MetaIndex
from fleethealth.score.signals import _evaluate_kind
from fleethealth.signals.history import shape_token
from fleethealth.signals.snapshot import InputIssue, Snapshot

Consumer = Literal["training", "serving", "remediation"]
CONSUMERS: tuple[str, ...] = ("training", "serving", "remediation")


class Scorer:
    """Scores a stream of snapshots, keeping what the engine reuses between cycles (``kept``)."""

    def __init__(self) -> None:
        self.kept = Kept()

    def score(
        self,
        snapshot: Snapshot,
        policy: Policy,
        now: float,
        consumer: str = "remediation",
        inventory: Mapping[str, Sequence[str]] | None = None,
        aggregation: str | None = None,
        expectations: Expectations | None = None,
    ) -> FleetHealth:
        """Score every entity in ``snapshot`` as of ``now`` for one consumer.

        ``inventory`` names entities that must get a tuple even with no samples at all (known nodes whose
        exporter vanished): they come out unknown, never healthy. ``aggregation`` overrides the consumer's
        cross-category function (min, gmean, mean) for baselines. ``expectations``: what entities
        reported before and why declared ones are expected (score/expect.py).
        """
        if consumer not in CONSUMERS:
            raise ValueError(f"unknown consumer {consumer!r}: expected one of {', '.join(CONSUMERS)}")
        how = aggregation or policy.aggregation.get(consumer, "min")  # type: ignore[call-overload]
        ev = _evaluation(self.kept, snapshot, policy, now, inventory, expectations)
        kinds = _Kinds(ev, how)
        if consumer != "serving":
            # Scores are made here, not on first access: a remediation or training reader takes every
            # kind, and a caller timing this call times the scoring. The serving consumer's one reader,
            # the router, takes replicas alone: its other kinds are made when asked for.
            for kind in KINDS:
                kinds[kind]
        return FleetHealth(now, consumer, policy.version_tag, kinds, ev.meta, list(snapshot.issues) + ev.issues)

    def forget_evaluations(self) -> None:
        """Drop the kept evaluation and every score kept because the inputs were equal last time
        (benchmarks: time a full scoring, not a re-aggregation). What depends only on which series exist
        (entity maps per label set, series -> entity) stays."""
        self.kept.forget_evaluations()


def score_snapshot(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    consumer: str = "remediation",
    inventory: Mapping[str, Sequence[str]] | None = None,
    aggregation: str | None = None,
    expectations: Expectations | None = None,
) -> FleetHealth:
    """``Scorer().score(...)``: one snapshot scored with nothing kept from, or for, another call.
    A caller scoring a stream holds a ``Scorer`` instead (what it keeps makes a cycle cheap)."""
    return Scorer().score(snapshot, policy, now, consumer, inventory, aggregation, expectations)


def forget_evaluations() -> None:
    """Kept for callers of the time when the engine kept its state in the module: nothing is kept
    there now (``score_snapshot`` starts afresh every call), so there is nothing to drop. A scorer's
    own memory is dropped by ``Scorer.forget_evaluations``."""


@dataclass
class _Evaluation:
    """The consumer-independent part of scoring: entities and every signal's sub-scores."""

    snapshot: Snapshot
    policy: Policy
    now: float
    inventory: Mapping[str, Sequence[str]] | None
    specs: dict[str, list[SignalSpec]]
    tables: dict[str, _KindTable]
    results: dict[str, list[_SignalResult]]
    categories: list[str]
    gpu_node: np.ndarray
    meta: _MetaIndex
    issues: list[InputIssue]
    kept: weakref.ReferenceType[Kept]  # the memory it was made with (weak: the memory holds this)
    bases: dict[str, _Base] = field(default_factory=dict)  # per kind: the consumer-independent aggregation
    kind_cats: dict[str, list[str]] = field(default_factory=dict)
    mats: dict[str, _Mats] = field(default_factory=dict)  # per kind: the results as matrices
    roll_up: dict[str, Any] = field(default_factory=dict)  # the node roll-up's consumer-independent part
    expectations: Expectations | None = None
    expect: dict[str, KindExpect] = field(default_factory=dict)  # per kind: peer groups, prior, declared


def _policy_kinds(kept: Kept, policy: Policy) -> tuple[dict[str, list[SignalSpec]], list[str], dict[str, list[str]]]:
    """A policy's signals per entity kind, its categories and each kind's categories, in policy order:
    the same lists every cycle (so that what is kept per list is found by identity)."""
    hit = kept.policy_kinds.get(id(policy))
    if hit is None or hit[0] is not policy:
        specs: dict[str, list[SignalSpec]] = {kind: [s for s in policy.signals if kind in s.entities] for kind in KINDS}
        categories = list(dict.fromkeys(s.category for s in policy.signals if s.score))  # read-only: none
        kind_cats: dict[str, list[str]] = {
            kind: [c for c in categories if any(s.category == c for s in specs[kind])] for kind in KINDS}
        if len(kept.policy_kinds) > 16:
            kept.policy_kinds.clear()
        made = kept.policy_kinds[id(policy)] = (policy, specs, categories, kind_cats)
        return made[1], made[2], made[3]
    return hit[1], hit[2], hit[3]


def _evaluation(
    kept: Kept, snapshot: Snapshot, policy: Policy, now: float, inventory: Mapping[str, Sequence[str]] | None,
    expectations: Expectations | None = None,
) -> _Evaluation:
    if kept.last_evaluation:
        last = kept.last_evaluation[0]
        if (
            last.snapshot is snapshot and last.policy is policy and last.now == now
            and (last.inventory is inventory or last.inventory == inventory)
            and len(last.snapshot) == len(snapshot) and last.expectations is expectations
        ):
            return last
    ctx = _Ctx(snapshot, policy, now, kept)
    # Entities come from which series the view holds: while a history says that set is unchanged (its
    # shape token), last cycle's tables are this cycle's (not with samples in the future left out).
    token = shape_token(snapshot) if ctx.index is not None else None
    r = ctx.resolver
    hit = kept.last_tables[0] if kept.last_tables else None
    if (
        hit is not None and token is not None and hit[0] == token and hit[1] is policy and hit[3] is r
        and hit[4] == r.n_keys and (hit[2] is inventory or hit[2] == inventory)
    ):
        tables, gpu_node = hit[5], hit[6]
    else:
        tables = _entity_tables(ctx, policy, inventory)
        gt = tables["gpu"]
        key_node = r.key_node_arr
        gpu_node_kid = key_node[gt.key_ids] if gt.key_ids.size else np.zeros(0, np.int64)
        nt = tables["node"]
        gpu_node = nt.entities(gpu_node_kid) if gpu_node_kid.size else gpu_node_kid
        if not (gpu_node >= 0).all():  # gpus always imply their node
            raise AssertionError("gpu without node")
        if token is not None:
            kept.last_tables[:] = [(token, policy, inventory, r, r.n_keys, tables, gpu_node)]
    specs, categories, kind_cats = _policy_kinds(kept, policy)
    results: dict[str, list[_SignalResult]] = {kind: [] for kind in KINDS}
    mats: dict[str, _Mats] = {}
    if ctx.index is not None:
        # a history's view: the plan built on the last view of this layout, else one for this view
        prev = kept.last_plan[0] if kept.last_plan else None
        plan = prev[1] if prev is not None and prev[0] is tables and prev[1].holds(ctx) else None
        if plan is None:
            plan = _Plan(ctx, tables, specs)
            if token is not None:
                kept.last_plan[:] = [(tables, plan)]
        found, mats = plan.run(ctx, specs)
        results.update(found)
    else:
        for kind in KINDS:
            if tables[kind].names:
                results[kind], mats[kind] = _evaluate_kind(ctx, kind, tables[kind], specs[kind])
    meta = _MetaIndex(ctx, policy, tables, gpu_node)
    ev = _Evaluation(
        snapshot, policy, now, inventory, specs, tables, results, categories, gpu_node, meta, ctx.issues,
        weakref.ref(kept), kind_cats=kind_cats, mats=mats, expectations=expectations,
        expect=_kind_expects(ctx, kept, tables, gpu_node, policy, expectations),
    )
    kept.last_evaluation[:] = [ev]
    return ev


def _kind_expects(ctx: _Ctx, kept: Kept, tables: dict[str, _KindTable], gpu_node: np.ndarray, policy: Policy,
                  expectations: Expectations | None) -> dict[str, KindExpect]:
    """Per peer kind (GPUs, replicas), what aggregation reads beyond the signals: the same objects while
    the groups and the expectations are (so that what aggregation keeps by them holds)."""
    groups = peer_groups(ctx, tables, gpu_node, policy, kept)
    hit = kept.kind_expect[0] if kept.kind_expect else None
    if hit is not None and hit[0] is groups and hit[1] is expectations:
        return hit[2]
    share = policy.expectation.carried_share
    made = {
        "gpu": kind_expect("gpu", tables["gpu"].names, groups["gpu"], expectations, tables["node"].names, gpu_node,
                           share),
        "replica": kind_expect("replica", tables["replica"].names, groups["replica"], expectations, None, None,
                               share),
    }
    kept.kind_expect[:] = [(groups, expectations, made)]
    return made
