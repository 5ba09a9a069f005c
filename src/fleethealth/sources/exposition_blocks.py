"""The fast block paths of the exposition parser and the parse context they share.

Theory of operation. A block is the sample lines between two comment lines. ``_fast_block`` takes a
block whose lines are all `name{labels} value` with one name: the first such block is cut in place
(``_cut_lines``: numpy finds the newlines and the '}'s) and its label strings interned in bulk; every
later block with the same label sequence is proved against it in place (``_template_block``: newlines,
the name at every line start and the known label strings as fixed-width rows compared with one memcmp,
value texts gathered between them), so a 25-field dcgm-exporter page costs one cut and 24 proofs. A block
with several names (histograms) is cut with C-level replace/split (``_mixed_block``). Every path returns
None, having added nothing, when it cannot prove the shape; the caller then takes the careful path
(``exposition_careful``). ``_Ctx`` holds one page's parse: its builder, types, label-string -> series
ids, the last block's template, the repeat check (``SeenSamples``) and the issues.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter

import numpy as np

from fleethealth.signals.snapshot import InputIssue, SnapshotBuilder
from fleethealth.sources.exposition_labels import (
    LabelCache,
    _merge_extra,
    _parse_labels,
    _parse_labels_bulk,
)
from fleethealth.sources.exposition_rules import SeenSamples, sample_text
from fleethealth.sources.exposition_values import (
    _bad_values,
    _fast_joined,
    _fast_values,
    blank_sentinel_mask,
    counter_like,
    value_problem,
)

_NAME_RE = re.compile(rb"[a-zA-Z_:][a-zA-Z0-9_:]*")



@dataclass
class _Ctx:
    builder: SnapshotBuilder
    source: str
    default_ts: float
    ts_div: float
    extra: tuple[tuple[str, str], ...]
    types: dict[str, str] = field(default_factory=dict)
    _sids: dict[bytes, int] = field(default_factory=dict)  # raw label string -> series id; see ``sids``
    _pending: list[tuple[list[bytes], list[int]]] = field(default_factory=list)
    bad_labels: dict[bytes, str] = field(default_factory=dict)
    counter_cache: dict[str, bool] = field(default_factory=dict)
    template: _Template | None = None  # the last block's label sequence
    scratch: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # see _newlines
    issues: list[InputIssue] = field(default_factory=list)
    m: list[int] = field(default_factory=list)
    s: list[int] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
    t: list[float] = field(default_factory=list)
    ln: list[int] = field(default_factory=list)
    added: int = 0  # samples this context has put into the builder (per-page counts for parse_many)
    seen: SeenSamples = field(default_factory=SeenSamples)
    scope: int | None = None  # parse_many: this page's number in the batch's SeenSamples
    labels: LabelCache = field(default_factory=LabelCache)  # parsed label strings (the caller's, if it holds one)

    def add_arrays(
        self, mids: np.ndarray, sids: np.ndarray, values: np.ndarray, ts: np.ndarray,
        lines: int | np.ndarray = 0, distinct: bool = False,
    ) -> None:
        """Add samples (line ``lines[i]``, or ``lines + i`` when an int, of the text); a sample of a series
        already read at the same instant is dropped and reported, as Prometheus does (the first is kept).
        ``distinct``: the caller knows the samples' (metric, series) pairs are distinct (a proven block)."""
        if self.m:
            _flush_careful(self)  # careful-path samples of earlier lines go first
        scope = None if self.scope is None else np.full(mids.shape[0], self.scope, np.int64)
        keep = self.seen.first_at_instant(mids, sids, ts, distinct, scope)
        if keep is not None:
            for i in np.flatnonzero(~keep).tolist():
                line = lines + i if isinstance(lines, int) else int(lines[i])
                self.issue(line, "duplicate sample for timestamp (the first is kept)",
                           sample_text(self.builder, int(mids[i]), int(sids[i]), float(values[i])))
            mids, sids, values, ts = mids[keep], sids[keep], values[keep], ts[keep]
            scope = None if scope is None else scope[keep]
        self.seen.add(mids, sids, ts, scope)
        self.added += int(values.shape[0])
        self.builder.add_arrays(mids, sids, values, ts)

    def scratch_of(self, size: int) -> np.ndarray:
        """A reusable bool buffer of at least ``size`` (fresh pages cost a fault each)."""
        if self.scratch.shape[0] < size:
            self.scratch = np.empty(size, bool)
        return self.scratch

    def issue(self, line: int, reason: str, text: bytes | str) -> None:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        self.issues.append(InputIssue(self.source, line, reason, text.strip()[:200]))

    def is_counter(self, name: str) -> bool:
        c = self.counter_cache.get(name)
        if c is None:
            c = self.counter_cache[name] = counter_like(name, self.types)
        return c

    def series_many(self, raws: list[bytes]) -> list[int] | None:
        """Series ids of many raw label strings already in the label cache; None if any is invalid."""
        parsed = list(map(self.labels.parsed.get, raws))
        if self.extra or not set(map(type, parsed)) <= {tuple}:
            out: list[int] = []
            for r in raws:
                sid = self.series(r)
                if isinstance(sid, str):
                    return None
                out.append(sid)
            return out
        ids = self.builder.series_ids(parsed)  # type: ignore[arg-type]
        self._pending.append((raws, ids))
        return ids

    @property
    def sids(self) -> dict[bytes, int]:
        """Series id of every raw label string interned so far. Bulk interning only queues its strings
        and ids: a 100k-GPU scrape whose later blocks all follow the template never looks one up, and
        the dict of 100k 200-byte keys costs about 2% of the parse."""
        if self._pending:
            for raws, ids in self._pending:
                self._sids.update(zip(raws, ids, strict=True))
            self._pending.clear()
        return self._sids

    def series(self, raw: bytes) -> int | str:
        """Series id for a raw label string (with extra labels merged), or why it is invalid."""
        sid = self.sids.get(raw)
        if sid is not None:
            return sid
        bad = self.bad_labels.get(raw)
        if bad is not None:
            return bad
        parsed = _parse_labels(raw, self.labels)
        if isinstance(parsed, str):
            self.bad_labels[raw] = parsed
            return parsed
        if self.extra:
            parsed = _merge_extra(parsed, self.extra)
        sid = self.sids[raw] = self.builder.series_id(parsed)
        return sid



