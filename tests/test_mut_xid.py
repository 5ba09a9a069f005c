"""The Xid catalog and classification as an operator reads them (issue 21: signals/xid.py had no test of its
own; these pin what each Xid means and which class it lands in, including the catalog's own verdict for an
Xid that is in none of the policy's explicit lists)."""

from __future__ import annotations

import pytest

from fleethealth.signals import xid as xid_mod
from fleethealth.signals.xid import RECOVERY_ACTIONS, classify_xid, xid_catalog, xid_info

# the policy's defaults (decide/oom.py Thresholds, policy.py): gate buckets and explicit lists
GATE_BUCKETS = ["RESET_GPU", "RESTART_BM", "RESTART_VM"]
GATE = [48, 62, 64, 74, 79, 95, 119, 120, 140]
APP = [13, 31, 43, 45, 94]
RESET = [63]


def classify(code: int, buckets: list[str] | None = None, gate: list[int] | None = None,
             app: list[int] | None = None, reset: list[int] | None = None) -> str:
    return classify_xid(code, GATE_BUCKETS if buckets is None else buckets, GATE if gate is None else gate,
                        APP if app is None else app, RESET if reset is None else reset)


def test_catalog_rows_read_from_the_shipped_export() -> None:
    cat = xid_catalog()
    assert len(cat) == 172  # every numbered row of NVIDIA's export, the header skipped
    assert min(cat) == 1 and max(cat) == 172
    x79 = cat[79]
    assert x79.code == 79
    assert x79.mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert x79.description == "GPU has fallen off the bus"
    assert x79.immediate == "RESTART_BM"
    assert x79.investigatory == "CONTACT_SUPPORT"
    assert x79.xid154 == "CUDA 12.7; GPU driver R565"
    # the export's in-cell line breaks ('|') become single spaces, runs of blanks collapse
    assert cat[13].mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"
    assert cat[62].description == "Internal micro-controller halt (newer drivers)"
    assert "|" not in cat[13].description and "  " not in cat[13].description
    assert cat[45].immediate == "WORKFLOW_XID_45"
    assert cat[45].investigatory.startswith("Solo: RESTART_FM Not Solo: IGNORE (follow other")
    assert cat[94].investigatory == "IGNORE (sympathetic)"
    assert cat[13].xid154 == ""


def test_blank_immediate_action_means_contact_support() -> None:
    info = xid_info(171)
    assert info is not None
    assert info.mnemonic == "UNCORRECTABLE_DRAM_ERROR"
    assert info.immediate == "CONTACT_SUPPORT"


def test_unknown_code_has_no_info() -> None:
    assert xid_info(9999) is None
    assert xid_info(0) is None
    assert xid_info(1) is not None and xid_info(1).mnemonic == "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD"


class _Fake:
    def __init__(self, text: str) -> None:
        self.text = text

    def joinpath(self, name: str) -> _Fake:
        assert name == "data/xids.tsv"
        return self

    def read_text(self, encoding: str = "") -> str:
        assert encoding == "utf-8"
        return self.text


