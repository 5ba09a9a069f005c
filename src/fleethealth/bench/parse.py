"""`fleethealth bench parse`: our exposition reader against prometheus-client's, on dcgm-exporter text.

The text is what dcgm-exporter writes for its default counter list: one `# HELP`/`# TYPE` block per field,
one line per GPU with the real label set (gpu, UUID, pci_bus_id, device, modelName, Hostname and the
driver-version label), 8 GPUs per Hostname, and the README's blank sentinel on a few memory temperatures.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from fleethealth.bench.calibration import cpu_calibration_ms
from fleethealth.signals.snapshot import Snapshot

# dcgm-exporter's default-counters.csv (DCGM 3.x/4.x), the fields enabled by default.
DCGM_DEFAULT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus, in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus, in bytes per second."),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons."),
)
# Plausible gauge ranges [lo, hi) so that the text also scores sensibly (no random Xids, sane temperatures).
_RANGES = {
    "DCGM_FI_DEV_SM_CLOCK": (1700, 1981), "DCGM_FI_DEV_MEM_CLOCK": (2619, 2620),
    "DCGM_FI_DEV_MEMORY_TEMP": (40, 70), "DCGM_FI_DEV_GPU_TEMP": (35, 75), "DCGM_FI_DEV_POWER_USAGE": (90, 700),
    "DCGM_FI_DEV_GPU_UTIL": (0, 101), "DCGM_FI_DEV_MEM_COPY_UTIL": (0, 101), "DCGM_FI_DEV_ENC_UTIL": (0, 1),
    "DCGM_FI_DEV_DEC_UTIL": (0, 1), "DCGM_FI_DEV_XID_ERRORS": (0, 1), "DCGM_FI_DEV_FB_FREE": (0, 81559),
    "DCGM_FI_DEV_FB_USED": (0, 81559), "DCGM_FI_DEV_VGPU_LICENSE_STATUS": (0, 1),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (0, 1), "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": (0, 2),
}
SENTINEL = "9223372036854775794"  # dcgm-exporter README: DCGM_FI_DEV_MEMORY_TEMP on a GPU without it


def dcgm_label_strings(n_gpus: int, seed: int = 0, comma_space: bool = False) -> list[str]:
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**63, size=(n_gpus, 2), dtype=np.int64)
    sep = ", " if comma_space else ","
    out = []
    for i in range(n_gpus):
        node, g = divmod(i, 8)
        h = f"{int(words[i, 0]):016x}{int(words[i, 1]):016x}"
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        out.append(
            "{" + sep.join((
                f'gpu="{g}"', f'UUID="{uuid}"', f'pci_bus_id="00000000:{0x18 + 0x10 * g:02X}:00.0"',
                f'device="nvidia{g}"', 'modelName="NVIDIA H100 80GB HBM3"', f'Hostname="node-{node:05d}"',
                'DCGM_FI_DRIVER_VERSION="550.54.15"',
            )) + "}"
        )
    return out


def dcgm_text(n_gpus: int, seed: int = 0, comma_space: bool = False, sentinel_every: int = 50) -> str:
    """dcgm-exporter /metrics text for ``n_gpus`` GPUs (25 default fields)."""
    rng = np.random.default_rng(seed + 1)
    labels_sp = [lab + " " for lab in dcgm_label_strings(n_gpus, seed, comma_space)]
    parts: list[str] = []
    for name, typ, help_ in DCGM_DEFAULT_FIELDS:
        parts.append(f"# HELP {name} {help_}\n# TYPE {name} {typ}\n")
        lo, hi = _RANGES.get(name, (0, 2000))
        if name.startswith("DCGM_FI_PROF"):
            vals = list(map("{:.6f}".format, rng.random(n_gpus).tolist()))
        elif typ == "counter":
            vals = list(map(str, rng.integers(0, 10**12, n_gpus).tolist()))
        else:
            vals = list(map(str, rng.integers(lo, hi, n_gpus).tolist()))
        if name == "DCGM_FI_DEV_MEMORY_TEMP" and sentinel_every:
            vals[::sentinel_every] = [SENTINEL] * len(vals[::sentinel_every])
        # name{labels} value lines, built by C-level joins (the generator must not dominate the benchmark).
        parts.append(name + ("\n" + name).join(map(str.__add__, labels_sp, vals)) + "\n")
    return "".join(parts)


Row = tuple[str, tuple[tuple[str, str], ...], float, float | None]


def prom_client_rows(text: str) -> list[Row]:
    """Samples as prometheus-client's parser reads them (name, sorted labels, value, timestamp).

    prometheus-client renames a 0.0.4 counter `x` (TYPE counter, no `_total`) to `x_total` for its
    OpenMetrics model; Prometheus stores `x`. The name is restored here so both sides speak Prometheus.
    """
    from prometheus_client.parser import text_string_to_metric_families

    declared_counters: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE ") and line.rstrip().endswith(" counter"):
            declared_counters.add(line.split()[2])
    rows: list[Row] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if fam.type == "counter" and name.endswith("_total") and name[:-6] in declared_counters:
                name = name[:-6]
            ts = None if s.timestamp is None else float(s.timestamp)  # type: ignore[arg-type]
            # Prometheus drops empty-valued labels (an empty value means absent); so do we.
            rows.append((name, tuple(sorted((k, v) for k, v in s.labels.items() if v)), float(s.value), ts))
    return rows


def our_rows(snap: Snapshot) -> list[Row]:
    return [(m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows()]


def compare_rows(ours: Iterable[Row], theirs: Iterable[Row], default_ts: float) -> list[str]:
    """Differences between our samples and prometheus-client's valid ones (NaN, Inf, blank sentinels and
    negative counters are dropped by us on purpose, and so are repeats of a series at one instant). Empty
    when equal."""
    from fleethealth.sources.exposition import counter_like, value_problem

    valid = [
        (n, lab, v, default_ts if t is None else float(t))
        for n, lab, v, t in theirs
        if value_problem(n, v, counter_like(n, {})) is None
    ]
    # A series repeated at one instant is one sample, the first (Prometheus: "duplicate sample for
    # timestamp"); prometheus-client's 0.0.4 parser keeps every line.
    first: dict[tuple[Any, ...], tuple[str, tuple[tuple[str, str], ...], float, float]] = {}
    for r in valid:
        first.setdefault((r[0], r[1], round(r[3], 9)), r)
    valid = list(first.values())
    a = sorted((n, lab, v, t) for n, lab, v, t in ours)
    b = sorted(valid)
    if a == b:
        return []
    sa, sb = set(a), set(b)
    diffs = [f"only ours: {r}" for r in list(sa - sb)[:5]] + [f"only prometheus-client: {r}" for r in list(sb - sa)[:5]]
    if not diffs:
        diffs = [f"same samples, different multiplicity ({len(a)} vs {len(b)})"]
    return diffs


def bench_parse(
    n_gpus: int, repeats: int = 3, prom_sample_gpus: int = 2000, seed: int = 0, warm: bool = False
) -> dict[str, Any]:
    """Time our parser (median of cold runs: label cache cleared) and prometheus-client's (on a subsample,
    extrapolated per sample), and check both read the same samples on the subsample.

    Rates are per second of this process's CPU time (``time.process_time``), which is what "one core"
    means on a shared machine where wall time also counts other people's work; wall times are reported
    beside them (``wall_*``).
    """
    from fleethealth.sources.exposition import LabelCache, parse_exposition

    default_ts = 1_700_000_000.0
    w0 = time.perf_counter()
    text = dcgm_text(n_gpus, seed).encode()
    gen_s = time.perf_counter() - w0
    n_lines = text.count(b"\n")
    walls: list[float] = []
    cpus: list[float] = []
    snap: Snapshot | None = None
    calibrations: list[float] = []
    for _ in range(max(1, repeats)):
        snap = None
        gc.collect()
        calibrations.append(cpu_calibration_ms())  # next to every run: the box's load changes by the second
        labels = LabelCache()  # cold: every label string parsed from scratch
        w0, c0 = time.perf_counter(), time.process_time()
        snap = parse_exposition(text, default_ts=default_ts, source="bench", labels=labels)
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0)
    assert snap is not None
    samples = len(snap)
    issues = len(snap.issues)
    snap = None
    warm_cpu: float | None = None
    if warm:
        gc.collect()
        c0 = time.process_time()
        snap = parse_exposition(text, default_ts=default_ts, source="bench", labels=labels)  # strings known
        warm_cpu = time.process_time() - c0
        snap = None
    mb = len(text) / 1e6
    del text
    gc.collect()

    # prometheus-client on a subsample (it reads ~15k samples/s), extrapolated per sample.
    k = min(n_gpus, prom_sample_gpus)
    small = dcgm_text(k, seed + 7)
    w0, c0 = time.perf_counter(), time.process_time()
    theirs = prom_client_rows(small)
    prom_cpu = time.process_time() - c0
    prom_wall = time.perf_counter() - w0
    ours = parse_exposition(small, default_ts=default_ts, source="bench-compare")
    diffs = compare_rows(our_rows(ours), theirs, default_ts)
    parse_s = statistics.median(cpus)
    sps = samples / parse_s
    prom_sps = len(theirs) / prom_cpu
    out: dict[str, Any] = {
        "gpus": n_gpus,
        "lines": n_lines,
        "mb": round(mb, 1),
        "samples": samples,
        "dropped_with_issue": issues,
        "clock": "process_cpu",
        "parse_s": round(parse_s, 4),
        "parse_runs_s": [round(t, 4) for t in cpus],
        "samples_per_s": round(sps),
        "prom_client_samples_per_s": round(prom_sps),
        "prom_client_measured_on_gpus": k,
        "prom_client_extrapolated_s": round(samples / prom_sps, 2),
        "speedup": round(sps / prom_sps, 1),
        "compared_samples": len(theirs),
        "equal": not diffs,
        "differences": diffs,
        "wall_parse_s": round(statistics.median(walls), 4),
        "wall_samples_per_s": round(samples / statistics.median(walls)),
        "wall_prom_client_samples_per_s": round(len(theirs) / prom_wall),
        "generate_s": round(gen_s, 2),
        "cpu_calibration_ms": statistics.median(calibrations),
        "cpu_calibration_runs_ms": calibrations,
    }
    if warm_cpu is not None:
        out["warm_parse_s"] = round(warm_cpu, 4)
        out["warm_samples_per_s"] = round(samples / warm_cpu)
    return out
