"""The policy: one YAML file, validated with pydantic, that says how signals become scores and scores
become decisions. The shipped default (``data/default-policy.yaml``) is documented in the README.

Loading never raises a traceback at a user: ``load_policy`` raises ``PolicyError`` whose message names
the key path and the line in the file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fleethealth.durations import parse_duration
from fleethealth.repair_policy import Remediation

Shape = Literal["gate", "ramp", "peer", "slo", "flag", "xid"]
Direction = Literal["higher", "lower"]
Aggregation = Literal["min", "gmean", "mean"]
EntityName = Literal["gpu", "node", "replica", "rank"]


ConsumerName = Literal["training", "serving", "remediation"]


def _default_aggregation() -> dict[ConsumerName, Aggregation]:
    return {"training": "min", "remediation": "min", "serving": "gmean"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _durations(cls, data: Any) -> Any:
        """Every ``*_s`` key also takes a written duration (``90s``, ``6h``, ``2h30m``: durations.py)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for k, v in data.items():
            if str(k).endswith("_s") and isinstance(v, str):
                try:
                    out[k] = parse_duration(v)
                except ValueError as e:
                    raise ValueError(f"{k}: {e}") from None
        return out


class SloWindow(Strict):
    long_s: float = Field(gt=0)
    short_s: float = Field(gt=0)
    factor: float = Field(gt=1)

    @field_validator("short_s")
    @classmethod
    def _short_below_long(cls, v: float, info: ValidationInfo) -> float:
        long_s = info.data.get("long_s")
        if long_s is not None and not v < long_s:
            raise ValueError(f"the short window ({v:g} s) must be shorter than the long one ({long_s:g} s)")
        return v


# keys that shape, weigh or expect a signal: meaningless (and refused) on a read-only one (``score: false``)
_SHAPING_KEYS = ("category", "shape", "weight", "warn", "crit", "above", "values", "peer_by", "k_warn",
                 "k_crit", "min_peers", "min_rel_dev", "mad_floor_rel", "flag", "flag_score", "value_flags", "bits",
                 "relative_to", "requests_metric", "threshold_s", "objective", "xid_window_s", "short_window_s",
                 "rate_window_s", "sustained")


