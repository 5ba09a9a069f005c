"""The structural tracker's label-set description (``_describe_many``) reads each label set as
``dict(ls)`` does (the first non-empty node / GPU label, the raw ``instance``), whatever the mix of
lengths, names, repeated names, empty values and kinds of series; and with its vectorised series table
(names and pairs interned by C-level dict and map passes) the tracker's interned ids (node names,
(node, GPU) pairs, in order of first appearance), its memory version and the target -> node pairs it
learns (in the same order) are the ones the one-at-a-time tracker (tests/structural_reference.py) ends
with."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import structural_reference as ref
from fleethealth.signals.snapshot import LabelSet, SnapshotBuilder
from fleethealth.sources.structural import StructuralTracker
from fleethealth.sources.structural_layout import _describe_many
from structural_support import same_report

NODE_LABELS = ("Hostname", "node", "hostname", "instance")
GPU_LABELS = ("gpu", "UUID")


def _one(ls: LabelSet) -> tuple[str | None, str | None, str | None]:
    """The tracker's description of one label set, as it read them one at a time."""
    d = dict(ls)
    node = next((d[k] for k in NODE_LABELS if d.get(k)), None)
    gpu = next((d[k] for k in GPU_LABELS if d.get(k)), None)
    return node, gpu, d.get("instance")


names = st.sampled_from(["Hostname", "node", "hostname", "instance", "gpu", "UUID", "job", "device", "a"])
values = st.sampled_from(["", "n1", "n2", "n1:9400", "0", "1", "GPU-x"])
label_set = st.lists(st.tuples(names, values), max_size=6).map(tuple)
# a few kinds of series repeated many times (a scrape), and odd ones mixed in
kind = st.lists(names, min_size=0, max_size=6)


@st.composite
def scrapes(draw: st.DrawFn) -> list[LabelSet]:
    kinds = draw(st.lists(kind, min_size=1, max_size=4))
    out: list[LabelSet] = []
    for _ in range(draw(st.integers(0, 40))):
        ks = draw(st.sampled_from(kinds))
        out.append(tuple((k, draw(values)) for k in ks))
    odd = draw(st.lists(label_set, max_size=5))
    for ls in odd:
        out.insert(draw(st.integers(0, len(out))), ls)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sets=scrapes())
def test_column_wise_description_is_the_one_at_a_time_one(sets: list[LabelSet]) -> None:
    want = [_one(ls) for ls in sets]
    got = _describe_many(sets, NODE_LABELS, GPU_LABELS)
    assert list(zip(*got, strict=True)) == want


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sets=scrapes(), chunk=st.integers(1, 24))
def test_description_a_chunk_at_a_time_is_the_one_at_a_time_one(sets: list[LabelSet], chunk: int) -> None:
    """Chunks of any size (a page's label sets split between chunks, exporters interleaved in one, odd
    label sets of the same length with other names): the same description."""
    import pytest

    import fleethealth.sources.structural_layout as layout

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layout, "_CHUNK", chunk)
        got = _describe_many(sets, NODE_LABELS, GPU_LABELS)
    assert list(zip(*got, strict=True)) == [_one(ls) for ls in sets]


def test_interleaved_exporters_in_big_chunks() -> None:
    """Thousands of label sets of three shapes interleaved page by page (chunks of mixed lengths, split
    by length), and of two shapes of one length (read one at a time): the same description."""
    sets: list[LabelSet] = []
    for p in range(300):
        sets += [(("Hostname", f"n{p}"), ("gpu", str(g)), ("instance", f"n{p}:9400")) for g in range(8)]
        sets += [(("instance", f"n{p}:9100"), ("job", "node"))]
        sets += [(("node", f"n{p}" if p % 7 else ""), ("UUID", f"GPU-{p}"), ("job", "x"))] * (p % 3)
    got = _describe_many(sets, NODE_LABELS, GPU_LABELS)
    assert list(zip(*got, strict=True)) == [_one(ls) for ls in sets]


