"""Training jobs that end: a job's nodes fall idle at its ``ends_at`` (scenario YAML, a duration from the start).

Theory of operation. A real job's end looks like this in the telemetry: its ranks stop reporting (the
rank timer's endpoint goes with the pod) and its GPUs go idle (utilisation ~0, power and temperature
down). That is what the simulator already does for a drained node (``node_out``: the load plan sets its
load to 0, the step's snapshot masks its rank rows, its ranks no longer hold the job's step up), so a
job's end marks its nodes out as well, for good: ``JobEnds.advance`` does it once per step (a bisect on
the sorted end times; nothing happens for jobs without an end, so their telemetry is bit for bit what it
was), and ``keeps_out`` tells the world's ``release`` that such a node stays out (no new work is modelled:
its job is over). Jobs without ``ends_at`` never end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fleethealth.sim.fleet import Fleet


class JobEnds:
    """The jobs' end times (absolute sim time) and which nodes have no job any more."""

    def __init__(self, fleet: Fleet, start: float) -> None:
        ends = sorted((start + j.spec.ends_at, j.index) for j in fleet.jobs if j.spec.ends_at is not None)
        self._at = [t for t, _ in ends]
        self._nodes = [fleet.jobs[j].nodes for _, j in ends]
        self._next = 0
        self.over = np.zeros(fleet.n_nodes, bool)  # nodes whose job has ended

    def advance(self, t: float, node_out: np.ndarray) -> None:
        """Mark (in ``node_out``, in place) the nodes of every job that has ended by ``t``."""
        while self._next < len(self._at) and self._at[self._next] <= t:
            nodes = self._nodes[self._next]
            self.over[nodes] = True
            node_out[nodes] = True
            self._next += 1

    def keeps_out(self, node: int) -> bool:
        """A node whose job has ended stays out of the workload when released (no new job arrives)."""
        return bool(self.over[node])
