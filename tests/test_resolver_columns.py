"""The resolver reads label sets column by column, in chunks (score/resolve.py ``_Resolver.update``): the
same entity keys, in the same order of first appearance, and the same grouping values as reading each
label set on its own, including exported_<name> labels a scraper displaced and label sets without a
node label."""

from __future__ import annotations

import random

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


def _reference(sets: list[tuple[tuple[str, str], ...]]) -> tuple[list[str], dict[str, list[int]], dict[str, list[str]]]:
    keys: dict[str, int] = {}
    cols: dict[str, list[int]] = {k: [] for k in resolve.KINDS}
    groups: dict[str, list[str]] = {k: [] for k in GROUPING}

    def kid(name: str) -> int:
        return keys.setdefault(name, len(keys))

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
        cols["gpu"].append(kid(f"gpu:{node}/gpu{g}") if node and g else -1)
        rep = next((d[k] for k in REPLICA_LABELS if d.get(k)), None)
        cols["replica"].append(kid("replica:" + rep) if rep else -1)
        job, rank = exposed_label(d, "job"), d.get("rank")
        cols["rank"].append(kid(f"rank:{job}/rank{rank}") if job and rank else -1)
    return list(keys), cols, groups


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
