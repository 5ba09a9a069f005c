"""Engine progress for /livez: a hung engine fails, an idle one passes. Pure; time is an argument.

Theory of operation. vLLM's own /health stays 200 while its engine is hung, so liveness must look at
work: while requests are running (the proxy's own in-flight requests that have reached the engine, or the
engine's ``vllm:num_requests_running``), some token must come out within ``timeout_s`` (a streamed chunk
seen by the proxy, a completed response, or a rise of ``vllm:generation_tokens_total``). The clock of the
stall starts at the later of the last progress and the moment work appeared, so an idle hour followed by
one request does not look like an hour-long stall.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ProgressWatch:
    timeout_s: float
    last_progress: float = 0.0
    busy_since: float | None = None  # when work appeared (None: idle)
    proxy_active: int = 0
    engine_running: float = 0.0
    last_gen_tokens: float | None = None

    def _update_busy(self, now: float) -> None:
        busy = self.proxy_active > 0 or self.engine_running > 0
        if busy and self.busy_since is None:
            self.busy_since = now
        elif not busy:
            self.busy_since = None

    def progress(self, now: float) -> None:
        self.last_progress = max(self.last_progress, now)

    def set_proxy_active(self, n: int, now: float) -> None:
        self.proxy_active = n
        self._update_busy(now)

    def observe_engine(self, now: float, running: float | None, gen_tokens_total: float | None) -> None:
        """One scrape of the engine's metrics."""
        if gen_tokens_total is not None:
            # A drop means the engine restarted: that is not progress, but it resets the baseline.
            if self.last_gen_tokens is not None and gen_tokens_total > self.last_gen_tokens:
                self.progress(now)
            self.last_gen_tokens = gen_tokens_total
        if running is not None:
            self.engine_running = running
        self._update_busy(now)

    def stalled_for(self, now: float) -> float:
        """Seconds of work without progress (0 when idle)."""
        if self.busy_since is None:
            return 0.0
        return max(0.0, now - max(self.last_progress, self.busy_since))

    def alive(self, now: float) -> bool:
        return self.stalled_for(now) <= self.timeout_s
