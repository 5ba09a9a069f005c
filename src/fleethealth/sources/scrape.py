"""Scrape many exporter endpoints directly (dcgm-exporter, vLLM, SGLang, the fleethealth agent), for users
without Prometheus.

All endpoints are fetched concurrently on one event loop with a bound on in-flight requests and a
per-endpoint timeout; each body is parsed as soon as it arrives, so parsing overlaps the slow endpoints.
Like Prometheus, every target gets ``up`` and ``scrape_duration_seconds`` samples and its samples carry
``instance`` and ``job`` labels. A target's ``honor_labels`` (default true) decides who wins when a page
carries its own ``job``/``instance`` (a per-rank training exporter's ``job`` is the training job): true
keeps the page's values and fills only missing ones; false is Prometheus' default (the target's win, the
page's move to ``exported_job``). An endpoint that fails or times out yields ``up 0`` and a source error
naming its URL: its entities get no fresh samples and go stale, never healthy.

We ask for the classic text format (0.0.4) first: prometheus-client 0.23+ rewrites ``vllm:`` to
``vllm_`` when it serves OpenMetrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from fleethealth.auth.redact import redact_text, redact_url
from fleethealth.signals.snapshot import InputIssue, Snapshot
from fleethealth.sources.base import describe_http_error
from fleethealth.sources.exposition import PagePlans, parse_exposition, parse_many_into
from fleethealth.sources.exposition_labels import HONOR_LABELS_MARK

ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    url: str
    labels: Mapping[str, str] = field(default_factory=dict)  # added to every sample (e.g. node, pool)
    job: str = "fleethealth"
    # The page's own labels win over job/instance/labels (Prometheus' honor_labels: true): the training
    # job of a rank sample must stay `job`, or ranks of different jobs become one peer group.
    honor_labels: bool = True

    @property
    def instance(self) -> str:
        """host:port, as Prometheus labels a target (never the URL's user:password@)."""
        parts = urlsplit(self.url)
        return parts.netloc.rpartition("@")[2] or redact_url(self.url)

    @property
    def safe_url(self) -> str:
        """The URL for messages, logs and served text: credentials and secret query values masked."""
        return redact_url(self.url)


@dataclass(slots=True)
class TargetResult:
    target: ScrapeTarget
    ok: bool
    duration_s: float
    samples: int = 0
    error: str | None = None


def parse_text(body: bytes, *, default_ts: float, source: str, extra_labels: Mapping[str, str]) -> Snapshot:
    """Exposition text to a Snapshot through the project's fast parser (one page; ``read`` batches)."""
    return parse_exposition(body, default_ts=default_ts, source=source, extra_labels=extra_labels)


class ScrapeSource:
    """``read(now)`` scrapes every target once. Keeps one connection pool across reads (keep-alive)."""

    def __init__(
        self,
        targets: Sequence[ScrapeTarget | str],
        *,
        timeout_s: float = 5.0,
        concurrency: int = 64,
        max_body_bytes: int = 64 << 20,
        name: str = "scrape",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.targets = [t if isinstance(t, ScrapeTarget) else ScrapeTarget(url=t) for t in targets]
        # `instance` names one target, as in Prometheus: host:port, plus the path when several targets
        # share a host:port (one exporter serving a page per node), so their `up` series never collide.
        netlocs = [t.instance for t in self.targets]
        self._instance = {
            t.url: (t.instance if netlocs.count(t.instance) == 1 else t.instance + urlsplit(t.url).path)
            for t in self.targets
        }
        self.timeout_s = timeout_s
        self.concurrency = max(1, concurrency)
        self.max_body_bytes = max_body_bytes
        self._transport = transport
        self._loop = asyncio.new_event_loop()
        self._client: httpx.AsyncClient | None = None
        self.last_results: list[TargetResult] = []
        # The targets' pages as last read (``exposition_plan``): a steady fleet's pages are read as the
        # same text with new values, and every read hands the history the same label-set list.
        self.plans = PagePlans()

    def close(self) -> None:
        if self._client is not None:
            self._loop.run_until_complete(self._client.aclose())
            self._client = None
        self._loop.close()

    def read(self, now: float) -> Snapshot:
        return self._loop.run_until_complete(self.read_async(now))

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
            self._client = httpx.AsyncClient(
                timeout=self.timeout_s, limits=limits, headers={"Accept": ACCEPT}, transport=self._transport,
            )
        return self._client

    async def read_async(self, now: float) -> Snapshot:
        client = self._get_client()
        sem = asyncio.Semaphore(self.concurrency)
        merged = self.plans.builder()

        bodies: dict[int, bytes] = {}

        async def one(i: int, t: ScrapeTarget) -> TargetResult:
            async with sem:
                t0 = time.perf_counter()
                try:
                    bodies[i] = await asyncio.wait_for(self._fetch(client, t), timeout=self.timeout_s)
                except TimeoutError:
                    return TargetResult(t, False, time.perf_counter() - t0, error=f"timeout after {self.timeout_s:g} s")
                except _FetchError as e:
                    return TargetResult(t, False, time.perf_counter() - t0, error=str(e))
                return TargetResult(t, True, time.perf_counter() - t0)

        results = await asyncio.gather(*(one(i, t) for i, t in enumerate(self.targets)))
        # All bodies in one batched parse: thousands of small pages cost about one big text (parse_many_into),
        # far less than one call per page, even though parsing no longer overlaps the slowest fetches.
        order = sorted(bodies)
        pages = [
            (bodies[i], {**({HONOR_LABELS_MARK: ""} if results[i].target.honor_labels else {}),
                         "instance": self._instance[results[i].target.url], "job": results[i].target.job,
                         **results[i].target.labels}, results[i].target.safe_url)
            for i in order
        ]
        counts: list[int] = []
        parse_many_into(merged, pages, default_ts=now, sample_counts=counts, plans=self.plans)
        for i, c in zip(order, counts, strict=True):
            results[i].samples = c
        for r in results:
            lbl = {"instance": self._instance[r.target.url], "job": r.target.job, **r.target.labels}
            merged.add("up", lbl, 1.0 if r.ok else 0.0, now)
            merged.add("scrape_duration_seconds", lbl, r.duration_s, now)
            if not r.ok:
                merged.source_errors.append(InputIssue(r.target.safe_url, 0, redact_text(r.error or "scrape failed")))
        self.last_results = list(results)
        return merged.build(now)

    async def _fetch(self, client: httpx.AsyncClient, t: ScrapeTarget) -> bytes:
        try:
            async with client.stream("GET", t.url) as resp:
                if resp.status_code != 200:
                    raise _FetchError(f"HTTP {resp.status_code}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise _FetchError(f"body larger than {self.max_body_bytes} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx.HTTPError as e:
            raise _FetchError(describe_http_error(e)) from None


class _FetchError(Exception):
    pass
