"""The resolver reads label sets column by column, in chunks (score/resolve.py ``_Resolver.update``): the
same entity keys, in the same order of first appearance, and the same grouping values as reading each
label set on its own, including exported_<name> labels a scraper displaced and label sets without a
node label. The key ids are handed out per kind by display name and merged back into the order of first
appearance (node, gpu, replica, rank per label set): the same ids, display names and gpu -> node keys as
the loop over label sets that handed out one name at a time, also with inventory keys (``_kid``) between
updates; the peer-group ids (``group_ids``, one or several labels) are those of a loop over the label
sets."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.score import resolve
from fleethealth.score.resolve import UNNAMED_NODE, _Resolver, exposed_label

NODE_LABELS = ("Hostname", "node", "instance")
REPLICA_LABELS = ("replica", "pod", "instance")
GROUPING = ("pool", "job", "modelName")


def _label_sets(n: int, seed: int) -> list[tuple[tuple[str, str], ...]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d: dict[str, str] = {}
        if rng.random() < 0.8:
            d[rng.choice(NODE_LABELS)] = f"n{rng.randrange(20)}"
        if rng.random() < 0.7:
            d["gpu"] = str(rng.randrange(8))
        for k in ("pool", "job", "modelName", "pod", "rank"):
            if rng.random() < 0.4:
                d[k] = f"{k}{rng.randrange(3)}"
        for k in ("job", "pool"):
            if rng.random() < 0.15:
                d["exported_" + k] = f"x{k}{rng.randrange(2)}"
        d["i"] = str(i)  # distinct label sets
        out.append(tuple(sorted(d.items())))
    return out


class _Ref:
    """The loop the resolver replaced: one label set at a time, one key name at a time."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.node: list[int] = []  # key id -> node key id (gpu keys), else -1

    def kid(self, name: str, node: int = -1) -> int:
        if name not in self.keys:
            self.keys[name] = len(self.keys)
            self.node.append(node)
        return self.keys[name]


def _reference(sets: list[tuple[tuple[str, str], ...]], ref: _Ref | None = None,
               ) -> tuple[list[str], dict[str, list[int]], dict[str, list[str]]]:
    ref = ref if ref is not None else _Ref()
    cols: dict[str, list[int]] = {k: [] for k in resolve.KINDS}
    groups: dict[str, list[str]] = {k: [] for k in GROUPING}
    kid = ref.kid

    for ls in sets:
        d = dict(ls)
        for k in GROUPING:
            groups[k].append(exposed_label(d, k))
        node = next((d[k] for k in NODE_LABELS if d.get(k)), None)
        g = d.get("gpu")
        if not node and g:
            node = UNNAMED_NODE
        nk = kid("node:" + node) if node else -1
        cols["node"].append(nk)
        cols["gpu"].append(kid(f"gpu:{node}/gpu{g}", nk) if node and g else -1)
        rep = next((d[k] for k in REPLICA_LABELS if d.get(k)), None)
        cols["replica"].append(kid("replica:" + rep) if rep else -1)
        job, rank = exposed_label(d, "job"), d.get("rank")
        cols["rank"].append(kid(f"rank:{job}/rank{rank}") if job and rank else -1)
    return list(ref.keys), cols, groups


def test_columns_read_as_each_label_set_alone() -> None:
    sets = _label_sets(5000, seed=7)
    r = _Resolver(NODE_LABELS, REPLICA_LABELS, GROUPING)
    r.update(sets[:1234])  # in two steps, the second across several chunks
    r.update(sets)
    names, cols, groups = _reference(sets)
    assert r.key_names == names
    assert {k: r.cols[k] for k in resolve.KINDS} == cols
    assert {k: r._label_cols[k][0] for k in GROUPING} == groups
    assert {k: r._label_cols[k][1] for k in GROUPING} == {
        k: [bool(dict(ls).get("exported_" + k)) for ls in sets] for k in GROUPING}


def _group_reference(sets: list[tuple[tuple[str, str], ...]], labels: tuple[str, ...]) -> tuple[list[int], list[tuple[str, ...]]]:
    keys: dict[tuple[str, ...], int] = {}
    ids = [keys.setdefault(tuple(exposed_label(dict(ls), k) for k in labels), len(keys)) for ls in sets]
    return ids, list(keys)


def _check(r: _Resolver, sets: list[tuple[tuple[str, str], ...]], ref: _Ref, cols: dict[str, list[int]]) -> None:
    assert r.key_names == list(ref.keys)
    assert r.n_keys == len(ref.keys)
    assert r.display == [k.split(":", 1)[1] for k in ref.keys]
    assert r.key_node == ref.node
    assert r.key_node_arr.tolist() == ref.node
    assert {k: r.cols[k] for k in resolve.KINDS} == cols
    for labels in (("pool",), ("job",), ("modelName", "pool"), ("pool", "job", "modelName")):
        if r.labelsets is None:  # nothing resolved yet: no groups to ask for
            break
        ids, values = _group_reference(sets, labels)
        assert r.group_ids(labels).tolist() == ids
        assert r.group_values(labels) == values


