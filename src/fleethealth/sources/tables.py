"""Recorded signal tables (CSV, JSON Lines, Parquet; optionally gzip-compressed) <-> Snapshot.

One row per sample: `ts` (unix seconds), `metric`, `value`, then one column per label; an empty or null
cell means the label is absent. This is the same model as exposition text, so replay and backtest feed the
engine exactly what a live scrape would. Reading is columnar (pyarrow), so a million-row recording loads in
about a second; a row that cannot be a sample (missing ts, non-numeric or NaN value, a DCGM blank sentinel,
a negative counter) becomes an ``InputIssue`` with its row number, never a value and never a crash.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleethealth.signals.snapshot import InputIssue, Snapshot, SnapshotBuilder
from fleethealth.sources.exposition import blank_sentinel_mask, counter_like, is_dcgm_field

__all__ = [
    "TABLE_SUFFIXES", "InputError", "decompress_bounded", "default_max_bytes", "is_gzip", "read_table", "table_format",
    "write_table",
]

TABLE_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
REQUIRED = ("ts", "metric", "value")


class InputError(Exception):
    """An input that cannot be read at all; the message is one line naming the file and why."""


def table_format(path: str | Path) -> tuple[str, bool] | None:
    """(format, gzipped) for a table path by its extension, or None if it is not a table."""
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    if not suffixes or suffixes[-1] not in TABLE_SUFFIXES:
        return None
    return TABLE_SUFFIXES[suffixes[-1]], gz


# The most one input may read or inflate to: a scrape of 10,000 GPUs is about 60 MB of text; a 4 MB gzip
# bomb stops here instead of taking 4 GB of memory. Raise it for bigger files (--max-input-mb).
DEFAULT_MAX_INPUT_BYTES = 256 << 20


def default_max_bytes() -> int:
    """The most bytes one input may read or decompress to: FLEETHEALTH_MAX_INPUT_BYTES, else 256 MiB."""
    env = os.environ.get("FLEETHEALTH_MAX_INPUT_BYTES", "").strip()
    try:
        return max(1, int(float(env))) if env else DEFAULT_MAX_INPUT_BYTES
    except ValueError:
        return DEFAULT_MAX_INPUT_BYTES


def is_gzip(raw: bytes) -> bool:
    return raw[:2] == b"\x1f\x8b"


def decompress_bounded(raw: bytes, max_bytes: int, name: str | Path) -> bytes:
    """gzip data (every member) inflated to at most ``max_bytes``: a small file that would inflate past
    the limit (a gzip bomb: 4 MB to 4 GB) stops there with an ``InputError`` instead of filling memory."""
    out: list[bytes] = []
    size = 0
    data = raw
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            while data:
                chunk = d.decompress(data, max(1, max_bytes + 1 - size))
                size += len(chunk)
                out.append(chunk)
                if size > max_bytes:
                    raise InputError(f"{name}: cannot read: decompresses to more than the input limit of "
                                     f"{max_bytes:,} bytes (--max-input-mb, FLEETHEALTH_MAX_INPUT_BYTES)")
                data = d.unconsumed_tail
                if d.eof:
                    break
                if not data and not d.eof:
                    raise InputError(f"{name}: cannot read: not valid gzip (the data is cut short)")
        except zlib.error as e:
            raise InputError(f"{name}: cannot read: not valid gzip ({e})") from None
        data = d.unused_data.lstrip(b"\0")  # the next member (gzip files may be concatenated), or padding
        if data and not is_gzip(data):
            break  # trailing garbage after the last member, as gzip(1) ignores it
    return b"".join(out)


def _read_bytes(path: Path, gz: bool, max_bytes: int) -> bytes:
    try:
        if path.stat().st_size > max_bytes:
            raise InputError(f"{path}: cannot read: larger than the input limit of {max_bytes:,} bytes "
                             "(--max-input-mb, FLEETHEALTH_MAX_INPUT_BYTES)")
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    if gz:
        raw = decompress_bounded(raw, max_bytes, path)
    return raw


# --- reading -------------------------------------------------------------------------------------------


def read_table(path: str | Path, max_bytes: int | None = None) -> Snapshot:
    """Read a recorded table; ``Snapshot.at`` is the latest valid sample time (0 when there is none).
    ``max_bytes``: the most the file may hold or decompress to (default ``default_max_bytes()``)."""
    p = Path(path)
    fmt = table_format(p)
    if fmt is None:
        raise InputError(f"{p}: cannot read: not a table (use .csv, .jsonl, .ndjson or .parquet, optionally .gz)")
    kind, gz = fmt
    raw = _read_bytes(p, gz, default_max_bytes() if max_bytes is None else max_bytes)
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (spreadsheet exports)
        raw = raw[3:]
    source = str(p)
    issues: list[InputIssue] = []
    if kind == "csv":
        table, lines = _load_csv(raw, source, issues)
    elif kind == "jsonl":
        table, lines = _load_jsonl(raw, source, issues)
    else:
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(pa.BufferReader(raw))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise InputError(f"{p}: cannot read: not a Parquet file ({str(e).splitlines()[0]})") from None
        lines = np.arange(1, table.num_rows + 1, dtype=np.int64)  # row number (1-based)
    return _table_to_snapshot(table, lines, source, issues)


def _load_csv(raw: bytes, source: str, issues: list[InputIssue]) -> tuple[pa.Table, np.ndarray]:
    import pyarrow.csv as pcsv

    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        # pyarrow turns a malformed row into text for its handler and fails on bytes that are not UTF-8;
        # replaced, such rows become numbered issues like any other bad row.
        raw = raw.decode("utf-8", "replace").encode("utf-8")
    first = raw.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
    header = next(csv.reader([first]), [])
    _check_columns(header, source)
    bad_rows: list[int] = []

    def invalid(row: pcsv.InvalidRow) -> str:
        n = int(row.number) if row.number is not None else 0
        bad_rows.append(n)
        issues.append(InputIssue(source, n, f"expected {row.expected_columns} columns, got {row.actual_columns}",
                                 row.text[:200]))
        return "skip"

    try:
        table = pcsv.read_csv(
            io.BytesIO(raw),
            read_options=pcsv.ReadOptions(use_threads=False),
            parse_options=pcsv.ParseOptions(invalid_row_handler=invalid, newlines_in_values=False),
            # Every column as text: label values like "+Inf" or "1.0" must survive unchanged.
            convert_options=pcsv.ConvertOptions(
                column_types={c: pa.string() for c in header}, strings_can_be_null=True,
                quoted_strings_can_be_null=True, null_values=[""],  # "NaN" is a bad value, not a gap
            ),
        )
    except (pa.ArrowException, ValueError) as e:
        raise InputError(f"{source}: cannot read: {str(e).splitlines()[0]}") from None
    # Data row i is file line i + 2 (line 1 is the header), shifted past rows skipped as malformed.
    lines = np.arange(2, table.num_rows + 2, dtype=np.int64)
    for n in sorted(bad_rows):
        lines[lines >= n] += 1
    return table, lines


def _load_jsonl(raw: bytes, source: str, issues: list[InputIssue]) -> tuple[pa.Table, np.ndarray]:
    try:
        import pyarrow.json as pjson

        table = pjson.read_json(io.BytesIO(raw), read_options=pjson.ReadOptions(use_threads=False))
        if raw.count(b"\n") + (not raw.endswith(b"\n")) == table.num_rows:  # no blank lines: rows = lines
            return table, np.arange(1, table.num_rows + 1, dtype=np.int64)
    except (pa.ArrowException, ValueError):
        pass  # mixed types or a broken line: the careful reader below says which line
    cols: dict[str, list[object]] = {}
    lines: list[int] = []
    n = 0
    for n, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:  # json.JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
            why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
            issues.append(InputIssue(source, n, f"invalid JSON ({why})", line[:200].decode("utf-8", "replace")))
            continue
        if not isinstance(obj, dict):
            issues.append(InputIssue(source, n, "not a JSON object", line[:200].decode("utf-8", "replace")))
            continue
        k = len(lines)
        for key, val in obj.items():
            col = cols.get(key)
            if col is None:
                col = cols[key] = [None] * k
            col.append(val)
        lines.append(n)
        for col in cols.values():
            if len(col) < k + 1:
                col.append(None)
    if not lines and not cols:
        cols = {c: [] for c in REQUIRED}
    _check_columns(list(cols), source, empty_ok=not lines)
    arrays = {}
    for key, vals in cols.items():
        if key in ("ts", "value"):
            arrays[key] = pa.array([_jnum(v) for v in vals], pa.string())
        else:
            arrays[key] = pa.array([None if v is None else _jstr(v) for v in vals], pa.string())
    return pa.table(arrays), np.asarray(lines, np.int64)


def _jnum(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "x"  # not a number
    return repr(v) if isinstance(v, float) else str(v)


def _jstr(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return json.dumps(v)


def _check_columns(names: Sequence[str], source: str, empty_ok: bool = False) -> None:
    missing = [c for c in REQUIRED if c not in names]
    if missing and not empty_ok:
        raise InputError(f"{source}: cannot read: missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)} (need ts, metric, value, then one column per label)")


def _as_float(arr: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, missing, unparseable) for a column of numbers or numeric text."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    missing = arr.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        stripped = pc.utf8_trim_whitespace(arr)
        empty = pc.equal(stripped, "").fill_null(False).to_numpy(zero_copy_only=False)
        missing = missing | empty
        try:
            arr = pc.cast(pc.if_else(pc.equal(stripped, ""), None, stripped), pa.float64())
            bad = np.zeros(len(missing), bool)
        except (pa.ArrowException, ValueError):
            vals = np.full(len(missing), np.nan)
            bad = np.zeros(len(missing), bool)
            for i, s in enumerate(stripped.to_pylist()):
                if s is None or s == "":
                    continue
                try:
                    if "_" in s:
                        raise ValueError
                    vals[i] = float(s)
                except ValueError:
                    bad[i] = True
            return vals, missing, bad
    elif pa.types.is_boolean(arr.type) or not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return np.full(len(missing), np.nan), missing, ~missing
    vals = np.asarray(arr.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False), np.float64)
    return vals, missing, np.zeros(len(missing), bool)


def _codes(arr: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str | None]]:
    """Dictionary codes of a column as text, with -1 for null or empty (label absent)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        try:
            arr = pc.cast(arr, pa.string())
        except (pa.ArrowException, ValueError):  # nested JSON values and the like: their JSON text
            arr = pa.array([None if v is None else _jstr(v) for v in arr.to_pylist()], pa.string())
    enc = pc.dictionary_encode(arr)
    dictionary: list[str | None] = enc.dictionary.to_pylist()
    codes = np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
    for i, d in enumerate(dictionary):
        if d == "":
            codes[codes == i] = -1
    return codes, dictionary


