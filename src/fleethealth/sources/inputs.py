"""What the command line reads: files, directories and URLs, merged into one Snapshot.

Each input is a path or an http(s) URL. Recorded tables are chosen by extension (.csv, .jsonl, .ndjson,
.parquet, optionally .gz); anything else is exposition text (Prometheus 0.0.4 or OpenMetrics, optionally
.gz). A directory means every file under it. ``-`` is standard input.

Failures are split the way the scorer needs them. A URL that cannot be fetched is the normal life of a
fleet (an exporter died): it becomes a ``source_errors`` entry and its entities go stale, never healthy.
A file that cannot be read at all is an operator mistake: ``InputError`` with one clear line, which the
CLI turns into exit code 2. Bad lines inside a readable input are ``issues`` on the snapshot.
"""

from __future__ import annotations

import gzip
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from fleethealth.signals.snapshot import InputIssue, Snapshot, SnapshotBuilder
from fleethealth.sources.exposition import parse_exposition
from fleethealth.sources.tables import InputError, read_table, table_format

__all__ = ["InputError", "fetch_url", "is_url", "read_inputs"]

_ACCEPT = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"


def is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))


def fetch_url(url: str, timeout_s: float) -> tuple[bytes, str] | str:
    """(body, content type) or, on any failure, one line saying why."""
    import httpx

    from fleethealth.sources.base import describe_http_error

    try:
        # Classic text first: prometheus-client rewrites vllm: names to vllm_ when serving OpenMetrics.
        r = httpx.get(url, timeout=timeout_s, headers={"Accept": _ACCEPT}, follow_redirects=True)
        r.raise_for_status()
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as e:
        return describe_http_error(e)
    return r.content, r.headers.get("content-type", "")


def _expand(inputs: Sequence[str]) -> list[str]:
    out: list[str] = []
    for item in inputs:
        if item != "-" and not is_url(item) and Path(item).is_dir():
            files = sorted(p for p in Path(item).rglob("*") if p.is_file() and not p.name.startswith("."))
            out.extend(str(p) for p in files)
        else:
            out.append(item)
    return out


def _read_file(path: str) -> bytes:
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    if path.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise InputError(f"{path}: cannot read: not valid gzip ({e})") from None
    return raw


def _instance(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


def read_inputs(inputs: Sequence[str], at: float, timeout_s: float = 10.0) -> Snapshot:
    """Read and merge every input into one Snapshot at ``at`` (the time given to untimestamped samples).

    Samples fetched from a URL get an ``instance`` label (host:port, as Prometheus adds it; a sample's own
    instance label is kept as ``exported_instance``). Raises ``InputError`` only for a local file that cannot be read at all.
    """
    items = _expand(inputs)
    urls = [u for u in items if is_url(u)]
    fetched: dict[str, tuple[bytes, str] | str] = {}
    if urls:
        with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
            for url, res in zip(urls, pool.map(lambda u: fetch_url(u, timeout_s), urls), strict=True):
                fetched[url] = res
    b = SnapshotBuilder()
    for item in items:
        if is_url(item):
            res = fetched[item]
            if isinstance(res, str):
                b.source_errors.append(InputIssue(item, 0, f"cannot fetch: {res}"))
                continue
            body, ctype = res
            fmt = table_format(urlsplit(item).path)
            if fmt is not None:
                b.extend_snapshot(_table_from_bytes(item, body, fmt[0], fmt[1]))
                continue
            om = True if "openmetrics" in ctype.lower() else None
            parse_exposition(body, default_ts=at, source=item, builder=b,
                             extra_labels={"instance": _instance(item)}, openmetrics=om)
        elif table_format(item) is not None:
            b.extend_snapshot(read_table(item))
        else:
            parse_exposition(_read_file(item), default_ts=at, source=item, builder=b)
    return b.build(at)


def _table_from_bytes(url: str, body: bytes, kind: str, gz: bool) -> Snapshot:
    suffix = "." + ("ndjson" if kind == "jsonl" else kind) + (".gz" if gz else "")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / ("table" + suffix)
        p.write_bytes(body)
        try:
            snap = read_table(p)
        except InputError as e:
            failed = Snapshot.empty(0.0)
            failed.source_errors.append(InputIssue(url, 0, str(e).replace(str(p), "table")))
            return failed
    for i, issue in enumerate(snap.issues):
        snap.issues[i] = InputIssue(url, issue.line, issue.reason, issue.text)
    return snap
