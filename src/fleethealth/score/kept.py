"""What a scorer keeps between cycles: every plan and result the engine reuses, in one object.

Theory of operation
-------------------
The engine is pure: its answer depends only on (snapshot, policy, now, consumer, inventory). It is also
fast on a stream of snapshots because most of a cycle's work depends only on which series exist (the
history's layout), not on their values: label sets resolved to entities, series -> entity maps, the
batched evaluation plan, peer groups, SLO bins; and on a healthy fleet much of the rest follows from
inputs equal to last cycle's (derived category scores, the node roll-up). All of that lives here, owned
by one ``Scorer`` (score/scorer.py) that the caller creates per stream of snapshots (the controller, a
backtest arm or lane, a GPU service): two streams never share a slot, and dropping the scorer drops
everything it kept. Nothing in ``score/`` is kept at module level.

Every entry is used only after checking that it was made from the same inputs (the objects it holds,
compared by identity, or the arrays it holds, compared by value): a stale entry costs a rebuild, never a
wrong answer. Entries hold references to the objects their keys name, so an ``id()`` in a key cannot be
recycled while the entry lives.

Bounds (what one scorer holds at most):

* ``resolvers``: 8 label-set lists (the oldest dropped first); each grows with its list's label sets;
* ``gauges``, ``columns``: 512 (metric, match, kind, table) layouts each, cleared when full;
* ``shape_plans``, ``peers``, ``xids``, ``buckets``, ``slo_bins``, ``slo_seen``, ``spec_plans``,
  ``spec_plan_of_lists``:
  64 entries each, cleared when full (a policy has a few dozen signals);
* ``policy_kinds``: 16 policies, cleared when full;
* ``roll_up_c``: 8 consumer entries, cleared when full;
* ``last_evaluation``, ``last_tables``, ``last_plan``, ``roll_up``, ``roll_up_a``, ``peer_groups``,
  ``kind_expect``: the last one only.

So a scorer's memory is a small multiple of one snapshot's per-series arrays (one plan, one evaluation,
the resolver's per-label-set lists), however long the stream.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fleethealth.policy import Policy, SignalSpec
    from fleethealth.score.aggregate import _SpecPlan
    from fleethealth.score.context import _GaugeRows
    from fleethealth.score.expect import KindExpect, PeerGroups
    from fleethealth.score.plan import _Plan, _ShapePlan
    from fleethealth.score.resolve import _KindTable, _Resolver
    from fleethealth.score.scorer import _Evaluation
    from fleethealth.score.signals import _PeerGroups, _XidLayout


class Kept:
    """One scorer's memory: the tables below, each with the bound in the module docstring."""

    def __init__(self) -> None:
        # (id(label-set list), node labels, replica labels) -> resolver (holds the list)
        self.resolvers: dict[tuple[int, tuple[str, ...], tuple[str, ...], tuple[str, ...]], _Resolver] = {}
        # ("g", metric, match, kind, id(table)) -> (table, the block's series, rows or None)
        self.gauges: dict[tuple[Any, ...], tuple[_KindTable, np.ndarray, _GaugeRows | None]] = {}
        # (metric, match, kind, id(table)) -> (table, series, entity per series, series usable, one per entity)
        self.columns: dict[tuple[Any, ...], tuple[_KindTable, np.ndarray, np.ndarray, np.ndarray, bool]] = {}
        # (id(policy), ids of a kind's specs) -> (policy, specs, plan)
        self.shape_plans: dict[tuple[int, tuple[int, ...]], tuple[Policy, list[SignalSpec], _ShapePlan]] = {}
        # (id(spec), kind, entity count) -> (spec, group ids per label set, source series, usable, groups)
        self.peers: dict[tuple[int, str, int],
                         tuple[SignalSpec, np.ndarray, np.ndarray, np.ndarray, _PeerGroups | None]] = {}
        # (id(spec), kind) -> (table, the block's series, rows kept (relative), series, entity, layout, spec)
        self.xids: dict[tuple[int, str], tuple[_KindTable, np.ndarray, np.ndarray | None, np.ndarray,
                                               np.ndarray, _XidLayout | None, SignalSpec]] = {}
        # (id(spec), kind) -> (spec, le per label set, histogram series, present, columns' series, chosen)
        self.buckets: dict[tuple[int, str], tuple[SignalSpec, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray | None]] = {}
        # (entity count, windows, slots, columns) -> (arrays held, column index, bins, counts, age bins, unique)
        self.slo_bins: dict[Hashable, tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]] = {}
        # (id(spec), entity count) -> (spec, le per label set, request, bucket entities and bucket series (arrays
        # held, compared by identity: a kept plan's), entities seen, notes): a latency SLO's seen and notes
        self.slo_seen: dict[tuple[int, int], tuple[SignalSpec, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray, list[tuple[int, str]]]] = {}
        # (ids of a kind's specs, categories) -> (specs, plan); (id(specs), id(categories)) -> (specs, cats, plan)
        self.spec_plans: dict[tuple[tuple[int, ...], tuple[str, ...]], tuple[list[SignalSpec], _SpecPlan]] = {}
        self.spec_plan_of_lists: dict[tuple[int, int], tuple[list[SignalSpec], list[str], _SpecPlan]] = {}
        # the node roll-up: (gpu -> node, order, starts, present); (GPU derived scores, node derived scores,
        # gpu -> node, consumer-independent arrays); per GPU consumer entry: (entry, node's, categories,
        # gpu -> node, (value, reasons, worst, worst member per node))
        self.roll_up: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.roll_up_a: list[tuple[Any, Any, np.ndarray, tuple[Any, ...]]] = []
        self.roll_up_c: dict[int, tuple[Any, Any, np.ndarray, np.ndarray, tuple[Any, ...]]] = {}
        # id(policy) -> (policy, signals per kind, categories, categories per kind)
        self.policy_kinds: dict[int, tuple[Policy, dict[str, list[SignalSpec]], list[str],
                                           dict[str, list[str]]]] = {}
        # A controller cycle scores one snapshot for several consumers (remediation, serving): the
        # consumer-independent evaluation of the last call (holding its snapshot and policy).
        self.last_evaluation: list[_Evaluation] = []
        # (shape token, policy, inventory, resolver, its key count, tables, gpu -> node): the last view's
        self.last_tables: list[tuple[Hashable, Policy, Any, _Resolver, int, dict[str, _KindTable], np.ndarray]] = []
        # (the tables it was built with, the plan): how the last history view was evaluated
        self.last_plan: list[tuple[dict[str, _KindTable], _Plan]] = []
        # the expectation model's peer groups: (tables, label sets resolved, policy section, groups per kind)
        self.peer_groups: list[tuple[dict[str, _KindTable], int, Any, dict[str, PeerGroups]]] = []
        # (groups, expectations, per kind: KindExpect): the last cycle's, while both are the same objects
        self.kind_expect: list[tuple[dict[str, PeerGroups], Any, dict[str, KindExpect]]] = []

    def forget_evaluations(self) -> None:
        """Drop the kept evaluation and every score kept because the inputs were equal last time
        (benchmarks: time a full scoring, not a re-aggregation). What depends only on which series exist
        (entity maps per label set, series -> entity) stays."""
        self.last_evaluation.clear()
        self.last_tables.clear()
        self.last_plan.clear()
        self.spec_plans.clear()  # their seen/fresh consequences and derived scores
        self.spec_plan_of_lists.clear()
        self.roll_up_a.clear()
        self.roll_up_c.clear()
