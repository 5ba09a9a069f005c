"""Scenario files: fleet shape, duration, step, seed and the faults to inject, validated with pydantic.

A scenario is plain YAML. Errors name the key and the line, like policy errors, because a scenario is
something users write by hand to replay their own incidents. Durations accept seconds or a unit suffix
(``15s``, ``30m``, ``6h``, ``7d``, or compound, largest unit first: ``2h30m``, ``1d12h``). A fault
whose onset is not inside the run (``onset >= duration``) is an error: it could only be scored as a miss.

Targets are strings resolved against the fleet once it is built: ``node-37``, ``node-37/gpu3``,
``pool:train-a``, ``rack:rack-02``, ``job:pretrain-70b``, ``replica:llama3-70b-007``, ``build:v0.7.0``, and
the topology's domains: ``nvlink_domain:nvl-00``, ``switch:sw-00``, ``power_zone:pz-00``,
``cooling_zone:cz-00``.

Shape of a file (``fleethealth sim show noise-only`` prints a complete one; ``fleethealth sim faults``
lists the kinds)::

    name: my-incident
    seed: 7
    duration: 2d            # simulated; a week of 512 GPUs runs in about half a minute
    step: 15s
    fleet:
      nodes_per_rack: 8     # nodes are named node-00, node-01, ...; racks rack-00, ...
      dcgm_fields: full     # or: default (dcgm-exporter's default list, no ECC/NVLink/violations)
      topology: {racks_per_power_zone: 4}   # optional domain labels: nvlink_domain_nodes,
                            # racks_per_switch, racks_per_power_zone, racks_per_cooling_zone
      pools:
        - {name: train-a, nodes: 48, workload: training,
           jobs: [{name: pretrain-70b, pp: 4, compute_s: 1.82}]}
        - {name: serve-a, nodes: 16, workload: serving,
           serving: {model: llama3-70b, gpus_per_replica: 4, builds: [v0.6.3, v0.7.0]}}
    faults:
      - {kind: thermal_drift, target: node-37, onset: 6h, params: {ramp_s: 39600}}
      - {kind: exporter_outage, target: node-17, onset: 4h, end: 5h}
      - {kind: cuda_oom, target: "replica:llama3-70b-002", onset: 3h, params: {class: fragmentation}}

Per-kind params (all optional): thermal_drift ramp_s, max_severity; xid79_off_bus vanish_after_s;
nvlink_errors hang_after_s, xid_every_s; xid13_bad_kernel per_node_per_hour, xid; bad_driver_rollout
driver, rollout_s, delay_s, fraction; serving_build_regression ttft_factor, itl_factor, error_rate;
cuda_oom class (single_request | batch_overload | fragmentation | driver), count, interval_s, xid;
stage_imbalance stage_weights; seq_imbalance sigma; replica_restart gap_s; sbe_climb base_per_s, doubling_s,
fault_after_s; slow_rank cause (host | nic | pcie), slowdown, link_gen, link_width; intermittent signal
(nvlink | pcie), duty, period_s; cooling_event ramp_s, max_c; clock_skew skew_s; job_crash first_xid, xid, repeat_s, spread_s; power_brownout
ramp_s, power_drop_w, clock_drop; nvlink_fabric rate, slowdown. GPU-level faults take
``gpu: N`` when the target is a whole node. ``magnitude`` scales every fault's effect.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleethealth.durations import parse_duration as parse_duration
from fleethealth.policy import validate_yaml

FaultKind = Literal[
    "gpu_reset_required",
    "thermal_drift",
    "xid79_off_bus",
    "ecc_dbe_remap_failure",
    "row_remap_pending",
    "nvlink_errors",
    "pcie_replay_storm",
    "xid13_bad_kernel",
    "bad_driver_rollout",
    "exporter_outage",
    "network_partition",
    "serving_build_regression",
    "replica_slo_burn",
    "cuda_oom",
    "stage_imbalance",
    "seq_imbalance",
    "replica_restart",
    "sbe_climb",
    "slow_rank",
    "intermittent",
    "silent_hang",
    "cooling_event",
    "frozen_exporter",
    "clock_skew",
    "job_crash",
    "power_brownout",
    "nvlink_fabric",
]

FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]


class ScenarioError(Exception):
    """A scenario that cannot be used; the message names the key and the line."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSpec(Strict):
    """A synchronous training job: per-rank compute up to the collective, then communication."""

    name: str
    nodes: int | None = Field(default=None, ge=1)  # default: the whole pool (or what is left of it)
    pp: int = Field(default=1, ge=1)  # pipeline stages; a stage's ranks are peers (label peer_group)
    compute_s: float = Field(default=1.82, gt=0)  # median per-rank compute time per step
    rank_noise: float = Field(default=0.01, ge=0)  # half-width of the relative per-sample jitter across ranks
    comm_s: float = Field(default=0.35, ge=0)  # collective time added to the slowest rank
    stage_weights: list[float] | None = None  # relative work per stage (unequal stages are not a fault)
    seq_imbalance: float = Field(default=0.0, ge=0)  # lognormal sigma per node per step (SE trace: ~0.14)
    # when the job ends (a duration from the scenario's start, e.g. 13h or 2h30m); None: it runs on. After
    # it its ranks stop reporting and its GPUs go idle (sim.job_end). An end after the run's end is no
    # error (unlike a fault's onset, nothing is scored on it): the job runs through a shortened run
    ends_at: float | None = Field(default=None, gt=0)

    @field_validator("ends_at", mode="before")
    @classmethod
    def _ends_at(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)