def test_a_newer_export_with_short_footnote_and_unnumbered_rows_is_read_not_crashed_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    header = "\t".join(f"h{i}" for i in range(11))
    full = "XID\t200\tNEW_ONE\tA new | fault\tY\tY\tY\tY\t  RESET_GPU  later\tINVESTIGATE_SW\tR999"
    ten = "XID\t201\tTEN_COLS\tTen columns\tY\tY\tY\tY\t\tIGNORE"
    short = "XID\t202\tSHORT\tNine columns\tY\tY\tY\tY\tRESET_GPU"
    note = "Note\t see below\tx\tx\tx\tx\tx\tx\tRESET_GPU\tx\tx"
    spaced = "XID\t 203 \tSPACED\tcode with blanks\tY\tY\tY\tY\tRESTART_APP\tIGNORE\t"
    monkeypatch.setattr(xid_mod.resources, "files", lambda pkg: _Fake("\n".join([header, full, ten, short, note,
                                                                                   spaced]) + "\n"))
    xid_catalog.cache_clear()
    try:
        cat = xid_catalog()
        assert sorted(cat) == [200, 201, 203]
        assert cat[200] == xid_mod.XidInfo(200, "NEW_ONE", "A new fault", "RESET_GPU", "INVESTIGATE_SW", "R999")
        assert cat[201].immediate == "CONTACT_SUPPORT" and cat[201].xid154 == ""
        assert cat[201].investigatory == "IGNORE"
        assert cat[203].immediate == "RESTART_APP" and cat[203].mnemonic == "SPACED"
        assert classify(200) == "gate" and classify(203) == "app" and classify(79, gate=[]) == "unknown"
    finally:
        monkeypatch.undo()
        xid_catalog.cache_clear()
    assert len(xid_catalog()) == 172


@pytest.mark.parametrize(("code", "want"), [
    (79, "gate"), (48, "gate"), (74, "gate"), (95, "gate"),  # explicit gate list
    (13, "app"), (31, "app"), (43, "app"), (45, "app"), (94, "app"),  # explicit app list
    (63, "reset"),  # explicit reset list (a row remap: reset at a safe point)
])
def test_explicit_lists(code: int, want: str) -> None:
    assert classify(code) == want


def test_explicit_lists_win_over_each_other_app_then_reset_then_gate() -> None:
    # an Xid an operator put in several lists: app beats reset beats gate
    assert classify(79, app=[79], reset=[79], gate=[79]) == "app"
    assert classify(79, app=[], reset=[79], gate=[79]) == "reset"
    assert classify(79, app=[], reset=[], gate=[79]) == "gate"
    # and the lists beat the catalog: 94 is RESTART_APP in the catalog, 64 RESET_GPU
    assert classify(94, app=[], reset=[94]) == "reset"
    assert classify(64, gate=[], reset=[64]) == "reset"
    assert classify(119, gate=[], app=[119]) == "app"


def test_catalog_decides_an_xid_in_none_of_the_lists() -> None:
    none: list[int] = []
    # 64 (row remap failure) and 120 (GSP error) say RESET_GPU; 79 RESTART_BM: gate by bucket alone
    assert xid_info(64).immediate == "RESET_GPU"  # type: ignore[union-attr]
    assert classify(64, gate=none, app=none, reset=none) == "gate"
    assert classify(120, gate=none, app=none, reset=none) == "gate"
    assert classify(79, gate=none, app=none, reset=none) == "gate"
    # a bucket the policy does not gate on: not gate
    assert classify(64, buckets=["RESTART_BM"], gate=none) == "info"
    assert classify(79, buckets=["RESET_GPU"], gate=none) == "info"
    # 13 and 31 are RESTART_APP in the catalog: the job first, whatever the lists say
    assert classify(13, app=none) == "app"
    assert classify(31, buckets=[], gate=none, app=none, reset=none) == "app"
    # IGNORE and CONTACT_SUPPORT rows are known but do not gate
    assert classify(92) == "info"  # excessive SBE interrupts: IGNORE
    assert classify(1) == "info"  # CONTACT_SUPPORT
    assert classify(171) == "info"  # blank in the export: CONTACT_SUPPORT
    # RESTART_APP even when an operator gates on that bucket: the bucket list is consulted first
    assert classify(13, buckets=["RESTART_APP"], app=none) == "gate"


def test_code_outside_the_catalog_is_unknown_unless_listed() -> None:
    assert classify(9999) == "unknown"
    assert classify(9999, gate=[9999]) == "gate"
    assert classify(9999, app=[9999]) == "app"
    assert classify(9999, reset=[9999]) == "reset"


def test_recovery_action_names() -> None:
    assert RECOVERY_ACTIONS == {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET"}
