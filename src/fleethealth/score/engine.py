"""The scoring engine's public names, in one place (the engine itself lives in the rooms of score/).

Theory of operation
-------------------
A whole fleet snapshot -> one health tuple per GPU, node, replica and rank. The work is split by stage,
each module with its own theory of operation:

* resolve.py: label sets -> entity keys (incremental, per stream);
* context.py: one call's view of the snapshot by metric, entity tables, result matrices;
* kernels.py: per-series arithmetic (latest sample, reset-aware increase, counter windows);
* signals.py, slo.py: one signal for every entity of a kind -> sub-scores (gauges, counters, peers,
  Xids; SLO burn rates);
* plan.py: a history view's whole evaluation as fixed numpy operations, kept while its layout holds;
* aggregate.py: gates, category means, cross-category function, confidence;
* rollup.py: a node is the weakest of its GPUs and its own signals;
* result.py: the columnar ``FleetHealth`` with lazy kinds and tuples;
* kept.py: what a scorer keeps between cycles, with its bounds;
* scorer.py: ``Scorer`` (one per stream of snapshots) and the stateless ``score_snapshot``.

reference.py is the scalar oracle the tests compare all of this with. This module re-exports the names
other code imports from ``fleethealth.score.engine``.
"""

from __future__ import annotations

from fleethealth.score.aggregate import KindScores
from fleethealth.score.kept import Kept
from fleethealth.score.kernels import _counter_runs, _increase_per_series, _value_flags
from fleethealth.score.resolve import KINDS, UNNAMED_NODE
from fleethealth.score.result import NODE_INFO_METRIC, REPLICA_INFO_METRIC, FleetHealth
from fleethealth.score.scorer import CONSUMERS, Consumer, Scorer, forget_evaluations, score_snapshot

__all__ = [
    "CONSUMERS",
    "KINDS",
    "NODE_INFO_METRIC",
    "REPLICA_INFO_METRIC",
    "UNNAMED_NODE",
    "Consumer",
    "FleetHealth",
    "KindScores",
    "Kept",
    "Scorer",
    "_counter_runs",
    "_increase_per_series",
    "_value_flags",
    "forget_evaluations",
    "score_snapshot",
]
