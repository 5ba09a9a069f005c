"""Values of the exposition parser: value texts into float64 exactly as float() reads them, and the
rules that turn a value into missing data (NaN, Inf, DCGM blank sentinels, negative counters).

Theory of operation. A block's value texts are joined into one bytes object and read by C-level numpy
readers: plain digits through numpy's integer reader (19+ digit values read again by float()), plain
decimals as an integer over a power of ten (``_decimal_values``: Clinger's fast path, the same double as
float()), else int() or float() per value. Anything neither accepts (``1_000``, a newline) is left to the
careful path. ``blank_sentinel_mask`` / ``value_problem`` are the vectorised and scalar forms of one rule
set, so every path reports the same values as missing data, with the same reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

# DCGM's "no value" markers (dcgm_structs.h, DCGM_BLANK_VALUES): a base value plus 0..15 for the kinds
# of blank (not found, not supported, not permissioned, ...). dcgm-exporter prints them as numbers, e.g.
# DCGM_FI_DEV_MEMORY_TEMP 9223372036854775794 (INT64 blank + 2 = not supported).
DCGM_INT32_BLANK = 0x7FFFFFF0  # 2147483632
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0  # 9223372036854775792
DCGM_FP64_BLANK = 140737488355328.0  # 2**47
# The exact blank values as the text reads them (float64): INT32 and FP64 blank + 0..15; every INT64 blank
# + 0..15 reads as 2**63. Only DCGM fields (DCGM_FI_*) carry them: any other metric may legitimately hold
# such a number (a Go exporter's process_virtual_memory_max_bytes is 2**64 - 1, a byte counter passes
# 2**47), so on them it is a plain sample.
_DCGM_BLANKS = np.array(sorted(
    {float(DCGM_INT32_BLANK + k) for k in range(16)} | {DCGM_FP64_BLANK + k for k in range(16)}
    | {float(DCGM_INT64_BLANK + k) for k in range(16)}
))
_DCGM_BLANK_SET = frozenset(_DCGM_BLANKS.tolist())
_BLANK_MIN = float(DCGM_INT32_BLANK)
DCGM_FIELD_PREFIX = "DCGM_FI_"

_COUNTER_SUFFIXES = ("_total", "_count", "_bucket")


def counter_like(name: str, types: Mapping[str, str]) -> bool:
    """Whether a sample name must never go negative: a counter family's sample (not `_created`), a
    histogram/summary `_count`/`_bucket`, or any name ending `_total`/`_count`/`_bucket`."""
    # An OpenMetrics counter family `foo` has samples `foo_total` (covered by the suffix) and
    # `foo_created` (a timestamp, not a counter); 0.0.4 declares the sample name itself as counter.
    return name.endswith(_COUNTER_SUFFIXES) or types.get(name) == "counter"


def blank_sentinel_mask(values: np.ndarray, dcgm: bool | np.ndarray) -> np.ndarray:
    """True where a value is a DCGM blank sentinel: exactly one of DCGM's blank values (dcgm_structs.h:
    INT32, INT64 and FP64 blank + 0..15 for not found, not supported, not permissioned, ...) on a DCGM
    field (``dcgm``: the metric is DCGM_FI_*, per value or for all). Values below the smallest blank (all
    of them, nearly always) cost one vectorised compare."""
    if dcgm is False:
        return np.zeros(values.shape[0], bool)
    m = values >= _BLANK_MIN
    if not m.any():
        return m
    idx = np.flatnonzero(m)
    m[idx] = np.isin(values[idx], _DCGM_BLANKS)
    return m & dcgm if dcgm is not True else m


def is_dcgm_field(name: str) -> bool:
    """Whether a metric is a DCGM field (the only metrics DCGM blank sentinels are recognised on)."""
    return name.startswith(DCGM_FIELD_PREFIX)


def value_problem(name: str, value: float, counter: bool) -> str | None:
    """Why one value must not become a signal, or None. Scalar twin of the vectorised checks (same rules
    as ``blank_sentinel_mask``)."""
    if value != value:
        return "NaN value"
    if value == _INF or value == -_INF:
        return "infinite value"
    if value >= _BLANK_MIN and value in _DCGM_BLANK_SET and name.startswith(DCGM_FIELD_PREFIX):
        return "DCGM blank sentinel (field not supported or not found)"
    if counter and value < 0:
        return "negative counter"
    return None


_INF = float("inf")


def is_openmetrics(data: bytes) -> bool:
    """OpenMetrics text ends with a `# EOF` line."""
    return data[-64:].rstrip().endswith(b"# EOF")


def _bad_values(is_counter: Callable[[str], bool], bname: bytes, values: np.ndarray) -> tuple[str, bool, np.ndarray]:
    """A block's metric name, whether it is a counter, and which of its values become missing data:
    NaN/Inf, DCGM blank sentinels (on DCGM fields), negative counters."""
    name = bname.decode("ascii")
    counter = bool(is_counter(name))
    bad = ~np.isfinite(values) | blank_sentinel_mask(values, name.startswith(DCGM_FIELD_PREFIX))
    if counter:
        bad |= values < 0
    return name, counter, bad


def _fast_values(vals: list[bytes], n: int) -> np.ndarray | None:
    """``_fast_joined`` for a list of value texts."""
    if b"" in vals:
        return None
    return _fast_joined(b" ".join(vals), n, lambda: vals, vals.__getitem__)


def _fast_joined(
    joined: bytes, n: int, vals: Callable[[], list[bytes]], val: Callable[[int], bytes]
) -> np.ndarray | None:
    """Values of one block (their texts joined by b" "; ``vals`` gives them as a list, ``val`` one of
    them, without making the list) as float64,
    exactly as float(text) reads them, or None if any is not a plain number. Most exporter values are
    integers: a block of plain digits goes through numpy's C integer reader at once (it parses about 10x
    faster than float(); its float reader is no faster than float()), with proof that it read one number
    per value: no value is empty or holds a space (so n - 1 spaces in all, none doubled or at an end) and
    numpy read n numbers. Plain decimals take ``_decimal_values``. Otherwise int() (twice as fast as
    float()), then float().
    float(int(s)) == float(s) and int64 -> float64 rounds to nearest, so all three agree."""
    if b"_" in joined or b"\n" in joined:
        return None  # int()/float() take 1_000 and "1\n", Prometheus does not: let the careful path judge
    if (
        not joined.translate(None, b"0123456789 ")
        and joined.count(b" ") == n - 1
        and joined
        and joined[:1] != b" "
        and joined[-1:] != b" "
        and b"  " not in joined
    ):
        ints = np.fromstring(joined, dtype=np.int64, sep=" ")
        if ints.shape[0] == n:
            out = ints.astype(np.float64)
            # Below 10**18 the integer is exact; 19+ digits may have saturated at 2**63 - 1 (strtoll):
            # those few (DCGM's INT64 blank is one) are read again by float().
            big = np.flatnonzero((ints >= 10**18) | (ints < 0))  # (digits only: negative = wrapped)
            for i in big.tolist():
                out[i] = float(val(i))
            return out
    dec = _decimal_values(joined, n)
    if dec is not None:
        return dec
    texts = vals()
    if b"" in texts:
        return None
    try:
        return np.fromiter(map(int, texts), np.float64, n)
    except ValueError:
        pass
    try:
        return np.fromiter(map(float, texts), np.float64, n)
    except ValueError:
        return None


_POW10 = 10.0 ** np.arange(23)  # exact in float64 up to 1e22


def _decimal_values(joined: bytes, n: int) -> np.ndarray | None:
    """Plain decimals (`0.482113`, dcgm-exporter's ratios) without float() per value: every value is
    digits with exactly one '.', so value = m / 10**k with m the digits read as one integer and k the
    digits after the point. With m < 2**53 and k <= 22 both operands are exact and IEEE division rounds
    once, to nearest: the same double float(text) gives (Clinger's fast path). None when it does not apply."""
    if joined.translate(None, b"0123456789. ") or joined.count(b".") != n or joined.count(b" ") != n - 1:
        return None
    buf = np.frombuffer(joined, np.uint8)
    dots = np.flatnonzero(buf == 46)
    ends = np.append(np.flatnonzero(buf == 32), len(joined))
    starts = np.concatenate(([0], ends[:-1] + 1))
    # One dot inside each value (value i spans starts[i]..ends[i]), and at least one digit.
    if not (((dots >= starts) & (dots < ends)).all() and (ends - starts >= 2).all()):
        return None
    k = ends - dots - 1
    if k.max() > 22 or (ends - starts).max() > 16:  # <= 15 digits: m < 10**15 < 2**53
        return None
    digits = joined.replace(b".", b"")
    if b"  " in digits or digits[:1] == b" " or digits[-1:] == b" ":
        return None
    m = np.fromstring(digits, dtype=np.int64, sep=" ")
    if m.shape[0] != n:
        return None
    return m.astype(np.float64) / _POW10[k]


def _parse_number(tok: bytes) -> float | None:
    if b"_" in tok:
        return None  # float() takes 1_000, Prometheus and prometheus-client do not
    try:
        return float(tok)
    except ValueError:
        return None
