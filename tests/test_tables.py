"""Recorded signal tables: exact round trips in every format (plain and gzip), numbered issues for bad
rows, clear errors for files that cannot be read."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fleethealth.bench.parse import dcgm_text, our_rows
from fleethealth.signals.snapshot import SnapshotBuilder
from fleethealth.sources.exposition import counter_like, parse_exposition, value_problem
from fleethealth.sources.tables import InputError, read_table, table_format, write_table

NOW = 1_700_000_000.0
FORMATS = ["csv", "jsonl", "ndjson", "parquet", "csv.gz", "jsonl.gz", "parquet.gz"]


def _sample_snapshot():
    text = dcgm_text(16, seed=5, comma_space=True) + (
        '# TYPE vllm:e2e_request_latency_seconds histogram\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m \\"q\\" é"} 7\n'
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m \\"q\\" é"} 3\n'
        "vllm:e2e_request_latency_seconds_sum 2.25 1700000001500\n"
        'node_info{pool="a,b",rack=""} 1\n'
    )
    return parse_exposition(text, default_ts=NOW)


@pytest.mark.parametrize("ext", FORMATS)
def test_round_trip_every_format(tmp_path: Path, ext: str) -> None:
    snap = _sample_snapshot()
    path = tmp_path / f"rec.{ext}"
    write_table(snap, path)
    back = read_table(path)
    assert sorted(our_rows(back)) == sorted(our_rows(snap))
    assert back.issues == []
    assert back.at == max(snap.ts.tolist())
    if ext.endswith(".gz"):
        assert gzip.decompress(path.read_bytes())  # really compressed


@settings(max_examples=25, deadline=None)
@given(st.lists(
    st.tuples(
        st.sampled_from(["a", "b_total", "vllm:x", "DCGM_FI_DEV_GPU_TEMP"]),
        st.dictionaries(st.sampled_from(["gpu", "le", "Hostname", "model"]),
                        st.text(alphabet=st.sampled_from(list('0a ,"\\\n+Ié{}')), min_size=1, max_size=5), max_size=3),
        st.floats(min_value=0, max_value=1e12, allow_nan=False),
        st.floats(min_value=0, max_value=2e9, allow_nan=False),
    ),
    min_size=1, max_size=20,
))
@example(samples=[("a", {}, 2147483632.0, 0.0)])  # DCGM's int32 blank on a foreign gauge: a value
@example(samples=[("DCGM_FI_DEV_GPU_TEMP", {}, 2147483632.0, 0.0)])  # on a DCGM field: an issue
def test_property_round_trip(tmp_path_factory: pytest.TempPathFactory, samples: list) -> None:
    b = SnapshotBuilder()
    for metric, labels, value, ts in samples:
        b.add(metric, labels, value, ts)
    snap = b.build(NOW)
    d = tmp_path_factory.mktemp("rt")
    # A DCGM field at one of DCGM's blank values is missing data on every input: it comes back as an
    # issue, never as a sample (the same value on another metric is a sample).
    expected = [r for r in our_rows(snap) if value_problem(r[0], r[2], counter_like(r[0], {})) is None]
    for ext in ("csv", "jsonl", "parquet"):
        write_table(snap, d / f"t.{ext}")
        back = read_table(d / f"t.{ext}")
        assert sorted(our_rows(back)) == sorted(expected), ext
        assert len(back.issues) == len(snap) - len(expected), ext


def test_bad_csv_rows_become_numbered_issues(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(
        "ts,metric,value,gpu,le\n"                      # 1
        "1,a,2,0,+Inf\n"                                # 2 good; le stays "+Inf"
        "2,b\n"                                         # 3 too few columns
        "3,c,x,1,\n"                                    # 4 non-numeric
        ",d,4,,\n"                                      # 5 missing ts
        "5,DCGM_FI_DEV_X,2147483634,1,\n"               # 6 int32 blank
        "6,e_total,-1,,\n"                              # 7 negative counter
        "7,f,NaN,,\n"                                   # 8 NaN
        "8,,1,,\n"                                      # 9 missing metric
        "9,g,1.0,,1.0\n"                                # 10 good; le stays "1.0"
        "10,h,inf,,\n"                                  # 11
        "11,DCGM_FI_DEV_Y,9223372036854775794,,\n"      # 12 int64 blank
        "12,i,1_000,,\n"                                # 13 not a Prometheus number
    )
    snap = read_table(p)
    assert sorted(our_rows(snap)) == [
        ("a", (("gpu", "0"), ("le", "+Inf")), 2.0, 1.0),
        ("g", (("le", "1.0"),), 1.0, 9.0),
    ]
    reasons = {i.line: i.reason for i in snap.issues}
    assert sorted(reasons) == [3, 4, 5, 6, 7, 8, 9, 11, 12, 13]
    assert "columns" in reasons[3]
    assert reasons[4] == "non-numeric value"
    assert reasons[5] == "missing ts"
    assert "sentinel" in reasons[6] and "sentinel" in reasons[12]
    assert reasons[7] == "negative counter"
    assert reasons[8] == "NaN value"
    assert reasons[9] == "missing metric"
    assert reasons[11] == "infinite value"
    assert all(i.source == str(p) for i in snap.issues)


def test_bad_jsonl_lines_become_numbered_issues(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(
        '{"ts": 1, "metric": "a", "value": 2, "gpu": 0}\n'   # 1 good, numeric label -> "0"
        "\n"                                                 # 2 blank
        "{bad\n"                                             # 3
        '{"ts": 2, "metric": "a", "value": "x"}\n'           # 4
        '{"ts": 3, "metric": "a", "value": NaN}\n'           # 5
        "[1]\n"                                              # 6
        '{"metric": "a", "value": 1}\n'                      # 7
        '{"ts": "4", "metric": "b", "value": "5.5"}\n'       # 8 good: numbers as text are fine
    )
    snap = read_table(p)
    assert sorted(our_rows(snap)) == [("a", (("gpu", "0"),), 2.0, 1.0), ("b", (), 5.5, 4.0)]
    assert {i.line: i.reason for i in snap.issues} == {
        3: snap.issues[0].reason, 4: "non-numeric value", 5: "NaN value", 6: "not a JSON object", 7: "missing ts",
    }
    assert "invalid JSON" in snap.issues[0].reason


def test_unreadable_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.csv: cannot read: No such file or directory$"):
        read_table(tmp_path / "nope.csv")
    (tmp_path / "x.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="cannot read") as e:
        read_table(tmp_path / "x.parquet")
    assert "\n" not in str(e.value)
    (tmp_path / "cols.csv").write_text("time,name,val\n1,a,2\n")
    with pytest.raises(InputError, match="missing columns ts, metric, value"):
        read_table(tmp_path / "cols.csv")
    (tmp_path / "bad.csv.gz").write_bytes(b"plain text, not gzip")
    with pytest.raises(InputError, match="gzip"):
        read_table(tmp_path / "bad.csv.gz")


def test_empty_tables_and_format_detection(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text("ts,metric,value\n")
    assert len(read_table(tmp_path / "e.csv")) == 0
    (tmp_path / "e.jsonl").write_text("")
    assert len(read_table(tmp_path / "e.jsonl")) == 0
    assert table_format("a/b.NDJSON.GZ") == ("jsonl", True)
    assert table_format("x.prom") is None
    assert table_format("x.gz") is None


def test_large_recording_is_columnar_fast(tmp_path: Path) -> None:
    snap = parse_exposition(dcgm_text(2000), default_ts=NOW)
    write_table(snap, tmp_path / "big.parquet")
    back = read_table(tmp_path / "big.parquet")
    assert len(back) == len(snap) == 2000 * 25 - 40
    assert len(back.labelsets) == 2000
    assert all(math.isfinite(v) for v in back.values[:100].tolist())


def test_odd_but_readable_tables(tmp_path: Path) -> None:
    bom = tmp_path / "excel.csv"
    bom.write_bytes(b"\xef\xbb\xbfts,metric,value,gpu\r\n1,a,2,0\r\n")
    assert sorted(our_rows(read_table(bom))) == [("a", (("gpu", "0"),), 2.0, 1.0)]
    nested = tmp_path / "nested.jsonl"
    nested.write_text('{"ts": 1, "metric": "a", "value": 2, "meta": {"x": 1}, "on": true}\n')
    assert sorted(our_rows(read_table(nested))) == [("a", (("meta", '{"x": 1}'), ("on", "true")), 2.0, 1.0)]


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["csv", "jsonl", "parquet"]))
def test_property_garbage_tables_never_crash(tmp_path_factory: pytest.TempPathFactory, junk: bytes, ext: str) -> None:
    p = tmp_path_factory.mktemp("junk") / f"j.{ext}"
    p.write_bytes((b"ts,metric,value,gpu\n" if ext == "csv" else b"") + junk)
    try:
        snap = read_table(p)
    except InputError as e:
        assert "\n" not in str(e) and "cannot read" in str(e)
        return
    assert all(math.isfinite(v) for v in snap.values.tolist())


def test_nul_bytes_in_names_and_label_values_are_issues(tmp_path: Path) -> None:
    p = tmp_path / "n.jsonl"
    p.write_text(
        '{"ts": 1, "metric": "ok", "value": 1, "gpu": "0"}\n'
        '{"ts": 1, "metric": "ok", "value": 2, "gpu": "1\\u0000"}\n'
        '{"ts": 1, "metric": "b\\u0000d", "value": 3, "gpu": "2"}\n'
    )
    snap = read_table(p)
    assert [(m, lab, v) for m, lab, v, _ in snap.rows()] == [("ok", {"gpu": "0"}, 1.0)]
    assert [(i.line, i.reason) for i in snap.issues] == [(n, "NUL byte in a metric or label name or value") for n in (2, 3)]
