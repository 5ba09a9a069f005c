"""Shared by the structural-signal equality tests."""

from __future__ import annotations

import numpy as np


def same_report(a: object, b: object) -> None:
    """Two trackers' reports are the same: the derived snapshot bit for bit, and every per-node answer in
    the same order."""
    sa, sb = a.snapshot, b.snapshot  # type: ignore[attr-defined]
    assert sa.at == sb.at and sa.metrics == sb.metrics and sa.labelsets == sb.labelsets
    for f in ("metric_ids", "series_ids", "values", "ts"):
        x, y = getattr(sa, f), getattr(sb, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
    assert sa.issues == sb.issues and sa.source_errors == sb.source_errors
    for f in ("gpus_now", "gpus_expected", "targets_down", "scrape_seconds"):
        assert getattr(a, f) == getattr(b, f), f
        assert list(getattr(a, f)) == list(getattr(b, f)), f  # same order too