class SignalSpec(Strict):
    """One signal: which metric, which entity it describes, and the shape that turns it into [0, 1]."""

    name: str
    metric: str
    # a read-only signal (``score: false``) has neither: see ``score``
    category: str = ""
    shape: Shape | None = None
    entities: list[EntityName] = Field(default_factory=lambda: list[EntityName](["gpu"]))
    kind: Literal["gauge", "counter"] = "gauge"
    weight: float = Field(default=1.0, gt=0)
    # Only samples whose labels fully match these regular expressions (e.g. {status: "5.."}).
    match: dict[str, str] = Field(default_factory=dict)
    # Signals of one family come from one exporter; an entity expects a family's signals only once it
    # has been seen in that family (a rank-timing-only fleet does not expect DCGM fields), and then a
    # dead exporter lowers confidence instead of vanishing. Default: the metric's prefix (DCGM, vllm...).
    family: str | None = None
    expected: bool = True  # absent => lowers confidence; False for optional fields (ECC, NVLink, ...)
    max_age_s: float | None = Field(default=None, gt=0)  # default: freshness.max_age_s
    rate_window_s: float | None = Field(default=None, gt=0)  # counters: default freshness.rate_window_s
    # counter ramps: a short window read beside the long one (rate_window_s), as burn rates are: once the
    # long window's rate is past `warn` (the count is significant), the worse of the two rates is scored,
    # so a storm reaches its critical level within the short window while sparse noise stays unscored
    short_window_s: float | None = Field(default=None, gt=0)
    # counters: the rate is the increase over the whole window, never over less (a history shorter than
    # the window, as after a restart, reads its events spread over the window): for "sustained over hours"
    # signals, so one burst seen in the first minutes of a history is not read as a sustained rate
    sustained: bool = False
    worse_if: Direction = "higher"
    # gate: value > above (or value in values) forces 0
    above: float | None = None
    values: list[float] | None = None
    # ramp
    warn: float | None = None
    crit: float | None = None
    # peer
    peer_by: list[str] = Field(default_factory=list)
    k_warn: float | None = Field(default=None, gt=0)  # robust z levels: MADs from the peers' median
    k_crit: float | None = Field(default=None, gt=0)
    min_peers: int | None = Field(default=None, ge=2)
    min_rel_dev: float = Field(default=0.0, ge=0)  # ignore deviations smaller than this share of the median
    mad_floor_rel: float = Field(default=0.001, ge=0)
    # flag: a fact for the decisions layer; value > above raises the flag and scores `flag_score`
    flag: str | None = None
    flag_score: float = Field(default=1.0, ge=0, le=1)
    value_flags: dict[int, str] = Field(default_factory=dict)  # flag name per exact value (enums)
    # flag: a bitmask field (clock-event reasons): flag name per bit; any of these bits set raises it
    bits: dict[int, str] = Field(default_factory=dict)
    # gauges: score the value as a share of another metric of the same entity (the PCIe link generation
    # of its device maximum); no reference value, no score
    relative_to: str | None = None
    # slo: error ratio (errors/requests counters) or latency (histogram base name and threshold)
    requests_metric: str | None = None
    threshold_s: float | None = Field(default=None, gt=0)
    objective: float | None = Field(default=None, gt=0, lt=1)
    # xid: application-level Xids are not gated here (decisions attribute them to jobs first)
    xid_window_s: float | None = Field(default=None, gt=0)
    # false: read, never scored. Its fresh raw value per entity is there for the decisions (e.g.
    # ``chronic.idle_signal``), but it is no part of any category, cross-category value, confidence,
    # expected set, reason or worst category: a field that says nothing about health must not move them
    # (a category that always scores 1 raises every geometric mean). No shape, no category, no peers.
    score: bool = True

    @field_validator("crit")
    @classmethod
    def _crit_beyond_warn(cls, v: float | None, info: ValidationInfo) -> float | None:
        warn, worse = info.data.get("warn"), info.data.get("worse_if")
        if v is None or warn is None or info.data.get("shape") != "ramp":
            return v
        if worse == "higher" and not v > warn:
            raise ValueError(f"crit ({v:g}) must be above warn ({warn:g}) for a ramp that is worse when higher")
        if worse == "lower" and not v < warn:
            raise ValueError(f"crit ({v:g}) must be below warn ({warn:g}) for a ramp that is worse when lower")
        return v

    @field_validator("k_crit")
    @classmethod
    def _k_crit_beyond_k_warn(cls, v: float | None, info: ValidationInfo) -> float | None:
        k_warn = info.data.get("k_warn")
        if v is not None and k_warn is not None and not v > k_warn:
            raise ValueError(f"k_crit ({v:g}) must be greater than k_warn ({k_warn:g})")
        return v

    @field_validator("match")
    @classmethod
    def _regexes(cls, v: dict[str, str]) -> dict[str, str]:
        for k, rx in v.items():
            try:
                re.compile(rx)
            except re.error as e:
                raise ValueError(f"match.{k}: not a regular expression: {e}") from None
        return v

    @property
    def family_name(self) -> str:
        if self.family:
            return self.family
        return re.split(r"[_:]", self.metric, maxsplit=1)[0]

    @model_validator(mode="after")
    def _shape_params(self) -> SignalSpec:
        if not self.score:
            # (each message starts with the key it is about: the error points at that key's line)
            # a key counts when written with a value of its own: a policy dumped and read back (tune,
            # a candidate file) writes every key at its default, which must still load
            fields = type(self).model_fields
            shaping = [k for k in _SHAPING_KEYS if k in self.model_fields_set
                       and getattr(self, k) != fields[k].get_default(call_default_factory=True)]
            if shaping:
                also = f" (nor {', '.join(shaping[1:])})" if shaping[1:] else ""
                raise ValueError(f"{shaping[0]} is not for a read-only signal (score: false){also}: it is never "
                                 "scored; drop it")
            if self.kind != "gauge":
                raise ValueError("kind must be gauge for a read-only signal (score: false): its fresh raw value")
            if self.expected and "expected" in self.model_fields_set:
                raise ValueError("expected must be false for a read-only signal (score: false): its absence "
                                 "must not lower confidence")
            # what it is (the model is frozen: set once, here): a dump of this policy then reads back
            object.__setattr__(self, "expected", False)
            return self
        if self.shape is None:
            raise ValueError("shape: a scored signal needs a shape (or score: false for a signal only read)")
        if not self.category:
            raise ValueError("category: a scored signal needs a category (or score: false for a signal only read)")
        if self.shape == "ramp" and (self.warn is None or self.crit is None):
            raise ValueError("a ramp needs both 'warn' and 'crit'")  # (their order: _crit_beyond_warn)
        if self.shape == "gate" and self.above is None and self.values is None:
            raise ValueError("a gate needs 'above' or 'values'")
        if self.shape == "peer" and not self.peer_by:
            raise ValueError("a peer signal needs 'peer_by' (labels that pick peers doing the same work)")
        if self.shape == "flag" and self.flag is None and not self.value_flags and not self.bits:
            raise ValueError("a flag signal needs 'flag', 'value_flags' or 'bits'")
        if self.bits and self.shape != "flag":
            raise ValueError("'bits' is for flag signals")
        if self.bits and any(b <= 0 or b & (b - 1) for b in self.bits):
            raise ValueError(f"bits: each key must be one bit (a power of two), got {sorted(self.bits)}")
        if self.relative_to is not None and (self.kind != "gauge" or self.shape not in ("ramp", "gate", "flag")):
            raise ValueError("relative_to is for gauges shaped by ramp, gate or flag")
        if self.shape == "slo" and self.requests_metric is None:
            raise ValueError("an slo signal needs 'requests_metric' (the request counter)")
        if self.short_window_s is not None:
            if self.kind != "counter" or self.shape != "ramp":
                raise ValueError("short_window_s is for counter ramps (kind: counter, shape: ramp)")
            if self.rate_window_s is not None and not self.short_window_s < self.rate_window_s:
                raise ValueError(f"short_window_s ({self.short_window_s:g}) must be shorter than rate_window_s "
                                 f"({self.rate_window_s:g})")
        if self.sustained and self.kind != "counter":
            raise ValueError("sustained is for counters (kind: counter): a rate over the whole window")
        return self


