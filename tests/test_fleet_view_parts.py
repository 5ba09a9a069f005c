"""The fleet view's pure parts, with values: the entity timeline (state spans, score points, the SVG's bands,
line and intent marks, "no record" before the controller's records begin), when a replica reads as
draining, and what a transition into READY says (no alarm-like reason)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from fleethealth.controller.timeline import score_points, state_spans, timeline_svg
from fleethealth.controller.view import _transition_reason, draining, not_yet_routed

T = 1_000_000.0
ROWS = [
    {"ts": T - 100, "entity": "n", "from": "STARTING", "to": "READY", "value": 0.97},
    {"ts": T + 600, "entity": "n", "from": "READY", "to": "DEGRADED", "value": 0.6},
    {"ts": T + 1200, "entity": "n", "from": "DEGRADED", "to": "QUARANTINED", "value": None},
]
INTENTS = [{"ts": T + 1200, "intent": "quarantine", "entity": "n", "reason": "min:thermal"},
           {"ts": T - 500, "intent": "page", "entity": "n", "reason": "old"}]


def test_state_spans_and_score_points_over_a_window() -> None:
    assert state_spans(ROWS, T, T + 1800, "QUARANTINED") == [
        (T, T + 600, "READY"), (T + 600, T + 1200, "DEGRADED"), (T + 1200, T + 1800, "QUARANTINED")]
    assert state_spans([], T, T + 60, "FAILED") == [(T, T + 60, "FAILED")]
    # the score before the window is the last transition's; unknown stays unknown
    assert score_points(ROWS, T, T + 1800, 0.1) == [(T, 0.97), (T + 600, 0.6), (T + 1200, None), (T + 1800, 0.1)]


def test_timeline_svg_bands_line_marks_and_no_record() -> None:
    svg = timeline_svg(ROWS, INTENTS, start=T, end=T + 1800, state_now="QUARANTINED", value_now=0.1)
    assert re.findall(r'class="band" data-state="([A-Z]+)"', svg) == ["READY", "DEGRADED", "QUARANTINED"]
    assert re.findall(r'data-intent="([a-z_]+)"', svg) == ["quarantine"]  # the page before the window is left out
    lines = re.findall(r'class="score"[^>]*points="([^"]+)"', svg)
    assert len(lines) == 2  # broken where the score was unknown
    assert "<script" not in svg and 'viewBox="0 0 420 132"' in svg
    young = timeline_svg(ROWS[1:], [], start=T, end=T + 1800, state_now="QUARANTINED", value_now=None,
                         known_from=T + 300)
    assert re.findall(r'data-state="([a-zA-Z]+)"', young)[:2] == ["none", "READY"]
    assert "no record before" in young


@dataclass
class Ent:
    entity: str
    state: str
    labels: dict[str, str] = field(default_factory=dict)
    weight: float | None = 1.0
    last_reason: str = ""


def test_when_a_replica_reads_as_draining() -> None:
    nodes = {"node-06": "DRAINING", "node-07": "READY", "node-08": "QUARANTINED"}
    assert draining(Ent("r1", "READY", {"node": "node-06"}), nodes) == "draining: its node node-06 is DRAINING"
    assert draining(Ent("r2", "READY", {"node": "node-08"}), nodes) == "draining: its node node-08 is QUARANTINED"
    assert draining(Ent("r3", "READY", {"node": "node-07"}), nodes) == ""
    assert draining(Ent("r4", "QUARANTINED", {"node": "node-07"}, weight=0.0), nodes).startswith(
        "draining: out of routing (weight 0")
    assert draining(Ent("r5", "DRAINING", {}, last_reason="min:serving"), nodes) == "draining: min:serving"


def test_starting_and_warming_replicas_are_not_draining() -> None:
    # QA finding 10: right after a start every replica (WARMING, weight 0) read "draining: out of routing
    # (weight 0, WARMING)", a fleet-wide drain to an SRE. They are not in routing yet; nothing drains them.
    nodes = {"node-06": "DRAINING", "node-07": "READY"}
    for state in ("STARTING", "WARMING"):
        rep = Ent("r", state, {"node": "node-07"}, weight=0.0, last_reason="min:serving")
        assert draining(rep, nodes) == ""
        assert not_yet_routed(rep) == f"{state.lower()}: not in routing yet"
        # its node going away still takes it
        assert draining(Ent("r", state, {"node": "node-06"}, weight=0.0), nodes) == "draining: its node node-06 is DRAINING"
    assert not_yet_routed(Ent("r", "READY", {"node": "node-07"})) == ""
    assert not_yet_routed(Ent("r", "QUARANTINED", {"node": "node-07"}, weight=0.0)) == ""


def test_a_return_to_ready_says_healthy_not_the_worst_category() -> None:
    assert _transition_reason({"from": "WARMING", "to": "READY", "reason": "min:serving", "value": 0.98}) == \
        "healthy (0.98)"
    assert _transition_reason({"from": "READY", "to": "DEGRADED", "reason": "min:thermal", "value": 0.5}) == \
        "min:thermal"


class _Kind:
    def __init__(self, names: list[str], values: list[float]) -> None:
        self.names, self.value = names, values


class _Health:
    def __init__(self, nodes: _Kind, replicas: _Kind | None = None) -> None:
        self.kinds = {"node": nodes} | ({"replica": replicas} if replicas else {})


def test_score_trail_samples_each_minute_keeps_six_hours_and_knows_unknown() -> None:
    from fleethealth.controller.timeline import ScoreTrail

    trail = ScoreTrail(every_s=60, keep_s=600)
    nan = float("nan")
    for k in range(20):  # a cycle every 15 s: one sample a minute is kept
        trail.observe(T + 15 * k, _Health(_Kind(["a", "b"], [1.0 - 0.01 * k, nan if k >= 8 else 0.5])))
    assert list(trail.ts) == [T, T + 60, T + 120, T + 180, T + 240]
    assert trail.series("a", T + 60) == [(T + 60, pytest.approx(0.96)), (T + 120, pytest.approx(0.92)),
                                         (T + 180, pytest.approx(0.88)), (T + 240, pytest.approx(0.84))]
    assert [v for _, v in trail.series("b", T)] == [0.5, 0.5, None, None, None]  # unknown stays unknown
    # a replica appears later: its column is new, earlier rows read it as absent
    trail.observe(T + 300, _Health(_Kind(["a", "b"], [0.8, 0.4]), _Kind(["r1"], [0.9])))
    assert [v for _, v in trail.series("r1", T)] == [None] * 5 + [pytest.approx(0.9)]
    assert trail.series("nobody", T) == []
    trail.observe(T + 1000, _Health(_Kind(["a"], [1.0])))  # older than keep_s goes
    assert trail.ts[0] >= T + 400


def test_timeline_follows_the_samples_with_dots_at_state_changes() -> None:
    samples = [(T + 60 * k, 0.97 - 0.005 * k) for k in range(20)] + [(T + 1260, None), (T + 1320, None)]
    svg = timeline_svg(ROWS, INTENTS, start=T, end=T + 1800, state_now="QUARANTINED", value_now=None,
                       samples=samples)
    lines = re.findall(r'class="score"[^>]*points="([^"]+)"', svg)
    assert len(lines) == 1 and len(lines[0].split()) == 20  # one segment through the known samples
    assert len(re.findall(r'class="at-change"', svg)) == 2  # 0.97 before the window, 0.6 at DEGRADED
