"""Signals operators ask for (issue 16 item 6), in the default policy where dcgm-exporter exposes them: a
PCIe link below its device maximum (scored as a share of it, ``relative_to``), hardware clock-event reasons
(a bitmask: ``bits``), fabric manager failure and an NVLink link down (``values`` on a flag; per link, any
link down counts whatever the other links say). Each is optional: an exporter that
does not ship the fields loses no confidence, and a GPU whose reference field is missing gets no score
(never a healthy one). The batched engine, the row path and the scalar reference agree."""

from __future__ import annotations

import dataclasses

import pytest

from fleethealth.policy import PolicyError, default_policy, default_policy_text, parse_policy
from fleethealth.score.engine import FleetHealth, score_snapshot
from fleethealth.score.reference import score_reference
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

POL = default_policy()
T0 = 1_700_000_000.0
ODD = {  # GPU -> its fields beside the healthy ones
    "n1/gpu2": {"DCGM_FI_DEV_PCIE_LINK_GEN": 3.0, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 8.0},
    "n1/gpu3": {"DCGM_FI_DEV_PCIE_LINK_GEN": 4.0},
    "n2/gpu0": {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(0x8 | 0x20)},  # HW slowdown + SW thermal
    "n2/gpu1": {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(0x20 | 0x4)},  # SW thermal + power cap: no fault
    "n3/gpu0": {"DCGM_FI_DEV_FABRIC_MANAGER_STATUS": 4.0},
    "n3/gpu1": {"DCGM_FI_DEV_FABRIC_MANAGER_STATUS": 1.0},
}


