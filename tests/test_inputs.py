"""read_inputs against real files, directories and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from act_support import free_port
from fleethealth.bench.parse import dcgm_text
from fleethealth.sources.exposition import parse_exposition
from fleethealth.sources.inputs import InputError, read_inputs
from fleethealth.sources.tables import write_table

NOW = 1_700_000_000.0
VLLM = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="llama",engine="0"} 4\n'
)
OM = "# TYPE up gauge\nup 1 1700000000.5\n# EOF\n"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        routes = {
            "/vllm": (200, "text/plain; version=0.0.4", VLLM.encode()),
            "/om": (200, "application/openmetrics-text; version=1.0.0", OM.encode()),
            "/broken": (500, "text/plain", b"boom"),
            "/rec.csv": (200, "text/csv", b"ts,metric,value,gpu\n5,DCGM_FI_DEV_GPU_TEMP,40,0\n6,x,bad,\n"),
            "/big": (200, "text/plain", b"m 1\n" * 500_000),
        }
        status, ctype, body = routes.get(self.path, (404, "text/plain", b"no"))
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_urls_files_and_tables_merge(server: str, tmp_path: Path) -> None:
    (tmp_path / "dcgm.prom").write_text(dcgm_text(8, seed=1))
    write_table(parse_exposition('rank_t{job="j",rank="0"} 1.8\n', default_ts=NOW - 30), tmp_path / "r.parquet")
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    snap = read_inputs(
        [str(tmp_path / "dcgm.prom"), f"{server}/vllm", f"{server}/om", f"{server}/broken", dead,
         str(tmp_path / "r.parquet"), f"{server}/rec.csv"],
        at=NOW, timeout_s=5,
    )
    assert snap.at == NOW
    rows = {(m, tuple(sorted(lab.items()))): (v, t) for m, lab, v, t in snap.rows()}
    host = server.split("//")[1]
    assert rows[("vllm:num_requests_running", (("engine", "0"), ("instance", host), ("model_name", "llama")))] == (4.0, NOW)
    assert rows[("up", (("instance", host),))] == (1.0, 1700000000.5)  # OpenMetrics: seconds
    assert rows[("rank_t", (("job", "j"), ("rank", "0")))] == (1.8, NOW - 30)
    assert rows[("DCGM_FI_DEV_GPU_TEMP", (("gpu", "0"),))] == (40.0, 5.0)  # a table keeps its own labels
    assert sum(1 for m, _ in rows if m == "DCGM_FI_DEV_SM_CLOCK") == 8
    errors = {e.source: e.reason for e in snap.source_errors}
    assert set(errors) == {f"{server}/broken", dead}
    assert "500" in errors[f"{server}/broken"]
    assert "connect" in errors[dead]
    assert any(i.source == f"{server}/rec.csv" and i.line == 3 for i in snap.issues)
    assert any(i.source.endswith("dcgm.prom") and "sentinel" in i.reason for i in snap.issues)


def test_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.prom"
    with pytest.raises(InputError) as e:
        read_inputs([str(missing)], at=NOW)
    assert str(e.value) == f"{missing}: cannot read: No such file or directory"
    with pytest.raises(InputError, match="nope.csv: cannot read: No such file or directory"):
        read_inputs([str(tmp_path / "nope.csv")], at=NOW)


def test_directory_and_gzip_inputs(tmp_path: Path) -> None:
    d = tmp_path / "scrapes"
    (d / "sub").mkdir(parents=True)
    (d / "a.prom").write_text('m{gpu="0"} 1\n')
    (d / "sub" / "b.prom.gz").write_bytes(gzip.compress(b'm{gpu="1"} 2\n'))
    write_table(parse_exposition('m{gpu="2"} 3\n', default_ts=NOW), d / "c.csv.gz")
    (d / ".hidden").write_text("garbage that would be issues\n")
    snap = read_inputs([str(d)], at=NOW)
    assert sorted((lab["gpu"], v) for _, lab, v, _ in snap.rows()) == [("0", 1.0), ("1", 2.0), ("2", 3.0)]
    assert snap.issues == []
    (d / "broken.gz").write_bytes(b"not gzip")
    with pytest.raises(InputError, match="gzip"):
        read_inputs([str(d)], at=NOW)


def test_bad_lines_in_a_readable_file_are_issues_not_errors(tmp_path: Path) -> None:
    p = tmp_path / "x.prom"
    p.write_text('ok 1\nbroken{ 2\nnan_one NaN\n')
    snap = read_inputs([str(p)], at=NOW)
    assert [(m, v) for m, _, v, _ in snap.rows()] == [("ok", 1.0)]
    assert [(i.source, i.line) for i in snap.issues] == [(str(p), 2), (str(p), 3)]
    assert snap.source_errors == []


def test_malformed_url_is_a_source_error_not_an_exception() -> None:
    snap = read_inputs(["http://"], at=NOW, timeout_s=2)
    assert len(snap) == 0
    assert [e.source for e in snap.source_errors] == ["http://"]
    assert snap.source_errors[0].reason.startswith("cannot fetch")


def test_a_url_body_is_read_up_to_the_limit_and_credentials_never_become_labels(server: str) -> None:
    from fleethealth.sources.inputs import read_inputs_report

    got = read_inputs_report([f"{server}/big"], NOW, max_bytes=100_000).snapshot
    assert len(got) == 0
    assert [e.reason for e in got.source_errors] == ["cannot fetch: the body is larger than the input limit of 100,000 bytes"]
    host = server.split("//")[1]
    got = read_inputs_report([server.replace("//", "//user:secret@") + "/vllm"], NOW).snapshot
    assert {dict(ls).get("instance") for ls in got.labelsets} == {host}
    dead = f"http://user:secret@127.0.0.1:{free_port()}/metrics?token=abc"
    got = read_inputs_report([dead, server.replace("//", "//u:secret@") + "/broken"], NOW).snapshot
    assert len(got.source_errors) == 2
    assert not any("secret" in e.source + e.reason or "abc" in e.source for e in got.source_errors)
