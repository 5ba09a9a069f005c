"""What the command line reads: files, directories and URLs, merged into one Snapshot.

Each input is a path or an http(s) URL. Recorded tables are chosen by extension (.csv, .jsonl, .ndjson,
.parquet, optionally .gz); anything else is exposition text (Prometheus 0.0.4 or OpenMetrics, optionally
gzip-compressed, whatever its name). A directory means every file under it. ``-`` is standard input.

Failures are split the way the scorer needs them. A URL that cannot be fetched is the normal life of a
fleet (an exporter died): it becomes a ``source_errors`` entry and its entities go stale, never healthy.
A file that cannot be read at all (missing, binary, a decompression past the size limit) is an operator
mistake: ``InputError`` with one clear line, which the CLI turns into exit code 2. Bad lines inside a
readable input are ``issues`` on the snapshot. Inputs that together hold no sample at all are reported by
``no_samples_reason`` (the CLI exits 2 with it rather than print an empty table).

Identity. A page is only useful if its samples say whose they are. A page read from a URL gets the URL's
host:port as ``instance``, as Prometheus does on scrape. A file whose samples carry no label naming a node
or a replica (a saved vLLM v1 page: ``model_name`` and ``engine`` only) gets its path as ``instance``, with
a one-line notice, so its entity exists instead of vanishing.

Recordings. A recorded table has its own clock: with no ``at`` given, the time scored is the recording's
last sample, not now; samples after ``at`` are the recording's future and are left out (counted, not
reported as clock skew); ``InputRead.recorded`` is the recording's time range.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from fleethealth.auth.redact import redact_text, redact_url
from fleethealth.signals.snapshot import InputIssue, Snapshot, SnapshotBuilder, window
from fleethealth.sources.exposition import parse_exposition
from fleethealth.sources.tables import (
    InputError,
    decompress_bounded,
    default_max_bytes,
    is_gzip,
    read_table,
    table_format,
)

__all__ = [
    "InputError", "InputRead", "binary_reason", "fetch_url", "is_url", "no_samples_reason", "read_file", "read_inputs",
    "read_inputs_report",
]

_ACCEPT = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
# Labels that say whose a sample is (the policy's node_labels and replica_labels by default, and the
# labels that name a rank's job); a page with none of them gets its source as ``instance``.
IDENTITY_LABELS = ("Hostname", "node", "hostname", "instance", "replica", "pod", "job")


def is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))


def fetch_url(url: str, timeout_s: float, max_bytes: int | None = None) -> tuple[bytes, str] | str:
    """(body, content type) or, on any failure, one line saying why. The body (decoded, if the server
    compressed it) is read up to ``max_bytes``; a longer one is a failure, never a GB in memory."""
    import httpx

    from fleethealth.sources.base import describe_http_error

    limit = default_max_bytes() if max_bytes is None else max_bytes
    try:
        # Classic text first: prometheus-client rewrites vllm: names to vllm_ when serving OpenMetrics.
        with httpx.stream("GET", url, timeout=timeout_s, headers={"Accept": _ACCEPT}, follow_redirects=True) as r:
            r.raise_for_status()
            parts: list[bytes] = []
            got = 0
            for chunk in r.iter_bytes():
                got += len(chunk)
                if got > limit:
                    return f"the body is larger than the input limit of {limit:,} bytes"
                parts.append(chunk)
            return b"".join(parts), r.headers.get("content-type", "")
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError, ValueError) as e:
        return describe_http_error(e)


def _expand(inputs: Sequence[str]) -> list[tuple[str, bool]]:
    """(input, named): every file under a directory (named False), the others as given."""
    out: list[tuple[str, bool]] = []
    for item in inputs:
        if item != "-" and not is_url(item) and Path(item).is_dir():
            files = sorted(p for p in Path(item).rglob("*") if p.is_file() and not p.name.startswith("."))
            out.extend((str(p), False) for p in files)
        else:
            out.append((item, True))
    return out


def read_file(path: str, max_bytes: int) -> bytes:
    """A file (or ``-``, stdin) whole, gzip inflated when it is gzip, at most ``max_bytes``; ``InputError``
    with one line when it cannot be read."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(max_bytes + 1)
        else:
            p = Path(path)
            if p.stat().st_size > max_bytes:
                raise InputError(f"{path}: cannot read: larger than the input limit of {max_bytes:,} bytes "
                                 "(--max-input-mb, FLEETHEALTH_MAX_INPUT_BYTES)")
            raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    if path.endswith(".gz") or is_gzip(raw):
        raw = decompress_bounded(raw, max_bytes, path)
    elif len(raw) > max_bytes:
        raise InputError(f"{path}: cannot read: larger than the input limit of {max_bytes:,} bytes")
    return raw