class Freshness(Strict):
    max_age_s: float = Field(default=90.0, gt=0)
    rate_window_s: float = Field(default=300.0, gt=0)
    future_skew_s: float = Field(default=30.0, ge=0)  # samples further in the future are clock skew


class PeerDefaults(Strict):
    k_warn: float = Field(default=3.0, gt=0)
    k_crit: float = Field(default=6.0, gt=0)
    min_peers: int = Field(default=4, ge=2)

    @field_validator("k_crit")
    @classmethod
    def _k_crit_beyond_k_warn(cls, v: float, info: ValidationInfo) -> float:
        k_warn = info.data.get("k_warn")
        if k_warn is not None and not v > k_warn:
            raise ValueError(f"k_crit ({v:g}) must be greater than k_warn ({k_warn:g})")
        return v


class SloDefaults(Strict):
    objective: float = Field(default=0.99, gt=0, lt=1)
    windows: list[SloWindow] = Field(
        default_factory=lambda: [
            SloWindow(long_s=3600, short_s=300, factor=14.4),
            SloWindow(long_s=21600, short_s=1800, factor=6.0),
        ]
    )


class XidPolicy(Strict):
    # Buckets of NVIDIA's catalog whose immediate action makes correct work impossible until a reset.
    gate_buckets: list[str] = Field(default_factory=lambda: ["RESET_GPU", "RESTART_BM", "RESTART_VM"])
    # Always gated whatever the catalog says (fallen off the bus, DBE, remap failure, ...).
    gate_xids: list[int] = Field(default_factory=lambda: [48, 62, 64, 74, 79, 95, 119, 120, 140])
    # Application-level: attributed to the job first; the decisions layer may blame the node.
    app_xids: list[int] = Field(default_factory=lambda: [13, 31, 43, 45, 94])
    # A pending row remap: schedule a reset, not a repair.
    reset_xids: list[int] = Field(default_factory=lambda: [63])
    window_s: float = Field(default=600.0, gt=0)


class Lifecycle(Strict):
    """Thresholds and dwell times of the node/replica state machine (hysteresis: exits stricter)."""

    flag_below: float = Field(default=0.9, ge=0, le=1)  # READY but flagged
    degraded_below: float = Field(default=0.7, ge=0, le=1)
    degraded_dwell_s: float = Field(default=120.0, ge=0)
    ready_above: float = Field(default=0.85, ge=0, le=1)  # way back from DEGRADED
    ready_dwell_s: float = Field(default=600.0, ge=0)
    quarantine_below: float = Field(default=0.3, ge=0, le=1)
    quarantine_dwell_s: float = Field(default=300.0, ge=0)
    # fast path: a score at or below floor_at (a critical sub-score: a counter past crit on both its
    # windows, a peer z past k_crit) for floor_dwell_s quarantines without the degraded-then-quarantine
    # dwell chain; None: off
    floor_at: float = Field(default=0.0, ge=0, le=1)
    floor_dwell_s: float | None = Field(default=None, ge=0)
    min_confidence: float = Field(default=0.5, ge=0, le=1)  # never act below this
    drain_timeout_s: float = Field(default=900.0, gt=0)
    recovering_dwell_s: float = Field(default=1800.0, ge=0)
    recovering_ok_above: float = Field(default=0.9, ge=0, le=1)
    max_recoveries: int = Field(default=3, ge=1)
    recovery_window_s: float = Field(default=7 * 86400.0, gt=0)
    # a GPU that needs this many row-remap resets within recovery_window_s is paged for repair (each still reset)
    max_row_remaps: int = Field(default=2, ge=1)
    active_test: list[str] = Field(default_factory=lambda: ["dcgm_diag_r2", "nccl_bandwidth"])
    warming_s: float = Field(default=60.0, ge=0)
    # after an OOM from batch overload (concurrency limited), a replica's score-driven quarantine is held
    overload_hold_s: float = Field(default=1800.0, ge=0)

    @model_validator(mode="after")
    def _hysteresis(self) -> Lifecycle:
        if not self.quarantine_below < self.degraded_below:
            raise ValueError("quarantine_below must be lower than degraded_below")
        if not self.ready_above > self.degraded_below:
            raise ValueError("ready_above must be higher than degraded_below (hysteresis)")
        if not self.ready_dwell_s >= self.degraded_dwell_s:
            raise ValueError("ready_dwell_s must be at least degraded_dwell_s (the way back is slower)")
        if not self.floor_at < self.quarantine_below:
            raise ValueError("floor_at must be lower than quarantine_below (the fast path is for the floor)")
        return self


