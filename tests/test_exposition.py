"""The exposition parser: same samples as prometheus-client's parser on valid text, every bad line reported
with its number and never turned into a value, DCGM sentinels, OpenMetrics, and both parse paths agreeing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest

from fleethealth.bench.parse import compare_rows, dcgm_text, our_rows, prom_client_rows
from fleethealth.signals.snapshot import SnapshotBuilder
from fleethealth.sources.exposition import (
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    parse_exposition,
    value_problem,
)

DATA = Path(__file__).parent / "data"
NOW = 1_700_000_000.0


def rows(text: str | bytes, **kw: object) -> list[tuple[str, dict[str, str], float, float]]:
    return list(parse_exposition(text, default_ts=NOW, **kw).rows())  # type: ignore[arg-type]


def assert_same_as_prom_client(text: str) -> None:
    snap = parse_exposition(text, default_ts=NOW)
    diffs = compare_rows(our_rows(snap), prom_client_rows(text), NOW)
    assert diffs == []


def test_dcgm_exporter_readme_sample() -> None:
    text = (DATA / "dcgm-exporter-readme.prom").read_text()
    snap = parse_exposition(text, default_ts=NOW, source="readme.prom")
    got = {(m, lab["gpu"], lab["UUID"]): (v, t) for m, lab, v, t in snap.rows()}
    uuid = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
    assert got == {("DCGM_FI_DEV_SM_CLOCK", "0", uuid): (139.0, NOW), ("DCGM_FI_DEV_MEM_CLOCK", "0", uuid): (405.0, NOW)}
    # The blank sentinel 9223372036854775794 becomes an issue on line 9, not a temperature.
    assert [(i.source, i.line) for i in snap.issues] == [("readme.prom", 9)]
    assert "sentinel" in snap.issues[0].reason
    assert "DCGM_FI_DEV_MEMORY_TEMP" in snap.issues[0].text


@pytest.mark.parametrize("comma_space", [False, True])
def test_generated_dcgm_text_equals_prometheus_client(comma_space: bool) -> None:
    text = dcgm_text(64, seed=3, comma_space=comma_space)
    snap = parse_exposition(text, default_ts=NOW)
    assert len(snap) == 64 * 25 - 2  # two GPUs report the memory-temperature sentinel
    assert len(snap.labelsets) == 64
    assert_same_as_prom_client(text)
    lab = snap.labels(0)
    assert set(lab) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
    assert lab["modelName"] == "NVIDIA H100 80GB HBM3"


def _vllm_registry() -> CollectorRegistry:
    r = CollectorRegistry()
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", ["model_name", "engine"], registry=r,
                     buckets=(0.001, 0.01, 0.1, 1.0, 10.0))
    itl = Histogram("vllm:inter_token_latency_seconds", "ITL", ["model_name", "engine"], registry=r)
    ok = Counter("vllm:request_success", "ok", ["model_name", "engine", "finished_reason"], registry=r)
    running = Gauge("vllm:num_requests_running", "running", ["model_name", "engine"], registry=r)
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", ["model_name", "engine"], registry=r)
    lat = Summary("http_request_duration_seconds", "lat", ["handler"], registry=r)
    for e in ("0", "1"):
        for x in (0.0005, 0.02, 0.3, 4.0, 40.0):
            ttft.labels("meta-llama/Llama-3.1-8B", e).observe(x)
            itl.labels("meta-llama/Llama-3.1-8B", e).observe(x / 100)
        ok.labels("meta-llama/Llama-3.1-8B", e, "stop").inc(17)
        ok.labels("meta-llama/Llama-3.1-8B", e, "length").inc(2)
        running.labels("meta-llama/Llama-3.1-8B", e).set(5)
        kv.labels("meta-llama/Llama-3.1-8B", e).set(0.42)
    lat.labels("/v1/completions").observe(0.2)
    return r


def test_vllm_histograms_equal_prometheus_client_and_keep_colons() -> None:
    text = generate_latest(_vllm_registry()).decode()
    assert_same_as_prom_client(text)
    snap = parse_exposition(text, default_ts=NOW)
    names = set(snap.metrics)
    assert "vllm:time_to_first_token_seconds_bucket" in names
    assert "vllm:time_to_first_token_seconds_sum" in names
    assert "vllm:time_to_first_token_seconds_count" in names
    assert "vllm:request_success_total" in names
    inf_buckets = [
        (lab, v) for m, lab, v, _ in snap.rows()
        if m == "vllm:time_to_first_token_seconds_bucket" and lab["le"] == "+Inf"
    ]
    assert len(inf_buckets) == 2 and all(v == 5.0 for _, v in inf_buckets)
    assert not snap.issues


def test_openmetrics_timestamps_exemplars_total_created() -> None:
    text = (
        "# TYPE vllm:request_success counter\n"
        "# HELP vllm:request_success Finished requests.\n"
        'vllm:request_success_total{finished_reason="stop"} 17 1700000100.5\n'
        'vllm:request_success_created{finished_reason="stop"} 1699990000.0 1700000100.5\n'
        "# TYPE ttft histogram\n"
        'ttft_bucket{le="0.1"} 3 # {trace_id="abc"} 0.05 1700000099.0\n'
        'ttft_bucket{le="+Inf"} 4\n'
        "ttft_count 4\n"
        "ttft_sum 1.5\n"
        "# EOF\n"
    )
    got = {(m, tuple(sorted(lab.items()))): (v, t) for m, lab, v, t in rows(text)}
    assert got[("vllm:request_success_total", (("finished_reason", "stop"),))] == (17.0, 1700000100.5)
    assert got[("vllm:request_success_created", (("finished_reason", "stop"),))] == (1699990000.0, 1700000100.5)
    assert got[("ttft_bucket", (("le", "0.1"),))] == (3.0, NOW)  # the exemplar is not a sample
    assert got[("ttft_bucket", (("le", "+Inf"),))] == (4.0, NOW)
    assert len(got) == 6

    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

    theirs = sorted(
        (s.name, tuple(sorted(s.labels.items())), float(s.value), NOW if s.timestamp is None else float(s.timestamp))
        for fam in om_parse(text) for s in fam.samples
    )
    ours = sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in rows(text))
    assert ours == theirs


def test_text_004_timestamps_are_milliseconds() -> None:
    text = 'up{job="a"} 1 1700000000123\nup{job="b"} 0\n'
    got = {lab["job"]: (v, t) for _, lab, v, t in rows(text)}
    assert got["a"] == (1.0, pytest.approx(1700000000.123))
    assert got["b"] == (0.0, NOW)
    assert_same_as_prom_client(text)


def test_label_syntax_escapes_spaces_trailing_commas() -> None:
    text = (
        'm{a="x\\"y", b="back\\\\slash",c="line\\nbreak",} 1\n'
        'm{ a = "1" ,b="2" } 2\n'
        "m{} 3\n"
        "n 4\n"  # (m 4 would be m{} again at the same instant: a duplicate sample)
        'm{a="}{ \\"} "} 5\n'
        'm{a="café ☕"} 6\n'
    )
    got = sorted((tuple(sorted(lab.items())), v) for _, lab, v, _ in rows(text))
    assert got == sorted([
        ((), 3.0), ((), 4.0),
        ((("a", "1"), ("b", "2")), 2.0),
        ((("a", 'x"y'), ("b", "back\\slash"), ("c", "line\nbreak")), 1.0),
        ((("a", '}{ "} '),), 5.0),
        ((("a", "café ☕"),), 6.0),
    ])
    assert_same_as_prom_client(text)


def test_bad_lines_become_numbered_issues_and_never_values() -> None:
    text = "\n".join([
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",          # 1
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",                            # 2
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 40',                             # 3
        'DCGM_FI_DEV_GPU_TEMP{gpu="1"} NaN',                            # 4
        'DCGM_FI_DEV_GPU_TEMP{gpu="2"} +Inf',                           # 5
        'DCGM_FI_DEV_GPU_TEMP{gpu="3"} -Inf',                           # 6
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="4"}} {DCGM_INT32_BLANK + 2}',      # 7
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="5"}} {DCGM_FP64_BLANK!r}',         # 8
        'DCGM_FI_DEV_GPU_TEMP{gpu="6"} 9223372036854775794',            # 9
        'DCGM_FI_DEV_GPU_TEMP{gpu="7" 41',                              # 10 unterminated labels
        "DCGM_FI_DEV_GPU_TEMP{gpu=\"8\"} forty",                        # 11
        "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter",                # 12
        'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0"} -3',                  # 13
        'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="1"} 3',                   # 14
        "requests_total -1",                                            # 15 untyped but _total
        'temperature_delta{gpu="0"} -1.5',                              # 16 a gauge may be negative
        "{not a line}",                                                 # 17
        'dup{a="1",a="2"} 1',                                           # 18
        "x_bucket{le=\"1\"} -2",                                        # 19
        "bad 1_000",                                                    # 20
        'DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1410 1700000000000 extra',       # 21
    ]) + "\n"
    snap = parse_exposition(text, default_ts=NOW, source="f.prom")
    kept = sorted((m, lab.get("gpu", ""), v) for m, lab, v, _ in snap.rows())
    assert kept == [
        ("DCGM_FI_DEV_GPU_TEMP", "0", 40.0),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "1", 3.0),
        ("temperature_delta", "0", -1.5),
    ]
    by_line = {i.line: i.reason for i in snap.issues}
    assert sorted(by_line) == [4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 18, 19, 20, 21]
    assert "NaN" in by_line[4]
    assert "infinite" in by_line[5] and "infinite" in by_line[6]
    assert all("sentinel" in by_line[n] for n in (7, 8, 9))
    assert all("negative counter" in by_line[n] for n in (13, 15, 19))
    assert "duplicate" in by_line[18]
    assert all(i.source == "f.prom" for i in snap.issues)
    assert all(math.isfinite(v) for v in snap.values.tolist())


def test_blank_sentinels_only_on_dcgm_fields_and_only_at_their_exact_values() -> None:
    # A node-exporter byte counter may pass 2**31 or 2**47 and every Go exporter prints
    # process_virtual_memory_max_bytes 1.8446744073709552e+19: plain samples. DCGM fields at DCGM's blank
    # values are blanks; a DCGM field next to a blank value (2**47 + 0.5, 2**47 + 16) is a value.
    text = (
        f"node_network_receive_bytes_total {DCGM_FP64_BLANK!r}\n"
        f"node_rx_bytes_total {DCGM_INT32_BLANK + 3}\n"
        f"some_gauge {DCGM_INT32_BLANK}\n"
        f"# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER {DCGM_INT32_BLANK + 1}\n"
        "process_virtual_memory_max_bytes 1.8446744073709552e+19\n"
        "go_big 9223372036854775807\n"
        "DCGM_FI_DEV_MEMORY_TEMP 9223372036854775794\n"
        f"DCGM_FI_DEV_POWER_USAGE {DCGM_FP64_BLANK + 15!r}\n"
        f"DCGM_FI_DEV_ENERGY {DCGM_FP64_BLANK + 0.5!r}\n"
        f"DCGM_FI_DEV_FB_USED {DCGM_INT32_BLANK + 16}\n"
        "DCGM_FI_DEV_BIG 1.8446744073709552e+19\n"
    )
    snap = parse_exposition(text, default_ts=NOW)
    assert sorted(m for m, *_ in snap.rows()) == [
        "DCGM_FI_DEV_BIG", "DCGM_FI_DEV_ENERGY", "DCGM_FI_DEV_FB_USED", "go_big",
        "node_network_receive_bytes_total", "node_rx_bytes_total", "process_virtual_memory_max_bytes",
        "some_gauge",
    ]
    assert sorted(i.line for i in snap.issues) == [5, 8, 9]
    assert all("sentinel" in i.reason for i in snap.issues)
    # the same rule for a single value and for a block on the fast path
    assert value_problem("process_virtual_memory_max_bytes", 2.0**64, False) is None
    assert value_problem("DCGM_FI_DEV_GPU_TEMP", 2.0**63, False) is not None
    fast = "".join(f'process_virtual_memory_max_bytes{{pod="p{i}"}} 1.8446744073709552e+19\n' for i in range(50))
    assert len(parse_exposition(fast, default_ts=NOW)) == 50


def test_garbage_never_raises() -> None:
    for junk in (b"\x00\xff\xfe{{{}}}\n", b"# TYPE\n#\n\n\n", b"", b"}" * 1000, "m{a=\"\\\"} 1\n", b"m{a=\"\xff\"} 1\n"):
        snap = parse_exposition(junk, default_ts=NOW)
        assert all(math.isfinite(v) for v in snap.values.tolist())


def test_fast_path_line_numbers_with_blank_lines_and_comments() -> None:
    lines = ["# HELP a x", "# TYPE a gauge"] + [f'a{{i="{i}"}} {i}' for i in range(5)]
    lines += ["", "# a comment", 'a{i="5"} NaN', 'a{i="6"} 6', "", ""]
    snap = parse_exposition("\n".join(lines), default_ts=NOW)
    assert len(snap) == 6
    assert [(i.line, i.reason) for i in snap.issues] == [(10, "NaN value")]


def test_crlf_and_text_without_trailing_newline() -> None:
    text = '# TYPE a gauge\r\na{x="1"} 1\r\na{x="2"} 2'
    assert sorted(v for *_, v, _ in rows(text)) == [1.0, 2.0]


def test_builder_sharing_and_extra_labels() -> None:
    b = SnapshotBuilder()
    parse_exposition('m{gpu="0"} 1\n', default_ts=NOW, builder=b, extra_labels={"instance": "h1:9400"})
    snap = parse_exposition('m{gpu="0",instance="own"} 2\nn 3\n', default_ts=NOW + 1, builder=b,
                            extra_labels={"instance": "h2:9400"})
    got = sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows())
    assert got == sorted([
        ("m", (("gpu", "0"), ("instance", "h1:9400")), 1.0, NOW),
        # The scraper's label wins; the sample's own value is kept as exported_instance (Prometheus).
        ("m", (("exported_instance", "own"), ("gpu", "0"), ("instance", "h2:9400")), 2.0, NOW + 1),
        ("n", (("instance", "h2:9400"),), 3.0, NOW + 1),
    ])
    assert snap.at == NOW + 1
    assert len(snap.metrics) == 2


# --- property tests: valid text equals prometheus-client; both parse paths agree -----------------------

_lname = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda s: not s.startswith("__"))
_lvalue = st.text(alphabet=st.sampled_from(list('ab }{,="\\\n é:')), max_size=8)
_value = st.one_of(
    st.integers(-10**6, 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
    st.sampled_from(["0", "1e3", "-0.0", "1.5E-7"]),
)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _exposition(draw: st.DrawFn) -> str:
    out = []
    for f in range(draw(st.integers(1, 4))):
        name = f"fam{f}"
        out.append(f"# TYPE {name} gauge")
        keys = draw(st.lists(_lname, unique=True, max_size=3))
        for _ in range(draw(st.integers(1, 5))):
            labels = ",".join(f'{k}="{_esc(draw(_lvalue))}"' for k in keys)
            sep = draw(st.sampled_from([" ", "  ", "\t"]))
            out.append(f"{name}{{{labels}}}{sep}{draw(_value)}")
    return "\n".join(out) + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_exposition())
def test_property_valid_text_equals_prometheus_client(text: str) -> None:
    # Repeated label sets on purpose: prometheus-client keeps duplicates, so do we.
    assert_same_as_prom_client(text)


@settings(max_examples=60, deadline=None)
@given(_exposition())
def test_property_fast_and_careful_paths_agree(text: str) -> None:
    from fleethealth.sources import exposition as ex

    fast = sorted((m, tuple(sorted(lab.items())), v) for m, lab, v, _ in rows(text))
    orig, orig_mixed = ex._fast_block, ex._mixed_block
    ex._fast_block = lambda *a, **k: None  # type: ignore[assignment]
    ex._mixed_block = lambda *a, **k: None  # type: ignore[assignment]
    try:
        careful = sorted((m, tuple(sorted(lab.items())), v) for m, lab, v, _ in rows(text))
    finally:
        ex._fast_block, ex._mixed_block = orig, orig_mixed
    assert fast == careful


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_property_arbitrary_bytes_never_raise(data: bytes) -> None:
    snap = parse_exposition(data, default_ts=NOW)
    assert all(math.isfinite(v) for v in snap.values.tolist())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(_lvalue, min_size=3, max_size=3), min_size=8, max_size=30),
    st.sampled_from([",", ", "]),
    st.booleans(),
)
def test_property_bulk_template_labels_equal_careful_parse(values: list[list[str]], sep: str, quoted: bool) -> None:
    """The template fast path for many label strings gives exactly the careful parser's result."""
    from fleethealth.sources import exposition as ex

    k0 = '"dotted.name"' if quoted else "zeta"
    raws = list(dict.fromkeys(
        ("{" + sep.join(f'{k}="{_esc(v)}"' for k, v in zip((k0, "alpha", "mid"), vs, strict=True)) + "}").encode()
        for vs in values
    ))
    cache = ex.LabelCache()  # (a fresh one: every string parsed in bulk)
    ex._parse_labels_bulk(raws, cache)
    bulk = [cache.parsed[r] for r in raws]
    careful = [ex._split_labels(r.decode()) for r in raws]
    assert bulk == careful


