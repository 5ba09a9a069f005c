"""The NVML node agent. No GPU or NVML library exists on these machines, so NVML is replaced by FakeNvml,
a class implementing the same pynvml calls and raising pynvml's own exceptions (a mock by necessity). The
HTTP server, client, kernel-log file, CLI process and exposition parsing are all real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import httpx
import pynvml
import pytest
from typer.testing import CliRunner

from act_support import free_port
from fleethealth.agent.exposition import render_exposition
from fleethealth.agent.server import Agent
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.kernel_log import KernelLogSource, bus_map_from_snapshot
from fleethealth.sources.nvml import NVML_ERRORS_METRIC, FakeGpu, FakeNvml, NvmlSource

DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def parse_page(text: str, now: float = 0.0) -> Snapshot:
    """Our own exposition parser when it exists; prometheus-client's otherwise."""
    try:
        from fleethealth.sources.exposition import parse_exposition
    except ImportError:
        from prometheus_client.parser import text_string_to_metric_families

        b = SnapshotBuilder()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                b.add(s.name, s.labels, s.value, now)
        return b.build(now)
    return parse_exposition(text, default_ts=now, source="agent")


def _values(snap: Snapshot, metric: str) -> dict[str, float]:
    return {labels.get("gpu", ""): v for m, labels, v, _ in snap.rows() if m == metric}


def _fake(n: int = 2, **kw: object) -> FakeNvml:
    return FakeNvml([FakeGpu(i) for i in range(n)], **kw)  # type: ignore[arg-type]