def binary_reason(raw: bytes) -> str | None:
    """Why bytes are not exposition text (a NUL in the first 8 KiB, or not UTF-8 there), or None."""
    head = raw[:8192]
    if b"\0" in head:
        return "binary data, not metrics text (a NUL byte near the start)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # (not a character cut at the 8 KiB boundary)
            return "binary data, not metrics text (not UTF-8)"
    return None


def _instance(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc.rsplit("@", 1)[-1] or url  # (never user:password@ in a label)


@dataclass
class InputRead:
    """What ``read_inputs_report`` read: the merged snapshot (``snapshot.at`` is the time scored),
    notices for the operator (one line each), the recording's time range, and how many recorded samples
    lie after ``at`` (left out)."""

    snapshot: Snapshot
    notices: list[str] = field(default_factory=list)
    recorded: tuple[float, float] | None = None
    after_at: int = 0


def read_inputs(inputs: Sequence[str], at: float, timeout_s: float = 10.0) -> Snapshot:
    """``read_inputs_report(...).snapshot`` at a given time."""
    return read_inputs_report(inputs, at, timeout_s=timeout_s).snapshot


def read_inputs_report(
    inputs: Sequence[str], at: float | None, *, now: float | None = None, timeout_s: float = 10.0,
    max_bytes: int | None = None, identity_labels: Sequence[str] = IDENTITY_LABELS,
) -> InputRead:
    """Read and merge every input into one Snapshot at ``at`` (the time given to untimestamped samples).

    ``at`` None: the last sample time of the recorded tables when there are any, else ``now``. Samples
    fetched from a URL get an ``instance`` label (host:port, as Prometheus adds it; a sample's own
    instance label is kept as ``exported_instance``); a file without any ``identity_labels`` gets its
    path as ``instance``. Raises ``InputError`` for a local input that cannot be read at all: missing, a
    binary file named on the command line, or past ``max_bytes`` (default: ``default_max_bytes()``).
    """
    limit = default_max_bytes() if max_bytes is None else max_bytes
    items = _expand(inputs)
    notices: list[str] = []
    tables: dict[str, Snapshot] = {}
    for item, _ in items:
        if not is_url(item) and table_format(item) is not None:
            tables[item] = read_table(item, max_bytes=limit)
    urls = [u for u, _ in items if is_url(u)]
    fetched: dict[str, tuple[bytes, str] | str] = {}
    if urls:
        with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
            for url, res in zip(urls, pool.map(lambda u: fetch_url(u, timeout_s, limit), urls), strict=True):
                fetched[url] = res
    for url in urls:
        res = fetched[url]
        fmt = table_format(urlsplit(url).path)
        if fmt is not None and not isinstance(res, str):
            tables[url] = _table_from_bytes(redact_url(url), res[0], fmt[0], fmt[1], limit)
    recorded_ts = [s.ts for s in tables.values() if len(s)]
    recorded = (min(float(t.min()) for t in recorded_ts), max(float(t.max()) for t in recorded_ts)) if recorded_ts else None
    if at is None:
        at = recorded[1] if recorded is not None else (now if now is not None else _wall_clock())
    after = 0
    b = SnapshotBuilder()
    for item, named in items:
        if item in tables:
            snap = tables[item]
            later = int((snap.ts > at).sum()) if len(snap) else 0
            if later:
                after += later
                snap = window(snap, float("-inf"), at)
            b.extend_snapshot(snap)
            continue
        if is_url(item):
            res = fetched[item]
            shown = redact_url(item)  # (issues are printed and served: never a password in them)
            if isinstance(res, str):
                b.source_errors.append(InputIssue(shown, 0, f"cannot fetch: {redact_text(res)}"))
                continue
            body, ctype = res
            om = True if "openmetrics" in ctype.lower() else None
            parse_exposition(body, default_ts=at, source=shown, builder=b,
                             extra_labels={"instance": _instance(item)}, openmetrics=om)
            continue
        raw = read_file(item, limit)
        why = binary_reason(raw)
        if why is not None:
            if named:
                raise InputError(f"{item}: cannot read: {why}")
            notices.append(f"{item}: skipped: {why}")
            continue
        _page_with_identity(b, raw, item, at, identity_labels, notices)
    if after:
        notices.append(f"{after:,} recorded sample(s) after the time scored ({at:.0f}) are left out")
    return InputRead(b.build(at), notices, recorded, after)


def _wall_clock() -> float:
    import time

    return time.time()


def _page_with_identity(
    b: SnapshotBuilder, raw: bytes, source: str, at: float, identity: Sequence[str], notices: list[str]
) -> None:
    """Parse one exposition file into ``b``; when none of its samples has a label naming its node or
    replica, its samples get ``instance=<source>`` (as a scrape would give them), with a notice."""
    page = parse_exposition(raw, default_ts=at, source=source)
    wanted = set(identity)
    if len(page) and not any(k in wanted for ls in page.labelsets for k, _ in ls):
        pair = ("instance", source)
        page.labelsets[:] = [tuple(sorted((*ls, pair))) for ls in page.labelsets]
        notices.append(f'{source}: no label names its node or replica ({", ".join(identity)}); its samples are '
                       f'taken as instance="{source}", as Prometheus does on scrape')
    b.extend_snapshot(page)


def no_samples_reason(read: InputRead, inputs: Sequence[str]) -> str | None:
    """One line saying why the inputs yielded no sample, or None when they yielded some."""
    snap = read.snapshot
    if len(snap):
        return None
    what = ", ".join(inputs[:3]) + (f" and {len(inputs) - 3} more" if len(inputs) > 3 else "")
    if snap.source_errors:
        e = snap.source_errors[0]
        more = f" (and {len(snap.source_errors) - 1} more)" if len(snap.source_errors) > 1 else ""
        return f"no input yielded a sample: {e.source}: {e.reason}{more}"
    if snap.issues:
        return (f"no input yielded a sample: {len(snap.issues):,} line(s) of {what} could not be read as samples "
                f"(first: {snap.issues[0]})")
    if read.after_at:
        return f"no input yielded a sample: all {read.after_at:,} recorded samples are after the time scored"
    skipped = [n for n in read.notices if ": skipped: " in n]
    if skipped:
        return f"no input yielded a sample: {skipped[0]}" + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else "")
    if not _expand(inputs):
        return f"no input yielded a sample: {what}: no files"
    return f"no input yielded a sample: {what}: empty (no metrics in it)"


def _table_from_bytes(url: str, body: bytes, kind: str, gz: bool, max_bytes: int) -> Snapshot:
    suffix = "." + ("ndjson" if kind == "jsonl" else kind) + (".gz" if gz else "")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / ("table" + suffix)
        p.write_bytes(body)
        try:
            snap = read_table(p, max_bytes=max_bytes)
        except InputError as e:
            failed = Snapshot.empty(0.0)
            failed.source_errors.append(InputIssue(url, 0, str(e).replace(str(p), "table")))
            return failed
    for i, issue in enumerate(snap.issues):
        snap.issues[i] = InputIssue(url, issue.line, issue.reason, issue.text)
    return snap


def max_bytes_from_mb(mb: float | None) -> int | None:
    """``--max-input-mb`` as bytes (None: the default)."""
    return None if mb is None else max(1, int(mb * 1e6))