def _flush_careful(ctx: _Ctx) -> None:
    """Add the samples the careful path collected in ``ctx``."""
    lines = np.asarray(ctx.ln, np.int64)
    m, s, v, t = ctx.m, ctx.s, ctx.v, ctx.t
    ctx.m, ctx.s, ctx.v, ctx.t, ctx.ln = [], [], [], [], []
    ctx.add_arrays(np.asarray(m, np.int32), np.asarray(s, np.int32), np.asarray(v, np.float64),
                   np.asarray(t, np.float64), lines)


def _flush(ctx: _Ctx) -> None:
    """Move what the careful path collected in ``ctx``, and the issues, into its builder."""
    if ctx.m:
        _flush_careful(ctx)
    ctx.builder.issues.extend(ctx.issues)
    ctx.issues = []



def _next_comment(raw: bytes, pos: int) -> int:
    """Offset of the next "\n# " at or after ``pos``, or -1. Searching for the one byte "#" runs at memchr
    speed (GB/s); bytes.find with the 3-byte needle crawls (~1 GB/s, half a second on a 100k-GPU scrape),
    and "#" is rare outside comment lines."""
    find = raw.find
    j = find(b"#", pos + 1)
    while j >= 0:
        if raw[j - 1] == 10 and raw[j + 1 : j + 2] == b" ":
            return j - 1
        j = find(b"#", j + 1)
    return -1