def _table_to_snapshot(table: pa.Table, lines: np.ndarray, source: str, issues: list[InputIssue]) -> Snapshot:
    names = table.column_names
    _check_columns(names, source, empty_ok=table.num_rows == 0)
    b = SnapshotBuilder()
    n = table.num_rows
    if n == 0:
        b.issues.extend(issues)
        return b.build(0.0)
    ts, ts_missing, ts_bad = _as_float(table.column("ts"))
    value, v_missing, v_bad = _as_float(table.column("value"))
    mcodes, mdict = _codes(table.column("metric"))
    label_cols = [c for c in names if c not in REQUIRED]
    lcodes = [_codes(table.column(c)) for c in label_cols]

    metric_names = [m or "" for m in mdict]
    is_dcgm = np.array([is_dcgm_field(m) for m in metric_names] + [False])[mcodes]
    is_counter = np.array([counter_like(m, {}) for m in metric_names] + [False])[mcodes]
    # NUL is never part of a metric name, a label name or a label value (as in exposition text).
    nul = np.array(["\0" in m for m in metric_names] + [False])[mcodes]
    for col, (codes, dictionary) in zip(label_cols, lcodes, strict=True):
        bad_vals = np.array(["\0" in (d or "") or "\0" in col for d in dictionary] + [False])
        if bad_vals.any():
            nul |= bad_vals[codes]
    reasons: list[tuple[np.ndarray, str]] = [
        (mcodes < 0, "missing metric"),
        (nul, "NUL byte in a metric or label name or value"),
        (ts_missing, "missing ts"),
        (ts_bad, "invalid ts"),
        (~ts_missing & ~ts_bad & ~np.isfinite(ts), "invalid ts"),
        (v_missing, "missing value"),
        (v_bad, "non-numeric value"),
        (np.isnan(value) & ~v_missing & ~v_bad, "NaN value"),
        (np.isinf(value), "infinite value"),
        (blank_sentinel_mask(value, is_dcgm), "DCGM blank sentinel (field not supported or not found)"),
        (is_counter & (value < 0), "negative counter"),
    ]
    bad = np.zeros(n, bool)
    found: list[tuple[np.ndarray, str]] = []
    for mask, reason in reasons:
        new = mask & ~bad
        if new.any():
            found.append((np.flatnonzero(new), reason))
            bad |= new
    if found:
        # The rows' text in one take() (a slice and to_pylist per row was ~50 us: minutes for a recording
        # with hundreds of thousands of blank sentinels).
        idx = np.concatenate([i for i, _ in found])
        texts = _rows_text(table, idx)
        reason_of = [r for i, r in found for _ in range(i.shape[0])]
        issues.extend(
            InputIssue(source, ln, reason, text)
            for ln, reason, text in zip(lines[idx].tolist(), reason_of, texts, strict=True)
        )
    keep = ~bad
    if keep.any():
        mid_map = np.array([b.metric_id(m) for m in metric_names] or [0], np.int32)
        sids = _series_ids(b, label_cols, lcodes, keep)
        b.add_arrays(mid_map[mcodes[keep]], sids, value[keep], ts[keep])
    issues.sort(key=lambda i: i.line)
    b.issues.extend(issues)
    at = float(ts[keep].max()) if keep.any() else 0.0
    return b.build(at)