class Chronic(Strict):
    """Chronic slowness priced against a swap (decide/chronic.py): a node whose performance peers agree it
    is slow (combined z, or a CUSUM of it over hours) and whose slowdown costs its synchronous job more
    over the horizon than one checkpoint restart is quarantined at the next safe point."""

    enabled: bool = True
    swap_cost_gpu_hours: float = Field(default=100.0, gt=0)  # one checkpoint restart of the job
    horizon_s: float = Field(default=86400.0, gt=0)  # how long the loss is counted ahead
    combined_z: float = Field(default=5.0, gt=0)  # Stouffer z over the performance peer signals
    cusum_k: float = Field(default=1.0, ge=0)  # CUSUM allowance (z); less accumulates nothing
    cusum_h: float = Field(default=4.0, gt=0)  # CUSUM alarm, z-hours
    cusum_cap: float = Field(default=3.0, gt=0)  # a reading counts at most this much (small shifts)
    categories: list[str] = Field(default_factory=lambda: ["performance"])  # peer signals read
    slowdown_signal: str = "rank_compute_time"  # its relative deviation is the job's slowdown
    # A DEGRADED node slow this long (evidence: combined z or CUSUM alarm) whose swap does not pay gets
    # one ticket-severity incident (decide.chronic.ticket); None: no ticket.
    ticket_after_s: float | None = Field(default=6 * 3600.0, gt=0)
    # ...and, once ticketed, is quarantined for its active test when its job has ended (its GPUs run no
    # rank), before new work lands on it; false: it stays DEGRADED (no new work) until it recovers.
    quarantine_when_idle: bool = True
    # "Idle" is positive evidence, never missing data (a lost rank-timer endpoint, a Prometheus gap): no
    # rank reports a compute time on the node AND every one of its GPUs reads ``idle_signal`` (a GPU
    # signal of the policy, raw value in %) fresh and below ``idle_util_below``, with the node's
    # confidence usable and no source error this cycle, for ``idle_dwell_s`` without a break.
    idle_signal: str = "gpu_util"
    idle_util_below: float = Field(default=10.0, gt=0, le=100)
    idle_dwell_s: float = Field(default=300.0, gt=0)


class Budgets(Strict):
    """How fast remediation may take capacity out of a pool (guards against scorer bugs and correlated
    events). Confirmed hard gates (``hard_gates``: the gate signals that mean the hardware is already out
    of service) spend their own, larger budget and skip the tensor-parallel rule (README: Budgets)."""

    quarantine_fraction_per_hour: float = Field(default=0.02, ge=0, le=1)
    quarantine_min_per_hour: int = Field(default=1, ge=0)
    window_s: float = Field(default=3600.0, gt=0)
    max_per_tp_group: int = Field(default=1, ge=0)
    hard_gates: list[str] = Field(default_factory=lambda: [
        "xid", "xid_count", "kernel_xid", "kernel_fallen_off", "recovery_action", "gpus_missing", "ecc_dbe",
        "row_remap_failure",
    ])
    hard_gate_fraction_per_hour: float = Field(default=0.1, ge=0, le=1)
    hard_gate_min_per_hour: int = Field(default=3, ge=0)
    # physical evidence of dead hardware (attribution.physical_xids / physical_gates): its own budget, so
    # the gates a bad driver raises before its version is suspect cannot spend it
    physical_fraction_per_hour: float = Field(default=0.1, ge=0, le=1)
    physical_min_per_hour: int = Field(default=3, ge=0)
    # pages as incidents (decide.incidents): an update at most this often, resolved after this long unseen
    incident_update_s: float = Field(default=1800.0, ge=0)
    incident_clear_s: float = Field(default=900.0, gt=0)


