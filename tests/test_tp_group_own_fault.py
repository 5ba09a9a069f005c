"""The tensor-parallel rule counts only isolations that still cost capacity (issue 16, decide16b item 2):
while a group-mate is already QUARANTINED the group's job is down, so a second node with evidence of its
own (a reading no other member of its group shares: a silent hang of its ranks) is isolated
at once instead of waiting for the mate's repair; a group whose in-service members degrade together is
still held by the rule (``tp_group_limit``), as are two nodes gated alike at once
(tests/test_decide_safety.py)."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind, State

NODES = 48


def _fleet(bad: dict[int, tuple[float, str]]) -> list:
    out = []
    for i in range(NODES):
        v, why = bad.get(i, (0.97, "min:performance"))
        # no rack label: three nodes of one rack going bad together would be a domain event instead
        out.append(tup(f"n{i:02d}", v, reason=why, labels={"pool": "h100", "tp_group": f"tp{i // 4}",
                                                            "driver_version": "v1"}))
    return out


def _make(onsets: dict[int, tuple[float, float, str]]):
    def make(t: float) -> list:
        return _fleet({n: (v, why) for n, (t0, v, why) in onsets.items() if t >= t0})
    return make


def _quarantined(r: Run, node: str) -> list[float]:
    return [t.ts for t in r.transitions if t.entity == node and t.to_state == State.QUARANTINED]


def test_a_hang_of_its_own_while_a_group_mate_is_quarantined_is_isolated_at_once() -> None:
    r = Run()
    # n08 loses a GPU (a hard gate); 3 min later its group-mate n09's ranks stop (performance at 0) while
    # n10 and n11, the rest of the group, read healthy
    r.steps(0, 3600, 60, _make({8: (600.0, 0.0, "gate:gpus_missing"), 9: (780.0, 0.0, "min:performance")}))
    assert r.st("n08") == State.QUARANTINED  # its repair has not come back: still isolated
    q = _quarantined(r, "n09")
    assert q and q[0] - 780.0 <= 600.0, q  # the lifecycle's own dwell, not the mate's repair
    assert not [i for i in r.of(IntentKind.PAGE) if i.reason == "tp_group_limit"]


def test_a_group_degrading_together_is_still_held() -> None:
    r = Run()
    r.steps(0, 3600, 60, _make({8: (600.0, 0.0, "gate:gpus_missing"), 9: (780.0, 0.0, "min:performance"),
                                10: (780.0, 0.0, "min:performance"), 11: (780.0, 0.0, "min:performance")}))
    assert r.st("n08") == State.QUARANTINED
    for n in ("n09", "n10", "n11"):
        assert not _quarantined(r, n) and r.st(n) == State.DEGRADED
    assert [i.entity for i in r.of(IntentKind.PAGE) if i.reason == "tp_group_limit"][:1] == ["tp_group/tp2"]
