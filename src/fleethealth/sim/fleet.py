"""The simulated fleet's topology: nodes of 8 GPUs in pools, racks and tensor-parallel groups, failure
domains above the rack (NVLink domain, switch, power and cooling zone, when the scenario's ``topology``
sets them), training jobs with ranks and pipeline stages, serving replicas. Built once from the scenario; every per-step
array in the simulation is indexed by the integer ids assigned here (node, gpu, rank, replica).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from fleethealth.sim.scenario import FleetSpec, JobSpec, ServingSpec

# Bus ids of the eight GPUs of an HGX H100 board, as nvidia-smi prints them.
HGX_BUS_IDS = [
    "00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
    "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0",
]


def _bus_id(i: int) -> str:
    return HGX_BUS_IDS[i] if i < len(HGX_BUS_IDS) else f"00000000:{0xC0 + i:02X}:00.0"


def _uuid(seed: int, node: str, gpu: int) -> str:
    h = hashlib.sha256(f"{seed}/{node}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(slots=True)
class Job:
    index: int
    name: str
    pool: str
    spec: JobSpec
    nodes: np.ndarray  # node ids, in rank order
    stage_of_node: np.ndarray  # pipeline stage of each of those nodes
    stage_weights: np.ndarray


@dataclass(slots=True)
class Replica:
    index: int
    name: str
    pod: str
    node: int
    gpus: np.ndarray
    build: str
    model: str
    pool: str
    spec: ServingSpec


@dataclass(slots=True)
class Fleet:
    spec: FleetSpec
    nodes: list[str]
    node_pool: list[str]
    node_rack: list[str]
    node_tp_group: list[str]
    node_driver: list[str]
    gpus_per_node: int
    uuids: list[str]
    jobs: list[Job] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)
    # rank arrays (one entry per training rank)
    rank_gpu: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rank_job: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rank_stage: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rank_number: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # gpu -> replica index or -1
    gpu_replica: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # failure domains above the rack (scenario ``topology``): label -> value per node
    node_domains: dict[str, list[str]] = field(default_factory=dict)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_gpus(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def node_index(self, name: str) -> int:
        try:
            return self.nodes.index(name)
        except ValueError:
            raise KeyError(name) from None

    def gpu_entity(self, g: int) -> str:
        return f"{self.nodes[g // self.gpus_per_node]}/gpu{g % self.gpus_per_node}"

    def gpus_of_node(self, n: int) -> np.ndarray:
        return np.arange(n * self.gpus_per_node, (n + 1) * self.gpus_per_node)

    def pool_nodes(self, pool: str) -> list[int]:
        return [i for i, p in enumerate(self.node_pool) if p == pool]

    def rack_nodes(self, rack: str) -> list[int]:
        return [i for i, r in enumerate(self.node_rack) if r == rack]

    def domain_nodes(self, label: str, value: str) -> list[int]:
        """Nodes of one failure domain (``rack``, or a topology label: ``nvlink_domain``, ``switch``,
        ``power_zone``, ``cooling_zone``); empty when the fleet has no such label or value."""
        if label == "rack":
            return self.rack_nodes(value)
        return [i for i, v in enumerate(self.node_domains.get(label, ())) if v == value]

    def job_by_name(self, name: str) -> Job:
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(name)

    def replica_by_name(self, name: str) -> Replica:
        for r in self.replicas:
            if r.name == name:
                return r
        raise KeyError(name)

    def node_labels(self, n: int) -> dict[str, str]:
        return {
            "node": self.nodes[n], "pool": self.node_pool[n], "rack": self.node_rack[n],
            "tp_group": self.node_tp_group[n], "driver_version": self.node_driver[n],
            "kernel_version": self.spec.kernel_version,
        } | {label: values[n] for label, values in self.node_domains.items()}


def build_fleet(spec: FleetSpec, seed: int) -> Fleet:
    total = sum(p.nodes for p in spec.pools)
    width = max(2, len(str(total - 1)))
    nodes = [f"{spec.node_prefix}{i:0{width}d}" for i in range(total)]
    gpn = spec.gpus_per_node
    node_pool: list[str] = []
    node_tp: list[str] = []
    node_driver: list[str] = []
    jobs: list[Job] = []
    replicas: list[Replica] = []
    rank_gpu: list[int] = []
    rank_job: list[int] = []
    rank_stage: list[int] = []
    rank_number: list[int] = []
    base = 0
    tp_counter = 0
    for pool in spec.pools:
        ids = list(range(base, base + pool.nodes))
        node_pool += [pool.name] * pool.nodes
        node_driver += [pool.driver_version or spec.driver_version] * pool.nodes
        if pool.workload == "training":
            job_specs = pool.jobs or [JobSpec(name=f"{pool.name}-job")]
            left = list(ids)
            default_pp = job_specs[0].pp
            for k, js in enumerate(job_specs):
                n = js.nodes if js.nodes is not None else (len(left) if k == len(job_specs) - 1 else 0)
                if n <= 0 or n > len(left):
                    raise ValueError(f"pool {pool.name}: job {js.name} wants {js.nodes} nodes, {len(left)} left")
                jn, left = left[:n], left[n:]
                pp = min(js.pp, n)
                # Nodes of one data-parallel replica hold consecutive pipeline stages.
                stage = np.array([i % pp for i in range(n)], np.int64)
                w = np.asarray(js.stage_weights or [1.0] * pp, np.float64)
                if len(w) != pp:
                    raise ValueError(f"job {js.name}: stage_weights needs {pp} entries, got {len(w)}")
                j = Job(len(jobs), js.name, pool.name, js, np.asarray(jn, np.int64), stage, w)
                jobs.append(j)
                for i, nd in enumerate(jn):
                    for g in range(gpn):
                        rank_gpu.append(nd * gpn + g)
                        rank_job.append(j.index)
                        rank_stage.append(int(stage[i]))
                        rank_number.append(i * gpn + g)
            if left:
                raise ValueError(f"pool {pool.name}: {len(left)} nodes belong to no job")
            tpn = pool.tp_group_nodes or default_pp
        else:
            tpn = pool.tp_group_nodes or 1
        for i in range(0, pool.nodes, tpn):
            node_tp += [f"tp-{pool.name}-{tp_counter:03d}"] * min(tpn, pool.nodes - i)
            tp_counter += 1
        if pool.workload == "serving":
            sv = pool.serving
            assert sv is not None
            per = max(1, gpn // sv.gpus_per_replica)
            for nd in ids:
                for k in range(per):
                    ri = len(replicas)
                    name = f"{sv.model}-{ri:03d}"
                    h = hashlib.sha256(f"{seed}/{name}".encode()).hexdigest()
                    gpus = np.arange(nd * gpn + k * sv.gpus_per_replica, nd * gpn + (k + 1) * sv.gpus_per_replica)
                    build = sv.builds[ri % len(sv.builds)]
                    replicas.append(
                        Replica(ri, name, f"vllm-{name}-{h[:5]}", nd, gpus, build, sv.model, pool.name, sv)
                    )
        base += pool.nodes
    racks = [f"rack-{i // spec.nodes_per_rack:02d}" for i in range(total)]
    uuids = [_uuid(seed, nodes[g // gpn], g % gpn) for g in range(total * gpn)]
    fleet = Fleet(spec, nodes, node_pool, racks, node_tp, node_driver, gpn, uuids, jobs, replicas,
                  node_domains=topology_labels(spec, total))
    fleet.rank_gpu = np.asarray(rank_gpu, np.int64)
    fleet.rank_job = np.asarray(rank_job, np.int64)
    fleet.rank_stage = np.asarray(rank_stage, np.int64)
    fleet.rank_number = np.asarray(rank_number, np.int64)
    fleet.gpu_replica = np.full(total * gpn, -1, np.int64)
    for r in replicas:
        fleet.gpu_replica[r.gpus] = r.index
    fleet.gpu_rank = np.full(total * gpn, -1, np.int64)
    fleet.gpu_rank[fleet.rank_gpu] = np.arange(len(rank_gpu))
    return fleet


# topology label -> (the value's prefix, what the scenario's TopologySpec groups by)
DOMAIN_PREFIX = {"nvlink_domain": "nvl", "switch": "sw", "power_zone": "pz", "cooling_zone": "cz"}


def topology_labels(spec: FleetSpec, total: int) -> dict[str, list[str]]:
    """The failure-domain labels of each node above its rack: an NVLink domain every
    ``nvlink_domain_nodes`` consecutive nodes; a switch, power and cooling zone every so many consecutive
    racks. Only the labels the topology sets."""
    topo = spec.topology
    rack = [i // spec.nodes_per_rack for i in range(total)]
    out: dict[str, list[str]] = {}
    if topo.nvlink_domain_nodes:
        out["nvlink_domain"] = [f"nvl-{i // topo.nvlink_domain_nodes:02d}" for i in range(total)]
    for label, per in (("switch", topo.racks_per_switch), ("power_zone", topo.racks_per_power_zone),
                       ("cooling_zone", topo.racks_per_cooling_zone)):
        if per:
            out[label] = [f"{DOMAIN_PREFIX[label]}-{r // per:02d}" for r in rack]
    return out


def bus_id(gpu_index: int) -> str:
    return _bus_id(gpu_index)