class Fleet(Strict):
    """Fleet-wide confidence: many entities losing confidence together is a telemetry problem."""

    low_confidence_fraction: float = Field(default=0.2, gt=0, le=1)
    min_entities: int = Field(default=5, ge=1)


class Attribution(Strict):
    app_xid_distinct_jobs: int = Field(default=2, ge=1)
    app_xid_window_s: float = Field(default=6 * 3600.0, gt=0)
    version_labels: list[str] = Field(default_factory=lambda: ["driver_version", "build", "kernel_version"])
    version_min_entities: int = Field(default=3, ge=2)
    version_fraction: float = Field(default=0.5, gt=0, le=1)
    # Physical evidence (README: Physical evidence): a gated node with one of these Xids flagged, or gated
    # by one of these signals, has hardware that is dead whatever the software did; a suspect version
    # does not hold it, and it spends budgets.physical_*, not the hard-gate budget.
    physical_xids: list[int] = Field(default_factory=lambda: [48, 64, 79, 95, 140])
    physical_gates: list[str] = Field(default_factory=lambda: [
        "gpus_missing", "kernel_fallen_off", "ecc_dbe", "row_remap_failure",
    ])
    # Version holds (README: Version holds): a node isolated at most this long before its version's
    # incident opened, by evidence the version explains, is held by the incident (its repair ladder stops)
    # and retested when the incident resolves, instead of being repaired, or left FAILED, for the driver.
    version_hold_lookback_s: float = Field(default=6 * 3600.0, gt=0)


class Domains(Strict):
    """Failure domains (README: Failure domains): nodes that share a rack, an NVLink / NVL72 domain, a
    switch, a power or cooling zone (the node labels named in ``labels``, copied onto tuples: each must
    be in ``metadata_labels``). When at least ``min_nodes`` nodes and at least ``fraction`` of one
    domain's nodes degrade or fail within ``window_s`` of each other, the domain is the suspect: one
    incident (``domain_correlation``) with the domain's evidence, and no signal-driven quarantine or
    drain of its nodes while it is open. ``action``: what a held node gets instead (``no_new_work``:
    the scheduler stops placing work on it; ``hold``: nothing, the node keeps its work). A confirmed
    hard gate (a GPU off the bus, a DBE) is hardware and is handled as such inside a domain event."""

    labels: list[str] = Field(default_factory=lambda: ["rack", "nvlink_domain", "switch", "power_zone",
                                                       "cooling_zone"])
    min_nodes: int = Field(default=3, ge=2)
    fraction: float = Field(default=0.3, gt=0, le=1)
    window_s: float = Field(default=1800.0, gt=0)
    action: Literal["hold", "no_new_work"] = "no_new_work"
    # What each label's event explains: signal categories or signal names (``app_xid``: the app-Xid
    # attribution's blame). A held node whose worst reason is outside what its open domain incidents
    # explain (a PCIe storm on one node of a hot rack) is decided as outside an event. A label not named
    # here explains everything (the domain holds any signal-driven remediation of its nodes).
    explains: dict[str, list[str]] = Field(default_factory=lambda: {
        "rack": ["thermal", "clocks", "power", "performance", "nvlink", "serving", "errors", "load", "app_xid"],
        "nvlink_domain": ["nvlink", "performance", "serving", "errors", "load", "app_xid"],
        "switch": ["performance", "serving", "errors", "load", "clocks", "power", "thermal"],
        "power_zone": ["power", "clocks", "thermal", "performance", "serving", "errors", "load", "xid", "xid_count", "kernel_xid",
                       "app_xid"],
        "cooling_zone": ["thermal", "clocks", "power", "performance", "serving", "errors", "load"],
    })

    @field_validator("labels")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        for i, name in enumerate(v):
            if not name.strip():
                raise ValueError(f"label [{i}] is empty")
            if name in v[:i]:
                raise ValueError(f"label '{name}' is named twice")
        return v


class Recurring(Strict):
    """Recurring faults (README: Recurring faults): an *episode* is one isolation (QUARANTINED or
    DRAINING) or one DEGRADED spell of an entity, counted per signal family (the reason's family, e.g.
    ``nvlink``) and per GPU where the reason names one. At the ``max_episodes``-th episode of one family
    within ``window_s``, the entity is not released again: FAILED with reason ``recurring:<family>``
    and one page suggesting repair. ``max_episodes: 0`` turns the rule off."""

    window_s: float = Field(default=7 * 86400.0, gt=0)
    max_episodes: int = Field(default=3, ge=0)


