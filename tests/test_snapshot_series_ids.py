"""SnapshotBuilder.series_ids (one pass when all sets are new and distinct, or all known) must intern
exactly as series_id one set at a time: same ids, same label-set list, whatever the mix."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.signals.snapshot import SnapshotBuilder

_SETS = [(), (("gpu", "0"),), (("gpu", "1"),), (("a", "x"), ("gpu", "0")), (("b", "y"),), (("gpu", "2"),)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_SETS), max_size=8), max_size=5))
def test_property_series_ids_equal_one_at_a_time(calls: list[list[tuple[tuple[str, str], ...]]]) -> None:
    bulk, one = SnapshotBuilder(), SnapshotBuilder()
    for sets in calls:
        assert bulk.series_ids(sets) == [one.series_id(ls) for ls in sets]
        assert bulk.labelsets == one.labelsets and bulk._labelset_ix == one._labelset_ix