def _header(ctx: _Ctx, header: bytes) -> bool:
    """Handle one comment line (without its '#'); True at `# EOF`."""
    parts = header.split(None, 3)
    if not parts:
        return False
    if parts[0] == b"EOF" and len(parts) == 1:
        return True
    if parts[0] == b"TYPE" and len(parts) >= 3:
        name = parts[1].decode("utf-8", "replace")
        ctx.types[name] = parts[2].decode("utf-8", "replace").lower()
        ctx.counter_cache.clear()
    return False



def _fast_block(ctx: _Ctx, buf: bytes, a: int, e: int, first: int) -> int | None:
    """All lines of buf[a:e] after its comment line are `name{labels} value` with one name: bulk path.
    Returns the number of those lines, or None, having added nothing, when it cannot prove the shape."""
    nl = buf.find(b"\n", a, e)
    if nl < 0:
        return 0
    brace = buf.find(b"{", nl + 1, min(e, nl + 300))
    if brace < 0:
        return None
    bname = buf[nl + 1 : brace]
    if _NAME_RE.fullmatch(bname) is None:
        return None
    got = _template_block(ctx, buf, a, nl, e, bname)
    if got is None:
        got = _split_block(ctx, buf, a, nl, e, bname)
        if got is None:
            return None
    cut, sids = got
    n = cut.n
    vt = _values_and_ts(ctx, cut)
    if vt is None:
        return None  # exemplars, 1_000, a broken value or timestamp: careful path
    values, ts = vt
    name, counter, bad = _bad_values(ctx.is_counter, bname, values)
    mid = ctx.builder.metric_id(name)
    lines: int | np.ndarray = first
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            reason = value_problem(name, float(values[i]), counter) or "invalid value"
            ctx.issue(first + i, reason, bname + cut.labs[i] + b" " + cut.val(i))
        keep = ~bad
        sids, values, ts = sids[keep], values[keep], ts[keep]
        lines = first + np.flatnonzero(keep)
    distinct = ctx.template is not None and ctx.template.distinct  # (the template is this block's)
    ctx.add_arrays(np.full(values.shape[0], mid, np.int32), sids, values, ts, lines, distinct)
    return n


@dataclass
class _Cut:
    """A block's sample lines, cut: line i is `name + labs[i] + b" " + value text i`, the value text being
    the value, or the value and a timestamp. Cut in place (``vs``/``ve``: where each value text lies in
    ``buf``) or by splitting (``vals``); either form gives the other on demand."""

    labs: list[bytes]
    buf: bytes = b""
    vs: np.ndarray | None = None
    ve: np.ndarray | None = None
    lab_at: np.ndarray | None = None  # where each label string starts in ``buf`` (when cut in place)
    _vals: list[bytes] | None = None
    _joined: bytes | None = None

    @property
    def n(self) -> int:
        return len(self.labs)

    def vals(self) -> list[bytes]:
        if self._vals is None:
            assert self.vs is not None and self.ve is not None
            self._vals = list(map(self.buf.__getitem__, map(slice, self.vs.tolist(), self.ve.tolist())))
        return self._vals

    def val(self, i: int) -> bytes:
        if self._vals is None and self.vs is not None and self.ve is not None:
            return self.buf[int(self.vs[i]) : int(self.ve[i])]
        return self.vals()[i]

    def joined(self) -> bytes:
        """The value texts joined by b" ". In place, gathered with one numpy fancy index (each value with
        the space before it, which the cut proved is there), without a bytes object per value."""
        if self._joined is None:
            if self._vals is not None or self.vs is None or self.ve is None:
                self._joined = b" ".join(self.vals())
            else:
                self._joined = (_gather(np.frombuffer(self.buf, np.uint8), self.vs, self.ve) or b" ")[1:]
        return self._joined