class Expectation(Strict):
    """Peers in the expectation model: a signal most members of an entity's peer group carry is expected of
    every member (``missing:<family or signals>`` when it lacks it). GPUs group by their node's pool and
    their training job, replicas by pool, model and role; a group smaller than ``min_group`` falls back to
    the pool, a pool smaller than that to the whole kind."""

    min_group: int = Field(default=3, ge=1)
    carried_share: float = Field(default=0.5, ge=0, lt=1)  # carried by more than this share of the group
    gpu_group_by: list[str] = Field(default_factory=lambda: ["pool", "job"])
    replica_group_by: list[str] = Field(default_factory=lambda: ["pool", "model", "role"])
    # a node's GPU count from its peers: a pool of at least gpu_count_min_peers nodes with GPUs, at least
    # gpu_count_fraction of them with the same count k, expects k of each (fewer: missing:gpuN)
    gpu_count_min_peers: int = Field(default=4, ge=2)
    gpu_count_fraction: float = Field(default=0.8, gt=0.5, le=1)


class Router(Strict):
    hold_s: float = Field(default=120.0, ge=0)  # hold last weight while confidence is low
    drain_step: float = Field(default=0.1, gt=0, le=1)  # then lower by this much per cycle
    min_weight: float = Field(default=0.0, ge=0, le=1)


class Policy(Strict):
    version: str = "default"
    freshness: Freshness = Field(default_factory=Freshness)
    peer: PeerDefaults = Field(default_factory=PeerDefaults)
    slo: SloDefaults = Field(default_factory=SloDefaults)
    xid: XidPolicy = Field(default_factory=XidPolicy)
    aggregation: dict[ConsumerName, Aggregation] = Field(default_factory=_default_aggregation)
    signals: list[SignalSpec]
    # A sub-score at 0 (at or past its critical level) zeroes its category instead of being averaged
    # with healthier views of the same condition: a rank 9 MADs slow is not half-healthy because its
    # clock is only 4 MADs low. Sub-scores between 0 and 1 are still averaged with their weights.
    critical_zeroes_category: bool = True
    lifecycle: Lifecycle = Field(default_factory=Lifecycle)
    chronic: Chronic = Field(default_factory=Chronic)
    budgets: Budgets = Field(default_factory=Budgets)
    fleet: Fleet = Field(default_factory=Fleet)
    attribution: Attribution = Field(default_factory=Attribution)
    router: Router = Field(default_factory=Router)
    expectation: Expectation = Field(default_factory=Expectation)  # peer groups of the expectation model
    remediation: Remediation = Field(default_factory=Remediation)  # repair ladders (repair_policy.py)
    # Labels that name the node of a sample, in order of preference.
    # Labels copied from samples onto tuples (what decisions correlate on: pool, version, job ...).
    metadata_labels: list[str] = Field(
        default_factory=lambda: [
            "pool", "rack", "tp_group", "driver_version", "DCGM_FI_DRIVER_VERSION", "kernel_version",
            "build", "job", "pod", "namespace", "modelName", "model_name", "model", "UUID", "pci_bus_id",
            "node", "zone", "nvlink_domain", "switch", "power_zone", "cooling_zone",
        ]
    )
    node_labels: list[str] = Field(default_factory=lambda: ["Hostname", "node", "hostname", "instance"])
    replica_labels: list[str] = Field(default_factory=lambda: ["replica", "pod", "instance"])
    # after metadata_labels: a domain label must be one of them (validated against it)
    domains: Domains = Field(default_factory=Domains)
    recurring: Recurring = Field(default_factory=Recurring)

    @field_validator("domains")
    @classmethod
    def _domain_labels_reach_tuples(cls, v: Domains, info: ValidationInfo) -> Domains:
        meta = info.data.get("metadata_labels")
        if meta is not None:
            missing = [x for x in v.labels if x not in meta]
            if missing:
                raise ValueError(f"labels {missing} are not in metadata_labels: only labels copied onto tuples "
                                 "can group nodes into domains")
        signals = info.data.get("signals")
        # the defaults name the shipped policy's signals; a policy with its own signals may lack them
        if signals is not None and "explains" in v.model_fields_set:
            known = {s.name for s in signals} | {s.category for s in signals if s.score} | {"app_xid"}
            for label, items in v.explains.items():
                if label not in v.labels:
                    raise ValueError(f"explains.{label}: not one of labels {v.labels}")
                unknown = [x for x in items if x not in known]
                if unknown:
                    raise ValueError(f"explains.{label}: {unknown} are neither signals nor categories of this "
                                     "policy (nor app_xid)")
        return v

    @field_validator("attribution")
    @classmethod
    def _physical_gates_are_signals(cls, v: Attribution, info: ValidationInfo) -> Attribution:
        signals = info.data.get("signals")
        # the defaults name the shipped policy's signals; a policy with its own signals may lack them
        if signals is not None and "physical_gates" in v.model_fields_set:
            names = {s.name for s in signals}
            unknown = [x for x in v.physical_gates if x not in names]
            if unknown:
                raise ValueError(f"physical_gates {unknown} are not signals of this policy")
        return v

    @field_validator("attribution")
    @classmethod
    def _physical_xids_gate(cls, v: Attribution, info: ValidationInfo) -> Attribution:
        # physical evidence is read only on a gated node: an Xid that never gates could never count
        from fleethealth.signals.xid import classify_xid

        x = info.data.get("xid")
        if x is not None:
            idle = [c for c in v.physical_xids
                    if classify_xid(c, x.gate_buckets, x.gate_xids, x.app_xids, x.reset_xids) != "gate"]
            if idle:
                raise ValueError(f"physical_xids {idle} do not gate a node (not in xid.gate_xids, and their "
                                 "catalog action is not in xid.gate_buckets, or they are app or reset Xids): "
                                 "physical evidence is only read on a gated node")
        return v

    @field_validator("signals")
    @classmethod
    def _unique(cls, v: list[SignalSpec]) -> list[SignalSpec]:
        seen: set[str] = set()
        for s in v:
            if s.name in seen:
                raise ValueError(f"signal name '{s.name}' is used twice")
            seen.add(s.name)
        return v

    # The policy is frozen: its digest is computed once (every scoring call stamps it on its result).
    _digest: str | None = PrivateAttr(default=None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Policy:
        c = super().model_copy(update=update, deep=deep)
        c._digest = None  # an updated copy is another policy
        return c

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]
        return self._digest

    @property
    def version_tag(self) -> str:
        return f"{self.version}@{self.digest}"

    def signal(self, name: str) -> SignalSpec:
        for s in self.signals:
            if s.name == name:
                return s
        raise KeyError(name)


