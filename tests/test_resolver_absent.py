"""``_Resolver.group_ids`` for labels none of the new label sets has (``_absent_from``: one tuple of "",
no exported flag, nothing spelled out per label set): on random streams of label sets read in random
chunks and updates, the same ids, exported flags and group values as the path that spells the labels
out per label set, for labels present, absent, present only in some updates, and combinations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.score import resolve
from fleethealth.score.resolve import _Resolver
from test_resolver_cold import _streams
from test_resolver_columns import NODE_LABELS, REPLICA_LABELS

_GROUPING = ("pool", "job", "modelName", "peer_group")
_ASKED = (("pool",), ("job",), ("modelName",), ("peer_group",), ("peer_group", "pool"), ("modelName", "peer_group"),
          ("job", "pool", "peer_group"))


class _Spelled(_Resolver):
    def _absent_from(self, label: str, start: int) -> bool:
        return False  # always the path that spells the labels out


@settings(max_examples=150, deadline=None)
@given(_streams(), st.integers(1, 9), st.lists(st.floats(0, 1), max_size=4), st.integers(0, 2**16))
def test_absent_labels_give_the_spelled_out_ids(sets: list[tuple[tuple[str, str], ...]], chunk: int,
                                                cuts: list[float], order: int) -> None:
    old_chunk = resolve._UPDATE_CHUNK
    resolve._UPDATE_CHUNK = chunk
    try:
        a = _Resolver(NODE_LABELS, REPLICA_LABELS, _GROUPING)
        b = _Spelled(NODE_LABELS, REPLICA_LABELS, _GROUPING)
        lo = 0
        for step, hi in enumerate(sorted({int(c * len(sets)) for c in cuts} | {len(sets)})):
            if hi <= lo:
                continue
            a.update(sets[:hi])
            b.update(sets[:hi])
            # asked in a different order each update: ids are handed out in order of asking per tuple
            k = (order + step) % len(_ASKED)
            for labels in _ASKED[k:] + _ASKED[:k]:
                assert a.group_ids(labels).tolist() == b.group_ids(labels).tolist()
                assert a.group_exported(labels).tolist() == b.group_exported(labels).tolist()
                assert a.group_values(labels) == b.group_values(labels)
            lo = hi
    finally:
        resolve._UPDATE_CHUNK = old_chunk