class ServingSpec(Strict):
    model: str = "llama3-70b"
    gpus_per_replica: int = Field(default=4, ge=1)
    builds: list[str] = Field(default_factory=lambda: ["v0.6.3"])
    rate_rps: float = Field(default=3.0, gt=0)  # mean requests per second per replica
    ttft_s: float = Field(default=0.25, gt=0)  # median time to first token at nominal load
    itl_s: float = Field(default=0.03, gt=0)  # median inter-token latency
    output_tokens: float = Field(default=220.0, gt=0)
    prompt_tokens: float = Field(default=1500.0, gt=0)
    error_rate: float = Field(default=0.0005, ge=0, le=1)
    diurnal: float = Field(default=0.35, ge=0, lt=1)  # relative day/night swing of the request rate


class PoolSpec(Strict):
    name: str
    nodes: int = Field(ge=1)
    workload: Literal["training", "serving", "idle"] = "training"
    tp_group_nodes: int | None = Field(default=None, ge=1)  # default: pp nodes (training), 1 (serving)
    jobs: list[JobSpec] = Field(default_factory=list)
    serving: ServingSpec | None = None
    driver_version: str | None = None  # default: the fleet's
    # this pool's exporter field list (default: the fleet's); a pool on dcgm-exporter's default list
    # lacks ECC, NVLink, violation, row-remap and recovery-action fields while other pools have them
    dcgm_fields: Literal["full", "default"] | None = None

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        if self.workload == "serving" and self.serving is None:
            object.__setattr__(self, "serving", ServingSpec())
        if self.workload != "serving" and self.serving is not None:
            raise ValueError("serving settings need workload: serving")
        if self.workload != "training" and self.jobs:
            raise ValueError("jobs need workload: training")
        return self


class TopologySpec(Strict):
    """Failure domains above the rack, as node labels (``fleethealth_node_info``, where a real fleet's node
    labels reach the scrape; the default policy's ``domains.labels`` names them). Each is off (no label)
    unless set, so a scenario without ``topology`` serves what it always did.

    ``nvlink_domain_nodes``: nodes per multi-node NVLink domain (GB200 NVL72: 18 trays of 4 GPUs, one
    rack; GPU feature discovery labels such nodes ``nvidia.com/gpu.clique=<cluster uuid>.<clique id>``,
    exported here as ``nvlink_domain``); an HGX node is its own NVLink domain, so none is labelled.
    ``racks_per_switch`` (``switch``: the leaf switch a rack's nodes hang off), ``racks_per_power_zone``
    (``power_zone``: a power shelf or PDU group) and ``racks_per_cooling_zone`` (``cooling_zone``: a
    CDU or a row's air handler): consecutive racks share one."""

    nvlink_domain_nodes: int | None = Field(default=None, ge=1)
    racks_per_switch: int | None = Field(default=None, ge=1)
    racks_per_power_zone: int | None = Field(default=None, ge=1)
    racks_per_cooling_zone: int | None = Field(default=None, ge=1)


