"""SeenSamples' repeat check with scopes (parse_many's pages): a repeat is one of the same metric, series,
instant and page; a block of other pages skips the earlier parts (the per-metric page mask), and the
mask grows with page numbers beyond its size."""

from __future__ import annotations

import numpy as np

from fleethealth.sources.exposition import parse_many
from fleethealth.sources.exposition_rules import SeenSamples


def _a(*xs: float) -> np.ndarray:
    return np.asarray(xs)


def test_other_pages_never_repeat_and_same_page_does() -> None:
    s = SeenSamples()
    m, sid, t = np.zeros(3, np.int32), np.asarray([1, 2, 3], np.int64), _a(5, 5, 5)
    assert s.first_at_instant(m, sid, t, True, np.asarray([0, 1, 2])) is None
    s.add(m, sid, t, np.asarray([0, 1, 2]))
    # same metric and series ids, same instant, pages 3..5 (a later group): all kept, no sort needed
    assert s.first_at_instant(m, sid, t, True, np.asarray([3, 4, 5])) is None
    s.add(m, sid, t, np.asarray([3, 4, 5]))
    # page 4 again with series 2 at the same instant: a repeat; page 4 series 9: not
    keep = s.first_at_instant(np.zeros(2, np.int32), np.asarray([2, 9]), _a(5, 5), True, np.asarray([4, 4]))
    assert keep is not None and keep.tolist() == [False, True]
    # the same series on page 4 at another instant: kept
    assert s.first_at_instant(np.zeros(1, np.int32), np.asarray([2]), _a(6), True, np.asarray([4])) is None


def test_mask_grows_and_unscoped_parse_still_finds_repeats() -> None:
    s = SeenSamples()
    s.add(np.zeros(1, np.int32), np.asarray([7]), _a(1), np.asarray([0]))
    s.add(np.zeros(1, np.int32), np.asarray([7]), _a(1), np.asarray([5000]))
    keep = s.first_at_instant(np.zeros(2, np.int32), np.asarray([7, 7]), _a(1, 1), True, np.asarray([4999, 5000]))
    assert keep is not None and keep.tolist() == [True, False]
    u = SeenSamples()  # one page (parse_exposition): no scope
    u.add(np.zeros(1, np.int32), np.asarray([3]), _a(2))
    keep = u.first_at_instant(np.zeros(1, np.int32), np.asarray([3]), _a(2), True)
    assert keep is not None and keep.tolist() == [False]


def test_parse_many_repeat_of_a_metric_met_again_later_in_its_page() -> None:
    page = b'a{x="1"} 1\nb{x="1"} 2\na{x="1"} 3\n'
    clean = b'a{x="1"} 4\nb{x="1"} 5\n'
    items = [(clean, {"instance": f"n{i}"}, f"n{i}") for i in range(40)] + [(page, {"instance": "bad"}, "bad")]
    snap = parse_many(items, default_ts=10.0)
    assert len(snap) == 2 * 41
    dup = [i for i in snap.issues if "duplicate sample" in i.reason]
    assert [(i.source, i.line) for i in dup] == [("bad", 3)]
