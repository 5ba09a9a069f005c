"""The structural tracker's cold-cycle shortcuts answer as the plain passes they replace:

- ``_learn_targets`` (C-level where every target is new and carries one node) leaves ``target_nodes`` as
  one ``setdefault(target, set()).add(node)`` per pair, in order, would: keys, sets and their order;
- ``_Layout.build`` (a block with the same series as the block before copies its bitmap row and node
  slots, kept once per run of such blocks) gives the bitmap of a scatter block by block and the node slots of a gather of every entry;
- ``_Layout.newest`` over such runs (the elementwise maximum of a run's times, scattered once) is the
  scatter-max over every entry (NaN and -inf times included).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder
from fleethealth.sources.structural import StructuralTracker

targets = st.sampled_from(["t1:9400", "t2:9400", "t3:9400", "t4:9400", ""])
nodes = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=300, deadline=None)
@given(prior=st.dictionaries(targets, st.sets(nodes, min_size=1), max_size=3),
       pairs=st.lists(st.tuples(targets, nodes), max_size=12, unique=True))
def test_learning_targets_is_one_setdefault_add_per_pair(prior: dict[str, set[str]],
                                                          pairs: list[tuple[str, str]]) -> None:
    tr = StructuralTracker()
    tr.target_nodes = {k: set(v) for k, v in prior.items()}
    want = {k: set(v) for k, v in prior.items()}
    for inst, node in pairs:
        want.setdefault(inst, set()).add(node)
    ids = {t: i for i, t in enumerate(dict.fromkeys(t for t, _ in pairs))}
    table = SimpleNamespace(inst=[t for t, _ in pairs], node=[n for _, n in pairs],
                            inst_id=np.array([ids[t] for t, _ in pairs], np.int64))
    tr._learn_targets(table, np.arange(len(pairs)))  # type: ignore[arg-type]
    assert tr.target_nodes == want
    assert list(tr.target_nodes) == list(want)
    assert {k: list(s) for k, s in tr.target_nodes.items()} == {k: list(s) for k, s in want.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scrapes=st.lists(st.dictionaries(st.sampled_from(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK",
                                                          "DCGM_FI_DEV_POWER_USAGE", "up"]),
                                         st.sets(st.integers(0, 5), max_size=6), min_size=1),
                        min_size=1, max_size=3))
def test_layout_copies_of_repeated_blocks_are_the_plain_scatter_and_gather(
        scrapes: list[dict[str, set[int]]]) -> None:
    """Metrics over the same GPUs (blocks with the same series, copied) and over others (scattered)."""
    h = SignalHistory(default_policy(), memory_s=600.0)
    tr = StructuralTracker(max_age_s=90)
    for i, scrape in enumerate(scrapes):
        t = 1_000.0 + 15 * i
        b = SnapshotBuilder()
        for metric, gpus in scrape.items():
            for g in sorted(gpus):
                b.add(metric, {"Hostname": f"n{g % 2}", "gpu": str(g), "instance": f"n{g % 2}:9400"}, 1.0, t)
        h.add(b.build(t))
        v = h.view(t)
        r = tr.observe(v, t)
        lay = tr._layout
        if lay is not None and lay.built:
            st_ = tr._table
            assert st_ is not None
            node_of = st_.node_of()
            slot = np.where(node_of >= 0, node_of, st_.rank_n)
            ix = v.index_upto(t + tr.future_skew_s)
            assert ix is not None
            bs = np.concatenate([ix.rows(v, a, e)[0] for a, e, _ in lay.blocks] or [np.zeros(0, np.int32)])
            np.testing.assert_array_equal(lay._entries(), bs)  # (kept run by run)
            assert lay._same_entries(bs) and (not bs.size or not lay._same_entries(bs[::-1] + 1))
            want_b = slot[bs]
            want_seen = np.zeros((max(len(v.metrics), 1), max(len(v.labelsets), 1)), bool)
            at = 0
            for a, e, m in lay.blocks:
                want_seen[m][bs[at:at + e - a]] = True
                if masks_target(tr, v.metrics)[m]:
                    want_b[at:at + e - a] = st_.rank_n
                at += e - a
            for (_, ranges, _), s, vv in zip(lay.cgroups, lay.g_series, lay.g_valid, strict=True):
                for c0, c1, m in ranges:
                    want_seen[m][s[c0:c1] if vv is None else s[c0:c1][vv[c0:c1]]] = True
            assert lay._b_runs is not None
            parts, pos, at = [], 0, 0
            for a, n, k in lay._b_runs:  # runs tile the entries; each run's slots kept once
                assert a == pos
                parts.append(np.tile(lay.b_node[at:at + n], k))
                pos, at = pos + n * k, at + n
            assert pos == bs.size and at == lay.b_node.size
            np.testing.assert_array_equal(np.concatenate(parts) if parts else want_b[:0], want_b)
            np.testing.assert_array_equal(lay._seen, want_seen.reshape(-1))
        h.add(r.snapshot)


def masks_target(tr: StructuralTracker, metrics: list[str]) -> np.ndarray:
    return tr._metric_masks(metrics)[3]


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_layouts_newest_over_runs_of_blocks_is_the_scatter_max(data: st.DataObject) -> None:
    from fleethealth.sources.structural_layout import _Layout

    n_slots = data.draw(st.integers(1, 6))
    times = st.sampled_from([100.0, 100.0, 100.0, 85.0, -np.inf, float("nan")])
    runs, slots, per_entry = [], [], []
    pos = 0
    for _ in range(data.draw(st.integers(0, 4))):
        n, k = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4))
        s = data.draw(st.lists(st.integers(0, n_slots - 1), min_size=n, max_size=n))
        runs.append((pos, n, k))
        slots += s
        per_entry += s * k
        pos += n * k
    na = data.draw(st.integers(0, 6))
    lay = _Layout.__new__(_Layout)
    lay.b_node, lay._b_runs = np.array(slots, np.int32), runs
    lay.a_node = np.array(data.draw(st.lists(st.integers(0, n_slots - 1), min_size=na, max_size=na)), np.int32)
    lay._n_slots, lay._top = n_slots, None
    for _ in range(3):
        bt = np.array(data.draw(st.lists(times, min_size=pos, max_size=pos)), np.float64)
        ta = np.array(data.draw(st.lists(times, min_size=na, max_size=na)), np.float64)
        need = np.array(data.draw(st.lists(st.booleans(), min_size=n_slots - 1, max_size=n_slots - 1)), bool)
        want = np.full(n_slots, -np.inf)
        with np.errstate(invalid="ignore"):  # (NaN times)
            np.maximum.at(want, np.array(per_entry, np.int64), bt)
            np.maximum.at(want, lay.a_node, ta)
            got = lay.newest(bt, ta, need)
        np.testing.assert_array_equal(got[:-1][need], want[:-1][need])
