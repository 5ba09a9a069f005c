"""The proxy's admission: a concurrency limit with a bounded FIFO queue that a drain can empty at once.

asyncio.Semaphore cannot tell its waiters "go away, retry elsewhere"; a drain must answer every queued
request with a retryable 503 right away, so the queue is explicit.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Rejected(Exception):
    """Not admitted; ``reason`` goes to the client with a 503 and Retry-After."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Admission:
    def __init__(self, limit: int, queue_limit: int) -> None:
        self.limit = max(1, limit)
        self.queue_limit = max(0, queue_limit)
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        if not self._waiters:
            return 0
        return sum(1 for f in self._waiters if not f.done())

    def try_acquire(self) -> bool:
        """A slot now if one is free and nobody waits before us (no await: the proxy's fast path)."""
        if self.active < self.limit and not self.queued:
            self.active += 1
            return True
        return False

    async def acquire(self, timeout_s: float) -> None:
        if self.active < self.limit and not self.queued:
            self.active += 1
            return
        if self.queued >= self.queue_limit:
            raise Rejected("admission queue full")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return  # granted at the very moment the wait ran out: keep the slot
            fut.cancel()
            raise Rejected(f"queued for more than {timeout_s:g}s") from None
        except asyncio.CancelledError:
            # Client went away: give the slot back if it was granted meanwhile.
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release()
            else:
                fut.cancel()
            raise

    def release(self) -> None:
        self.active = max(0, self.active - 1)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.active < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.active += 1
                fut.set_result(None)

    def set_limit(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    def reject_waiting(self, reason: str) -> int:
        """Every queued request gets ``Rejected(reason)``; returns how many."""
        n = 0
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(Rejected(reason))
                n += 1
        return n