def _series_ids(
    b: SnapshotBuilder, label_cols: list[str], lcodes: list[tuple[np.ndarray, list[str | None]]], keep: np.ndarray
) -> np.ndarray:
    k = int(keep.sum())
    if not label_cols:
        return np.full(k, b.series_id(()), np.int32)
    # One int64 key per row (mixed radix over the label columns' dictionaries, re-densified whenever it
    # would overflow), so grouping is a 1-D np.unique instead of a row-wise sort.
    key = np.zeros(k, np.int64)
    span = 1
    for codes, dictionary in lcodes:
        radix = len(dictionary) + 1
        if span * radix >= 2**62:
            _, key = np.unique(key, return_inverse=True)
            key = np.asarray(key, np.int64).reshape(-1)
            span = int(key.max()) + 1 if k else 1
        key = key * radix + (codes[keep] + 1)
        span *= radix
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    sid_of = np.empty(len(first), np.int32)
    cols = [codes[keep][first].tolist() for codes, _ in lcodes]
    for u in range(len(first)):
        labels = tuple(sorted(
            (name, str(dictionary[col[u]]))
            for name, (_, dictionary), col in zip(label_cols, lcodes, cols, strict=True)
            if col[u] >= 0
        ))
        sid_of[u] = b.series_id(labels)
    return sid_of[np.asarray(inverse).reshape(-1)]


