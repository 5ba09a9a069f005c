"""Read the signals a policy needs from anything that speaks the Prometheus HTTP API.

Only ``/api/v1/query`` and ``/api/v1/query_range`` are used (both via POST with a form body, so long
selectors never hit URL limits), so Thanos, Mimir and VictoriaMetrics work as well as Prometheus.

Why raw samples instead of instant vectors: an instant query stamps every value with the evaluation time
and silently reuses samples up to five minutes old (the lookback delta), which would make a dead exporter
look fresh. So counters and gauges are both read as range vectors through an instant query
(``{__name__=~"a|b"}[90s]``): raw samples with their real timestamps, which lets the engine judge age and
compute rates itself. Overlapping windows would hand the rolling history the same sample twice, so the
source remembers the newest timestamp it emitted per series and emits only newer samples. After the
first read (or a gap), the window shrinks to the time since the last good read plus slack.

Failures (timeout, refused connection, ``"status": "error"``, a body that is not JSON) become
``source_errors``; warnings of a partial response become ``issues``. Nothing here raises for them.
``unread_metrics`` names the metrics of the last read's failed or partial queries: their series may be
missing from it for no reason of their own, so the controller draws no absence conclusion from them
(``controller.loop``: a GPU is not "missing" because its query timed out while ``up`` answered).

Scale: decoding the API's JSON and converting it costs on the order of 10 us per sample in CPython
(measured here: about 60-100k samples per CPU second), so one controller reading 2 samples per series of
~12 policy fields follows roughly 30-60k GPUs per 15 s. Larger fleets shard with ``matchers`` (one
controller per pool or cluster) or use the direct scraper.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import numpy as np

from fleethealth.auth.redact import redact_url
from fleethealth.policy import Policy
from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot
from fleethealth.sources.base import describe_http_error

INFO_METRICS: tuple[str, ...] = ("fleethealth_node_info", "fleethealth_replica_info")
# Prometheus' own per-target series: the structural signals (scrape failures and latency) come from them.
TARGET_METRICS: tuple[str, ...] = ("up", "scrape_duration_seconds")
# DCGM reports fields a GPU lacks as huge sentinels; they are missing data, never values.
_BLANK_ABOVE = 9.0e18
_INT32_BLANK = (2147483632.0, 2147483647.0)
_NAME_OK = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class PromQueryError(Exception):
    """A query that produced no usable answer; the message is one line."""


@dataclass(frozen=True, slots=True)
class QueryPlan:
    """Which metric names to read, split by how they are used."""

    gauges: tuple[str, ...]
    counters: tuple[str, ...]
    targets: tuple[str, ...] = TARGET_METRICS

    @property
    def all_names(self) -> tuple[str, ...]:
        return self.gauges + self.counters + self.targets


def _is_counter_name(name: str) -> bool:
    return name.endswith(("_total", "_count", "_bucket", "_sum"))


def plan_queries(policy: Policy, extra_metrics: Iterable[str] = (), with_targets: bool = True) -> QueryPlan:
    """The series the policy reads: each signal's metric, SLO request counters, histogram buckets and the
    info metrics that carry node and replica metadata. Nothing else is queried."""
    gauges: dict[str, None] = {}
    counters: dict[str, None] = {}
    for s in policy.signals:
        if s.shape == "slo":
            if s.threshold_s is not None:
                counters[f"{s.metric}_bucket"] = None  # latency SLO: histogram base name
                counters[f"{s.metric}_count"] = None
            else:
                counters[s.metric] = None
            if s.requests_metric:
                counters[s.requests_metric] = None
        elif s.kind == "counter" or _is_counter_name(s.metric):
            counters[s.metric] = None
        else:
            gauges[s.metric] = None
    for m in INFO_METRICS:
        gauges[m] = None
    for m in extra_metrics:
        (counters if _is_counter_name(m) else gauges)[m] = None
    for m in counters:
        gauges.pop(m, None)
    bad = [m for m in [*gauges, *counters] if not _NAME_OK.match(m)]
    if bad:
        raise ValueError(f"not valid metric names: {', '.join(bad)}")
    return QueryPlan(
        gauges=tuple(gauges), counters=tuple(counters), targets=TARGET_METRICS if with_targets else ()
    )


def name_selector(names: Sequence[str], matchers: str = "") -> str:
    """``{__name__=~"a|b"}`` (names are validated metric names: no regex metacharacters but none needed)."""
    extra = f",{matchers}" if matchers else ""
    if len(names) == 1:
        return f"{names[0]}{{{matchers}}}" if matchers else names[0]
    return '{__name__=~"' + "|".join(names) + '"' + extra + "}"


def _chunks(names: Sequence[str], size: int) -> list[tuple[str, ...]]:
    return [tuple(names[i : i + size]) for i in range(0, len(names), size)]


def _duration(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds))}s"


@dataclass(slots=True)
class QueryResult:
    result_type: str
    result: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


class PrometheusAPI:
    """A thin client for the two query endpoints. Raises PromQueryError with one clear line."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = client or httpx.Client(timeout=timeout_s, headers=dict(headers or {}))

    def close(self) -> None:
        self._client.close()

    def _post(self, path: str, form: dict[str, str]) -> QueryResult:
        url = f"{self.base_url}{path}"
        try:
            resp = self._client.post(url, data=form, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise PromQueryError(describe_http_error(e)) from None
        try:
            body = resp.json()
        except ValueError:
            raise PromQueryError(f"HTTP {resp.status_code}: answer is not JSON: {resp.text[:120]!r}") from None
        if not isinstance(body, dict):
            raise PromQueryError(f"HTTP {resp.status_code}: unexpected answer shape")
        if body.get("status") != "success":
            et = body.get("errorType", "error")
            raise PromQueryError(f"HTTP {resp.status_code}: {et}: {body.get('error', 'no error message')}")
        data = body.get("data") or {}
        warnings = [str(w) for w in (body.get("warnings") or [])]
        return QueryResult(str(data.get("resultType", "")), list(data.get("result") or []), warnings)

    def query(self, promql: str, at: float) -> QueryResult:
        form = {"query": promql, "time": f"{at:.3f}", "timeout": _duration(self.timeout_s)}
        return self._post("/api/v1/query", form)

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> QueryResult:
        form = {
            "query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}",
            "timeout": _duration(self.timeout_s),
        }
        return self._post("/api/v1/query_range", form)


def _bad_value(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "infinite"
    if v >= _BLANK_ABOVE or _INT32_BLANK[0] <= v <= _INT32_BLANK[1]:
        return "DCGM blank sentinel"
    return None


class _Series:
    """Persistent interning for one source: metric names, label sets and, per (metric, labels) series,
    the newest timestamp already emitted. Snapshots share these lists (they only grow between
    compactions), so the rolling history maps their ids once instead of on every read."""

    def __init__(self) -> None:
        self.metrics: list[str] = []
        self.labelsets: list[LabelSet] = []
        self._mix: dict[str, int] = {}
        self._six: dict[LabelSet, int] = {}
        self.slots: dict[tuple[str, LabelSet], list[Any]] = {}  # -> [metric id, series id, last ts, read no]

    def slot(self, name: str, labels: LabelSet) -> list[Any]:
        key = (name, labels)
        sl = self.slots.get(key)
        if sl is None:
            mid = self._mix.get(name)
            if mid is None:
                mid = self._mix[name] = len(self.metrics)
                self.metrics.append(name)
            sid = self._six.get(labels)
            if sid is None:
                sid = self._six[labels] = len(self.labelsets)
                self.labelsets.append(labels)
            sl = self.slots[key] = [mid, sid, -math.inf, 0]
        return sl

    def compacted(self, live_read: int) -> _Series:
        """A fresh table with only the series touched by read ``live_read`` (their last timestamps kept),
        so a churning fleet (pods come and go) does not grow memory forever."""
        out = _Series()
        for (name, labels), sl in self.slots.items():
            if sl[3] >= live_read:
                out.slot(name, labels)[2:] = sl[2:]
        return out


class _ResultReader:
    """Turns vector/matrix results into sample columns, keeping only samples newer than already emitted."""

    def __init__(self, series: _Series, source: str, read_no: int = 0, dedup: bool = True) -> None:
        self.series = series
        self.source = source
        self.read_no = read_no
        self.dedup = dedup
        self.bad: dict[tuple[str, str], int] = {}
        self._m: list[int] = []
        self._s: list[int] = []
        self._v: list[float] = []
        self._t: list[float] = []

    def add(self, res: QueryResult, stamp: float | None = None) -> None:
        lo, hi = _INT32_BLANK
        m_app, s_app, v_app, t_app = self._m.append, self._s.append, self._v.append, self._t.append
        slot_of = self.series.slot
        for series in res.result:
            metric = series.get("metric")
            if not metric or "__name__" not in metric:
                continue  # an expression result without a name is no signal
            items = sorted(metric.items())
            name = metric["__name__"]
            items.remove(("__name__", name))
            labels: LabelSet = tuple(items)
            pairs = series.get("values")
            if pairs is None:
                one = series.get("value")
                if one is None:
                    continue
                pairs = (one,)
            sl = slot_of(name, labels)
            mid, sid = sl[0], sl[1]
            last = sl[2] if self.dedup else -math.inf
            newest = last
            for ts_raw, val_raw in pairs:
                ts = float(ts_raw) if stamp is None else stamp
                if ts <= last:
                    continue
                v = float(val_raw)
                # fast path: an ordinary finite value (NaN fails every comparison)
                if not (-_BLANK_ABOVE < v < lo or hi < v < _BLANK_ABOVE):
                    why = _bad_value(v)
                    if why is not None:
                        self.bad[(name, why)] = self.bad.get((name, why), 0) + 1
                        continue
                m_app(mid)
                s_app(sid)
                v_app(v)
                t_app(ts)
                if ts > newest:
                    newest = ts
            if self.dedup:
                sl[3] = self.read_no
                if newest > last:
                    sl[2] = newest

    def issues(self) -> list[InputIssue]:
        # One issue per metric and cause, with a count: a fleet of blank fields must not flood the log.
        return [
            InputIssue(self.source, 0, f"{n} sample(s) dropped: {why}", name)
            for (name, why), n in sorted(self.bad.items())
        ]

    def snapshot(self, at: float, issues: list[InputIssue], errors: list[InputIssue]) -> Snapshot:
        return Snapshot(
            at=at, metrics=self.series.metrics, labelsets=self.series.labelsets,
            metric_ids=np.asarray(self._m, np.int32), series_ids=np.asarray(self._s, np.int32),
            values=np.asarray(self._v, np.float64), ts=np.asarray(self._t, np.float64),
            issues=issues + self.issues(), source_errors=errors,
        )


class PrometheusSource:
    """The live source: every ``read(now)`` queries the policy's series as of ``now``."""

    def __init__(
        self,
        url: str,
        policy: Policy,
        *,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        extra_metrics: Iterable[str] = (),
        matchers: str = "",
        gauge_mode: Literal["raw", "instant"] = "raw",
        chunk: int = 16,
        min_window_s: float = 30.0,
        slack_s: float = 30.0,
        name: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.name = name or f"prometheus:{redact_url(url)}"  # the name is logged and served
        self.api = PrometheusAPI(url, timeout_s=timeout_s, headers=headers, client=client)
        self.plan = plan_queries(policy, extra_metrics)
        self.matchers = matchers
        self.gauge_mode = gauge_mode
        self.chunk = max(1, chunk)
        self.rate_window_s = policy.freshness.rate_window_s
        self.max_age_s = policy.freshness.max_age_s
        self.min_window_s = min_window_s
        self.slack_s = slack_s
        self._series = _Series()
        self._reads = 0
        self._last_ok: dict[str, float] = {}
        self.last_success: float | None = None
        self.last_error: str | None = None
        # metrics of the last read's failed queries and of those answered as partial responses
        self.unread_metrics: frozenset[str] = frozenset()

    def close(self) -> None:
        self.api.close()

    def _window(self, group: str, now: float, longest: float) -> float:
        last = self._last_ok.get(group)
        if last is None or now <= last:
            return longest
        return min(longest, max(self.min_window_s, now - last + self.slack_s))

    def groups(self) -> dict[str, tuple[str, ...]]:
        """The metric names each query group reads (``c0``.. counters, ``g0``.. gauges and targets)."""
        out = {f"c{i}": names for i, names in enumerate(_chunks(self.plan.counters, self.chunk))}
        out.update((f"g{i}", names) for i, names in enumerate(_chunks(self.plan.gauges + self.plan.targets,
                                                                      self.chunk)))
        return out

    def queries(self, now: float) -> list[tuple[str, str, bool]]:
        """(group, PromQL, is_range) for this read; public so tests and `explain` can show them."""
        out: list[tuple[str, str, bool]] = []
        for group, names in self.groups().items():
            sel = name_selector(names, self.matchers)
            if group.startswith("c"):
                out.append((group, f"{sel}[{_duration(self._window(group, now, self.rate_window_s))}]", True))
            elif self.gauge_mode == "instant":
                out.append((group, sel, False))
            else:
                out.append((group, f"{sel}[{_duration(self._window(group, now, self.max_age_s))}]", True))
        return out

    def read(self, now: float) -> Snapshot:
        self._reads += 1
        reader = _ResultReader(self._series, self.name, self._reads)
        issues: list[InputIssue] = []
        errors: list[InputIssue] = []
        names_of = self.groups()
        unread: set[str] = set()
        for group, promql, is_range in self.queries(now):
            try:
                res = self.api.query(promql, now)
            except PromQueryError as e:
                errors.append(InputIssue(self.name, 0, str(e), promql))
                unread.update(names_of[group])
                continue
            if res.result_type not in ("matrix", "vector"):
                errors.append(InputIssue(self.name, 0, f"unexpected result type {res.result_type!r}", promql))
                unread.update(names_of[group])
                continue
            reader.add(res, stamp=None if is_range else now)
            if res.warnings:  # a partial response (a store unreachable): its data is kept, not complete
                issues.extend(InputIssue(self.name, 0, f"partial response: {w}", promql) for w in res.warnings)
                unread.update(names_of[group])
            self._last_ok[group] = now
        self.unread_metrics = frozenset(unread)
        snap = reader.snapshot(now, issues, errors)
        if errors:
            self.last_error = errors[0].reason
        else:
            self.last_success = now
            self.last_error = None
        self._compact()
        return snap

    def _compact(self) -> None:
        # Series seen in none of the last reads are forgotten once they outnumber the live ones.
        slots = len(self._series.slots)
        if slots > 100_000 and self._reads % 16 == 0:
            live = self._series.compacted(self._reads - 8)
            if len(live.slots) * 2 < slots:
                self._series = live


def read_range(
    api: PrometheusAPI,
    names: Sequence[str],
    start: float,
    end: float,
    step_s: float,
    *,
    matchers: str = "",
    chunk: int = 16,
) -> Snapshot:
    """Range query for recordings and evidence: every named series, evaluated every ``step_s``.

    Raises PromQueryError: a recording or an evidence bundle that silently lacks data is worse than a
    clear failure the caller can report.
    """
    reader = _ResultReader(_Series(), f"prometheus:{api.base_url}", dedup=False)
    issues: list[InputIssue] = []
    for names_chunk in _chunks(list(names), max(1, chunk)):
        res = api.query_range(name_selector(names_chunk, matchers), start, end, step_s)
        reader.add(res)
        issues.extend(InputIssue(reader.source, 0, f"partial response: {w}") for w in res.warnings)
    return reader.snapshot(end, issues, [])


def record_policy_range(
    url: str, policy: Policy, start: float, end: float, step_s: float, timeout_s: float = 30.0
) -> Snapshot:
    """A recording of everything the policy reads between start and end, for replay and backtest."""
    api = PrometheusAPI(url, timeout_s=timeout_s)
    try:
        return read_range(api, plan_queries(policy).all_names, start, end, step_s)
    finally:
        api.close()
