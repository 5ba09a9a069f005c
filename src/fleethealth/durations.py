"""Durations as people write them in policies and scenarios: seconds (``900``), one unit (``15s``,
``30m``, ``6h``, ``7d``, ``1w``) or compound, largest unit first, each unit once (``2h30m``, ``1d12h``,
``1m30s``). Pure; anything else is a ValueError that shows the accepted forms."""

from __future__ import annotations

import re
from typing import Any

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_ONE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_COMPOUND = re.compile(r"^(?:\d+(?:\.\d+)?w)?(?:\d+(?:\.\d+)?d)?(?:\d+(?:\.\d+)?h)?(?:\d+(?:\.\d+)?m)?"
                       r"(?:\d+(?:\.\d+)?s)?$")
HINT = "expected a duration like 900, '15s', '6h', '2h30m' or '7d'"


def parse_duration(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(HINT)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        m = _ONE.match(v)
        if m:
            return float(m.group(1)) * UNITS[m.group(2) or "s"]
        c = v.strip().replace(" ", "")
        if c and _COMPOUND.match(c):
            return sum(float(n) * UNITS[u] for n, u in _PART.findall(c))
    raise ValueError(f"{HINT}, got {v!r}")
