"""GPU readings straight from NVML (nvidia-ml-py), named and labelled as dcgm-exporter names them.

NVML sits behind ``NvmlApi``: the handful of pynvml calls we make, with pynvml's own names and return
shapes. The real implementation is the ``pynvml`` module itself; ``FakeNvml`` implements the same calls
for tests and demos on machines without a GPU (these machines have none). Errors are pynvml's own
exception classes in both.

Each reading is a *probe* (one NVML call giving one or a few fields). A probe that fails for a device
(NotSupported, NoPermission, GpuIsLost, ...) leaves those fields out and is counted in
``fleethealth_agent_nvml_errors_total{probe, error}``; it never fails the collection. A probe that is not
supported on a device is not asked again (NVML's answer does not change while the driver is loaded).

Units follow DCGM: W for power (NVML gives mW), MiB for framebuffer (NVML bytes), microseconds for
violation time (NVML ns), mJ for energy.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import pynvml

from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.base import failed_snapshot

GPU_COUNT_METRIC = "fleethealth_agent_gpus"
NVML_ERRORS_METRIC = "fleethealth_agent_nvml_errors_total"


class NvmlApi(Protocol):
    """The pynvml calls fleethealth makes (the ``pynvml`` module satisfies it; so does ``FakeNvml``)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int]) -> Sequence[Any]: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int: ...


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver, no library, no permission)."""


def _text(v: str | bytes) -> str:
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


def error_name(exc: BaseException) -> str:
    """``NVMLError_NotSupported`` -> ``NotSupported``; anything else by its class name."""
    name = type(exc).__name__
    return name.removeprefix("NVMLError_") if name.startswith("NVMLError") else name


# ---------------------------------------------------------------------------------------------------------
# Metric catalogue: dcgm-exporter's names, help texts and types.

METRIC_HELP: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("counter", "Total number of single-bit persistent ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", "Total number of double-bit persistent ECC errors."),
    "DCGM_FI_DEV_RETIRED_SBE": ("counter", "Total number of retired pages due to single-bit errors."),
    "DCGM_FI_DEV_RETIRED_DBE": ("counter", "Total number of retired pages due to double-bit errors."),
    "DCGM_FI_DEV_RETIRED_PENDING": ("counter", "Total number of pages pending retirement."),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "Whether a row remapping is pending (a GPU reset applies it)."),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask)."),
    "DCGM_FI_DEV_POWER_VIOLATION": ("counter", "Throttling duration due to power constraints (in us)."),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("counter", "Throttling duration due to thermal constraints (in us)."),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink flow-control CRC errors."),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink data CRC errors."),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink retries."),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink recovery errors."),
    "DCGM_FI_DEV_GPU_RECOVERY_ACTION": ("gauge", "GPU recovery action the driver asks for (0 none, 1 GPU reset, "
                                                 "2 node reboot, 3 drain P2P, 4 drain and reset)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered (0 once it is older than "
                                        "the agent's --xid-hold)."),
    GPU_COUNT_METRIC: ("gauge", "GPUs NVML sees on this node (a drop is a hardware signal)."),
    NVML_ERRORS_METRIC: ("counter", "NVML probes that failed, by probe and error (NotSupported fields are "
                                    "counted once)."),
}

# NVML field ids read in one nvmlDeviceGetFieldValues call.
_FIELD_METRICS: dict[int, str] = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: "DCGM_FI_DEV_MEMORY_TEMP",
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
}
_MIB = 1024.0 * 1024.0


def _field_value(fv: Any) -> float:
    v = fv.value
    return float({
        pynvml.NVML_VALUE_TYPE_DOUBLE: lambda: v.dVal,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: lambda: v.uiVal,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: lambda: v.ulVal,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: lambda: v.ullVal,
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: lambda: v.sllVal,
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: lambda: v.siVal,
    }.get(int(fv.valueType), lambda: v.ullVal)())


def _probe_fields(n: NvmlApi, h: Any) -> dict[str, float]:
    try:
        values = list(n.nvmlDeviceGetFieldValues(h, list(_FIELD_METRICS)))
    except (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Uninitialized):
        raise
    except pynvml.NVMLError:
        # Some drivers fail the whole call for one field id they do not know (the recovery action is
        # R565+); asking field by field keeps the ones they do know.
        values = []
        for fid in _FIELD_METRICS:
            with contextlib.suppress(pynvml.NVMLError):
                values.extend(n.nvmlDeviceGetFieldValues(h, [fid]))
        if not values:
            raise
    out: dict[str, float] = {}
    for fv in values:
        metric = _FIELD_METRICS.get(int(fv.fieldId))
        if metric is not None and int(fv.nvmlReturn) == pynvml.NVML_SUCCESS:
            out[metric] = _field_value(fv)
    return out


def _ecc(n: NvmlApi, h: Any) -> dict[str, float]:
    c, u = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
    return {
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": n.nvmlDeviceGetTotalEccErrors(h, c, vol),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": n.nvmlDeviceGetTotalEccErrors(h, u, vol),
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": n.nvmlDeviceGetTotalEccErrors(h, c, agg),
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": n.nvmlDeviceGetTotalEccErrors(h, u, agg),
    }


def _remapped(n: NvmlApi, h: Any) -> dict[str, float]:
    corr, unc, pending, failure = n.nvmlDeviceGetRemappedRows(h)
    return {
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": corr,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": unc,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0 if pending else 0.0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1.0 if failure else 0.0,
    }


def _memory(n: NvmlApi, h: Any) -> dict[str, float]:
    m = n.nvmlDeviceGetMemoryInfo(h)
    return {"DCGM_FI_DEV_FB_USED": m.used / _MIB, "DCGM_FI_DEV_FB_FREE": m.free / _MIB}


def _util(n: NvmlApi, h: Any) -> dict[str, float]:
    u = n.nvmlDeviceGetUtilizationRates(h)
    return {"DCGM_FI_DEV_GPU_UTIL": u.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": u.memory}


# (probe name, reader). Probe names are what the error counter and the unsupported cache use.
PROBES: list[tuple[str, Callable[[NvmlApi, Any], dict[str, float]]]] = [
    ("gpu_temp", lambda n, h: {"DCGM_FI_DEV_GPU_TEMP": n.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}),
    ("sm_clock", lambda n, h: {"DCGM_FI_DEV_SM_CLOCK": n.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)}),
    ("mem_clock", lambda n, h: {"DCGM_FI_DEV_MEM_CLOCK": n.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)}),
    ("power_usage", lambda n, h: {"DCGM_FI_DEV_POWER_USAGE": n.nvmlDeviceGetPowerUsage(h) / 1000.0}),
    ("total_energy", lambda n, h: {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": n.nvmlDeviceGetTotalEnergyConsumption(h)}),
    ("utilization", _util),
    ("memory", _memory),
    ("ecc", _ecc),
    ("retired_sbe", lambda n, h: {"DCGM_FI_DEV_RETIRED_SBE": len(n.nvmlDeviceGetRetiredPages(
        h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))}),
    ("retired_dbe", lambda n, h: {"DCGM_FI_DEV_RETIRED_DBE": len(n.nvmlDeviceGetRetiredPages(
        h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))}),
    ("retired_pending", lambda n, h: {"DCGM_FI_DEV_RETIRED_PENDING": float(
        n.nvmlDeviceGetRetiredPagesPendingStatus(h) != 0)}),
    ("remapped_rows", _remapped),
    ("pcie_replay", lambda n, h: {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": n.nvmlDeviceGetPcieReplayCounter(h)}),
    ("clocks_event_reasons", lambda n, h: {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS":
                                           n.nvmlDeviceGetCurrentClocksEventReasons(h)}),
    ("power_violation", lambda n, h: {"DCGM_FI_DEV_POWER_VIOLATION": n.nvmlDeviceGetViolationStatus(
        h, pynvml.NVML_PERF_POLICY_POWER).violationTime / 1000.0}),
    ("thermal_violation", lambda n, h: {"DCGM_FI_DEV_THERMAL_VIOLATION": n.nvmlDeviceGetViolationStatus(
        h, pynvml.NVML_PERF_POLICY_THERMAL).violationTime / 1000.0}),
    ("field_values", _probe_fields),
]


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str  # as NVML prints it (00000000:3B:00.0), which is also dcgm-exporter's label
    minor: int | None

    def labels(self, hostname: str, driver: str) -> dict[str, str]:
        labels = {"gpu": str(self.index), "UUID": self.uuid, "pci_bus_id": self.pci_bus_id,
                  "modelName": self.name, "Hostname": hostname, "DCGM_FI_DRIVER_VERSION": driver}
        if self.minor is not None:
            labels["device"] = f"nvidia{self.minor}"
        return labels


@dataclass(slots=True)
class NvmlSource:
    """Reads every GPU NVML sees into a Snapshot of dcgm-exporter-named samples (``read(now)``)."""

    hostname: str
    nvml: NvmlApi = field(default_factory=lambda: pynvml)  # type: ignore[arg-type,return-value]
    name: str = "nvml"
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    gpus: list[GpuIdentity] = field(default_factory=list)
    driver: str = ""
    _unsupported: set[tuple[int, str]] = field(default_factory=set)
    _started: bool = False

    def start(self) -> None:
        """Initialise NVML; raises NvmlUnavailable with a one-line reason where there is no GPU driver."""
        if self._started:
            return
        try:
            self.nvml.nvmlInit()
        except pynvml.NVMLError as e:
            hint = {
                "LibraryNotFound": "the NVIDIA driver's libnvidia-ml.so.1 is not installed (no GPU driver here)",
                "DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
                "NoPermission": "no permission to talk to the NVIDIA driver",
            }.get(error_name(e), str(e))
            raise NvmlUnavailable(f"NVML is not available: {hint} ({error_name(e)})") from e
        self._started = True
        try:
            self.driver = _text(self.nvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as e:
            self._count_error("driver_version", e)

    def close(self) -> None:
        if self._started:
            with contextlib.suppress(pynvml.NVMLError):
                self.nvml.nvmlShutdown()
            self._started = False

    def _count_error(self, probe: str, exc: BaseException) -> None:
        self.errors[(probe, error_name(exc))] += 1

    def _identity(self, index: int, h: Any) -> GpuIdentity:
        n = self.nvml
        bus = n.nvmlDeviceGetPciInfo(h).busId
        try:
            minor: int | None = n.nvmlDeviceGetMinorNumber(h)
        except pynvml.NVMLError as e:
            self._count_error("minor_number", e)
            minor = None
        return GpuIdentity(index, _text(n.nvmlDeviceGetUUID(h)), _text(n.nvmlDeviceGetName(h)), _text(bus), minor)

    def _sample_device(self, index: int) -> tuple[GpuIdentity, dict[str, float]] | None:
        try:
            h = self.nvml.nvmlDeviceGetHandleByIndex(index)
            ident = self._identity(index, h)
        except pynvml.NVMLError as e:
            self._count_error("device", e)
            return None
        values: dict[str, float] = {}
        for probe, reader in PROBES:
            if (index, probe) in self._unsupported:
                continue
            try:
                values.update(reader(self.nvml, h))
            except pynvml.NVMLError as e:
                self._count_error(probe, e)
                if isinstance(e, pynvml.NVMLError_NotSupported):
                    self._unsupported.add((index, probe))
        return ident, values

    def read(self, now: float) -> Snapshot:
        try:
            self.start()
        except NvmlUnavailable as e:
            return failed_snapshot(now, self.name, str(e))
        try:
            count = self.nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            self._count_error("device_count", e)
            return failed_snapshot(now, self.name, f"nvmlDeviceGetCount failed: {error_name(e)}")
        b = SnapshotBuilder()
        gpus: list[GpuIdentity] = []
        for index in range(count):
            got = self._sample_device(index)
            if got is None:
                continue
            ident, values = got
            gpus.append(ident)
            labels = ident.labels(self.hostname, self.driver)
            for metric, value in values.items():
                b.add(metric, labels, value, now)
        self.gpus = gpus
        b.add(GPU_COUNT_METRIC, {"Hostname": self.hostname}, float(len(gpus)), now)
        for (probe, err), c in sorted(self.errors.items()):
            b.add(NVML_ERRORS_METRIC, {"Hostname": self.hostname, "probe": probe, "error": err}, float(c), now)
        return b.build(now)

    def bus_to_gpu(self) -> dict[str, str]:
        """Bus id -> GPU index of the GPUs seen by the last read (for the kernel-log parser)."""
        return {g.pci_bus_id: str(g.index) for g in self.gpus}


# ---------------------------------------------------------------------------------------------------------
# The fake NVML layer


@dataclass(slots=True)
class FakeGpu:
    """One fake device. ``values`` keys are the probe names of ``FAKE_DEFAULTS``; ``unsupported`` names the
    pynvml calls (or NVML field ids) that raise NotSupported; ``lost`` makes every call raise GpuIsLost."""

    index: int
    uuid: str = ""
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = ""
    minor: int | None = None
    values: dict[str, Any] = field(default_factory=dict)
    fields: dict[int, float] = field(default_factory=dict)
    unsupported: set[str | int] = field(default_factory=set)
    # Field ids this fake driver does not know: a batch containing one fails whole (as older drivers may).
    unknown_fields: set[int] = field(default_factory=set)
    lost: bool = False
    processes: list[int] = field(default_factory=list)  # pids of compute processes holding the GPU
    persistence: int = 0  # persistence mode (1 = enabled)

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-{self.index:08x}-fake-0000-0000-{self.index:012x}"
        self.pci_bus_id = self.pci_bus_id or f"00000000:{0x18 + 0x20 * self.index:02X}:00.0"
        self.minor = self.index if self.minor is None else self.minor
        self.values = {**FAKE_DEFAULTS, **self.values}


FAKE_DEFAULTS: dict[str, Any] = {
    "temperature": 45, "sm_clock": 1980, "mem_clock": 2619, "power_mw": 350_000, "energy_mj": 123_456_789,
    "util_gpu": 87, "util_mem": 40, "fb_used": 60_000 * 1024 * 1024, "fb_free": 21_000 * 1024 * 1024,
    "ecc": {}, "retired_sbe": [], "retired_dbe": [], "retired_pending": 0, "remapped_rows": (0, 0, 0, 0),
    "pcie_replay": 0, "clocks_event_reasons": 0, "power_violation_ns": 0, "thermal_violation_ns": 0,
}


class FakeNvml:
    """Implements ``NvmlApi`` over ``FakeGpu`` objects, raising pynvml's own exceptions as the real one
    does. Tests mutate ``gpus[i].values`` between reads. ``library_missing`` makes ``nvmlInit`` fail the
    way it fails on a machine without the driver."""

    def __init__(self, gpus: Iterable[FakeGpu], *, driver: str = "550.54.15", library_missing: bool = False) -> None:
        self.gpus = list(gpus)
        self.driver = driver
        self.library_missing = library_missing
        self.initialised = False
        self.calls: Counter[str] = Counter()

    @staticmethod
    def from_json(path: str | Path) -> FakeNvml:
        """``{"driver": "...", "gpus": [{"index": 0, "values": {...}, "unsupported": [...]}, ...]}``."""
        spec = json.loads(Path(path).read_text())
        gpus = []
        for g in spec.get("gpus", []):
            g = dict(g)
            g["unsupported"] = set(g.get("unsupported", []))
            g["fields"] = {int(k): float(v) for k, v in g.get("fields", {}).items()}
            if "remapped_rows" in g.get("values", {}):
                g["values"]["remapped_rows"] = tuple(g["values"]["remapped_rows"])
            gpus.append(FakeGpu(**g))
        return FakeNvml(gpus, driver=spec.get("driver", "550.54.15"))

    @staticmethod
    def _raise(code: int) -> Any:
        raise pynvml.NVMLError(code)

    def _gpu(self, handle: Any, call: str) -> FakeGpu:
        self.calls[call] += 1
        if not self.initialised:
            self._raise(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu: FakeGpu = handle
        if gpu.lost:
            self._raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        if call in gpu.unsupported:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self) -> None:
        if self.library_missing:
            self._raise(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            self._raise(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu(self.gpus[index], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetPciInfo")
        # The real struct's busId is a C char array: bytes.
        return SimpleNamespace(busId=g.pci_bus_id.encode(), busIdLegacy=g.pci_bus_id[4:].encode())

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        g = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in g.processes]

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPersistenceMode").persistence

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        g = self._gpu(handle, "nvmlDeviceGetMinorNumber")
        assert g.minor is not None
        return g.minor

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetTemperature").values["temperature"])

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return int(g.values["sm_clock" if clock == pynvml.NVML_CLOCK_SM else "mem_clock"])

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetPowerUsage").values["power_mw"])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").values["energy_mj"])

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.values["util_gpu"], memory=g.values["util_mem"])

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        used, free = g.values["fb_used"], g.values["fb_free"]
        return SimpleNamespace(used=used, free=free, total=used + free)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        kind = "sbe" if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "dbe"
        scope = "vol" if counter_type == pynvml.NVML_VOLATILE_ECC else "agg"
        return int(g.values["ecc"].get(f"{kind}_{scope}", 0))

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        g = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        single = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return list(g.values["retired_sbe" if single else "retired_dbe"])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus").values["retired_pending"])

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        r = self._gpu(handle, "nvmlDeviceGetRemappedRows").values["remapped_rows"]
        return (int(r[0]), int(r[1]), int(r[2]), int(r[3]))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").values["pcie_replay"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").values["clocks_event_reasons"])

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetViolationStatus")
        key = "power_violation_ns" if policy == pynvml.NVML_PERF_POLICY_POWER else "thermal_violation_ns"
        return SimpleNamespace(referenceTime=0, violationTime=int(g.values[key]))

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: Sequence[int]) -> Sequence[Any]:
        g = self._gpu(handle, "nvmlDeviceGetFieldValues")
        if g.unknown_fields & set(field_ids):
            self._raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        out = []
        for fid in field_ids:
            ok = fid in g.fields and fid not in g.unsupported
            out.append(SimpleNamespace(
                fieldId=fid, scopeId=0, timestamp=0, latencyUsec=0,
                valueType=pynvml.NVML_VALUE_TYPE_DOUBLE,
                nvmlReturn=pynvml.NVML_SUCCESS if ok else pynvml.NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(dVal=float(g.fields.get(fid, 0.0))),
            ))
        return out
