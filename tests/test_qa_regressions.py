"""Regressions QA found on inputs nobody on the team wrote, each pinned by the smallest input that shows it."""

from __future__ import annotations

import pytest

from fleethealth.review.kpis import EntityInfo, pool_kpis, state_seconds

DAY = 86400.0


def test_a_past_period_is_not_in_the_state_an_entity_took_later() -> None:
    # A node quarantined at day 14 (its store holds nothing older): `kpis --compare -14d..-7d` read the week
    # before as 168 h in QUARANTINED (its current state), 1344 GPU-h lost to isolated nodes, verdict 'better'.
    trs = [{"ts": 14 * DAY, "entity": "n", "kind": "node", "from": "READY", "to": "QUARANTINED",
            "reason": "gate:xid", "detail": ""}]
    ents = {"n": EntityInfo("node", "train-a", 8, "QUARANTINED")}
    assert state_seconds(trs, ents, 0.0, 7 * DAY) == {"n": {"READY": 7 * DAY}}
    k = pool_kpis(trs, [], ents, start=0.0, end=7 * DAY)["train-a"]
    assert k.lost_isolated_gpu_h == 0.0
    # inside and after the transition the current state still counts
    assert state_seconds(trs, ents, 15 * DAY, 16 * DAY) == {"n": {"QUARANTINED": DAY}}
    assert pool_kpis(trs, [], ents, start=13 * DAY, end=15 * DAY)["train-a"].lost_isolated_gpu_h == pytest.approx(8 * 24)
