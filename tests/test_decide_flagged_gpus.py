"""The decider's flagged GPUs (decide.tuples._flagged_gpus): built from the engine's columns without the
per-signal details, reused across cycles while a row is unchanged, and equal in everything the decider
reads to the engine's full tuples (a fleet-wide flag storm built one full tuple per GPU: ~14 s at 100k)."""

from __future__ import annotations

from fleethealth.decide.tuples import LabelMemo, _lifecycle_and_flagged, _Rows
from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.score.health import HealthTuple
from fleethealth.signals.snapshot import SnapshotBuilder


def _health(t: float, xid: dict[tuple[int, int], float]):  # type: ignore[no-untyped-def]
    b = SnapshotBuilder()
    for n in range(4):
        for g in range(8):
            lab = {"Hostname": f"node-{n}", "gpu": str(g), "modelName": "H100", "UUID": f"GPU-{n}-{g}",
                   "job": f"job-{n % 2}"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, xid.get((n, g), 0.0), t)
    return score_snapshot(b.build(t), default_policy(), t)


def _read(t: HealthTuple) -> tuple[object, ...]:
    """What the decider reads of a GPU tuple."""
    return (t.entity, t.kind, t.flags, dict(t.labels), t.value, t.confidence, t.reason, t.worst, t.worst_member)


def test_flagged_gpus_read_as_the_engine_full_tuples_and_are_reused_while_unchanged() -> None:
    storm = {(n, g): 79.0 for n in range(4) for g in range(8) if (n + g) % 3 == 0}
    h1 = _health(100.0, storm)
    full = [h1.get(h1.kinds["gpu"].names[i]) for i in sorted(h1.kinds["gpu"].flags) if h1.kinds["gpu"].flags[i]]
    assert len(full) == len(storm) and all(t is not None and t.details for t in full)
    memo: LabelMemo = {}
    rows: dict[str, _Rows] = {}
    _, plain = _lifecycle_and_flagged(h1, None, None)  # no memo, no cache: the same reading
    _, first = _lifecycle_and_flagged(h1, memo, rows)
    assert [_read(t) for t in plain] == [_read(t) for t in first] == [_read(t) for t in full if t is not None]
    assert all(not t.details for t in first)  # the details the decider never reads are not built
    # the same columns next cycle: the same tuple objects
    _, again = _lifecycle_and_flagged(h1, memo, rows)
    assert all(a is b for a, b in zip(first, again, strict=True))
    # one GPU's Xid clears, another's starts: the changed rows are new, the rest kept
    storm2 = dict(storm)
    storm2.pop((0, 0))
    storm2[(0, 1)] = 79.0
    h2 = _health(100.0, storm2)
    _, second = _lifecycle_and_flagged(h2, memo, rows)
    full2 = [h2.get(h2.kinds["gpu"].names[i]) for i in sorted(h2.kinds["gpu"].flags) if h2.kinds["gpu"].flags[i]]
    assert [_read(t) for t in second] == [_read(t) for t in full2 if t is not None]
    assert "node-0/gpu0" not in {t.entity for t in second} and "node-0/gpu1" in {t.entity for t in second}
    kept = {t.entity: t for t in first}
    assert any(kept.get(t.entity) is t for t in second)
    # nothing flagged: no tuples and nothing kept
    _, none = _lifecycle_and_flagged(_health(100.0, {}), memo, rows)
    assert none == [] and "gpu:flagged" not in rows