NODE_EXPORTER = """\
# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.1e-05
go_gc_duration_seconds{quantile="0.5"} 3.4e-05
go_gc_duration_seconds{quantile="1"} 0.000521
go_gc_duration_seconds_sum 0.812
go_gc_duration_seconds_count 11020
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 1.23456789e+06
node_cpu_seconds_total{cpu="0",mode="iowait"} 312.5
node_cpu_seconds_total{cpu="1",mode="idle"} 1.2345e+06
# HELP node_hwmon_temp_celsius Hardware monitor for temperature (input)
# TYPE node_hwmon_temp_celsius gauge
node_hwmon_temp_celsius{chip="platform_coretemp_0",sensor="temp1"} 45
# HELP node_memory_MemAvailable_bytes Memory information field MemAvailable_bytes.
# TYPE node_memory_MemAvailable_bytes gauge
node_memory_MemAvailable_bytes 1.0283745280e+11
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-7B"} 3.0
sglang:token_usage{model_name="Qwen/Qwen2.5-7B"} 0.71
"""


def test_node_exporter_and_sglang_text_equal_prometheus_client() -> None:
    assert_same_as_prom_client(NODE_EXPORTER)
    snap = parse_exposition(NODE_EXPORTER, default_ts=NOW)
    assert len(snap) == 12 and not snap.issues
    names = set(snap.metrics)
    assert {"go_gc_duration_seconds", "go_gc_duration_seconds_sum", "node_cpu_seconds_total",
            "sglang:num_running_reqs", "sglang:token_usage"} <= names