def test_nvml_source_names_labels_and_units_follow_dcgm_exporter() -> None:
    fake = FakeNvml([
        FakeGpu(0, values={"temperature": 61, "power_mw": 612_500, "fb_used": 1024 * 1024 * 1024,
                           "remapped_rows": (3, 1, 1, 0), "ecc": {"dbe_vol": 2}, "retired_dbe": [0x1, 0x2],
                           "clocks_event_reasons": 0x40, "thermal_violation_ns": 5_000_000},
                fields={pynvml.NVML_FI_DEV_MEMORY_TEMP: 71.0,
                        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 12.0,
                        pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 1.0}),
        FakeGpu(1),
    ])
    src = NvmlSource("node-a", fake)
    snap = src.read(100.0)
    rows = [(m, labels, v) for m, labels, v, t in snap.rows() if labels.get("gpu") == "0"]
    got = {m: v for m, _, v in rows}
    assert got["DCGM_FI_DEV_GPU_TEMP"] == 61
    assert got["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(612.5)  # W, NVML gives mW
    assert got["DCGM_FI_DEV_FB_USED"] == 1024  # MiB
    assert got["DCGM_FI_DEV_SM_CLOCK"] == 1980
    assert got["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 3
    assert got["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 1
    assert got["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1
    assert got["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 2
    assert got["DCGM_FI_DEV_RETIRED_DBE"] == 2
    assert got["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x40
    assert got["DCGM_FI_DEV_THERMAL_VIOLATION"] == 5000  # us
    assert got["DCGM_FI_DEV_MEMORY_TEMP"] == 71
    assert got["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 12
    assert got["DCGM_FI_DEV_GPU_RECOVERY_ACTION"] == 1
    labels = rows[0][1]
    assert set(labels) == DCGM_LABELS
    assert labels["pci_bus_id"] == "00000000:18:00.0" and labels["device"] == "nvidia0"
    assert labels["Hostname"] == "node-a" and labels["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
    assert all(t == 100.0 for *_, t in snap.rows())
    # GPU 1 supports no field values: those fields are absent, not zero.
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in {m for m, labels, _, _ in snap.rows() if labels.get("gpu") == "1"}
    assert src.bus_to_gpu() == {"00000000:18:00.0": "0", "00000000:38:00.0": "1"}


def test_not_supported_fields_are_omitted_counted_and_not_asked_again() -> None:
    fake = FakeNvml([FakeGpu(0, unsupported={"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors"}),
                     FakeGpu(1)])
    src = NvmlSource("n", fake)
    for t in (1.0, 2.0, 3.0):
        snap = src.read(t)
    gpu0 = {m for m, labels, _, _ in snap.rows() if labels.get("gpu") == "0"}
    gpu1 = {m for m, labels, _, _ in snap.rows() if labels.get("gpu") == "1"}
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING" not in gpu0 and "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in gpu0
    assert "DCGM_FI_DEV_ROW_REMAP_PENDING" in gpu1 and "DCGM_FI_DEV_GPU_TEMP" in gpu0
    assert fake.calls["nvmlDeviceGetRemappedRows"] == 3 + 1  # gpu1 three times, gpu0 once
    errs = {(labels["probe"], labels["error"]): v for m, labels, v, _ in snap.rows() if m == NVML_ERRORS_METRIC}
    assert errs == {("remapped_rows", "NotSupported"): 1.0, ("ecc", "NotSupported"): 1.0}


def test_field_values_survive_a_driver_that_rejects_an_unknown_field_id() -> None:
    fake = FakeNvml([FakeGpu(0, fields={pynvml.NVML_FI_DEV_MEMORY_TEMP: 66.0},
                             unknown_fields={pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION})])
    snap = NvmlSource("n", fake).read(1.0)
    assert _values(snap, "DCGM_FI_DEV_MEMORY_TEMP") == {"0": 66.0}
    assert _values(snap, "DCGM_FI_DEV_GPU_RECOVERY_ACTION") == {}


def test_lost_gpu_drops_out_and_gpu_count_falls() -> None:
    fake = _fake(3)
    src = NvmlSource("n", fake)
    assert _values(src.read(1.0), "fleethealth_agent_gpus") == {"": 3.0}
    fake.gpus[1].lost = True
    snap = src.read(2.0)
    assert _values(snap, "fleethealth_agent_gpus") == {"": 2.0}
    assert set(_values(snap, "DCGM_FI_DEV_GPU_TEMP")) == {"0", "2"}
    assert any(labels.get("error") == "GpuIsLost" for m, labels, _, _ in snap.rows() if m == NVML_ERRORS_METRIC)


def test_missing_library_is_a_source_error_not_a_crash() -> None:
    snap = NvmlSource("n", _fake(library_missing=True)).read(5.0)
    assert len(snap) == 0
    assert "LibraryNotFound" in snap.source_errors[0].reason


def test_render_exposition_escapes_and_keeps_latest_sample() -> None:
    b = SnapshotBuilder()
    b.add("m_total", {"a": 'x"y\\z\nw'}, 1.0, 1.0)
    b.add("m_total", {"a": 'x"y\\z\nw'}, 2.0, 3.0)
    b.add("m_total", {"a": 'x"y\\z\nw'}, 5.0, 2.0)
    b.add("g", {}, 0.25, 1.0)
    text = render_exposition(b.build(3.0), {"m_total": ("counter", "help me")})
    assert text == ('# HELP m_total help me\n# TYPE m_total counter\nm_total{a="x\\"y\\\\z\\nw"} 2\n'
                    "g 0.25\n")
    snap = parse_page(text)
    assert {(m, v) for m, _, v, _ in snap.rows()} == {("m_total", 2.0), ("g", 0.25)}


def test_agent_serves_metrics_over_http_with_kernel_log_xids(tmp_path: Path) -> None:
    klog_path = tmp_path / "kern.log"
    klog_path.write_text("")
    fake = _fake(2)
    clock = [1_700_000_000.0]
    klog = KernelLogSource(path=str(klog_path), node="node-a", year=2023, tz=UTC)  # clock[0] is this line's time
    agent = Agent(NvmlSource("node-a", fake), klog, interval=3600, clock=lambda: clock[0])
    host, port = agent.start("127.0.0.1", 0)
    try:
        with httpx.Client(base_url=f"http://{host}:{port}", timeout=5) as client:
            r = client.get("/metrics")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
            snap = parse_page(r.text)
            assert not snap.issues
            assert set(_values(snap, "DCGM_FI_DEV_GPU_TEMP")) == {"0", "1"}
            # counters keep dcgm-exporter's names (no _total added), as Prometheus stores them
            assert set(_values(snap, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")) == {"0", "1"}
            assert _values(snap, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0, "1": 0.0}
            temp_labels = next(labels for m, labels, _, _ in snap.rows() if m == "DCGM_FI_DEV_GPU_TEMP")
            assert set(temp_labels) == DCGM_LABELS
            # bus ids read back from the page map to the GPUs, as the controller will use them
            assert bus_map_from_snapshot(snap)[("node-a", "0000:38:00.0")] == "1"
            assert client.get("/healthz").status_code == 200
            assert client.get("/nope").status_code == 404

            # A GPU fault: Xid 79 on GPU 1's bus (the kernel prints it without the function) and hotter GPU 0.
            with klog_path.open("a") as f:
                f.write("Nov 14 22:13:20 node-a kernel: NVRM: Xid (PCI:0000:38:00): 79, pid=0, "
                        "GPU has fallen off the bus.\n")
            fake.gpus[0].values["temperature"] = 93
            clock[0] += 30
            agent.collect(clock[0])
            snap = parse_page(client.get("/metrics").text)
            assert _values(snap, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0, "1": 79.0}
            assert _values(snap, "fleethealth_kernel_xid_total") == {"1": 1.0}
            assert _values(snap, "DCGM_FI_DEV_GPU_TEMP")["0"] == 93
            ups = {labels["source"]: v for m, labels, v, _ in snap.rows() if m == "fleethealth_agent_source_up"}
            assert ups == {"nvml": 1.0, "kernel_log": 1.0}

            # Past the hold the last-Xid gauge returns to 0 (a reset GPU is not gated for ever); the counter stays.
            clock[0] += 301
            agent.collect(clock[0])
            snap = parse_page(client.get("/metrics").text)
            assert _values(snap, "DCGM_FI_DEV_XID_ERRORS") == {"0": 0.0, "1": 0.0}
            assert _values(snap, "fleethealth_kernel_xid_total") == {"1": 1.0}

            # Collections stop (clock runs on): /healthz goes 503 rather than serving stale numbers quietly.
            clock[0] += 4 * 3600
            assert client.get("/healthz").status_code == 503
    finally:
        agent.stop()


def test_agent_keeps_serving_gpu_metrics_when_the_kernel_log_fails() -> None:
    agent = Agent(NvmlSource("n", _fake(1)), KernelLogSource(command=["/nonexistent/dmesg", "-w"]), interval=60)
    snap = parse_page(render_exposition(agent.collect(10.0)))
    ups = {labels["source"]: v for m, labels, v, _ in snap.rows() if m == "fleethealth_agent_source_up"}
    assert ups == {"nvml": 1.0, "kernel_log": 0.0}
    assert _values(snap, "DCGM_FI_DEV_GPU_TEMP") == {"0": 45.0}
    assert agent.healthy(10.0)  # GPU readings are fresh; the kernel log's failure is its own signal


def test_cli_without_gpu_exits_2_with_one_line() -> None:
    from fleethealth.cli.main import app

    result = CliRunner().invoke(app, ["agent", "--listen", "127.0.0.1:0"])
    assert result.exit_code == 2
    out = result.output.strip()
    assert "NVML is not available" in out and "Traceback" not in out


@pytest.mark.timeout(60)
def test_cli_agent_process_with_fake_gpus_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    spec = tmp_path / "gpus.json"
    spec.write_text(json.dumps({"driver": "560.35.03", "gpus": [
        {"index": 0, "values": {"temperature": 50}},
        {"index": 1, "unsupported": ["nvmlDeviceGetPowerUsage"]},
    ]}))
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleethealth.cli.main", "agent", "--listen", f"127.0.0.1:{port}",
         "--interval", "0.2", "--hostname", "node-z", "--fake-nvml", str(spec)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    break
                time.sleep(0.1)
        assert text, proc.stderr.read().decode() if proc.stderr and proc.poll() is not None else "no answer"
        snap = parse_page(text)
        assert _values(snap, "DCGM_FI_DEV_GPU_TEMP") == {"0": 50.0, "1": 45.0}
        assert set(_values(snap, "DCGM_FI_DEV_POWER_USAGE")) == {"0"}
        drivers = {labels["DCGM_FI_DRIVER_VERSION"] for m, labels, _, _ in snap.rows() if labels.get("gpu")}
        assert drivers == {"560.35.03"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