class PolicyError(Exception):
    """A policy that cannot be used; the message names the key and the line."""


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Follow a pydantic error location through the YAML node tree to a 1-based line number."""
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == str(part):
                    nxt = v
                    line = k.start_mark.line + 1
                    break
            if nxt is None:
                return line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _child_line(node: yaml.Node | None, loc: tuple[Any, ...], key: str) -> int | None:
    """The line of ``key`` in the mapping at ``loc``, None when that mapping does not write it."""
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return None
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((k.start_mark.line + 1 for k, _ in node.value if k.value == key), None)


def _loc_name(loc: tuple[Any, ...], data: Any) -> str:
    out: list[str] = []
    cur = data
    for part in loc:
        if isinstance(part, int):
            name = None
            if isinstance(cur, list) and part < len(cur) and isinstance(cur[part], dict):
                name = cur[part].get("name")
            out.append(f"[{part}]" + (f"({name})" if name else ""))
            cur = cur[part] if isinstance(cur, list) and part < len(cur) else None
        else:
            out.append(("." if out else "") + str(part))
            cur = cur.get(part) if isinstance(cur, dict) else None
    return "".join(out) or "<top>"


M = TypeVar("M", bound=BaseModel)

MAX_YAML_DEPTH = 64  # nesting of mappings and lists; a policy needs 5


def load_yaml_strict(text: str, source: str, error: type[Exception]) -> tuple[yaml.Node | None, Any]:
    """(node tree, data) of a YAML text, refusing what PyYAML would take silently or crash on: nesting
    deeper than ``MAX_YAML_DEPTH`` (its composer recurses: 1000 levels were a RecursionError), a key
    given twice in one mapping (PyYAML keeps the last: a silent override), NUL bytes (a binary file).
    Every refusal raises ``error`` with one line naming the file and the line."""
    if "\0" in text:
        raise error(f"{source}: not YAML: binary data (a NUL byte on line {text.count(chr(10), 0, text.index(chr(0))) + 1})")
    try:
        depth = 0
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):  # the parser is iterative: any depth is safe here
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    line = ev.start_mark.line + 1 if ev.start_mark is not None else "?"
                    raise error(f"{source}:{line}: YAML nested deeper than {MAX_YAML_DEPTH} levels")
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _no_duplicate_keys(node, source, error)
        data = yaml.safe_load(text)
    except yaml.reader.ReaderError as e:  # a control character: PyYAML's message is two lines, no line number
        raise error(_reader_error(text, source, e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise error(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    return node, data


def _reader_error(text: str, source: str, e: yaml.reader.ReaderError) -> str:
    """One line for a character YAML does not allow: the file, the line, the key it sits under."""
    pos = max(0, min(int(e.position), len(text)))
    line = text.count("\n", 0, pos) + 1
    char = e.character if isinstance(e.character, int) else ord(str(e.character)[:1] or "\0")
    key = _key_at(text.translate({char: " "}), pos)
    return (f"{source}:{line}: not valid YAML: character U+{char:04X}, which YAML does not allow"
            + (f", in the value of '{key}'" if key else ""))


def _key_at(text: str, pos: int) -> str:
    """The dotted key path whose value spans ``pos`` in ``text`` ("" when none can be told)."""
    try:
        node: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return ""
    path: list[str] = []
    while node is not None:
        nxt: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.start_mark.index <= pos < max(v.end_mark.index, k.end_mark.index + 1):
                    path.append(str(k.value))
                    nxt = v
                    break
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                if v.start_mark.index <= pos < v.end_mark.index:
                    path.append(f"[{i}]")
                    nxt = v
                    break
        node = nxt
    return ".".join(path).replace(".[", "[")


def _no_duplicate_keys(root: yaml.Node | None, source: str, error: type[Exception]) -> None:
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    line = k.start_mark.line + 1
                    if k.value in first:
                        raise error(f"{source}:{line}: key '{k.value}' given twice in one mapping "
                                    f"(first on line {first[k.value]}); YAML would silently keep only the last")
                    first[k.value] = line
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def validate_yaml(
    text: str, source: str, model: type[M], error: type[Exception], *, what: str, hint: str,
    drop_loc: tuple[str, ...] = (),
) -> M:
    """Parse YAML text into a pydantic model. Every failure raises ``error`` with one line per problem,
    naming the file, the line and the key path (``mine.yaml:12: signals[3](gpu_temp).warn: ...``), never
    a traceback. Used for the policy, the controller config and simulator scenarios alike."""
    node, data = load_yaml_strict(text, source, error)
    if not isinstance(data, dict):
        raise error(f"{source}: {hint}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            # pydantic reports the branches of a union as extra path parts; callers may drop them
            loc = tuple(p for p in loc if p not in drop_loc)
            msg = err["msg"].removeprefix("Value error, ")
            # a validator of a whole section (it needs the rest of the policy) names the key it is about
            # first ('physical_xids [92] do not gate ...'): the error points at that key and its line
            # ('category: a scored signal needs ...' names a key the section does not write: the path names
            # it, the line is the section's)
            head, _, rest = msg.partition(" ")
            key = head.removesuffix(":")
            if loc and rest and (_child_line(node, loc, key) is not None
                                 or (head.endswith(":") and key.isidentifier())):
                loc, msg = (*loc, key), rest
            line = _line_of(node, loc)
            msgs.append(f"{source}:{line or '?'}: {_loc_name(loc, data)}: {msg}")
        raise error(f"invalid {what}\n  " + "\n  ".join(msgs)) from None


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    return validate_yaml(text, source, Policy, PolicyError, what="policy",
                         hint="a policy is a YAML mapping with at least a 'signals' list")


def load_policy(path: str | Path | None = None) -> Policy:
    if path is None:
        return default_policy()
    return parse_policy(read_policy_text(path), str(path))


def read_policy_text(path: str | Path) -> str:
    """A policy file's text; ``PolicyError`` (one line) when it cannot be read or is not text."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise PolicyError(f"{p}: cannot read policy: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{p}: cannot read policy: binary data, not YAML text (not UTF-8)") from None
    if "\0" in text:
        raise PolicyError(f"{p}: cannot read policy: binary data, not YAML text (a NUL byte)")
    return text