def test_prometheus_client_default_registry_output_equal() -> None:
    from prometheus_client import REGISTRY

    assert_same_as_prom_client(generate_latest(REGISTRY).decode())


@st.composite
def _multi_block_mutated(draw: st.DrawFn) -> str:
    """dcgm-like text (several fields x 10 GPUs, same label order), with a few lines of later blocks
    mutated so that the template path must notice and fall back."""
    n = 10
    labels = [f'{{gpu="{g}",UUID="GPU-{g:04d}",Hostname="node-{g // 8}"}}' for g in range(n)]
    blocks = []
    for f in range(3):
        lines = [f"# TYPE DCGM_F{f} gauge"] + [f"DCGM_F{f}{lab} {g * 10 + f}" for g, lab in enumerate(labels)]
        blocks.append(lines)
    for _ in range(draw(st.integers(0, 3))):
        b = draw(st.integers(1, 2))
        i = draw(st.integers(1, len(blocks[b]) - 1))
        kind = draw(st.sampled_from(["label", "drop", "swap", "brace", "ts", "nan", "dup", "space", "name"]))
        line = blocks[b][i]
        if kind == "label":
            blocks[b][i] = line.replace('gpu="', 'gpu="x')
        elif kind == "drop":
            del blocks[b][i]
        elif kind == "swap" and i + 1 < len(blocks[b]):
            blocks[b][i], blocks[b][i + 1] = blocks[b][i + 1], blocks[b][i]
        elif kind == "brace":
            blocks[b][i] = line.replace('UUID="', 'UUID="} ')
        elif kind == "ts":
            blocks[b][i] = line + " 1700000000000"
        elif kind == "nan":
            blocks[b][i] = line.rsplit(" ", 1)[0] + " NaN"
        elif kind == "dup":
            blocks[b].insert(i, line)
        elif kind == "space":
            blocks[b][i] = line.replace("} ", "}  ")
        elif kind == "name":
            blocks[b][i] = line.replace("DCGM_F", "DCGM_G", 1)
    return "\n".join(ln for blk in blocks for ln in blk) + "\n"