@dataclass
class _Template:
    """The last block's label sequence: raw label strings, the length of each + b" " (``lens``), their
    series ids, and for ``_rows``: the lines grouped by that length, (length, line indices, their labels
    + b" " joined), or None when there are too many lengths (then one bytes.startswith per line)."""

    labs: list[bytes]
    lens: np.ndarray
    sids: np.ndarray
    groups: list[tuple[int, np.ndarray, bytes]] | None
    _labsp: list[bytes] | None = None
    _distinct: bool | None = None

    @property
    def distinct(self) -> bool:
        """Whether no series id repeats (a block that repeats a series may hold duplicate samples). New
        series get increasing ids, so the first block of a scrape is proved by one vectorised compare."""
        if self._distinct is None:
            s = self.sids
            self._distinct = bool((s[1:] > s[:-1]).all()) or np.unique(s).shape[0] == s.shape[0]
        return self._distinct

    @property
    def labsp(self) -> list[bytes]:
        """Each label string + b" " (made only for the per-line fallback)."""
        if self._labsp is None:
            self._labsp = list(map(bytes.__add__, self.labs, repeat(b" ")))
        return self._labsp


def _make_template(cut: _Cut, sids: np.ndarray) -> _Template:
    at = cut.lab_at
    labsp: list[bytes] | None = None
    if at is not None and cut.vs is not None:  # cut in place: labels + b" " are buf[at[i]:vs[i]]
        lens = cut.vs - at
    else:
        labsp = list(map(bytes.__add__, cut.labs, repeat(b" ")))
        lens = np.fromiter(map(len, labsp), np.int64, len(labsp))

    def rows(w: int, idx: np.ndarray) -> bytes:
        if labsp is None:
            assert at is not None
            return _rows(cut.buf, w, at[idx])
        return b"".join(map(labsp.__getitem__, idx.tolist()))

    groups: list[tuple[int, np.ndarray, bytes]] | None = None
    if lens.shape[0]:
        lo, hi = int(lens.min()), int(lens.max())
        widths = [lo] if lo == hi else np.unique(lens).tolist()
        if len(widths) <= 16:  # (hostnames of a few lengths; each group costs a few numpy calls per piece)
            groups = []
            for w in widths:
                idx = np.arange(lens.shape[0]) if lo == hi else np.flatnonzero(lens == w)
                groups.append((w, idx, rows(w, idx)))
    return _Template(cut.labs, lens, sids, groups, labsp)


def _newlines(ctx: _Ctx, buf: bytes, a: int, e: int) -> np.ndarray:
    """Offsets in ``buf`` of every newline in buf[a:e], in order: numpy's vectorised compare, piece by
    piece into a small reused scratch (no 20 MB temporary to fault in and read back)."""
    return _find_byte(ctx, buf, a, e, 10)


