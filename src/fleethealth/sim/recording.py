"""Recordings: the recorded signal table (columns ts, metric, value, then one column per label, null where a
series lacks that label), streamed to Parquet (or CSV) a batch of steps at a time so a long scenario never
sits in memory. ``read_recording`` turns a table back into a Snapshot.

The layout is the one ``fleethealth.sources.tables`` reads and writes (``read_table`` reads these files);
this writer streams Parquet and CSV because a simulated week is hundreds of millions of rows. Other
extensions (.jsonl, .gz) go through ``tables.write_table`` in memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fleethealth.signals.snapshot import LabelSet, Snapshot, SnapshotBuilder
from fleethealth.sim.simulation import Simulation

FIXED = ("ts", "metric", "value")


@dataclass(slots=True)
class RecordingStats:
    path: str
    steps: int
    rows: int
    seconds: float


class _LabelCodes:
    """Per label key: the code of each series' value in a dictionary (-1: the series lacks the key)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.n = 0
        self.codes: dict[str, np.ndarray] = {k: np.zeros(0, np.int32) for k in keys}
        self.dicts: dict[str, list[str]] = {k: [] for k in keys}
        self._ix: dict[str, dict[str, int]] = {k: {} for k in keys}

    def update(self, labelsets: list[LabelSet]) -> None:
        if len(labelsets) == self.n:
            return
        new = labelsets[self.n:]
        for k in self.keys:
            add = np.full(len(new), -1, np.int32)
            ix = self._ix[k]
            for i, ls in enumerate(new):
                for kk, v in ls:
                    if kk == k:
                        c = ix.get(v)
                        if c is None:
                            c = ix[v] = len(self.dicts[k])
                            self.dicts[k].append(v)
                        add[i] = c
                        break
            self.codes[k] = np.concatenate([self.codes[k], add])
        self.n = len(labelsets)


def _label_keys(sim: Simulation) -> list[str]:
    keys = {k for ls in sim.intern.labelsets for k, _ in ls}
    keys.add("xid")
    return sorted(keys - set(FIXED))


def snapshots_to_table(snaps: list[Snapshot], keys: list[str], codes: _LabelCodes, metrics: list[str]) -> pa.Table:
    m = np.concatenate([s.metric_ids for s in snaps])
    sid = np.concatenate([s.series_ids for s in snaps])
    cols: dict[str, pa.Array] = {
        "ts": pa.array(np.concatenate([s.ts for s in snaps])),
        "metric": pa.DictionaryArray.from_arrays(pa.array(m, pa.int32()), pa.array(metrics, pa.string())),
        "value": pa.array(np.concatenate([s.values for s in snaps])),
    }
    for k in keys:
        c = codes.codes[k][sid]
        cols[k] = pa.DictionaryArray.from_arrays(
            pa.array(c, pa.int32(), mask=c < 0), pa.array(codes.dicts[k], pa.string())
        )
    return pa.table(cols)


def write_snapshots(snaps: Iterable[Snapshot], path: str | Path, keys: list[str], batch_steps: int = 40) -> int:
    """Stream snapshots (sharing one interning, as a Simulation's do) into one table file; returns rows."""
    p = Path(path)
    csv = p.suffix.lower() == ".csv"
    codes = _LabelCodes(keys)
    schema = pa.schema(
        [("ts", pa.float64()), ("metric", pa.string() if csv else pa.dictionary(pa.int32(), pa.string())),
         ("value", pa.float64())]
        + [(k, pa.string() if csv else pa.dictionary(pa.int32(), pa.string())) for k in keys]
    )
    rows = 0
    pw: pq.ParquetWriter | None = None
    cw: pacsv.CSVWriter | None = None
    batch: list[Snapshot] = []

    def flush() -> None:
        nonlocal rows, pw, cw
        if not batch:
            return
        last = batch[-1]
        codes.update(last.labelsets)
        table = snapshots_to_table(batch, keys, codes, last.metrics)
        if csv:
            table = table.cast(schema)
            if cw is None:
                cw = pacsv.CSVWriter(str(p), schema)
            cw.write_table(table)
        else:
            table = table.cast(schema)
            if pw is None:
                pw = pq.ParquetWriter(str(p), schema, compression="snappy")
            pw.write_table(table)
        rows += table.num_rows
        batch.clear()

    try:
        for s in snaps:
            batch.append(s)
            if len(batch) >= batch_steps:
                flush()
        flush()
    finally:
        if pw is not None:
            pw.close()
        if cw is not None:
            cw.close()
    if pw is None and cw is None:
        # nothing recorded: still leave a valid, empty table behind
        empty = pa.table({f.name: pa.array([], f.type) for f in schema})
        if csv:
            pacsv.write_csv(empty, str(p))
        else:
            pq.write_table(empty, str(p))
    return rows


