"""Actuation settings: advise by default, enforcement per intent kind, kill switch, retry and drain limits.

Loaded from the ``actuation:`` section of the controller's config (YAML or a dict). Unknown keys are
errors so a typo never silently leaves enforcement on or off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleethealth.decide.model import IntentKind

Mode = Literal["advise", "enforce"]


class ActuationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # advise: every intent is recorded and exposed, nothing is changed anywhere.
    mode: Mode = "advise"
    # In enforce mode only these kinds act; the rest are recorded as advised.
    enforce: frozenset[IntentKind] = frozenset()
    # Stops all actuation at once (also settable at run time through ActuationRunner.kill()).
    kill_switch: bool = False

    # Circuit breaker (defence in depth behind the decisions layer's budgets): at most this many distinct
    # entities isolated (quarantine, node drain) per window; more are held, recorded as "breaker", and
    # tried again when the window frees. None: off.
    breaker_max_entities: int | None = Field(default=None, ge=1)
    breaker_window_s: float = Field(default=300.0, gt=0)

    # Retries: attempts made within one submit, then later cycles, until max_attempts in all.
    attempts_per_cycle: int = Field(default=3, ge=1)
    max_attempts: int = Field(default=8, ge=1)
    backoff_initial_s: float = Field(default=0.5, ge=0)
    backoff_max_s: float = Field(default=30.0, ge=0)

    # Kubernetes node actions.
    taint_key: str = "fleethealth.io/unhealthy"
    # NoExecute evicts every pod without a toleration and ignores PodDisruptionBudgets: opt-in only.
    noexecute: bool = False
    label_prefix: str = "fleethealth.io"
    condition_type: str = "GPUHealthy"
    drain_timeout_s: float = Field(default=900.0, gt=0)
    # One apply waits at most this long for PDB-held pods, then returns "in progress" to the runner.
    drain_block_s: float = Field(default=5.0, ge=0)
    # Pods still not evicted at the drain limit are reported; deleted only if this is set.
    force_delete_after_timeout: bool = False
    # Pods sharing one of these labels' values form a tensor-parallel group, evicted together.
    tp_group_labels: tuple[str, ...] = ("fleethealth.io/tp-group", "leaderworkerset.sigs.k8s.io/group-key")
    ignore_daemonsets: bool = True

    # Active tests (Jobs pinned to the node).
    test_namespace: str = "fleethealth-system"
    test_images: dict[str, str] = Field(default_factory=lambda: {
        "dcgm_diag_r2": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        "dcgm_diag_r3": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        "nccl_bandwidth": "ghcr.io/coreweave/nccl-tests:12.4.1-cudnn-devel-ubuntu22.04-nccl2.21.5-1-0c3a0fe",
    })
    test_timeout_s: float = Field(default=1800.0, gt=0)

    # Router: the pod condition a readiness gate names, for yes/no gateways.
    readiness_condition: str = "fleethealth.io/healthy"
    healthy_weight_threshold: float = Field(default=0.5, ge=0, le=1)

    @field_validator("enforce", mode="before")
    @classmethod
    def _kinds(cls, v: Any) -> Any:
        if v in ("all", ["all"]):
            return frozenset(IntentKind)
        return v

    def enforces(self, kind: IntentKind) -> bool:
        return self.mode == "enforce" and not self.kill_switch and kind in self.enforce


def load_actuation_config(source: str | Path | dict[str, Any] | None) -> ActuationConfig:
    if source is None:
        return ActuationConfig()
    data = source if isinstance(source, dict) else yaml.safe_load(Path(source).read_text()) or {}
    if "actuation" in data and isinstance(data["actuation"], dict):
        data = data["actuation"]
    return ActuationConfig.model_validate(data)