@settings(max_examples=120, deadline=None)
@given(_multi_block_mutated())
def test_property_template_path_agrees_with_careful_path(text: str) -> None:
    from fleethealth.sources import exposition as ex

    def run() -> tuple[list[tuple[str, tuple[tuple[str, str], ...], float, float]], list[tuple[int, str]]]:
        snap = parse_exposition(text, default_ts=NOW)
        return (sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows()),
                sorted((i.line, i.reason) for i in snap.issues))

    fast = run()
    orig, orig_mixed = ex._fast_block, ex._mixed_block
    ex._fast_block = lambda *a, **k: None  # type: ignore[assignment]
    ex._mixed_block = lambda *a, **k: None  # type: ignore[assignment]
    try:
        careful = run()
    finally:
        ex._fast_block, ex._mixed_block = orig, orig_mixed
    assert fast == careful


def test_empty_label_values_mean_absent_in_both_label_paths() -> None:
    # Twelve GPUs so that the bulk template path parses them; spaced "= """ on purpose.
    text = "".join(f'm{{gpu="{g}", pod= "{"p" if g % 2 else ""}"}} {g}\n' for g in range(12))
    got = {lab["gpu"]: lab.get("pod") for _, lab, _, _ in rows(text)}
    assert got == {str(g): ("p" if g % 2 else None) for g in range(12)}


