"""Chronic slowness and the fast path: pure helpers the decider calls once per cycle.

Theory of operation
-------------------
Fast path. A counter ramp read over a short and a long window (``short_window_s``) that scores 0 raises
the flag ``floor:<signal>`` on its GPU (``score.signals``); ``at_floor`` tells the decider whether a
node's flags carry one, and the lifecycle then quarantines after ``lifecycle.floor_dwell_s`` instead of
the degraded-then-quarantine dwell chain.
"""

from __future__ import annotations

from collections.abc import Iterable

FLOOR_PREFIX = "floor:"


def at_floor(*flag_sets: Iterable[str] | None) -> bool:
    """Whether any of the flag sets names a counter at its critical rate on both windows."""
    return any(f.startswith(FLOOR_PREFIX) for fs in flag_sets if fs for f in fs)
