"""Kernel-log Xid parsing: real line shapes (dmesg, dmesg -T, journald, syslog, ISO, kmsg), bus-id mapping,
counter construction, issues, and the live follower on a real file and a real command."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from fleethealth.signals.snapshot import SnapshotBuilder
from fleethealth.sources.kernel_log import (
    FALLEN_OFF_METRIC,
    RECOVERY_METRIC,
    SXID_METRIC,
    XID_METRIC,
    KernelLogSource,
    bus_map_from_snapshot,
    normalize_bus_id,
    parse_kernel_log,
)


def _utc(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> float:
    return datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp()


def _series(snap, metric):  # type: ignore[no-untyped-def]
    out: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for m, labels, v, t in snap.rows():
        if m == metric:
            out.setdefault(tuple(sorted(labels.items())), []).append((t, v))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        ("0000:3b:00", "0000:3b:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("PCI:0000:10:00.0", "0000:10:00.0"),
        ("3b:00.1", "0000:3b:00.1"),
        ("0018:01:00", "0018:01:00.0"),
        ("not a bus", None),
    ],
)
def test_normalize_bus_id(text: str, norm: str | None) -> None:
    assert normalize_bus_id(text) == norm


def test_dmesg_relative_stamp_with_boot_time() -> None:
    r = parse_kernel_log(
        "[12345.678901] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n",
        source="dmesg", node="n1", boot_time=1_700_000_000.0,
    )
    (e,) = r.events
    assert e.ts == pytest.approx(1_700_000_000.0 + 12345.678901)
    assert (e.node, e.pci_bus_id, e.xid, e.pid, e.process_name) == ("n1", "0000:18:00.0", 79, 1234, None)
    assert e.message == "GPU has fallen off the bus."
    assert e.line == 1
    assert not r.issues
    assert e.entity == "n1"  # the bus map did not know the GPU: the node carries it
    assert e.to_dict()["xid"] == 79 and e.to_dict()["entity"] == "n1"


def test_dmesg_relative_stamp_without_boot_time_is_kept_relative_and_reported() -> None:
    r = parse_kernel_log("[  100.5] NVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE\n" * 3, source="d", node="n")
    assert [e.ts for e in r.events] == [100.5, 100.5, 100.5]
    assert not r.issues  # every line became an event
    assert len(r.notes) == 1 and "boot_time" in r.notes[0].reason


def test_dmesg_ctime_stamp() -> None:
    r = parse_kernel_log(
        "[Mon Oct  2 10:41:07 2023] NVRM: Xid (PCI:0000:3b:00): 13, pid='1234', name='python3', Graphics SM "
        "Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address\n",
        source="dmesg-T", node="n1",
    )
    (e,) = r.events
    assert e.ts == _utc(2023, 10, 2, 10, 41, 7)
    assert (e.pid, e.process_name, e.xid) == (1234, "python3", 13)
    assert e.message.startswith("Graphics SM Warp Exception")


def test_journald_short_takes_host_from_line_and_year_from_argument() -> None:
    r = parse_kernel_log(
        "Oct 02 10:41:07 gpu-node-7 kernel: NVRM: Xid (PCI:0000:3d:00): 79, pid=0, GPU has fallen off the bus.\n"
        "Oct  2 10:41:08 gpu-node-7 kernel: [ 5.000] NVRM: Xid (PCI:0000:3d:00): 79, pid=0, again\n",
        source="journal", node="ignored-when-line-has-host", year=2023,
    )
    assert [e.node for e in r.events] == ["gpu-node-7", "gpu-node-7"]
    # The wall clock wins over the dmesg stamp embedded in the message.
    assert [e.ts for e in r.events] == [_utc(2023, 10, 2, 10, 41, 7), _utc(2023, 10, 2, 10, 41, 8)]
    assert r.events[1].message == "again"


def test_syslog_year_from_now_and_new_year_rollover() -> None:
    now = _utc(2024, 1, 1, 0, 5, 0)
    r = parse_kernel_log(
        "Dec 31 23:59:59 h kernel: NVRM: Xid (PCI:0000:3d:00): 31, pid=5, name=x, MMU Fault\n"
        "Jan  1 00:00:01 h kernel: NVRM: Xid (PCI:0000:3d:00): 31, pid=5, name=x, MMU Fault\n",
        source="syslog", now=now,
    )
    assert [e.ts for e in r.events] == [_utc(2023, 12, 31, 23, 59, 59), _utc(2024, 1, 1, 0, 0, 1)]


def test_zoneless_stamps_are_read_in_the_given_zone_and_iso_offsets_win() -> None:
    cest = timezone(timedelta(hours=2))
    r = parse_kernel_log(
        "Oct 02 12:41:07 h kernel: NVRM: Xid (PCI:0000:3d:00): 79, pid=0, x\n"
        "[Mon Oct  2 12:41:08 2023] NVRM: Xid (PCI:0000:3d:00): 79, pid=0, x\n"
        "2023-10-02T10:41:09+00:00 h kernel: NVRM: Xid (PCI:0000:3d:00): 79, pid=0, x\n",
        source="tz", node="h", year=2023, tz=cest,
    )
    assert [e.ts for e in r.events] == [_utc(2023, 10, 2, 10, 41, 7), _utc(2023, 10, 2, 10, 41, 8),
                                        _utc(2023, 10, 2, 10, 41, 9)]


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2023-10-02T10:41:07.123456+00:00", _utc(2023, 10, 2, 10, 41, 7) + 0.123456),
        ("2023-10-02T12:41:07+0200", _utc(2023, 10, 2, 10, 41, 7)),
        ("2023-10-02T10:41:07Z", _utc(2023, 10, 2, 10, 41, 7)),
    ],
)
def test_iso_stamps(stamp: str, expected: float) -> None:
    r = parse_kernel_log(f"{stamp} host-a kernel: NVRM: Xid (PCI:0000:3d:00): 79, pid=0, x\n", source="iso")
    (e,) = r.events
    assert e.ts == pytest.approx(expected)
    assert e.node == "host-a"


def test_dmesg_iso_format_without_host_and_kmsg() -> None:
    r = parse_kernel_log(
        "2023-10-02T10:41:07,500000+00:00 NVRM: Xid (PCI:0000:3f:00): 46\n"
        "6,1234,2000000,-;NVRM: Xid (PCI:0000:3f:00): 46\n",
        source="mixed", node="n9", boot_time=1000.0,
    )
    assert [e.ts for e in r.events] == [pytest.approx(_utc(2023, 10, 2, 10, 41, 7) + 0.5), 1002.0]
    assert all(e.node == "n9" for e in r.events)


def test_pid_and_name_variants_and_minimal_lines() -> None:
    r = parse_kernel_log(
        "[1.0] NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x1\n"
        "[2.0] NVRM: Xid (PCI:0000:66:00): 32, pid=2280636, name=train.3, Channel ID 0000000d intr0 00040000\n"
        "[3.0] NVRM: Xid (PCI:0000:3f:00): 46\n"
        "[4.0] NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000)\n"
        "[5.0] NVRM: Xid (0000:03:00): 13, 0003 00000000 0000a297 00000000\n",
        source="v", node="n", boot_time=0.0,
    )
    got = [(e.xid, e.pid, e.process_name, e.pci_bus_id) for e in r.events]
    assert got == [
        (13, None, None, "0000:b5:00.0"),
        (32, 2280636, "train.3", "0000:66:00.0"),
        (46, None, None, "0000:3f:00.0"),
        (149, None, None, "0018:01:00.0"),
        (13, None, None, "0000:03:00.0"),
    ]
    assert r.events[1].message == "Channel ID 0000000d intr0 00040000"
    assert r.events[3].message.startswith("NETIR_LINK_EVT")


def test_nvlink_xid74_register_list_kept_in_message() -> None:
    line = ("[7.0] NVRM: Xid (PCI:0000:10:00.0): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error "
            "detected on link 14(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
    (e,) = parse_kernel_log(line, source="s", node="n", boot_time=0.0).events
    assert e.xid == 74 and e.pci_bus_id == "0000:10:00.0"
    assert e.message.endswith("link 14(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
    assert e.raw == line


def test_xid154_recovery_action_gauge() -> None:
    r = parse_kernel_log(
        "[10.0] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
        "Required)\n"
        "[20.0] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to "
        "0x2 (Node Reboot Required)\n",
        source="s", node="n", boot_time=1000.0, bus_to_gpu={"00000000:3B:00.0": "3"},
    )
    assert [e.recovery_action for e in r.events] == [1, 2]
    rec = _series(r.snapshot, RECOVERY_METRIC)
    ((labels, points),) = rec.items()
    assert dict(labels) == {"Hostname": "n", "pci_bus_id": "0000:3b:00.0", "gpu": "3"}
    assert points == [(1010.0, 1.0), (1020.0, 2.0)]


def test_sxid_lines() -> None:
    r = parse_kernel_log(
        "[73309.599396] nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate\n"
        "[ 1108.858286] nvidia-nvswitch3: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout (First)\n"
        "[ 1109.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Severity 1 Engine instance 00\n",
        source="s", node="n", boot_time=0.0,
    )
    got = [(e.sxid, e.switch, e.fatal, e.link, e.pci_bus_id, e.message) for e in r.sxid_events]
    assert got == [
        (20009, 0, False, 4, "0000:06:00.0", "RX Short Error Rate"),
        (24007, 3, True, 28, "0000:c3:00.0", "sourcetrack timeout (First)"),
        (12028, 0, None, None, "0000:05:00.0", "Severity 1 Engine instance 00"),
    ]
    assert not r.events
    sx = _series(r.snapshot, SXID_METRIC)
    assert {dict(k)["sxid"] for k in sx} == {"20009", "24007", "12028"}
    assert all(set(dict(k)) == {"Hostname", "pci_bus_id", "sxid"} for k in sx)


def test_multiline_fallen_off_the_bus_notice() -> None:
    r = parse_kernel_log(
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n",
        source="s", node="n", boot_time=0.0, bus_to_gpu={("n", "0000:b3:00"): "5"},
    )
    (f,) = r.fallen_off
    assert (f.pci_bus_id, f.gpu, f.ts, f.line) == ("0000:b3:00.0", 5, 1843.308145, 3)
    assert _series(r.snapshot, FALLEN_OFF_METRIC)


def test_counter_has_zero_baseline_and_cumulative_counts_per_series() -> None:
    lines = "".join(
        f"[{t}.0] NVRM: Xid (PCI:0000:{bus}:00): {x}, pid=1, name=p, msg\n"
        for t, bus, x in [(10, "3b", 31), (20, "3b", 31), (30, "3b", 79), (40, "5d", 31), (50, "3b", 31)]
    )
    r = parse_kernel_log(lines, source="s", node="n", boot_time=1000.0,
                         bus_to_gpu={"0000:3b:00.0": "0", "0000:5d:00.0": "1"})
    xs = {(dict(k)["gpu"], dict(k)["xid"]): v for k, v in _series(r.snapshot, XID_METRIC).items()}
    assert xs[("0", "31")] == [(1009.999, 0.0), (1010.0, 1.0), (1020.0, 2.0), (1050.0, 3.0)]
    assert xs[("0", "79")] == [(1029.999, 0.0), (1030.0, 1.0)]
    assert xs[("1", "31")] == [(1039.999, 0.0), (1040.0, 1.0)]
    assert r.snapshot.at == 1050.0


def test_out_of_order_lines_still_give_a_monotonic_counter() -> None:
    text = ("Oct 02 10:00:05 h kernel: NVRM: Xid (PCI:0000:3b:00): 31, pid=1, x\n"
            "Oct 02 10:00:01 h kernel: NVRM: Xid (PCI:0000:3b:00): 31, pid=1, x\n")
    r = parse_kernel_log(text, source="s", year=2023)
    ((_, pts),) = _series(r.snapshot, XID_METRIC).items()
    assert [v for _, v in pts] == [0.0, 1.0, 2.0]
    assert np.all(np.diff([t for t, _ in pts]) > 0)


def test_garbled_unknown_and_unrelated_lines_are_counted_never_fatal() -> None:
    r = parse_kernel_log(
        "Linux version 6.1.0\n"
        "[1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"
        "[2.0] NVRM: Xid (PCI:0000:66:00): abc, pid=2280636\n"
        "[3.0] NVRM: Xid : 32, pid=2280636\n"
        "\x00\xff garbage \ufffd\n"
        "[4.0] NVRM: Xid (PCI:0000:66:00): 9999, pid=1, name=x\n"
        "NVRM: Xid (PCI:0000:66:00): 79, pid=1\n",  # no stamp: takes the previous line's time
        source="f", node="n", boot_time=0.0,
    )
    assert [e.xid for e in r.events] == [9999, 79]
    assert r.events[1].ts == 4.0
    assert r.stats["garbled"] == 2 and r.stats["ignored"] >= 2 and r.stats["lines"] == 7
    lines = sorted(i.line for i in r.issues if "garbled" in i.reason)
    assert lines == [3, 4]
    assert [i.line for i in r.issues] == [3, 4]  # only the lines that could not become events
    assert any("9999" in n.reason and n.line == 6 for n in r.notes)
    assert len(r.snapshot.issues) == 2


def test_lines_without_host_or_node_are_reported_once() -> None:
    r = parse_kernel_log("[1.0] NVRM: Xid (PCI:0000:66:00): 79, pid=1\n" * 2, source="f", boot_time=0.0)
    assert len(r.events) == 2 and r.events[0].node is None
    assert not r.issues and sum("no host name" in n.reason for n in r.notes) == 1
    ((labels, _),) = _series(r.snapshot, XID_METRIC).items()
    assert "Hostname" not in dict(labels)


def test_bus_map_from_dcgm_exporter_snapshot() -> None:
    b = SnapshotBuilder()
    b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "pci_bus_id": "00000000:18:00.0", "Hostname": "n1"}, 40, 1.0)
    b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "1", "pci_bus_id": "00000000:3B:00.0", "Hostname": "n1"}, 40, 1.0)
    b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": "1", "pci_bus_id": "00000000:3B:00.0", "Hostname": "n2"}, 40, 1.0)
    b.add("up", {"instance": "x"}, 1, 1.0)
    bus_map = bus_map_from_snapshot(b.build(1.0))
    assert bus_map == {("n1", "0000:18:00.0"): "0", ("n1", "0000:3b:00.0"): "1", ("n2", "0000:3b:00.0"): "1"}
    r = parse_kernel_log(
        "Oct 02 10:41:07 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, x\n"
        "Oct 02 10:41:07 n3 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, x\n",
        source="s", year=2023, bus_to_gpu=bus_map,
    )
    assert [e.gpu for e in r.events] == [1, None]
    assert [e.entity for e in r.events] == ["n2/gpu1", "n3"]


def test_source_follows_a_growing_rotating_file(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("Oct 02 10:00:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 31, pid=1, x\n")
    src = KernelLogSource(path=str(log), year=2023, bus_to_gpu={"0000:3b:00.0": "0"}, tz=UTC)
    t0 = _utc(2023, 10, 2, 10, 0, 0)
    s1 = src.read(t0 + 10)
    assert _series(s1, XID_METRIC)
    ((_, pts),) = _series(s1, XID_METRIC).items()
    assert pts == [(t0 - 0.001, 0.0), (t0, 1.0), (t0 + 10, 1.0)]

    # A half-written line is not read until it is complete.
    with log.open("a") as f:
        f.write("Oct 02 10:00:20 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 31, pid=1, x\nOct 02 10:00:21 n1 ker")
    s2 = src.read(t0 + 30)
    ((_, pts),) = _series(s2, XID_METRIC).items()
    assert pts == [(t0 + 20, 2.0), (t0 + 30, 2.0)]
    with log.open("a") as f:
        f.write("nel: NVRM: Xid (PCI:0000:3b:00): 31, pid=1, x\n")
    s3 = src.read(t0 + 40)
    assert _series(s3, XID_METRIC)[next(iter(_series(s3, XID_METRIC)))][-1] == (t0 + 40, 3.0)

    # Rotation: a new file starts from its beginning; counts carry on.
    log.rename(tmp_path / "kern.log.1")
    log.write_text("Oct 02 10:00:50 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 31, pid=1, x\n")
    s4 = src.read(t0 + 60)
    ((_, pts),) = _series(s4, XID_METRIC).items()
    assert pts == [(t0 + 50, 4.0), (t0 + 60, 4.0)]


def test_source_missing_file_is_a_source_error(tmp_path: Path) -> None:
    src = KernelLogSource(tmp_path / "nope.log")
    snap = src.read(100.0)
    assert len(snap) == 0 and snap.source_errors and "cannot read" in snap.source_errors[0].reason


def test_source_from_command(tmp_path: Path) -> None:
    script = tmp_path / "fake_dmesg.py"
    script.write_text(
        "import sys\n"
        "print('[10.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, fallen', flush=True)\n"
        "print('[11.0] nvidia-nvswitch1: SXid (PCI:0000:05:00.0): 12028, Fatal, Link 3 x', flush=True)\n"
    )
    # A list in the first position is a command (a path would be a str or a Path).
    src = KernelLogSource([sys.executable, str(script)], node="n1", boot_time=1000.0)
    try:
        import time

        deadline = time.monotonic() + 10
        seen: set[str] = set()
        errors = []
        while time.monotonic() < deadline and not {XID_METRIC, SXID_METRIC} <= seen:
            snap = src.read(2000.0)
            seen |= {m for m, *_ in snap.rows()}
            errors.extend(snap.source_errors)
            time.sleep(0.05)
        assert {XID_METRIC, SXID_METRIC} <= seen
        # The command ended: reported as a source error, and a restart does not count the replay twice.
        for _ in range(40):
            snap = src.read(2001.0)
            errors.extend(snap.source_errors)
            time.sleep(0.05)
        assert any("exited" in e.reason for e in errors)
        assert src.parser.counts[(XID_METRIC, (("Hostname", "n1"), ("pci_bus_id", "0000:3b:00.0"),
                                               ("xid", "79")))] == 1
    finally:
        src.close()


def test_source_reads_dev_kmsg_directly_without_blocking() -> None:
    import os

    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    src = KernelLogSource("/dev/kmsg", node="here")
    try:
        import time

        t0 = time.monotonic()
        snap = src.read(time.time())
        again = src.read(time.time())  # nothing new: returns at once instead of blocking
        assert time.monotonic() - t0 < 10
        assert not snap.source_errors and not again.source_errors
        assert src.parser.stats["lines"] > 0
    finally:
        src.close()


def test_source_from_now_on_skips_what_the_file_already_held(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("Oct 02 10:00:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, old\n")
    src = KernelLogSource(log, from_start=False, year=2023, tz=UTC)
    assert len(src.read(_utc(2023, 10, 2, 10, 0, 5))) == 0
    with log.open("a") as f:
        f.write("Oct 02 10:00:10 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, new\n")
    snap = src.read(_utc(2023, 10, 2, 10, 0, 15))
    assert {labels["xid"] for m, labels, _, _ in snap.rows() if m == XID_METRIC} == {"48"}


def test_source_with_a_command_that_cannot_run_is_a_source_error() -> None:
    src = KernelLogSource(command=["/nonexistent/dmesg", "-w"])
    snap = src.read(1.0)
    assert len(snap) == 0 and "cannot run" in snap.source_errors[0].reason