def _find_byte(ctx: _Ctx, buf: bytes, a: int, e: int, byte: int) -> np.ndarray:
    arr = np.frombuffer(buf, np.uint8)
    scratch = ctx.scratch_of(_PIECE)
    parts = []
    for c0 in range(a, e, _PIECE):
        c1 = min(c0 + _PIECE, e)
        m = scratch[: c1 - c0]
        np.equal(arr[c0:c1], byte, out=m)
        parts.append(np.flatnonzero(m) + c0)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _values_and_ts(ctx: _Ctx, cut: _Cut) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, timestamps) for one block's value texts: `v` or `v ts` (Prometheus /federate writes a
    timestamp on every sample), or None when the careful path must judge."""
    n = cut.n
    joined = cut.joined()
    values = _fast_joined(joined, n, cut.vals, cut.val)
    if values is not None:
        return values, np.full(n, ctx.default_ts, np.float64)
    if joined.count(b" ") != 2 * n - 1:  # not one space inside every value text on average
        return None
    # Exactly one space inside *each* value text: counting the total only would let "1 2 3" next to "4"
    # pair values with the wrong lines.
    parts = list(map(bytes.split, cut.vals(), repeat(b" ")))
    if set(map(len, parts)) != {2}:
        return None
    values = _fast_values(list(map(itemgetter(0), parts)), n)
    ts = _fast_values(list(map(itemgetter(1), parts)), n)
    if values is None or ts is None or not np.isfinite(ts).all():
        return None
    return values, ts / ctx.ts_div


def _template_block(ctx: _Ctx, buf: bytes, a: int, nl: int, e: int, bname: bytes) -> tuple[_Cut, np.ndarray] | None:
    """Blocks after the first repeat the same label strings in the same order (one block per field, one
    line per GPU): prove that buf[a:e] (a comment line ending at ``nl``, then sample lines) is exactly
    `bname + labs[i] + b" " + value_i` per line for the previous block's label strings, in place, with
    memcmp-speed operations and no copy of the block.

    Proof. The scan below lists every newline of buf[a:e]; there are n (one per template label) and the
    first ends the comment line, so line i (1..n) is the text between newline i-1 and newline i (or e),
    and holds no newline. Checks: (1) offsets: label i + b" " fits inside line i, starting len(name)
    bytes after its start, with at least one byte after it; (2) the 1 + len(name) + 1 bytes from the
    newline before each line are b"\n" + name + b"{"; (3) the bytes at label i's offset are labsp[i].
    So line i = name + labsp[i] + the rest of the line, and that rest (no newline in it) is value text
    i. (2) and (3) compare every byte, as equal-width rows gathered by numpy and compared with one
    memcmp (``_rows``); the old rebuild-and-compare proved the same by joining the expected text (a
    20 MB copy per block) after a regex pass for the values. A single wrong byte anywhere changes a
    newline (count or place), a name, a label, or a value text (the value readers then judge it);
    tests/test_exposition_proof.py checks every such corruption against the careful parser."""
    t = ctx.template
    if t is None:
        return None
    n = len(t.labs)
    # Piece by piece, so that each piece of text is read from memory once and is still in the CPU cache
    # for the name and label compares and the gathering of its value texts.
    arr = np.frombuffer(buf, np.uint8)
    scratch = ctx.scratch_of(_PIECE)
    needle = b"\n" + bname + b"{"
    skip = 1 + len(bname)
    lens = t.lens
    parts: list[np.ndarray] = []
    pieces: list[bytes] = []  # the value texts, each with the space before it, gathered piece by piece
    got = 0
    tail = np.zeros(0, np.int64)  # the newline before the one line whose end is not known yet
    for c0 in range(a, e, _PIECE):
        c1 = min(c0 + _PIECE, e)
        m = scratch[: c1 - c0]
        np.equal(arr[c0:c1], 10, out=m)
        nls = np.flatnonzero(m) + c0
        k = nls.shape[0]
        if got + k > n:
            return None
        if k:
            lab_at = nls + skip
            if int((lab_at + lens[got : got + k]).max()) > e:  # (a label past the end: not this block)
                return None
            if _rows(buf, skip + 1, nls) != needle * k or not _labels_at(t, buf, lab_at, got):
                return None
            known = np.concatenate((tail, nls))  # lines got - len(tail) .. got + k - 2 now have their end
            i0 = got - tail.shape[0]
            v = _gather(arr, known[:-1] + skip + lens[i0 : got + k - 1], known[1:])
            if v is None:
                return None
            pieces.append(v)
            tail = nls[-1:]
        parts.append(nls)
        got += k
    if got != n or tail.shape[0] == 0:
        return None
    nls = np.concatenate(parts)
    if nls[0] != nl:
        return None
    vs = nls + skip + lens
    ve = np.append(nls[1:], e)
    if not (vs < ve).all():
        return None
    last = _gather(arr, tail + skip + lens[-1:], np.array([e], np.int64))
    if last is None:
        return None
    pieces.append(last)
    return _Cut(t.labs, buf, vs, ve, _joined=b"".join(pieces)[1:]), t.sids


def _labels_at(t: _Template, buf: bytes, lab_at: np.ndarray, i0: int) -> bool:
    """Whether buf holds labsp[i] at lab_at[i - i0] for the lines i0 .. i0 + len(lab_at) - 1 (each row
    inside buf): per label length, one gather of rows and one memcmp against the template's joined
    labels (bytes.startswith at an offset: no copy of either side)."""
    i1 = i0 + lab_at.shape[0]
    if t.groups is None:
        return all(map(buf.startswith, t.labsp[i0:i1], lab_at.tolist()))
    for width, idx, want in t.groups:
        if len(t.groups) == 1:
            j0, j1, at = i0, i1, lab_at
        else:
            j0, j1 = np.searchsorted(idx, (i0, i1)).tolist()
            if j0 == j1:
                continue
            at = lab_at[idx[j0:j1] - i0]
        if not want.startswith(_rows(buf, width, at), j0 * width):
            return False
    return True


_PIECE = 1 << 20  # 1 MiB of text and its scratch: still in cache (here 512 KiB L2, 32 MiB L3) when reused


def _rows(buf: bytes, width: int, at: np.ndarray) -> bytes:
    """buf[at[i] : at[i] + width] for every i, concatenated (every row must lie inside buf): a numpy
    gather of fixed-width rows from a zero-copy view, about twice as fast as a bytes.startswith call per
    row, and compared by the caller with one memcmp."""
    view = np.ndarray((len(buf) - width + 1,), np.dtype((np.void, width)), buf, 0, (1,))
    return view[at].tobytes()


def _gather(arr: np.ndarray, vs: np.ndarray, ve: np.ndarray) -> bytes | None:
    """arr[vs[i] - 1 : ve[i]] for every i, concatenated: value texts each with the byte before it (the
    space after the labels). None if one is empty (vs >= ve: the labels ran into the next line)."""
    w = ve - vs + 1
    if w.shape[0] == 0:
        return b""
    if not (w >= 2).all():
        return None
    idx = np.arange(int(w.sum()), dtype=np.int64) + np.repeat(vs - 1 - (np.cumsum(w) - w), w)
    return arr[idx].tobytes()


_PIECE = 1 << 18  # 256 KiB of text and its scratch fit in a core's 512 KiB L2 cache


def _cut_lines(ctx: _Ctx, buf: bytes, a: int, nl: int, e: int, bname: bytes) -> _Cut | None:
    """Cut the sample lines of buf[a:e] (after the comment line ending at ``nl``) into label strings and
    value texts in place, when every line is `bname{...} value` with exactly one '}'. numpy finds the
    newlines (so the lines, as in ``_template_block``) and the '}'s: n of them, the i-th inside line i
    after its '{' (the label runs from the '{' after the name to it), followed by a space and at least
    one value byte; the name + '{' at every line start is compared as rows (``_rows``). None when that
    does not hold (a '}' inside a label value, a line of another shape)."""
    nls = _newlines(ctx, buf, a, e)
    n = nls.shape[0]
    if n == 0 or nls[0] != nl:
        return None
    br = _find_byte(ctx, buf, nl, e, 125)
    if br.shape[0] != n:
        return None
    lab_at = nls + (1 + len(bname))
    ve = np.append(nls[1:], e)
    vs = br + 2
    if not ((br > lab_at) & (vs < ve)).all():  # (so every row below lies inside its line)
        return None
    if not (np.frombuffer(buf, np.uint8)[br + 1] == 32).all():
        return None
    if _rows(buf, len(bname) + 2, nls) != (b"\n" + bname + b"{") * n:
        return None
    labs = list(map(buf.__getitem__, map(slice, lab_at.tolist(), (br + 1).tolist())))
    return _Cut(labs, buf, vs, ve, lab_at)


def _cut_block(chunk: bytes, bname: bytes) -> _Cut | None:
    """(raw label strings, value texts) of the lines after chunk's first line, all `bname{labels} value`,
    cut with C-level replace/split; None if any line has another shape. The fallback of ``_cut_lines``
    for label values holding '}'."""
    core = chunk.replace(b"\n" + bname + b"{", b"\n{")
    if (len(chunk) - len(core)) % len(bname):
        return None
    r = (len(chunk) - len(core)) // len(bname)  # lines that start with name{
    # "} " -> "}\n\n": each line splits into (labels, b"", value), and the growth counts the splits, so the
    # line count falls out without another pass over the text: lines = pieces - 1 - 2 * splits.
    core2 = core.replace(b"} ", b"}\n\n")
    s = len(core2) - len(core)
    parts = core2.split(b"\n")
    n = len(parts) - 1 - 2 * s
    if not (n == r == s):
        return None  # a line without name{ or "} ", a label value holding "} ", a blank line...
    return _Cut(parts[1::3], _vals=parts[3::3])


def _intern_labels(ctx: _Ctx, labs: list[bytes]) -> np.ndarray | None:
    """Series id of every raw label string, parsing the new ones in bulk; None if any is invalid."""
    known = ctx.sids
    # Nothing known yet (a scrape's first block): every line's string is new, duplicates and all, and
    # series_many gives the ids in line order (a repeated string gets its first id again).
    new = [r for r in dict.fromkeys(labs) if r not in known] if known else labs
    if new:
        _parse_labels_bulk(new, ctx.labels)
        ids = ctx.series_many(new)
        if ids is None:
            return None
        if new is labs:
            return np.array(ids, np.int32)
    return np.fromiter(map(ctx.sids.__getitem__, labs), np.int32, len(labs))


def _split_block(ctx: _Ctx, buf: bytes, a: int, nl: int, e: int, bname: bytes) -> tuple[_Cut, np.ndarray] | None:
    """Cut every line into (raw labels, value), intern the label strings, and keep them as the template
    for the next block."""
    cut = _cut_lines(ctx, buf, a, nl, e, bname) or _cut_block(buf[a:e], bname)
    if cut is None:
        return None
    sids = _intern_labels(ctx, cut.labs)
    if sids is None:
        return None
    ctx.template = _make_template(cut, sids)
    return cut, sids


def _mixed_block(ctx: _Ctx, chunk: bytes, first: int) -> int | None:
    """Lines `name{labels} value` with several names (histograms: _bucket, _sum, _count): cut every line
    into (name, labels, value) with C-level replace/split; None, having added nothing, if unsure."""
    core = chunk.replace(b"{", b"\n{")
    r1 = len(core) - len(chunk)  # one per "{"
    core2 = core.replace(b"} ", b"}\n\n")
    r2 = len(core2) - len(core)  # one per "} "
    parts = core2.split(b"\n")
    n = len(parts) - 1 - r1 - 2 * r2
    if not (n == r1 == r2) or n == 0:
        return None
    names, labs, gaps, vals = parts[1::4], parts[2::4], parts[3::4], parts[4::4]
    if gaps.count(b"") != n:
        return None
    uniq = set(names)
    if any(_NAME_RE.fullmatch(x) is None for x in uniq):
        return None
    vt = _values_and_ts(ctx, _Cut(labs, _vals=vals))
    if vt is None:
        return None
    values, ts = vt
    sids = _intern_labels(ctx, labs)
    if sids is None:
        return None
    name_of = {x: x.decode("ascii") for x in uniq}
    mid_of = {x: ctx.builder.metric_id(nm) for x, nm in name_of.items()}
    mids = np.fromiter(map(mid_of.__getitem__, names), np.int32, n)
    counter_of = {x: ctx.is_counter(nm) for x, nm in name_of.items()}
    counter = np.fromiter(map(counter_of.__getitem__, names), bool, n)
    exact = np.fromiter((x.startswith(b"DCGM_FI_") for x in names), bool, n) if any(
        x.startswith(b"DCGM_FI_") for x in uniq) else False
    bad = ~np.isfinite(values) | blank_sentinel_mask(values, exact) | (counter & (values < 0))
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            nm = name_of[names[i]]
            reason = value_problem(nm, float(values[i]), counter_of[names[i]]) or "invalid value"
            ctx.issue(first + i, reason, names[i] + labs[i] + b" " + vals[i])
        keep = ~bad
        mids, sids, values, ts = mids[keep], sids[keep], values[keep], ts[keep]
        ctx.add_arrays(mids, sids, values, ts, first + np.flatnonzero(keep))
    else:
        ctx.add_arrays(mids, sids, values, ts, first)
    return n