def test_comments_without_space_and_bare_hash_lines() -> None:
    # The classic format ignores any other '#' line; OpenMetrics (this text ends with # EOF) allows none,
    # so there they are reported, and the samples around them are still read.
    text = "# TYPE a gauge\na{x=\"1\"} 1\n#no space comment\na{x=\"2\"} 2\n#\n#\tTYPE odd\n# EOF\n"
    snap = parse_exposition(text.removesuffix("# EOF\n"), default_ts=NOW)
    assert sorted(v for *_, v, _ in snap.rows()) == [1.0, 2.0]
    assert snap.issues == []
    snap = parse_exposition(text, default_ts=NOW)
    assert sorted(v for *_, v, _ in snap.rows()) == [1.0, 2.0]
    assert [(i.line, i.reason.split(" (")[0]) for i in snap.issues] == [(n, "invalid comment line") for n in (3, 5, 6)]


def _careful_rows(text: str) -> tuple[list[tuple[str, tuple[tuple[str, str], ...], float, float]], list[tuple[int, str]]]:
    from fleethealth.sources import exposition as ex

    orig, orig_mixed = ex._fast_block, ex._mixed_block
    ex._fast_block = lambda *a, **k: None  # type: ignore[assignment]
    ex._mixed_block = lambda *a, **k: None  # type: ignore[assignment]
    try:
        snap = parse_exposition(text, default_ts=NOW)
    finally:
        ex._fast_block, ex._mixed_block = orig, orig_mixed
    return (sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows()),
            sorted((i.line, i.reason) for i in snap.issues))