def test_many_kinds_of_one_length_and_repeated_names() -> None:
    sets: list[LabelSet] = [(("a", str(i)), ("job", "j"), ("x" + str(i % 13), "v")) for i in range(100)]
    sets += [(("Hostname", ""), ("Hostname", "h"), ("gpu", "")), (("Hostname", "h"), ("Hostname", ""), ("UUID", "u"))]
    sets += [(("node", "n"), ("gpu", "1"), ("instance", ""))] * 20
    got = _describe_many(sets, NODE_LABELS, GPU_LABELS)
    assert list(zip(*got, strict=True)) == [_one(ls) for ls in sets]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(scrapes(), min_size=1, max_size=4))
def test_series_table_interns_as_the_one_at_a_time_tracker(batches: list[list[LabelSet]]) -> None:
    """Label sets arriving in batches (a history's list grows): the same ids, memory and learned targets
    as the reference, and the same report on a view of one sample per label set."""
    _interns_as_the_reference(batches)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(scrapes(), min_size=1, max_size=4), chunk=st.integers(1, 12))
def test_series_table_interns_chunk_by_chunk_as_the_one_at_a_time_tracker(
        batches: list[list[LabelSet]], chunk: int) -> None:
    """The same, the label sets described and interned in chunks of any size (names, instances and GPU
    ids met first in a later chunk, a distinct (target, node) pair's first series in any chunk)."""
    import pytest

    import fleethealth.sources.structural_layout as layout

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layout, "_CHUNK", chunk)
        _interns_as_the_reference(batches)


def _interns_as_the_reference(batches: list[list[LabelSet]]) -> None:
    fast, plain = StructuralTracker(), ref.StructuralTracker()
    b = SnapshotBuilder()
    for i, batch in enumerate(batches):
        t = 100.0 + 15 * i
        for ls in batch:
            b.add("DCGM_FI_DEV_GPU_TEMP", ls, 50.0, t)
        b.add("up", {"instance": "n1:9400", "job": "dcgm"}, 1.0, t)
        v = b.build(t)
        a, c = fast.observe(v, t), plain.observe(v, t)
        same_report(a, c)
        assert fast.target_nodes == plain.target_nodes
        assert {k: list(s) for k, s in fast.target_nodes.items()} == {k: list(s) for k, s in plain.target_nodes.items()}
        assert fast.max_gpus == plain.max_gpus
        assert fast._names == plain._names and list(fast._pair_ix.items()) == list(plain._pair_ix.items())
        assert fast._pair_node == plain._pair_node
        # the memory the controller saves: each node's GPU ids, off the pairs it has seen
        want = {nm: sorted({g for (n, g) in plain._pair_ix if n == nm}) for nm in plain.max_gpus}
        assert {nm: (n, sorted(ids)) for nm, (n, ids) in fast.memory().items()} == {
            nm: (n, want[nm]) for nm, n in plain.max_gpus.items()}
    # one memory bump per new (node, GPU) pair, the batches' label sets described as the list grows
    tr = StructuralTracker()
    grown: list[LabelSet] = []
    for batch in batches:
        grown.extend(ls for ls in dict.fromkeys(batch) if ls not in grown)
        tr._series(grown)
    pairs = list(dict.fromkeys((n, g) for n, g, _ in map(_one, grown) if n is not None and g is not None))
    assert tr.memory_version == len(pairs) and list(tr._pair_ix) == pairs
    assert tr._pair_node == [tr._name_ix[n] for n, _ in pairs]


def test_a_layout_is_built_when_first_seen_and_kept_while_steady() -> None:
    """A history view's layout is built on its first cycle (no cycle reads it pair by pair first), and
    the same layout object serves the cycles after while the fleet is steady."""
    from fleethealth.policy import default_policy
    from fleethealth.signals.history import SignalHistory

    h = SignalHistory(default_policy(), memory_s=600.0)
    tr, plain = StructuralTracker(max_age_s=90), ref.StructuralTracker(max_age_s=90)
    lays = []
    for i in range(5):
        t = 1_000.0 + 15 * i
        b = SnapshotBuilder()
        for g in range(4):
            b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": "a", "gpu": str(g), "instance": "a:9400"}, 50.0, t)
        b.add("up", {"instance": "a:9400", "job": "dcgm"}, 1.0, t)
        h.add(b.build(t))
        v = h.view(t)
        r = tr.observe(v, t)
        same_report(r, plain.observe(v, t))
        assert tr._layout is not None and tr._layout.built
        lays.append(tr._layout)
        h.add(r.snapshot)
    assert lays[2] is lays[3] is lays[4]


