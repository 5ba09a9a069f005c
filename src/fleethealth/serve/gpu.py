"""/gpuz: can this replica's GPU be trusted? Local GPU signals scored by the project's engine, plus the
CUDA errors the sidecar saw in the engine's responses and log.

Readers are edges behind a one-method Protocol (``read(now) -> Snapshot``, never raising for outside
failures): NVML when the library is present, or the node's exporter URL. ``GpuCheck`` is the pure part:
it keeps a rolling history (counters need several samples to become rates), scores it with
``Scorer.score`` and turns the GPU tuples into a verdict. Unknown (no reader, a dead exporter) is
reported as unknown and does not fail /gpuz: a telemetry outage is not a GPU fault, and draining on it
would turn a metrics problem into an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np

from fleethealth.decide.oom import context_errors_in
from fleethealth.policy import Policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import InputIssue, Snapshot, SnapshotBuilder

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


class GpuReader(Protocol):
    async def read(self, now: float) -> Snapshot: ...


def _failed(now: float, source: str, reason: str) -> Snapshot:
    snap = Snapshot.empty(now)
    snap.source_errors.append(InputIssue(source=source, line=0, reason=reason))
    return snap


def parse_text(body: bytes, now: float, source: str, extra_labels: Mapping[str, str]) -> Snapshot:
    """Exposition text to a Snapshot: the project's parser when present, prometheus-client's otherwise."""
    try:
        from fleethealth.sources.exposition import parse_exposition
    except ImportError:
        parse_exposition = None  # type: ignore[assignment]
    if parse_exposition is not None:
        return parse_exposition(body, default_ts=now, source=source, extra_labels=extra_labels)
    from prometheus_client.parser import text_string_to_metric_families

    b = SnapshotBuilder()
    try:
        for fam in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for s in fam.samples:
                if s.value != s.value:  # NaN
                    continue
                labels = {**s.labels, **extra_labels}
                b.add(s.name, labels, s.value, float(s.timestamp) if s.timestamp is not None else now)
    except ValueError as e:
        b.issues.append(InputIssue(source, 0, "unparsable exposition", str(e)))
    return b.build(now)


NODE_LABELS = ("Hostname", "node", "hostname")


def only_node(snap: Snapshot, node: str) -> Snapshot:
    """Samples of ``node`` (by its Hostname/node/hostname label); samples with none of those labels are
    taken to be this node's and get ``Hostname=node`` so the scorer can name their GPU."""
    keep_ls: list[bool] = []
    new_ls = []
    for ls in snap.labelsets:
        d = dict(ls)
        names = [d[k] for k in NODE_LABELS if k in d]
        if not names:
            d["Hostname"] = node
            keep_ls.append(True)
        else:
            keep_ls.append(node in names)
        new_ls.append(tuple(sorted(d.items())))
    keep = np.asarray(keep_ls, bool)[snap.series_ids] if len(snap) else np.zeros(0, bool)
    return Snapshot(snap.at, snap.metrics, new_ls, snap.metric_ids[keep], snap.series_ids[keep],
                    snap.values[keep], snap.ts[keep], list(snap.issues), list(snap.source_errors))