@settings(max_examples=40, deadline=None)
@given(st.integers(8, 30), st.lists(st.sampled_from(["nan", "neg", "brace", "nolabels", "ts", "esc"]), max_size=3),
       st.randoms(use_true_random=False))
def test_property_histogram_blocks_fast_equals_careful_and_prometheus_client(
    replicas: int, mutations: list[str], rnd: object
) -> None:
    r = CollectorRegistry()
    h = Histogram("vllm:e2e_request_latency_seconds", "e2e", ["model_name", "replica"], registry=r,
                  buckets=(0.1, 1.0, 10.0))
    for i in range(replicas):
        h.labels("m", f"r{i}").observe(0.5 * i)
    lines = generate_latest(r).decode().splitlines()
    touched: set[int] = set()
    for mut in mutations:
        i = rnd.randrange(2, len(lines))  # type: ignore[attr-defined]
        # one mutation per line: stacked ones ("1.0 NaN", two timestamps) are malformed lines that
        # prometheus-client's lenient parser half-reads and ours reports
        if lines[i].startswith("#") or i in touched:
            continue
        touched.add(i)
        if mut == "nan":
            lines[i] = lines[i].rsplit(" ", 1)[0] + " NaN"
        elif mut == "neg":
            lines[i] = lines[i].rsplit(" ", 1)[0] + " -1.0"
        elif mut == "brace":
            lines[i] = lines[i].replace('model_name="m"', 'model_name="{m} "')
        elif mut == "nolabels":
            lines[i] = lines[i].split("{")[0] + " 1.0"
        elif mut == "ts":
            lines[i] = lines[i] + " 1700000000000"
        elif mut == "esc":
            lines[i] = lines[i].replace('model_name="m"', 'model_name="a\\"b"')
    text = "\n".join(lines) + "\n"
    snap = parse_exposition(text, default_ts=NOW)
    fast = (sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows()),
            sorted((i.line, i.reason) for i in snap.issues))
    assert fast == _careful_rows(text)
    if not {"ts", "nan"} <= set(mutations):  # "1.0 NaN" as value + timestamp: prometheus-client takes it
        assert compare_rows(our_rows(snap), prom_client_rows(text), NOW) == []


def test_federate_style_timestamps_on_every_sample_take_the_bulk_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleethealth.sources import exposition as ex

    slow_calls: list[int] = []
    real_slow = ex._slow_block
    def counted(*a: object) -> int:
        slow_calls.append(1)
        return real_slow(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(ex, "_slow_block", counted)
    lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    lines += [f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",instance="h:9400"}} {40 + g} {1700000000000 + g}' for g in range(20)]
    text = "\n".join(lines) + "\n"
    snap = parse_exposition(text, default_ts=NOW)
    assert sorted((v, t) for *_, v, t in snap.rows()) == [(40.0 + g, 1700000000.0 + g / 1000) for g in range(20)]
    assert slow_calls == []  # the bulk path took the timestamps
    monkeypatch.setattr(ex, "_slow_block", real_slow)
    assert (sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows()), []) == _careful_rows(text)
    assert_same_as_prom_client(text)
