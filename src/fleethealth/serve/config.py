"""The sidecar's settings (one frozen dataclass) and its clock."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from fleethealth.decide.oom import DEFAULT_THRESHOLDS, OomThresholds
from fleethealth.policy import Policy, default_policy
from fleethealth.serve.canary import CanaryConfig


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class FunctionClock:
    """A plain ``() -> float`` (``time.time``, a test's lambda) as a Clock."""

    def __init__(self, fn: Callable[[], float]) -> None:
        self.fn = fn

    def now(self) -> float:
        return float(self.fn())


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    if clock is None:
        return SystemClock()
    if hasattr(clock, "now"):
        return clock  # type: ignore[return-value]
    return FunctionClock(clock)  # type: ignore[arg-type]


def default_replica_name() -> str:
    return os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()


@dataclass(frozen=True)
class SidecarConfig:
    upstream: str  # the engine's base URL, e.g. http://127.0.0.1:8000
    replica: str = field(default_factory=default_replica_name)
    admin_token: str | None = field(default_factory=lambda: os.environ.get("FLEETHEALTH_ADMIN_TOKEN") or None,
                                    repr=False)  # never in a log line
    admin_loopback_only: bool = True  # admin endpoints answer only clients on 127.0.0.0/8 or ::1
    # Who may call /admin/* (serve.admin_security): the static admin_token above (all verbs), a token file
    # (auth.access.StaticTokens: user, token or token_sha256, verbs drain/undrain/get), and/or the cluster
    # (TokenReview + SubjectAccessReview on fleethealth.io replicas/<replica>). Reads: admin_read.
    admin_tokens_file: Path | None = None
    admin_kubernetes_auth: bool = False
    admin_audiences: tuple[str, ...] = ()
    admin_read: Literal["loopback", "open", "authenticated"] = "loopback"
    # The audit trail of admin actions: a local append-only JSON Lines file (rotated at audit_max_bytes,
    # audit_keep files kept) and, when a Kubernetes API is configured, Events on this replica's Pod.
    audit_log: Path | None = None
    audit_max_bytes: int = 10 << 20
    audit_keep: int = 3
    audit_events: bool = True
    namespace: str = field(default_factory=lambda: os.environ.get("POD_NAMESPACE") or "default")
    # The Kubernetes API (for TokenReview/SubjectAccessReview and Events): "auto" = in-cluster when the pod
    # has a service account and something needs it; "off"; or kube_host + kube_token (tests, out of cluster).
    kubernetes: Literal["auto", "off"] = "auto"
    kube_host: str | None = None
    kube_token: str | None = field(default=None, repr=False)
    kube_verify_ssl: bool = True
    docs: bool = False  # /docs, /redoc and /openapi.json (off: nothing about the API is served)
    max_body_bytes: int = 16 << 20  # larger request bodies (prompts included) are refused with 413
    max_drain_seconds: float = 30.0
    retry_after_s: int = 5
    max_concurrency: int = 256  # requests forwarded to the engine at once; more wait in the proxy's queue
    queue_limit: int = 512  # waiting in the proxy beyond this: 503 at once
    queue_timeout_s: float = 30.0
    ready_queue_limit: int = 64  # /readyz fails when this many wait in the proxy (protection level)
    ready_engine_waiting_limit: float = 64  # ... or the engine reports this many waiting
    liveness_timeout_s: float = 30.0  # running work without any token for this long: /livez fails
    engine_down_grace_s: float = 60.0  # engine unreachable this long after it had been up: /livez fails
    probe_interval_s: float = 2.0  # background loop: health, metrics, GPU, canary
    health_timeout_s: float = 5.0
    upstream_connect_timeout_s: float = 5.0
    upstream_read_timeout_s: float = 600.0
    warmup_prompt: str = "Hello"
    warmup_max_tokens: int = 1
    warmup_timeout_s: float = 120.0
    max_batch_tokens: int | None = None  # the engine's batch token budget, for OOM classification
    kv_capacity_tokens: int | None = None  # tokens the engine's KV cache holds (vLLM logs it at start)
    degraded_max_tokens: int | None = None  # DEGRADED: refuse new requests longer than this (None: no limit)
    oom_clip_max_tokens: bool = False  # oversized requests: clip max_tokens instead of rejecting
    concurrency_recover_s: float = 60.0  # after a batch-overload OOM: +1 concurrency per this many quiet s
    gpu_metrics_url: str | None = None  # the node's exporter (dcgm-exporter) when NVML is not used
    gpu_node: str | None = None  # keep only this node's samples from the exporter (label Hostname etc.)
    use_nvml: bool | None = None  # None: NVML when the library loads and no exporter URL is given
    gpu_fail_below: float = 0.3  # a GPU tuple below this fails /gpuz (default: policy quarantine_below)
    cuda_error_window_s: float = 600.0  # CUDA context errors seen within this fail /gpuz
    engine_log: Path | None = None
    evidence_dir: Path | None = None
    redact_prompts: bool = True
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    oom: OomThresholds = DEFAULT_THRESHOLDS
    policy: Policy = field(default_factory=default_policy)