@dataclass
class ExporterGpuReader:
    """Scrapes the node's exporter (dcgm-exporter) and keeps only this node's samples when told its name."""

    url: str
    node: str | None = None
    timeout_s: float = 5.0
    _client: httpx.AsyncClient | None = None

    async def read(self, now: float) -> Snapshot:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, verify=not self.url.startswith("http://"))
        try:
            r = await self._client.get(self.url, headers={"Accept": ACCEPT})
            r.raise_for_status()
        except httpx.HTTPError as e:
            return _failed(now, self.url, f"{type(e).__name__}: {e}")
        snap = parse_text(r.content, now, self.url, {})
        return only_node(snap, self.node) if self.node else snap

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def nvml_present() -> bool:
    """Whether the NVIDIA management library loads here (it does not on machines without a GPU driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    with contextlib.suppress(Exception):
        pynvml.nvmlShutdown()
    return True


class NvmlGpuReader:
    """The local GPUs through the project's NVML source (dcgm-exporter names), off the event loop. Without
    the NVIDIA library (as on machines with no GPU) every read is a source error, never a healthy GPU."""

    def __init__(self, node: str, nvml: Any = None) -> None:
        from fleethealth.sources.nvml import NvmlSource

        self.source = NvmlSource(hostname=node) if nvml is None else NvmlSource(hostname=node, nvml=nvml)

    async def read(self, now: float) -> Snapshot:
        return await asyncio.to_thread(self.source.read, now)


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    ok: bool | None  # None: unknown
    score: float | None
    reason: str
    gpus: tuple[dict[str, Any], ...] = ()
    flags: tuple[str, ...] = ()
    cuda_errors: tuple[str, ...] = ()
    fatal: bool = False  # a hard gate (Xid, ECC, fallen off the bus): node tier
    fb_used_mib: float | None = None  # framebuffer in use on this replica's GPUs (canary: memory release)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "score": self.score, "reason": self.reason, "gpus": list(self.gpus),
                "flags": list(self.flags), "cuda_errors": list(self.cuda_errors), "fatal": self.fatal,
                "fb_used_mib": self.fb_used_mib}


def fb_used_mib(snap: Snapshot) -> float | None:
    """Sum over GPUs of the latest DCGM_FI_DEV_FB_USED in ``snap`` (None when absent)."""
    try:
        m = snap.metrics.index("DCGM_FI_DEV_FB_USED")
    except ValueError:
        return None
    sel = np.flatnonzero(snap.metric_ids == m)
    if sel.size == 0:
        return None
    latest: dict[int, tuple[float, float]] = {}
    for i in sel.tolist():
        sid, t, v = int(snap.series_ids[i]), float(snap.ts[i]), float(snap.values[i])
        if sid not in latest or t >= latest[sid][0]:
            latest[sid] = (t, v)
    return sum(v for _, v in latest.values())


@dataclass
class GpuCheck:
    policy: Policy
    fail_below: float = 0.3
    history: SignalHistory | None = None
    last: GpuVerdict = field(default_factory=lambda: GpuVerdict(None, None, "no GPU signals yet"))
    _scorer: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.history is None:
            self.history = SignalHistory(self.policy, memory_s=max(900.0, self.policy.freshness.rate_window_s * 2))

    def evaluate(self, snap: Snapshot | None, now: float, cuda_errors: Iterable[str] = ()) -> GpuVerdict:
        errs = tuple(cuda_errors)
        score: float | None = None
        gpus: list[dict[str, Any]] = []
        flags: list[str] = []
        gate = False
        reason = "no GPU reader configured"
        if snap is not None:
            assert self.history is not None
            self.history.add(snap)
            if self._scorer is None:
                from fleethealth.score.engine import Scorer

                self._scorer = Scorer()  # one per check: its history's stream
            fh = self._scorer.score(self.history.view(now), self.policy, now, consumer="remediation")
            tuples = fh.by_kind("gpu")
            known = [t for t in tuples if t.value is not None]
            for t in tuples:
                gpus.append(t.to_dict())
                flags.extend(t.flags)
                if t.value is not None and t.value <= 0.0 and t.reason.startswith("gate:"):
                    gate = True
            if known:
                worst = min(known, key=lambda t: t.value if t.value is not None else 1.0)
                score = worst.value
                reason = f"{worst.entity}: {worst.reason}"
            elif snap.source_errors:
                reason = "GPU signals unavailable: " + "; ".join(str(e) for e in snap.source_errors[:3])
            else:
                reason = "no fresh GPU samples"
        fb = fb_used_mib(snap) if snap is not None else None
        if errs:
            # Hardware-looking errors (illegal address, ECC, fallen off the bus, fatal Xids) mean the node;
            # others (a device-side assert) poison only this process's CUDA context: the pod.
            hw = any(context_errors_in(e) or e.startswith("Xid ") for e in errs)
            v = GpuVerdict(False, score, f"CUDA errors seen: {errs[-1][:200]}", tuple(gpus), tuple(flags), errs,
                           fatal=hw or gate, fb_used_mib=fb)
        elif score is None:
            v = GpuVerdict(None, None, reason, tuple(gpus), tuple(flags), fb_used_mib=fb)
        elif score < self.fail_below or gate:
            v = GpuVerdict(False, score, reason, tuple(gpus), tuple(flags), fatal=gate, fb_used_mib=fb)
        else:
            v = GpuVerdict(True, score, reason, tuple(gpus), tuple(flags), fb_used_mib=fb)
        self.last = v
        return v