def policy_warnings(text: str, policy: Policy, source: str = "<policy>") -> list[str]:
    """Lines naming what a valid policy probably got wrong: a metric no known exporter emits (DCGM
    fields, dcgm-exporter, vLLM, SGLang, fleethealth's own; ``known_metrics``), with the closest known
    name. Warnings, not errors: a policy may read an operator's own exporter."""
    from fleethealth.known_metrics import is_known_metric, suggest_metric

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        node = None
    out: list[str] = []
    for i, spec in enumerate(policy.signals):
        for key in ("metric", "requests_metric"):
            name = getattr(spec, key)
            if name is None or is_known_metric(name):
                continue
            line = _line_of(node, ("signals", i, key))
            hint = suggest_metric(name)
            out.append(f"{source}:{line or '?'}: signals[{i}]({spec.name}).{key}: '{name}' is not a metric any known "
                       "exporter emits (DCGM, dcgm-exporter, vLLM, SGLang, fleethealth)"
                       + (f"; did you mean '{hint}'?" if hint else "; the signal will never have data unless your "
                          "own exporter provides it"))
    return out


def default_policy_text() -> str:
    return resources.files("fleethealth").joinpath("data/default-policy.yaml").read_text()


@lru_cache(maxsize=1)
def default_policy() -> Policy:
    return parse_policy(default_policy_text(), "default-policy.yaml")
