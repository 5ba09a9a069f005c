"""CUDA out-of-memory classification: an OOM is a symptom, not a diagnosis.

Theory of operation. The same "CUDA out of memory" text comes from four different causes, and each has a
different smallest action that fits (the seed's table; never "restart on every OOM"):

- DEVICE_FAULT: the OOM comes with a fatal Xid or a CUDA context error (illegal memory access, ECC,
  fallen off the bus). Memory numbers from a broken device mean nothing: quarantine the node and run a
  health check. Checked first because it overrides everything else.
- OVERSIZED_REQUEST: this one request cannot fit (its tokens exceed the model length, the batch token
  budget or the KV capacity, or it alone filled most of a full batch). Reject it with a clear client error or
  clip its max_tokens; the replica is fine.
- FRAGMENTATION: there was enough memory in total (free + reserved-but-unallocated covers the failed
  allocation) but not in one piece. Only a fresh worker fixes that: drain and rebuild the worker (pod tier).
- BATCH_OVERLOAD: the scheduler admitted too much at once (batch tokens or KV cache near full). Lower
  concurrency; nothing is broken. Also the answer when context is missing, because it is the softest action
  (the explanation says so).

Pure: no clocks, no I/O. ``parse_torch_oom`` turns PyTorch's OOM message into numbers so the sidecar can
fill an ``OomEvent`` from an engine's error response.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from fleethealth.decide.model import Intent, IntentKind, Tier
from fleethealth.signals.xid import classify_xid


class OomClass(StrEnum):
    OVERSIZED_REQUEST = "oversized_request"
    BATCH_OVERLOAD = "batch_overload"
    FRAGMENTATION = "fragmentation"
    DEVICE_FAULT = "device_fault"


# CUDA errors that mean the context (or the device) is no longer trustworthy. Matched case-insensitively
# as substrings of engine error text / log lines.
CONTEXT_ERROR_PATTERNS: tuple[str, ...] = (
    "illegal memory access",
    "an illegal instruction was encountered",
    "unspecified launch failure",
    "uncorrectable ecc",
    "fallen off the bus",
    "gpu is lost",
    "cuda_error_launch_failed",
    "cudaerrorlaunchfailure",
    "cudaerrorillegaladdress",
    "cuda_error_illegal_address",
    "cudaerrorecc",
    "cuda_error_ecc_uncorrectable",
    "misaligned address",
)

_OOM_PATTERNS = re.compile(
    r"(cuda out of memory|outofmemoryerror|cuda error: out of memory|cudaErrorMemoryAllocation|"
    r"CUDA_ERROR_OUT_OF_MEMORY|out of memory)",
    re.IGNORECASE,
)
_XID_RE = re.compile(r"xid[^0-9]{0,40}?(\d{1,3})\b", re.IGNORECASE)


def is_oom_text(text: str) -> bool:
    return bool(_OOM_PATTERNS.search(text))


def context_errors_in(text: str) -> list[str]:
    """The context-error patterns found in ``text`` (empty when none)."""
    low = text.lower()
    return [p for p in CONTEXT_ERROR_PATTERNS if p in low]


# Errors that poison only the process that raised them (an application bug), not the device.
APP_ERROR_PATTERNS: tuple[str, ...] = ("device-side assert",)


def context_error_kinds(text: str) -> list[str]:
    """Why ``text`` (one CUDA error seen near an OOM) means the context or device is not trustworthy:
    the known hardware-looking patterns, else any other CUDA error that is neither an OOM nor an
    application bug (reported as ``cuda_error``). Empty when it means nothing of the kind."""
    found = context_errors_in(text)
    if found:
        return found
    low = text.lower()
    if "cuda" in low and not is_oom_text(text) and not any(p in low for p in APP_ERROR_PATTERNS):
        return ["cuda_error"]
    return []


def xids_in(text: str) -> list[int]:
    """Xid codes mentioned in ``text`` (kernel log shape ``NVRM: Xid (PCI:...): 79, ...`` or ``Xid 79``)."""
    out: list[int] = []
    for m in re.finditer(r"NVRM: Xid \([^)]*\):\s*(\d{1,3})", text):
        out.append(int(m.group(1)))
    if not out:
        out = [int(m.group(1)) for m in _XID_RE.finditer(text)]
    return out


_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3}


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNITS[unit.lower()])


# PyTorch's format_size writes sizes up to 1 KiB as "N bytes" ("0 bytes is reserved by PyTorch but
# unallocated", seen on an H200 with torch 2.11), larger ones as "1.50 KiB/MiB/GiB".
_SZ = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes?|[KMGT]i?B|B)"


@dataclass(frozen=True, slots=True)
class TorchOomNumbers:
    requested_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None


def parse_torch_oom(text: str) -> TorchOomNumbers:
    """Numbers from PyTorch's OOM message, e.g. ``Tried to allocate 2.00 GiB. GPU 0 has a total capacity
    of 79.15 GiB of which 1.50 GiB is free. ... Of the allocated memory 70.00 GiB is allocated by PyTorch,
    and 5.00 GiB is reserved by PyTorch but unallocated.`` Missing parts stay None."""

    def grab(pattern: str) -> int | None:
        m = re.search(pattern, text, re.IGNORECASE)
        return _bytes(m.group(1), m.group(2)) if m else None

    return TorchOomNumbers(
        requested_bytes=grab(r"tried to allocate\s+" + _SZ),
        total_bytes=grab(r"total capacity of\s+" + _SZ),
        free_bytes=grab(r"of which\s+" + _SZ + r"\s+is free"),
        allocated_bytes=grab(_SZ + r"\s+is allocated by PyTorch"),
        reserved_unallocated_bytes=grab(_SZ + r"\s+is reserved by PyTorch but unallocated"),
    )


@dataclass(frozen=True, slots=True)
class OomEvent:
    """One OOM and what was known around it. Every field but ``ts`` may be unknown (None / empty)."""

    ts: float
    prompt_tokens: int | None = None
    max_tokens: int | None = None  # requested output budget
    output_tokens: int | None = None  # produced before the OOM (when it struck mid-decode)
    batch_tokens: int | None = None  # tokens scheduled in the batch that failed
    max_batch_tokens: int | None = None  # the engine's batch token budget (vLLM max_num_batched_tokens)
    running_requests: int | None = None
    kv_cache_usage: float | None = None  # 0..1
    kv_capacity_tokens: int | None = None
    requested_bytes: int | None = None  # the allocation that failed
    free_bytes: int | None = None
    reserved_bytes: int | None = None  # reserved by the allocator but unallocated (or total reserved, see
    # _cached_bytes: a value >= allocated_bytes is read as torch.cuda.memory_reserved())
    allocated_bytes: int | None = None
    total_bytes: int | None = None
    recent_xids: tuple[int, ...] = ()
    cuda_errors: tuple[str, ...] = ()
    model_max_len: int | None = None
    entity: str = ""  # replica (or gpu) the OOM happened on
    model: str = ""

    @property
    def request_tokens(self) -> int | None:
        """Tokens this request needs at most: prompt plus output budget (or what it produced)."""
        if self.prompt_tokens is None:
            return None
        out = self.max_tokens if self.max_tokens is not None else (self.output_tokens or 0)
        return self.prompt_tokens + max(out, self.output_tokens or 0)


@dataclass(frozen=True, slots=True)
class OomThresholds:
    """Defaults for the classifier; the sidecar may pass its own."""

    fatal_xid_classes: tuple[str, ...] = ("gate", "reset")  # classify_xid results that mean a device fault
    gate_buckets: tuple[str, ...] = ("RESET_GPU", "RESTART_BM", "RESTART_VM")
    gate_xids: tuple[int, ...] = (48, 62, 64, 74, 79, 95, 119, 120, 140)
    app_xids: tuple[int, ...] = (13, 31, 43, 45, 94)
    reset_xids: tuple[int, ...] = (63,)
    oversize_fraction: float = 1.0  # request tokens above this share of the tightest capacity: oversized
    oversize_batch_share: float = 0.5  # one request holding this share of the failed batch: oversized
    overload_batch_share: float = 0.85  # batch tokens at this share of the budget: overload
    overload_kv_usage: float = 0.9
    fragmentation_min_share: float = 0.05  # free+reserved at least this share of total memory ...
    fragmentation_cover: float = 1.0  # ... and at least this multiple of the failed allocation
    fragmentation_unknown_share: float = 0.1  # failed allocation unknown: spare must be this share of total
    concurrency_factor: float = 0.75  # BATCH_OVERLOAD: new concurrency limit = running * factor
    min_concurrency: int = 1


DEFAULT_THRESHOLDS = OomThresholds()


@dataclass(frozen=True, slots=True)
class OomVerdict:
    cls: OomClass
    explanation: str
    evidence: tuple[str, ...] = field(default_factory=tuple)
    confident: bool = True  # False when the class is the fallback for missing context
    max_tokens_allowed: int | None = None  # OVERSIZED_REQUEST: a max_tokens that would fit, if any


def fatal_xids(xids: Iterable[int], th: OomThresholds = DEFAULT_THRESHOLDS) -> list[int]:
    return sorted({
        x for x in xids
        if classify_xid(x, list(th.gate_buckets), list(th.gate_xids), list(th.app_xids), list(th.reset_xids))
        in th.fatal_xid_classes
    })


def _capacity(ev: OomEvent) -> tuple[int | None, str]:
    known = [(v, n) for v, n in ((ev.model_max_len, "model_max_len"), (ev.max_batch_tokens, "max_batch_tokens"),
                                 (ev.kv_capacity_tokens, "kv_capacity_tokens")) if v is not None and v > 0]
    if not known:
        return None, ""
    return min(known)


def _cached_bytes(ev: OomEvent) -> int | None:
    """Reserved-but-unallocated bytes. ``reserved_bytes`` is read that way unless it is at least
    ``allocated_bytes``, in which case it is the allocator's total reservation (torch.cuda.memory_reserved)
    and the cached part is the difference."""
    if ev.reserved_bytes is None:
        return None
    if ev.allocated_bytes is not None and ev.reserved_bytes >= ev.allocated_bytes:
        return ev.reserved_bytes - ev.allocated_bytes
    return ev.reserved_bytes


def _batch_full(ev: OomEvent, th: OomThresholds) -> list[str]:
    over = []
    if ev.batch_tokens is not None and ev.max_batch_tokens and ev.batch_tokens >= th.overload_batch_share * ev.max_batch_tokens:
        over.append(f"batch_tokens {ev.batch_tokens}/{ev.max_batch_tokens}")
    if ev.kv_cache_usage is not None and ev.kv_cache_usage >= th.overload_kv_usage:
        over.append(f"kv_cache_usage {ev.kv_cache_usage:.2f}")
    return over


def classify_oom(ev: OomEvent, th: OomThresholds = DEFAULT_THRESHOLDS) -> OomVerdict:
    """Pick the OOM's class (see the module docstring for the order and why)."""
    fx = fatal_xids(ev.recent_xids, th)
    ctx = sorted({p for e in ev.cuda_errors for p in context_error_kinds(e)})
    if fx or ctx:
        parts = []
        if fx:
            parts.append("fatal Xid " + ",".join(str(x) for x in fx))
        if ctx:
            parts.append("CUDA context error (" + "; ".join(ctx) + ")")
        return OomVerdict(
            OomClass.DEVICE_FAULT,
            "OOM together with " + " and ".join(parts) + ": the device cannot be trusted; quarantine and "
            "run a health check",
            tuple([f"xid:{x}" for x in fx] + [f"cuda_error:{c}" for c in ctx]),
        )

    req = ev.request_tokens
    cap, cap_name = _capacity(ev)
    if req is not None and cap is not None and req > th.oversize_fraction * cap:
        allowed = None
        if ev.prompt_tokens is not None:
            room = int(th.oversize_fraction * cap) - ev.prompt_tokens
            allowed = room if room > 0 else None
        return OomVerdict(
            OomClass.OVERSIZED_REQUEST,
            f"request needs {req} tokens (prompt {ev.prompt_tokens} + output {req - (ev.prompt_tokens or 0)}) "
            f"but {cap_name} is {cap}: reject it or lower max_tokens"
            + (f" to at most {allowed}" if allowed else
               " (the prompt alone is too long)" if ev.prompt_tokens is not None else ""),
            (f"request_tokens:{req}", f"{cap_name}:{cap}"),
            max_tokens_allowed=allowed,
        )
    cached = _cached_bytes(ev)
    spare = None
    if ev.free_bytes is not None or cached is not None:
        spare = (ev.free_bytes or 0) + (cached or 0)
    # With the failed allocation known, "enough in total" is exact; without it, spare memory must be large.
    enough = spare is not None and (
        spare >= th.fragmentation_cover * ev.requested_bytes if ev.requested_bytes is not None
        else bool(ev.total_bytes) and spare >= th.fragmentation_unknown_share * (ev.total_bytes or 0))
    if spare is not None and ev.total_bytes and enough and spare >= th.fragmentation_min_share * ev.total_bytes \
            and (cached or 0) > 0:
        return OomVerdict(
            OomClass.FRAGMENTATION,
            f"{_gib(spare)} was free or reserved-but-unallocated (of {_gib(ev.total_bytes)}) yet an allocation "
            + (f"of {_gib(ev.requested_bytes)} " if ev.requested_bytes is not None else "")
            + "failed: memory is fragmented; drain and rebuild the worker",
            (f"spare_bytes:{spare}", f"requested_bytes:{ev.requested_bytes}", f"cached_bytes:{cached}"),
        )

    full = _batch_full(ev, th)
    if req is not None and full and ev.batch_tokens and req >= th.oversize_batch_share * ev.batch_tokens:
        # A full batch that one request dominates: lowering concurrency would not help, shrinking it would.
        allowed = None
        if ev.prompt_tokens is not None and ev.max_tokens is not None:
            allowed = max(1, ev.max_tokens // 2)
        return OomVerdict(
            OomClass.OVERSIZED_REQUEST,
            f"one request holds {req} of the batch's {ev.batch_tokens} tokens: reject it or lower max_tokens",
            (f"request_tokens:{req}", f"batch_tokens:{ev.batch_tokens}"),
            max_tokens_allowed=allowed,
        )

    over = full
    if over:
        return OomVerdict(
            OomClass.BATCH_OVERLOAD,
            "the batch was full (" + ", ".join(over) + "): lower concurrency or the batch token limit",
            tuple(over),
        )
    return OomVerdict(
        OomClass.BATCH_OVERLOAD,
        "no sign of an oversized request, fragmentation or a device fault; treated as batch overload "
        "(the softest action: lower concurrency) for want of context",
        ("insufficient_context",),
        confident=False,
    )


def _gib(n: int | float) -> str:
    return f"{n / 1024**3:.2f} GiB"


def new_concurrency_limit(current_limit: int, running: int | None, th: OomThresholds = DEFAULT_THRESHOLDS) -> int:
    """Multiplicative decrease from what was running when the OOM struck (never below the floor)."""
    base = running if running is not None and running > 0 else current_limit
    return max(th.min_concurrency, min(current_limit, int(base * th.concurrency_factor)))


def oom_intents(ev: OomEvent, now: float, th: OomThresholds = DEFAULT_THRESHOLDS,
                current_limit: int | None = None, policy_version: str = "") -> list[Intent]:
    """The smallest actions that fit the OOM's class, as data. Never a plain restart: a worker rebuild is
    only for fragmentation, and then together with a drain so requests in flight finish first."""
    v = classify_oom(ev, th)
    ent = ev.entity
    base = {"oom_class": str(v.cls)}
    if v.cls is OomClass.OVERSIZED_REQUEST:
        params: dict[str, object] = dict(base)
        params.update({"prompt_tokens": ev.prompt_tokens, "max_tokens": ev.max_tokens,
                       "max_tokens_allowed": v.max_tokens_allowed})
        return [Intent(now, IntentKind.REJECT_REQUEST, ent, v.explanation, params, Tier.INSTANCE,
                       policy_version=policy_version)]
    if v.cls is OomClass.BATCH_OVERLOAD:
        limit = current_limit if current_limit is not None else (ev.running_requests or 1)
        new = new_concurrency_limit(limit, ev.running_requests, th)
        return [Intent(now, IntentKind.LIMIT_CONCURRENCY, ent, v.explanation,
                       {**base, "max_concurrency": new, "confident": v.confident}, Tier.INSTANCE,
                       policy_version=policy_version)]
    if v.cls is OomClass.FRAGMENTATION:
        return [
            Intent(now, IntentKind.DRAIN, ent, v.explanation, dict(base), Tier.POD, policy_version=policy_version),
            Intent(now, IntentKind.REBUILD_WORKER, ent, v.explanation, dict(base), Tier.POD,
                   policy_version=policy_version),
            Intent(now, IntentKind.CAPTURE_EVIDENCE, ent, v.explanation, dict(base), Tier.POD,
                   policy_version=policy_version),
        ]
    return [
        Intent(now, IntentKind.DRAIN, ent, v.explanation, dict(base), Tier.NODE, policy_version=policy_version),
        Intent(now, IntentKind.QUARANTINE, ent, v.explanation, {**base, "evidence": list(v.evidence)}, Tier.NODE,
               policy_version=policy_version),
        Intent(now, IntentKind.RUN_ACTIVE_TEST, ent, v.explanation, dict(base), Tier.NODE,
               policy_version=policy_version),
        Intent(now, IntentKind.CAPTURE_EVIDENCE, ent, v.explanation, dict(base), Tier.NODE,
               policy_version=policy_version),
    ]
