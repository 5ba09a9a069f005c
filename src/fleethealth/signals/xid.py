"""NVIDIA's Xid catalog (shipped as data/xids.tsv, exported from NVIDIA's "Analyzing Xid Catalog").

The catalog is the authority for what an Xid means and what its immediate action is; the policy decides
which resolution buckets gate a GPU.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

# Driver R565+ recovery action (Xid 154 and DCGM_FI_DEV_GPU_RECOVERY_ACTION, field 1523).
RECOVERY_ACTIONS: dict[int, str] = {0: "NONE", 1: "GPU_RESET", 2: "NODE_REBOOT", 3: "DRAIN_P2P", 4: "DRAIN_AND_RESET"}


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    mnemonic: str
    description: str
    immediate: str  # resolution bucket of the immediate action, e.g. RESET_GPU, RESTART_BM, RESTART_APP
    investigatory: str
    xid154: str


def _clean(s: str | None) -> str:
    return " ".join((s or "").replace("|", " ").split())


@lru_cache(maxsize=1)
def xid_catalog() -> dict[int, XidInfo]:
    text = resources.files("fleethealth").joinpath("data/xids.tsv").read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text), delimiter="\t"))
    out: dict[int, XidInfo] = {}
    for row in rows[1:]:
        if len(row) < 10 or not row[1].strip().isdigit():
            continue
        code = int(row[1])
        immediate = _clean(row[8]).split(" ")[0] if _clean(row[8]) else "CONTACT_SUPPORT"
        out[code] = XidInfo(
            code=code,
            mnemonic=_clean(row[2]),
            description=_clean(row[3]),
            immediate=immediate,
            investigatory=_clean(row[9]),
            xid154=_clean(row[10]) if len(row) > 10 else "",
        )
    return out


def xid_info(code: int) -> XidInfo | None:
    return xid_catalog().get(code)


def xid_bucket(code: int) -> str | None:
    """The resolution bucket of an Xid's immediate action in NVIDIA's catalog (RESET_GPU, RESTART_BM, ...)."""
    info = xid_info(code)
    return None if info is None else info.immediate


def classify_xid(code: int, gate_buckets: list[str], gate_xids: list[int], app_xids: list[int],
                 reset_xids: list[int]) -> str:
    """One of: gate (correct work impossible until reset/reboot), reset (schedule a reset at a safe
    point), app (application-level: attribute to the job first), info (other known Xids), unknown."""
    if code in app_xids:
        return "app"
    if code in reset_xids:
        return "reset"
    if code in gate_xids:
        return "gate"
    info = xid_info(code)
    if info is None:
        return "unknown"
    if info.immediate in gate_buckets:
        return "gate"
    if info.immediate == "RESTART_APP":
        return "app"
    return "info"