def _scrape(t: float, link_fields: bool = True, max_missing: str | None = None, lacks: str | None = None) -> Snapshot:
    b = SnapshotBuilder()
    for n in range(6):
        for g in range(4):
            name = f"n{n}/gpu{g}"
            lab = {"Hostname": f"n{n}", "gpu": str(g), "UUID": f"GPU-{n}-{g}", "modelName": "NVIDIA H100 80GB HBM3",
                   "pool": "train" if n < 4 else "serve"}
            fields = {"DCGM_FI_DEV_GPU_TEMP": 60.0, "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_XID_ERRORS": 0.0,
                      "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0.0, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": 3.0}
            if link_fields and n < 4:  # nodes 4 and 5: an exporter without the link fields
                fields |= {"DCGM_FI_DEV_PCIE_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16.0,
                           "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5.0, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16.0}
            fields |= ODD.get(name, {})
            if name == max_missing:
                fields.pop("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", None)
            if name == lacks:
                for m in [m for m in fields if m.startswith("DCGM_FI_DEV_PCIE")]:
                    del fields[m]
            for metric, v in fields.items():
                b.add(metric, lab, v, t)
            links = {"n3/gpu2": (3, 2, 3, 0), "n3/gpu3": (3, 1, 3, 0)}.get(name, (3, 3, 3, 3))
            for link, state in enumerate(links):  # NVLink state per link: 0 n/a, 1 disabled, 2 down, 3 up
                b.add("DCGM_FI_DEV_NVLINK_LINK_STATUS", {**lab, "link": str(link)}, float(state), t)
    return b.build(t)


def _all_paths(**kw: object) -> tuple[list[FleetHealth], dict[str, object]]:
    h = SignalHistory(POL)
    for k in range(3):
        h.add(_scrape(T0 + 15 * k, **kw))  # type: ignore[arg-type]
    now = T0 + 31
    view = h.view(now)
    last = _scrape(T0 + 30, **kw)  # type: ignore[arg-type]
    return ([score_snapshot(view, POL, now), score_snapshot(dataclasses.replace(view, index=None), POL, now)],
            score_reference(last, POL, now))  # type: ignore[return-value]


def _detail(fh: FleetHealth, gpu: str, signal: str) -> object:
    return next(d for d in fh.tuples[gpu].details if d.signal == signal)


def test_a_downtrained_link_scores_as_a_share_of_its_maximum() -> None:
    fhs, ref = _all_paths()
    for fh in fhs:
        gen, width = _detail(fh, "n1/gpu2", "pcie_link_gen"), _detail(fh, "n1/gpu2", "pcie_link_width")
        assert gen.raw == pytest.approx(0.6) and gen.score == pytest.approx(1 - 0.39 / 0.79)  # type: ignore[attr-defined]
        assert width.raw == pytest.approx(0.5) and width.score == 0.0  # type: ignore[attr-defined]
        assert fh.tuples["n1/gpu2"].value == 0.0 and fh.tuples["n1/gpu2"].reason == "min:pcie"
        # Gen4 of Gen5 at full width: the generation alone (idle GPUs lower it to save power) only degrades
        # (the pcie category's mean of generation and width)
        assert fh.tuples["n1/gpu3"].value == pytest.approx((1 - 0.19 / 0.79 + 1) / 2)
        assert fh.tuples["n0/gpu0"].value == 1.0
    assert ref["n1/gpu2"].value == 0.0 and ref["n1/gpu3"].value == pytest.approx((1 - 0.19 / 0.79 + 1) / 2)  # type: ignore[attr-defined]


def test_hardware_clock_events_and_a_fabric_manager_failure_are_flagged_and_scored() -> None:
    fhs, ref = _all_paths()
    for fh in fhs:
        t = fh.tuples["n2/gpu0"]
        assert "clock_event:hw_slowdown" in t.flags and t.value == pytest.approx(0.6) and t.reason == "min:clocks"
        assert fh.tuples["n2/gpu1"].value == 1.0 and not [f for f in fh.tuples["n2/gpu1"].flags if "clock" in f]
        fm = fh.tuples["n3/gpu0"]
        assert "fabric_manager:failure" in fm.flags and fm.value == 0.0 and fm.reason == "min:nvlink"
        assert "fabric_manager:not_started" in fh.tuples["n3/gpu1"].flags and fh.tuples["n3/gpu1"].value == 1.0
    assert ref["n2/gpu0"].value == pytest.approx(0.6) and ref["n3/gpu0"].value == 0.0  # type: ignore[attr-defined]
    a, b = fhs
    for name in a.tuples:
        assert a.tuples[name].value == pytest.approx(b.tuples[name].value, abs=1e-12), name
        assert sorted(a.tuples[name].flags) == sorted(b.tuples[name].flags), name


def test_an_exporter_without_the_optional_fields_loses_no_confidence() -> None:
    fhs, _ = _all_paths()  # pool serve's exporter ships no link fields; pool train's does
    nowhere, _ = _all_paths(link_fields=False)  # no exporter ships them
    for fh in fhs:
        assert fh.tuples["n4/gpu0"].confidence == nowhere[0].tuples["n4/gpu0"].confidence
        assert "pcie_link" not in fh.tuples["n4/gpu0"].reason
        assert not [d for d in fh.tuples["n4/gpu0"].details if d.signal.startswith("pcie_link") and d.score is not None]


def test_a_gpu_missing_the_fields_its_pool_carries_reads_missing_not_healthy() -> None:
    fhs, _ = _all_paths(lacks="n0/gpu1")
    for fh in fhs:
        t = fh.tuples["n0/gpu1"]
        assert t.confidence < fh.tuples["n0/gpu0"].confidence and "pcie_link" in t.reason


def test_a_missing_device_maximum_is_no_score_never_a_healthy_one() -> None:
    fhs, ref = _all_paths(max_missing="n1/gpu2")
    for fh in fhs:
        assert _detail(fh, "n1/gpu2", "pcie_link_gen").score is None  # type: ignore[attr-defined]
        assert _detail(fh, "n1/gpu2", "pcie_link_width").score == 0.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(("old", "new", "err"), [
    ("    bits: {8: \"clock_event:hw_slowdown\", 64:", "    bits: {12: \"clock_event:hw_slowdown\", 64:", "one bit"),
    ("    relative_to: DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH\n", "    relative_to: DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH\n    kind: counter\n",
     r"relative_to: is for gauges"),
])
def test_bad_bits_and_ratios_are_policy_errors(old: str, new: str, err: str) -> None:
    text = default_policy_text()
    assert old in text
    with pytest.raises(PolicyError, match=err):
        parse_policy(text.replace(old, new, 1))


def test_one_nvlink_link_down_among_others_flags_the_gpu() -> None:
    fhs, ref = _all_paths()
    for fh in fhs:
        down = fh.tuples["n3/gpu2"]  # links up, down, up, not supported
        assert "nvlink_link_down" in down.flags and down.value == 0.0 and down.reason == "min:nvlink"
        other = fh.tuples["n3/gpu3"]  # a disabled link is configuration, not a fault
        assert "nvlink_link_down" not in other.flags and other.value == 1.0
    assert ref["n3/gpu2"].value == 0.0 and ref["n3/gpu3"].value == 1.0  # type: ignore[attr-defined]