class FleetSpec(Strict):
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    nodes_per_rack: int = Field(default=8, ge=1)
    model_name: str = "NVIDIA H100 80GB HBM3"
    driver_version: str = "550.54.15"
    kernel_version: str = "5.15.0-105-generic"
    node_prefix: str = "node-"
    # full: every field the simulator knows (a tuned exporter); default: dcgm-exporter's default counter
    # list, without ECC, NVLink, violation, row-remap and recovery-action fields
    dcgm_fields: Literal["full", "default"] = "full"
    # export DCGM_FI_DEV_PCIE_LINK_GEN / _LINK_WIDTH and the device maxima (Gen5 x16 unless a fault
    # downtrains a link); off by default, so recordings made before these fields stay as they were
    pcie_link_fields: bool = False
    topology: TopologySpec = Field(default_factory=TopologySpec)
    pools: list[PoolSpec] = Field(min_length=1)

    @field_validator("pools")
    @classmethod
    def _unique(cls, v: list[PoolSpec]) -> list[PoolSpec]:
        names = [p.name for p in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pool names must be unique: {', '.join(dup)}")
        return v


class FaultSpec(Strict):
    kind: FaultKind
    target: str | list[str]
    onset: float = 0.0
    end: float | None = None  # None: lasts until repaired (or the end of the scenario)
    magnitude: float = Field(default=1.0, gt=0)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("onset", "end", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)

    @model_validator(mode="after")
    def _order(self) -> FaultSpec:
        if self.end is not None and self.end <= self.onset:
            raise ValueError("end must be after onset")
        return self

    @property
    def targets(self) -> list[str]:
        return [self.target] if isinstance(self.target, str) else list(self.target)


class Scenario(Strict):
    name: str
    description: str = ""
    seed: int = 0
    start: float = 1767225600.0  # 2026-01-01T00:00:00Z: simulated time, never the wall clock
    duration: float = 86400.0
    step: float = 15.0
    fleet: FleetSpec
    faults: list[FaultSpec] = Field(default_factory=list)

    @field_validator("duration", "step", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return parse_duration(v)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        if self.step <= 0 or self.duration < self.step:
            raise ValueError("need step > 0 and duration >= step")
        for i, f in enumerate(self.faults):
            if f.onset >= self.duration:
                raise ValueError(f"faults[{i}] ({f.kind} on {f.target}): onset {f.onset:g} s is not inside the "
                                 f"run (duration {self.duration:g} s); it could only ever be scored as a miss")
        return self

    @property
    def n_steps(self) -> int:
        return int(self.duration // self.step)

    def with_overrides(self, **kw: Any) -> Scenario:
        """A copy with some top-level fields replaced (duration, seed, ...), re-validated. A shorter
        duration cuts the run: faults that would begin after its new end are left out (they are not in
        the run; a scenario file that lists one is an error)."""
        data = self.model_dump()
        data.update({k: v for k, v in kw.items() if v is not None})
        if kw.get("duration") is not None:
            end = parse_duration(kw["duration"])
            data["faults"] = [f for f in data["faults"] if f["onset"] < end]
        return Scenario.model_validate(data)


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    return validate_yaml(text, source, Scenario, ScenarioError, what="scenario",
                         hint="a scenario is a YAML mapping with 'name', 'fleet' and 'faults'",
                         drop_loc=("str", "list[str]"))


def builtin_names() -> list[str]:
    d = resources.files("fleethealth").joinpath("data/scenarios")
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))


def builtin_text(name: str) -> str:
    return resources.files("fleethealth").joinpath(f"data/scenarios/{name}.yaml").read_text()


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name, or a scenario YAML file by path."""
    s = str(name_or_path)
    if s in builtin_names():
        return parse_scenario(builtin_text(s), f"{s}.yaml")
    p = Path(s)
    if not p.exists():
        raise ScenarioError(
            f"no scenario {s!r}: not a file and not a built-in (built-ins: {', '.join(builtin_names())})"
        )
    try:
        text = p.read_text()
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read scenario: {e.strerror or e}") from None
    return parse_scenario(text, str(p))