def write_recording(sim: Simulation, path: str | Path, steps: int | None = None, every: int = 1) -> RecordingStats:
    """Run ``sim`` (the rest of its scenario, or ``steps`` steps) and write every ``every``-th snapshot."""
    import time

    t0 = time.perf_counter()
    n = 0

    def gen() -> Iterable[Snapshot]:
        nonlocal n
        for k, (_, snap) in enumerate(sim.steps(steps)):
            n += 1
            if k % every == 0:
                yield snap

    if Path(path).suffix.lower() in (".parquet", ".csv"):
        rows = write_snapshots(gen(), path, _label_keys(sim))
    else:
        # .jsonl and gzipped tables: the shared table writer, all samples in memory (short runs only)
        from fleethealth.signals.snapshot import merge_snapshots
        from fleethealth.sources.tables import write_table

        merged = merge_snapshots(list(gen()))
        write_table(merged, path)
        rows = len(merged)
    return RecordingStats(str(path), n, rows, time.perf_counter() - t0)


def read_recording(path: str | Path) -> Snapshot:
    """Read a recorded signal table back into one Snapshot (all its samples, labels re-interned)."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        # labels are text even when they look like numbers (le="+Inf", gpu="3"): never let CSV infer types
        import csv

        with p.open(newline="") as fh:
            header = next(csv.reader(fh), [])
        types = {c: (pa.float64() if c in ("ts", "value") else pa.string()) for c in header}
        table = pacsv.read_csv(str(p), convert_options=pacsv.ConvertOptions(column_types=types))
    else:
        table = pq.read_table(str(p))
    keys = [c for c in table.column_names if c not in FIXED]
    b = SnapshotBuilder()
    if table.num_rows == 0:
        return b.build(0.0)
    # Vectorised: every column becomes dictionary codes (-1 for null), unique rows of codes are series.
    def codes(name: str) -> tuple[np.ndarray, list[str]]:
        col = table.column(name).combine_chunks()
        if not pa.types.is_dictionary(col.type):
            col = col.cast(pa.string()).dictionary_encode()
        idx = col.indices.to_numpy(zero_copy_only=False)
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        return np.where(valid, idx, -1).astype(np.int64), [str(v) for v in col.dictionary.to_pylist()]

    m_codes, m_dict = codes("metric")
    mmap = np.array([b.metric_id(m) for m in m_dict] or [0], np.int32)
    mids = mmap[m_codes]
    label_codes = [codes(k) for k in keys]
    if keys:
        # mixed-radix key, re-densified after each column so it never overflows
        key = np.zeros(table.num_rows, np.int64)
        span = 1
        for c, d in label_codes:
            if span * (len(d) + 1) >= 2**62:
                _, key = np.unique(key, return_inverse=True)
                key = key.reshape(-1).astype(np.int64)
                span = int(key.max()) + 1
            key = key * (len(d) + 1) + (c + 1)
            span *= len(d) + 1
        _, key = np.unique(key, return_inverse=True)
        key = key.reshape(-1).astype(np.int64)
        first = np.unique(key, return_index=True)[1]
        uniq = np.stack([c[first] for c, _ in label_codes], axis=1)
        inverse = key
        smap = np.empty(len(uniq), np.int32)
        for i, row in enumerate(uniq.tolist()):
            ls = tuple(sorted(
                (k, label_codes[j][1][c]) for j, (k, c) in enumerate(zip(keys, row, strict=True))
                if c >= 0 and label_codes[j][1][c] != ""
            ))
            smap[i] = b.series_id(ls)
        sids = smap[inverse.reshape(-1)]
    else:
        sids = np.full(table.num_rows, b.series_id(()), np.int32)
    ts = table.column("ts").to_numpy()
    b.add_arrays(mids, sids, table.column("value").to_numpy(), ts)
    return b.build(float(ts.max()))
