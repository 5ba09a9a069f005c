"""Canary re-admission of a RECOVERING replica. Pure: time is an argument, no I/O.

Theory of operation. A recovered replica is not trusted with full traffic at once (the seed: probe
inference, then a small share of short requests, watch error rate, TTFT, TPOT/ITL, memory release and GPU
signals, full weight after a stable window). The canary starts with a probe phase: the sidecar sends probe
inferences and the canary waits for ``probes_required`` successes. Then the ramp: the published weight
grows linearly from ``initial_share`` to 1 over ``stable_window_s`` and the proxy admits that share of
*short* requests (max_tokens at most ``short_max_tokens``); any bad observation (error rate over the limit
with enough requests, mean TTFT or ITL over the limit, GPU not trusted, memory not released) fails the
canary at once. Surviving the whole window with at least ``min_requests`` observed passes it.

``ShareGate`` turns the weight into admission decisions deterministically (no randomness: tests and
replays see the same admissions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    CONTINUE = "continue"
    PASS = "pass"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class CanaryConfig:
    probes_required: int = 2
    probe_timeout_s: float = 30.0  # probe phase must finish within this
    initial_share: float = 0.05
    stable_window_s: float = 120.0
    short_max_tokens: int = 256
    min_requests: int = 5  # observations (probes count) needed before passing
    max_error_rate: float = 0.05
    min_requests_for_rate: int = 5
    max_ttft_s: float = 2.0
    max_itl_s: float = 0.2
    max_failures: int = 3  # canary failures within failure_window_s before FAILED
    failure_window_s: float = 3600.0
    memory_tolerance: float = 0.1  # GPU memory in use may exceed the last healthy READY level by this share


@dataclass(frozen=True, slots=True)
class Observation:
    """What the sidecar saw since the canary started (counts are cumulative over the canary)."""

    requests: int = 0
    errors: int = 0
    probe_successes: int = 0
    probe_failures: int = 0
    mean_ttft_s: float | None = None
    mean_itl_s: float | None = None
    gpu_ok: bool | None = None  # None: unknown (no GPU signals); never fails the canary by itself
    memory_released: bool | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    weight: float
    phase: str  # probe | ramp | done
    reason: str


@dataclass(slots=True)
class Canary:
    started_at: float
    config: CanaryConfig = field(default_factory=CanaryConfig)
    ramp_started_at: float | None = None

    def step(self, obs: Observation, now: float) -> Decision:
        c = self.config
        bad = self._bad(obs)
        if bad:
            return Decision(Verdict.FAIL, 0.0, "probe" if self.ramp_started_at is None else "ramp", bad)
        if self.ramp_started_at is None:
            if obs.probe_successes >= c.probes_required:
                self.ramp_started_at = now
            elif now - self.started_at > c.probe_timeout_s:
                return Decision(Verdict.FAIL, 0.0, "probe",
                                f"only {obs.probe_successes}/{c.probes_required} probe inferences succeeded "
                                f"within {c.probe_timeout_s:g}s")
            else:
                return Decision(Verdict.CONTINUE, 0.0, "probe", "waiting for probe inferences")
        elapsed = now - self.ramp_started_at
        if elapsed >= c.stable_window_s:
            if obs.requests >= c.min_requests:
                return Decision(Verdict.PASS, 1.0, "done",
                                f"stable for {elapsed:.0f}s over {obs.requests} requests")
            return Decision(Verdict.CONTINUE, 1.0 if c.stable_window_s == 0 else self._weight(elapsed), "ramp",
                            f"stable window over but only {obs.requests}/{c.min_requests} requests seen")
        return Decision(Verdict.CONTINUE, self._weight(elapsed), "ramp", f"ramping ({elapsed:.0f}s stable)")

    def _weight(self, elapsed: float) -> float:
        c = self.config
        if c.stable_window_s <= 0:
            return 1.0
        frac = min(1.0, max(0.0, elapsed / c.stable_window_s))
        return round(c.initial_share + (1.0 - c.initial_share) * frac, 4)

    def _bad(self, obs: Observation) -> str:
        c = self.config
        if obs.probe_failures and self.ramp_started_at is None:
            return f"{obs.probe_failures} probe inference(s) failed"
        if obs.gpu_ok is False:
            return "GPU signals say the device cannot be trusted"
        if obs.memory_released is False:
            return "GPU memory was not released"
        if obs.requests >= c.min_requests_for_rate and obs.errors / obs.requests > c.max_error_rate:
            return f"error rate {obs.errors}/{obs.requests} over {c.max_error_rate:.0%}"
        if obs.mean_ttft_s is not None and obs.mean_ttft_s > c.max_ttft_s:
            return f"mean TTFT {obs.mean_ttft_s:.3f}s over {c.max_ttft_s:g}s"
        if obs.mean_itl_s is not None and obs.mean_itl_s > c.max_itl_s:
            return f"mean inter-token latency {obs.mean_itl_s:.3f}s over {c.max_itl_s:g}s"
        return ""


def recent_failures(failures: list[float], now: float, window_s: float) -> int:
    return sum(1 for t in failures if now - t <= window_s)


@dataclass(slots=True)
class ShareGate:
    """Admit a ``weight`` share of offered requests, deterministically (a running quota)."""

    offered: int = 0
    admitted: int = 0

    def admit(self, weight: float) -> bool:
        self.offered += 1
        if weight >= 1.0 or self.admitted < weight * self.offered:
            self.admitted += 1
            return True
        return False
