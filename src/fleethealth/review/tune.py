"""`fleethealth tune`: sweep a policy's thresholds and dwell times against scenarios with ground truth and
labelled recordings, and show the trade-off between quarantine precision and detection time.

Theory of operation
-------------------
A *parameter* is a dotted path into the policy (``lifecycle.quarantine_dwell_s``, ``peer.k_warn``) or into
one signal by name (``signals.sm_clock.k_warn``) with the values to try. The grid is every combination
(the current policy is always point 0). Each point is a policy made by ``with_overrides`` (validated like a
file: an impossible combination, say ``quarantine_below`` above ``degraded_below``, is reported and left
out, not run) and scored on every input:

* a **scenario** runs through ``run_backtest`` (closed loop, the product's own decision loop, no
  baselines); its ground truth gives true and false quarantines and each injected fault's response time;
* a **recording** with **labels** (the incidents an operator labelled in ``fleethealth review``, exported
  with ``review --format json``) replays through ``DecisionLoop``; a quarantine of an entity inside one of
  its incidents labelled ``confirmed`` is true, any other quarantine is false, and a confirmed incident the
  candidate never quarantined is missed.

Figures per point, over all inputs: **precision** = true / all quarantines (None when there were none);
**recall** = faults (or confirmed incidents) acted on / those due; **detection** = the mean over every
fault due (the median is reported beside it) of the time from its onset to the response, a missed fault counting as the time from its onset
to the end of its run (so a point cannot look fast by missing the slow faults). The **Pareto front** holds
the points no other point beats on both precision (higher) and detection (lower) while matching or beating
its recall. Points run in parallel processes (``jobs``); every point is deterministic (the scenarios carry
their seeds), so a sweep is reproducible. Nothing here writes a policy in place: ``candidate_yaml`` gives
the text of a point's policy, which ``policy check`` accepts and ``backtest --policy`` replays.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml

from fleethealth.policy import Policy, PolicyError


class TuneError(ValueError):
    """A parameter, value or input the sweep cannot use; one line naming it."""


@dataclass(frozen=True, slots=True)
class Param:
    path: str
    values: tuple[Any, ...]

    @staticmethod
    def parse(text: str) -> Param:
        """``lifecycle.quarantine_dwell_s=120,300,600``."""
        if "=" not in text:
            raise TuneError(f"{text!r}: expected PATH=V1,V2,... (e.g. lifecycle.quarantine_dwell_s=120,300)")
        path, _, vals = text.partition("=")
        values = tuple(yaml.safe_load(v) for v in vals.split(",") if v.strip())
        if not path.strip() or not values:
            raise TuneError(f"{text!r}: expected PATH=V1,V2,...")
        return Param(path.strip(), values)


def _set(tree: dict[str, Any], path: str, value: Any) -> Any:
    """Set ``path`` in a policy dump; returns the old value. ``signals.NAME.FIELD`` finds a signal by name."""
    parts = path.split(".")
    node: Any = tree
    for i, key in enumerate(parts[:-1]):
        if isinstance(node, list):
            match = [s for s in node if isinstance(s, dict) and s.get("name") == key]
            if not match:
                raise TuneError(f"{path}: no signal named {key!r} in the policy")
            node = match[0]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise TuneError(f"{path}: the policy has no {'.'.join(parts[: i + 1])!r}")
    last = parts[-1]
    if not isinstance(node, dict) or last not in node:
        raise TuneError(f"{path}: the policy has no such setting")
    old = node.get(last)
    node[last] = value
    return old


def with_overrides(policy: Policy, overrides: Mapping[str, Any], version: str | None = None) -> Policy:
    """The policy with the settings changed (validated as a policy file would be)."""
    tree = policy.model_dump(mode="json")
    for path, value in overrides.items():
        _set(tree, path, value)
    if version is not None:
        tree["version"] = version
    try:
        return Policy.model_validate(tree)
    except Exception as e:  # pydantic's ValidationError: say which setting, in one line, for a person
        errors = getattr(e, "errors", None)
        first = errors()[0] if callable(errors) and errors() else None
        where = ".".join(str(x) for x in first["loc"]) if first else ""
        why = str(first["msg"]).removeprefix("Value error, ") if first else str(e).splitlines()[0]
        setting = ", ".join(f"{k}={v}" for k, v in overrides.items())
        raise TuneError(f"{setting}: not a valid policy: {where + ': ' if where else ''}{why}") from None


def candidate_yaml(policy: Policy, overrides: Mapping[str, Any], note: str = "") -> str:
    tree = policy.model_dump(mode="json")
    head = ["# fleethealth policy candidate from `fleethealth tune` (not applied: review, then"
            " `fleethealth backtest --policy` and `fleethealth policy check` it)"]
    head += [f"# {k}: {v}" for k, v in overrides.items()]
    if note:
        head.append(f"# {note}")
    return "\n".join(head) + "\n" + yaml.safe_dump(tree, sort_keys=False, width=110)


# ---- one point ---------------------------------------------------------------------------------------

@dataclass(slots=True)
class InputScore:
    name: str
    quarantines: int = 0
    true_quarantines: int = 0
    due: int = 0
    caught: int = 0
    detections: list[float] = field(default_factory=list)  # per due fault, censored at the run's end
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "quarantines": self.quarantines, "true_quarantines": self.true_quarantines,
                "due": self.due, "caught": self.caught, "detections_s": list(self.detections), "error": self.error}


def score_scenario(policy: Policy, scenario: Any, cycle_s: float = 60.0) -> InputScore:
    from fleethealth.backtest import evaluate, run_backtest

    res = evaluate(run_backtest(scenario, policy, [], cycle_s=cycle_s, closed_loop=True))
    out = InputScore(scenario.name, quarantines=int(res["quarantines"]), true_quarantines=int(res["true_quarantines"]))
    end = float(res["simulated_s"])
    for inc in res.get("incidents", []):
        if not inc.get("faulty", True) or inc.get("expected") in (None, "nothing", "none"):
            continue
        out.due += 1
        # a fault that is due a quarantine is detected when it is removed from service; others on response
        t = inc.get("removal_s") if inc.get("expected") == "quarantine" else inc.get("response_s")
        if inc.get("action_ok") and t is not None:
            out.caught += 1
            out.detections.append(float(t))
        else:
            out.detections.append(max(0.0, end - float(inc["onset_s"])))
    return out


@dataclass(frozen=True, slots=True)
class LabelledIncident:
    entity: str
    start: float
    end: float | None
    confirmed: bool
    onset: float | None = None


def labels_from_review(doc: Mapping[str, Any]) -> list[LabelledIncident]:
    """The labelled incidents of a ``review --format json`` document."""
    out = []
    for inc in doc.get("incidents", []):
        lab = inc.get("label")
        if not lab:
            continue
        out.append(LabelledIncident(str(inc["entity"]), float(inc["start"]),
                                    None if inc.get("end") is None else float(inc["end"]),
                                    lab["label"] == "confirmed", lab.get("onset")))
    return out


def score_recording(policy: Policy, name: str, recording: Any, labels: Sequence[LabelledIncident],
                    slack_s: float = 3600.0) -> InputScore:
    """Replay a recording with the candidate policy and score its quarantines against the labels."""
    from fleethealth.decide.loop import DecisionLoop, replay_cycles
    from fleethealth.decide.model import State

    loop = DecisionLoop(policy)
    quarantines: list[tuple[str, float]] = []
    last = 0.0
    for res in replay_cycles(loop, recording):
        last = res.now
        quarantines += [(t.entity, t.ts) for t in res.decision.transitions if t.to_state == State.QUARANTINED]
    out = InputScore(name, quarantines=len(quarantines))
    confirmed = [lb for lb in labels if lb.confirmed]

    def inside(lb: LabelledIncident, e: str, ts: float) -> bool:
        end = lb.end if lb.end is not None else last
        node = e.split("/", 1)[0]
        return (e == lb.entity or node == lb.entity) and lb.start - slack_s <= ts <= end + slack_s

    out.true_quarantines = sum(1 for e, ts in quarantines if any(inside(lb, e, ts) for lb in confirmed))
    for lb in confirmed:
        out.due += 1
        onset = lb.onset if lb.onset is not None else lb.start
        hits = [ts for e, ts in quarantines if inside(lb, e, ts)]
        if hits:
            out.caught += 1
            out.detections.append(max(0.0, min(hits) - onset))
        else:
            out.detections.append(max(0.0, last - onset))
    return out


@dataclass(slots=True)
class Point:
    index: int
    overrides: dict[str, Any]
    inputs: list[InputScore] = field(default_factory=list)
    error: str | None = None
    front: bool = False

    @property
    def quarantines(self) -> int:
        return sum(i.quarantines for i in self.inputs)

    @property
    def precision(self) -> float | None:
        q = self.quarantines
        return None if q == 0 else sum(i.true_quarantines for i in self.inputs) / q

    @property
    def recall(self) -> float | None:
        due = sum(i.due for i in self.inputs)
        return None if due == 0 else sum(i.caught for i in self.inputs) / due

    @property
    def detection_s(self) -> float | None:
        d = [x for i in self.inputs for x in i.detections]
        return None if not d else float(statistics.fmean(d))

    @property
    def detection_median_s(self) -> float | None:
        d = [x for i in self.inputs for x in i.detections]
        return None if not d else float(statistics.median(d))

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "current": self.index == 0, "overrides": dict(self.overrides),
                "precision": self.precision, "recall": self.recall, "detection_s": self.detection_s,
                "detection_median_s": self.detection_median_s,
                "quarantines": self.quarantines, "front": self.front, "error": self.error,
                "inputs": [i.to_dict() for i in self.inputs]}


def grid(params: Sequence[Param]) -> list[dict[str, Any]]:
    """Every combination, the current policy ({}) first."""
    combos: list[dict[str, Any]] = [{}]
    if params:
        for vals in itertools.product(*(p.values for p in params)):
            combos.append({p.path: v for p, v in zip(params, vals, strict=True)})
    return combos


def pareto(points: Iterable[Point]) -> list[Point]:
    """Mark and return the points that no other point dominates (precision up, detection down, recall no
    lower). A point with no quarantine at all has precision n/a and is on the front only if it catches
    everything another point catches, at least as fast."""
    pts = [p for p in points if p.error is None and p.detection_s is not None]

    def key(p: Point) -> tuple[float, float, float]:
        return (p.precision if p.precision is not None else 1.0, -(p.detection_s or 0.0), p.recall or 0.0)

    front = []
    for p in pts:
        kp = key(p)
        dominated = any(all(a >= b for a, b in zip(key(q), kp, strict=True)) and key(q) != kp for q in pts
                        if q is not p)
        p.front = not dominated
        if p.front:
            front.append(p)
    return sorted(front, key=lambda p: p.detection_s or 0.0)


# ---- the sweep -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Inputs:
    """What every point is scored on: scenario objects and (name, recording snapshot, labels) triples."""

    scenarios: tuple[Any, ...] = ()
    recordings: tuple[tuple[str, Any, tuple[LabelledIncident, ...]], ...] = ()
    cycle_s: float = 60.0


def run_point(policy: Policy, index: int, overrides: dict[str, Any], inputs: Inputs) -> Point:
    pt = Point(index, dict(overrides))
    try:
        pol = policy if not overrides else with_overrides(policy, overrides, f"{policy.version}+tune{index}")
    except (TuneError, PolicyError) as e:
        pt.error = str(e)
        return pt
    for sc in inputs.scenarios:
        try:
            pt.inputs.append(score_scenario(pol, sc, inputs.cycle_s))
        except ValueError as e:
            pt.inputs.append(InputScore(sc.name, error=str(e)))
            pt.error = f"{sc.name}: {e}"
    for name, rec, labels in inputs.recordings:
        pt.inputs.append(score_recording(pol, name, rec, labels))
    return pt


def _run_packed(args: tuple[Policy, int, dict[str, Any], Inputs]) -> Point:
    return run_point(*args)


def sweep(policy: Policy, params: Sequence[Param], inputs: Inputs, jobs: int = 1,
          progress: Callable[[Point, int], None] | None = None) -> list[Point]:
    """Score every grid point (in ``jobs`` processes) and mark the Pareto front."""
    combos = grid(params)
    work = [(policy, i, c, inputs) for i, c in enumerate(combos)]
    points: list[Point] = []
    if jobs <= 1 or len(work) <= 1:
        for w in work:
            points.append(_run_packed(w))
            if progress:
                progress(points[-1], len(work))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            for pt in ex.map(_run_packed, work):
                points.append(pt)
                if progress:
                    progress(pt, len(work))
    pareto(points)
    return points
