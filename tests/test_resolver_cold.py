"""The resolver's cold path (score/resolve.py ``_Resolver._update_chunk``): each kind's new values are
written into its dict with the id they take if every value of the chunk is new, and renumbered when some
were known already. On random streams of label sets (runs of like label sets read transposed, mixed
ones read as dicts, values seen before, inventory keys between updates, any chunk size), the keys, ids,
gpu -> node keys, per-label-set columns, peer groups and their exported_<name> flags are those of the loop
over label sets."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.score import resolve
from fleethealth.score.resolve import _Resolver
from test_resolver_columns import GROUPING, NODE_LABELS, REPLICA_LABELS, _check, _Ref, _reference

_NODES = [f"n{i}" for i in range(6)]


@st.composite
def _streams(draw: st.DrawFn) -> list[tuple[tuple[str, str], ...]]:
    out: list[tuple[tuple[str, str], ...]] = []
    for _ in range(draw(st.integers(1, 8))):
        shape = draw(st.sampled_from(["page", "node", "mixed"]))
        n = draw(st.integers(1, 12))
        if shape == "page":  # a dcgm-exporter page: like label sets, a GPU each (some repeated)
            node = draw(st.sampled_from(_NODES))
            model = draw(st.sampled_from(["", "H100", "A100"]))
            for g in draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)):
                out.append((("Hostname", node), ("gpu", str(g)), ("instance", f"{node}:9400"),
                            ("modelName", model)))
        elif shape == "node":  # a tracker's node info
            out += [(("node", draw(st.sampled_from(_NODES))),) for _ in range(n)]
        else:  # anything: with or without node, gpu, job, rank, pod, exported_ labels
            for _ in range(n):
                d: dict[str, str] = {}
                for k, vals in (("Hostname", _NODES), ("instance", _NODES), ("gpu", ["0", "1", ""]),
                                ("job", ["j0", "j1"]), ("exported_job", ["x0", ""]), ("rank", ["0", "1"]),
                                ("pod", ["p0", "p1"]), ("pool", ["a", "b"]), ("exported_pool", ["xa", ""]),
                                ("modelName", ["H100"])):
                    if draw(st.booleans()):
                        d[k] = draw(st.sampled_from(vals))
                out.append(tuple(sorted(d.items())))
    return out


@settings(max_examples=150, deadline=None)
@given(sets=_streams(), chunk=st.sampled_from([1, 2, 3, 5, 8, 64, 2048]), cuts=st.lists(st.floats(0, 1), max_size=3),
       inv=st.booleans())
def test_cold_path_hands_out_the_loops_keys(sets: list[tuple[tuple[str, str], ...]], chunk: int, cuts: list[float],
                                             inv: bool) -> None:
    old_chunk = resolve._UPDATE_CHUNK
    resolve._UPDATE_CHUNK = chunk
    try:
        r = _Resolver(NODE_LABELS, REPLICA_LABELS, GROUPING)
        ref = _Ref()
        cols: dict[str, list[int]] = {k: [] for k in resolve.KINDS}
        lo = 0
        for hi in sorted({int(c * len(sets)) for c in cuts} | {len(sets)}):
            if hi <= lo:
                continue
            r.update(sets[:hi])  # the list as a history grows it
            _, got, _ = _reference(sets[lo:hi], ref)
            for k in resolve.KINDS:
                cols[k] += got[k]
            _check(r, sets[:hi], ref, cols)
            for labels in (("pool",), ("job",), ("job", "pool")):  # incremental, added to the kept flags
                assert r.group_exported(labels).tolist() == [
                    any(dict(ls).get("exported_" + k) for k in labels) for ls in sets[:hi]]
            if inv:  # inventory names between updates: later label sets find them known
                nk = r._kid("node", "n1")
                assert nk == ref.kid("node:n1")
                assert r._kid("gpu", "n1/gpu1", nk) == ref.kid("gpu:n1/gpu1", nk)
                assert r._kid("replica", "p1") == ref.kid("replica:p1")
            lo = hi
    finally:
        resolve._UPDATE_CHUNK = old_chunk


def test_a_cold_fleet_resolves_as_the_loop() -> None:
    """A fleet of pages of eight GPUs and the tracker's node label sets after them, as a cold 100k-GPU
    cycle sees them (here 2,000 GPUs, chunks of 64), pickled and read back (new string objects)."""
    sets: list[tuple[tuple[str, str], ...]] = []
    for node in range(250):
        h = ("Hostname", f"node-{node:05d}")
        inst = ("instance", f"node-{node:05d}:9400")
        sets += [(("DCGM_FI_DRIVER_VERSION", "550"), h, ("gpu", str(g)), inst) for g in range(8)]
    sets += [(("node", f"node-{node:05d}"),) for node in range(250)]
    sets = pickle.loads(pickle.dumps(sets))
    old_chunk = resolve._UPDATE_CHUNK
    resolve._UPDATE_CHUNK = 64
    try:
        r = _Resolver(NODE_LABELS, REPLICA_LABELS, GROUPING)
        r.update(sets)
    finally:
        resolve._UPDATE_CHUNK = old_chunk
    ref = _Ref()
    _, cols, _ = _reference(sets, ref)
    _check(r, sets, ref, cols)