def test_a_gpu_missing_from_one_metric_while_another_metric_went_stale() -> None:
    """GPU 0 holds the newest sample of a metric no longer scraped (stale) and an older sample than GPU 1
    of a fresh one: it is absent from the read just made, in the row path and the index path alike
    (the stale metric's newest sample says nothing about now)."""
    from fleethealth.policy import default_policy
    from fleethealth.signals.history import SignalHistory

    def scrape(t: float, gpus: tuple[int, ...], metric: str) -> object:
        b = SnapshotBuilder()
        for g in gpus:
            b.add(metric, {"Hostname": "a", "gpu": str(g), "instance": "a:9400"}, 50.0, t)
        return b.build(t)

    h = SignalHistory(default_policy(), memory_s=600.0)
    tr, plain = StructuralTracker(max_age_s=90), ref.StructuralTracker(max_age_s=90)
    steps = [(1000.0, (0, 1), "DCGM_FI_DEV_MEM_CLOCK"), (1000.0, (0, 1), "DCGM_FI_DEV_GPU_TEMP"),
             (1050.0, (0,), "DCGM_FI_DEV_MEM_CLOCK"), (1200.0, (0, 1), "DCGM_FI_DEV_GPU_TEMP"),
             (1215.0, (1,), "DCGM_FI_DEV_GPU_TEMP")]
    for t, gpus, metric in steps:
        h.add(scrape(t, gpus, metric))  # type: ignore[arg-type]
        v = h.view(t)
        r = tr.observe(v, t)
        same_report(r, plain.observe(v, t))
        h.add(r.snapshot)
    assert r.gpus_now == {"a": 1} and r.gpus_expected == {"a": 2}


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_layouts_newest_time_per_node_is_the_scatter_max(data: st.DataObject) -> None:
    """``_Layout.newest``: for every node it is asked for, the same as a scatter-max of the entries'
    times per node slot, whether every node has an entry at the newest time (no scatter) or not, NaN and
    -inf times included; asked again with the same or other times (the slots at the newest time kept
    while the entries at it are the same), the same."""
    import numpy as np

    from fleethealth.sources.structural_layout import _Layout

    n_slots = data.draw(st.integers(1, 6))
    times = st.sampled_from([100.0, 100.0, 100.0, 85.0, -np.inf, float("nan")])
    nb, na = data.draw(st.integers(0, 12)), data.draw(st.integers(0, 12))
    lay = _Layout.__new__(_Layout)
    lay.b_node = np.array(data.draw(st.lists(st.integers(0, n_slots - 1), min_size=nb, max_size=nb)), np.int32)
    lay.a_node = np.array(data.draw(st.lists(st.integers(0, n_slots - 1), min_size=na, max_size=na)), np.int32)
    lay._n_slots, lay._top = n_slots, None
    bt = np.array(data.draw(st.lists(times, min_size=nb, max_size=nb)), np.float64)
    ta = np.array(data.draw(st.lists(times, min_size=na, max_size=na)), np.float64)
    for _ in range(3):
        if data.draw(st.booleans()):  # other times (else the same again)
            bt = np.array(data.draw(st.lists(times, min_size=nb, max_size=nb)), np.float64)
            ta = np.array(data.draw(st.lists(times, min_size=na, max_size=na)), np.float64)
        need = np.array(data.draw(st.lists(st.booleans(), min_size=n_slots - 1, max_size=n_slots - 1)), bool)
        want = np.full(n_slots, -np.inf)
        with np.errstate(invalid="ignore"):  # (NaN times)
            np.maximum.at(want, lay.b_node, bt)
            np.maximum.at(want, lay.a_node, ta)
            got = lay.newest(bt, ta, need)
        np.testing.assert_array_equal(got[:-1][need], want[:-1][need])