def test_keys_and_groups_as_the_loop_hands_them_out() -> None:
    sets = _label_sets(6000, seed=11)
    r = _Resolver(NODE_LABELS, REPLICA_LABELS, GROUPING)
    ref = _Ref()
    cols: dict[str, list[int]] = {k: [] for k in resolve.KINDS}
    for lo, hi in ((0, 700), (700, 4100), (4100, 6000)):
        r.update(sets[:hi])  # the list as a history grows it
        _, got, _ = _reference(sets[lo:hi], ref)
        for k in resolve.KINDS:
            cols[k] += got[k]
        _check(r, sets[:hi], ref, cols)
        # an inventory's names between updates (context._entity_tables): the same ids as the loop's
        assert r._kid("node", f"inv{lo}") == ref.kid(f"node:inv{lo}")
        nk = ref.keys["node:n3"] if "node:n3" in ref.keys else ref.kid("node:n3")
        assert r._kid("node", "n3") == nk
        assert r._kid("gpu", f"n3/gpu{lo}", nk) == ref.kid(f"gpu:n3/gpu{lo}", nk)
        assert r._kid("replica", "pod1") == ref.kid("replica:pod1")


def test_one_chunk_per_label_set_and_uniform_sets() -> None:
    """Chunks of one label set, and a fleet of like label sets (a page per node: chunks read transposed),
    as the big one."""
    sets = _label_sets(300, seed=3)
    fleet = [tuple(sorted({"Hostname": f"h{i // 8}", "gpu": str(i % 8), "instance": f"h{i // 8}:9400",
                           "modelName": "H100", "i": str(i)}.items())) for i in range(400)]
    # like label sets with a training job's ranks, the scrape's job displaced to exported_job on some
    ranks = [tuple(sorted({"node": f"h{i // 8}", "gpu": str(i % 8), "rank": str(i), "job": "scrape",
                           "exported_job": f"train{i % 3}" if i % 5 else "", "pool": "p",
                           "exported_pool": "" if i % 2 else "xp"}.items())) for i in range(300)]
    for data in (sets, fleet, ranks, sets + fleet, fleet + sets, fleet + ranks):
        for chunk in (1, 7, resolve._UPDATE_CHUNK):
            old_chunk = resolve._UPDATE_CHUNK
            resolve._UPDATE_CHUNK = chunk
            try:
                r = _Resolver(NODE_LABELS, REPLICA_LABELS, GROUPING)
                r.update(data)
            finally:
                resolve._UPDATE_CHUNK = old_chunk
            ref = _Ref()
            _, cols, groups = _reference(data, ref)
            _check(r, data, ref, cols)
            assert {k: r._label_cols[k][0] for k in GROUPING} == groups


_VALUES = st.sampled_from(["", "a", "b", "c", "a:1", "a/gpu1"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["Hostname", "node", "instance", "gpu", "pod", "replica", "rank",
                                                 "job", "exported_job", "pool", "exported_pool", "modelName"]),
                                _VALUES, max_size=7), max_size=40),
       st.integers(1, 40))
def test_any_label_sets_resolve_as_the_loop(dicts: list[dict[str, str]], split: int) -> None:
    """Any label sets (empty values, values that look like other keys, a node/gpu name that reads as
    another's), updated in two steps: the loop's keys, ids, display names, gpu -> node keys and groups."""
    sets = list(dict.fromkeys(tuple(sorted(d.items())) for d in dicts))
    ref = _Ref()
    _, cols, groups = _reference(sets, ref)
    old_chunk = resolve._UPDATE_CHUNK
    for chunk in (old_chunk, 1, 3):  # chunks of one label set: each read transposed (same labels)
        resolve._UPDATE_CHUNK = chunk
        try:
            r = _Resolver(NODE_LABELS, REPLICA_LABELS, GROUPING)
            r.update(sets[:split])
            r.update(sets)
        finally:
            resolve._UPDATE_CHUNK = old_chunk
        _check(r, sets, ref, cols)
        assert {k: r._label_cols[k][0] for k in GROUPING} == groups
        assert {k: r._label_cols[k][1] for k in GROUPING} == {
            k: [bool(dict(ls).get("exported_" + k)) for ls in sets] for k in GROUPING}
        if sets:
            assert np.array_equal(r.arr["gpu"], np.asarray(cols["gpu"], np.int64))