def _rows_text(table: pa.Table, idx: np.ndarray) -> list[str]:
    rows = table.take(pa.array(idx, pa.int64())).to_pylist()
    return [", ".join(f"{k}={v}" for k, v in row.items() if v not in (None, ""))[:200] for row in rows]


# --- writing -------------------------------------------------------------------------------------------


def _snapshot_table(snap: Snapshot) -> pa.Table:
    keys = sorted({k for ls in snap.labelsets for k, _ in ls} - set(REQUIRED))
    # Dictionary arrays (ids into the interned names and label sets) decoded by Arrow, not per row here.
    mids = pa.array(snap.metric_ids.astype(np.int32), pa.int32())
    sids = pa.array(snap.series_ids.astype(np.int32), pa.int32())
    cols: dict[str, pa.Array] = {
        "ts": pa.array(snap.ts, pa.float64()),
        "metric": pa.DictionaryArray.from_arrays(mids, pa.array(snap.metrics, pa.string())).dictionary_decode(),
        "value": pa.array(snap.values, pa.float64()),
    }
    dicts = [dict(ls) for ls in snap.labelsets]
    for key in keys:
        per_series = pa.array([d.get(key) for d in dicts], pa.string())
        cols[key] = pa.DictionaryArray.from_arrays(sids, per_series).dictionary_decode()
    return pa.table(cols)


def write_table(snapshot: Snapshot, path: str | Path) -> None:
    """Write a snapshot's samples as a table chosen by extension (.csv, .jsonl/.ndjson, .parquet, + .gz).
    Labels named ts, metric or value cannot be columns and are left out."""
    p = Path(path)
    fmt = table_format(p)
    if fmt is None:
        raise InputError(f"{p}: cannot write: not a table extension (.csv, .jsonl, .ndjson, .parquet, + .gz)")
    kind, gz = fmt
    table = _snapshot_table(snapshot)
    buf = io.BytesIO()
    if kind == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, buf, pcsv.WriteOptions(quoting_style="needed"))
    elif kind == "jsonl":
        # Label and metric JSON is rendered once per series / name; rows only format two numbers.
        def enc(v: str) -> str:
            return json.dumps(v, ensure_ascii=False)

        series = [
            "".join(f", {enc(k)}: {enc(v)}" for k, v in ls if k not in REQUIRED) for ls in snapshot.labelsets
        ]
        metrics = [enc(m) for m in snapshot.metrics]
        lines = [
            f'{{"ts": {t!r}, "metric": {metrics[m]}, "value": {v!r}{series[s]}}}\n'
            for t, m, v, s in zip(
                snapshot.ts.tolist(), snapshot.metric_ids.tolist(), snapshot.values.tolist(),
                snapshot.series_ids.tolist(), strict=True,
            )
        ]
        buf.write("".join(lines).encode())
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, buf)
    data = buf.getvalue()
    p.write_bytes(gzip.compress(data, 6) if gz else data)
