"""Properties of the kernel-log parser: never raises, round-trips events through every envelope, and builds
monotonic counters whose last value is the number of events."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.sources.kernel_log import BASELINE_OFFSET_S, XID_METRIC, normalize_bus_id, parse_kernel_log

BOOT = 1_690_000_000.0  # 2023-07-22: a year with an unambiguous syslog year argument


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=400))
def test_arbitrary_text_never_raises_and_line_numbers_are_in_range(text: str) -> None:
    r = parse_kernel_log(text, source="fuzz", node="n", boot_time=BOOT)
    n = len(text.splitlines())
    assert r.stats["lines"] == n
    assert all(1 <= i.line <= n for i in r.issues)
    assert len(r.issues) == r.stats["garbled"]  # every garbled line is reported, and only those


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet="NVRMXidSPCI:()0123456789abcdef,.=' \t[]<>-", max_size=80), max_size=20))
def test_near_miss_lines_never_raise(lines: list[str]) -> None:
    r = parse_kernel_log("\n".join(f"[1.0] NVRM: Xid {x}" for x in lines), source="f", node="n", boot_time=0.0)
    assert r.stats["xid"] + r.stats["garbled"] + r.stats["ignored"] <= r.stats["lines"]
    assert len(r.issues) == r.stats["garbled"]


event = st.tuples(
    st.integers(0, 86_400 * 30),  # whole seconds after BOOT (ctime and syslog stamps have no fraction)
    st.sampled_from([0x18, 0x3B, 0x5D, 0xB3]),
    st.sampled_from([13, 31, 48, 63, 74, 79, 94, 119]),
    st.sampled_from(["dmesg", "ctime", "syslog", "iso", "kmsg"]),
)


def _line(offset: int, bus: int, xid: int, style: str) -> str:
    msg = f"NVRM: Xid (PCI:0000:{bus:02x}:00): {xid}, pid=42, name=python3, something"
    wall = datetime.fromtimestamp(BOOT + offset, UTC)
    if style == "dmesg":
        return f"[{offset:>5}.000000] {msg}"
    if style == "ctime":
        return f"[{wall.strftime('%a %b')} {wall.day:>2} {wall.strftime('%H:%M:%S %Y')}] {msg}"
    if style == "syslog":
        return f"{wall.strftime('%b')} {wall.day:>2} {wall.strftime('%H:%M:%S')} node-x kernel: {msg}"
    if style == "iso":
        return f"{wall.isoformat()} node-x kernel: {msg}"
    return f"4,{offset},{offset * 1_000_000},-;{msg}"


@settings(max_examples=100, deadline=None)
@given(st.lists(event, min_size=1, max_size=30))
def test_events_round_trip_through_every_envelope_and_counters_are_monotonic(events: list) -> None:  # type: ignore[type-arg]
    text = "\n".join(_line(*e) for e in events)
    r = parse_kernel_log(text, source="p", node="node-x", boot_time=BOOT, year=2023)
    assert not r.issues
    got = sorted((round(e.ts), e.pci_bus_id, e.xid) for e in r.events)
    want = sorted((round(BOOT + off), normalize_bus_id(f"{bus:02x}:00"), xid) for off, bus, xid, _ in events)
    assert got == want
    assert all(e.node == "node-x" and e.pid == 42 and e.process_name == "python3" for e in r.events)

    per_series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for m, labels, v, t in r.snapshot.rows():
        if m == XID_METRIC:
            per_series.setdefault(tuple(sorted(labels.items())), []).append((t, v))
    for key, pts in per_series.items():
        labels = dict(key)
        n = sum(1 for off, bus, xid, _ in events
                if normalize_bus_id(f"{bus:02x}:00") == labels["pci_bus_id"] and str(xid) == labels["xid"])
        pts.sort()
        assert pts[0][1] == 0.0 and abs(pts[1][0] - pts[0][0] - BASELINE_OFFSET_S) < 1e-6
        values = [v for _, v in pts]
        assert values == sorted(values) and values[-1] == n
