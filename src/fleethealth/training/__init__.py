"""Training-side instrumentation: per-rank compute time up to the gradient collective (``RankTimer``).

Imports nothing heavy: torch and prometheus-client are loaded only when a timer attaches or exports.
"""

from fleethealth.training.rank_timer import (
    COMPUTE_METRIC,
    FIRST_COLLECTIVE_METRIC,
    STEP_METRIC,
    RankTimer,
    StepTiming,
)

__all__ = ["COMPUTE_METRIC", "FIRST_COLLECTIVE_METRIC", "STEP_METRIC", "RankTimer", "StepTiming"]
