"""The engine's state belongs to its caller: no module-level cache in score/ or decide/; a Scorer per
stream keeps what it reuses; two scorers used turn about on two different fleets give what each gives
alone (and what a stateless call gives); dropping a scorer frees what it kept. Real simulator fleets."""

from __future__ import annotations

import ast
import gc
import pathlib
import warnings
import weakref
from typing import Any

import numpy as np

from fleethealth.policy import Policy, default_policy
from fleethealth.score.engine import KINDS, FleetHealth, Scorer, score_snapshot
from fleethealth.signals.history import SignalHistory
from fleethealth.sim import Simulation
from sim_support import small_scenario

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "fleethealth"
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "WeakKeyDictionary",
                  "WeakValueDictionary", "WeakSet", "bytearray"}
_MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard",
             "remove", "appendleft", "move_to_end", "__setitem__"}


def _is_mutable(v: ast.expr) -> bool:
    if isinstance(v, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(v, ast.Call):
        f = v.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in _MUTABLE_CALLS
    return False


def module_caches(path: pathlib.Path) -> list[str]:
    """Module-level names bound to a mutable container that the module's code changes (an item set or
    deleted, a mutating method called, rebound by ``global``), or that start empty (a container kept to
    be filled later): a cache, whatever its name. Constant tables (filled once, only read) pass."""
    tree = ast.parse(path.read_text())
    mutable: dict[str, int] = {}
    found: list[str] = []
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if value is None or not _is_mutable(value):
            continue
        empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", None)
                 and not getattr(value, "elts", None)) or (isinstance(value, ast.Call) and not value.args)
        for t in targets:
            if isinstance(t, ast.Name):
                mutable[t.id] = node.lineno
                if empty:
                    found.append(f"{path.name}:{node.lineno} {t.id} starts empty at module level")
    for node in ast.walk(tree):
        name = None
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                    name = t.value.id
                elif isinstance(t, ast.Name) and isinstance(node, ast.AugAssign):
                    name = t.id
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.attr in _MUTATORS):
            name = node.func.value.id
        elif isinstance(node, ast.Global):
            found.extend(f"{path.name}:{node.lineno} global {n}" for n in node.names if n in mutable)
        if name is not None and name in mutable and not _is_local(tree, node, name):
            found.append(f"{path.name}:{node.lineno} {name} (bound at line {mutable[name]}) is changed")
    return found


def _is_local(tree: ast.Module, node: ast.AST, name: str) -> bool:
    """Whether ``name`` at ``node`` is a function's own variable (assigned or a parameter in it)."""
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if not any(n is node for n in ast.walk(fn)):
            continue
        args = fn.args
        if name in {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}:
            return True
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
                return True
    return False


def test_no_module_level_cache_in_score_or_decide() -> None:
    found = [c for room in ("score", "decide") for p in sorted((SRC / room).glob("*.py")) for c in module_caches(p)]
    assert found == []


def test_the_cache_finder_finds_caches(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("_A: dict[int, int] = {}\n")
    assert module_caches(p)
    p.write_text("_A = {1: 2}\n\ndef f(k):\n    _A[k] = 3\n")
    assert module_caches(p)
    p.write_text("_L = [0]\n\ndef f():\n    _L.append(1)\n")
    assert module_caches(p)
    p.write_text("_C = {1: 2}\nRX = frozenset({'a'})\n\ndef f(k):\n    _C = {}\n    _C[k] = 1\n    return _C\n")
    assert module_caches(p) == []


# --------------------------------------------------------------------------------------------------
# Two fleets, two scorers
# --------------------------------------------------------------------------------------------------
FIELDS = ("value", "confidence", "sub", "cat", "raw", "rate", "z", "age", "n_expected", "n_fresh", "worst")


def _same(a: FleetHealth, b: FleetHealth, where: str) -> None:
    for kind in KINDS:
        ka, kb = a.kinds[kind], b.kinds[kind]
        assert ka.names == kb.names, (where, kind)
        for f in FIELDS:
            x, y = np.asarray(getattr(ka, f), float), np.asarray(getattr(kb, f), float)
            assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True), (where, kind, f)
        assert list(ka.reason) == list(kb.reason), (where, kind)
        assert {k: v for k, v in ka.flags.items() if v} == {k: v for k, v in kb.flags.items() if v}, (where, kind)
        assert ka.notes == kb.notes and dict(ka.worst_member) == dict(kb.worst_member), (where, kind)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b], where


def _fleets() -> list[tuple[Simulation, Policy]]:
    """Two different fleets: the small one with an Xid and a hot GPU under the default policy, a larger
    training-only one under a second policy object (another default, other freshness)."""
    a = small_scenario([{"kind": "xid79_off_bus", "target": "node-01/gpu3", "onset": 300}], seed=3, duration="20m")
    b = small_scenario(seed=8, duration="20m", nodes_per_rack=3, pools=[
        {"name": "train", "nodes": 9, "workload": "training", "jobs": [{"name": "job-b", "pp": 3, "compute_s": 1.5}]}])
    pol_b = default_policy().model_copy(update={"freshness": default_policy().freshness.model_copy(
        update={"max_age_s": 60.0})})
    return [(Simulation(a), default_policy()), (Simulation(b), pol_b)]


def _run(streams: list[tuple[Simulation, Policy]], scorers: list[Scorer] | None, steps: int,
         ) -> list[list[FleetHealth]]:
    """Each stream stepped and scored (remediation and serving) turn about; ``scorers`` None: a
    stateless ``score_snapshot`` per call."""
    hists = [SignalHistory(pol) for _, pol in streams]
    out: list[list[FleetHealth]] = [[] for _ in streams]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(steps):
            for i, ((sim, pol), h) in enumerate(zip(streams, hists, strict=True)):
                h.add(sim.step())
                now = sim.t + 1.0
                view = h.view(now)
                for consumer in ("remediation", "serving"):
                    if scorers is None:
                        fh = score_snapshot(view, pol, now, consumer)
                    else:
                        fh = scorers[i].score(view, pol, now, consumer)
                    out[i].append(fh)
    return out


def test_two_scorers_turn_about_on_two_fleets_equal_each_alone() -> None:
    steps = 40
    fleets = _fleets()
    together = _run(fleets, [Scorer(), Scorer()], steps)
    alone = [_run([f], [Scorer()], steps)[0] for f in _fleets()]
    fresh = [_run([f], None, steps)[0] for f in _fleets()]
    sizes = {len(together[0][-1].kinds["gpu"].names), len(together[1][-1].kinds["gpu"].names)}
    assert len(sizes) == 2  # two fleets of different sizes
    for i in range(2):
        for k, (t, a, f) in enumerate(zip(together[i], alone[i], fresh[i], strict=True)):
            _same(t, a, f"fleet {i} call {k}: together vs alone")
            _same(t, f, f"fleet {i} call {k}: kept vs stateless")
    # the fault is seen: node-01 of the first fleet (its GPU off the bus) is not healthy by the end
    hurt = together[0][-2].tuples["node-01"]
    assert hurt.value is None or hurt.value < 0.5, hurt


def test_one_scorer_on_two_fleets_in_turn_equals_one_each() -> None:
    """A scorer shared by two streams (a caller's mistake) still gives right numbers: what it keeps is
    checked against its inputs, never assumed."""
    steps = 25
    shared = Scorer()
    together = _run(_fleets(), [shared, shared], steps)
    fresh = [_run([f], None, steps)[0] for f in _fleets()]
    for i in range(2):
        for k, (t, f) in enumerate(zip(together[i], fresh[i], strict=True)):
            _same(t, f, f"fleet {i} call {k}")


def test_the_scorer_keeps_its_plan_between_cycles_and_forgets_on_request() -> None:
    (sim, pol), = _fleets()[:1]
    h = SignalHistory(pol)
    s = Scorer()
    plans = []
    for _ in range(6):
        h.add(sim.step())
        s.score(h.view(sim.t + 1.0), pol, sim.t + 1.0)
        plans.append(s.kept.last_plan[0][1])
    assert plans[-1] is plans[-2]  # steady state: the layout plan is reused
    before = s.score(h.view(sim.t + 1.0), pol, sim.t + 1.0)
    s.forget_evaluations()
    assert not s.kept.last_plan and not s.kept.last_evaluation
    _same(s.score(h.view(sim.t + 1.0), pol, sim.t + 1.0), before, "after forget_evaluations")


def test_dropping_a_scorer_frees_what_it_kept() -> None:
    (sim, pol), = _fleets()[:1]
    h = SignalHistory(pol)
    s = Scorer()
    fh: Any = None
    for _ in range(6):
        h.add(sim.step())
        fh = s.score(h.view(sim.t + 1.0), pol, sim.t + 1.0)
    kept = weakref.ref(s.kept)
    plan = weakref.ref(s.kept.last_plan[0][1])
    resolver = weakref.ref(next(iter(s.kept.resolvers.values())))
    assert kept() is not None and plan() is not None
    node_value = fh.tuples["node-01"].value
    del s
    # no reference cycle holds it: freed as soon as the scorer is dropped (before any gc pass)
    assert kept() is None and plan() is None
    gc.collect()
    assert resolver() is None or fh is not None  # the result may keep its own evaluation's resolver
    # a result read after its scorer is gone still reads (its own memory, the same numbers)
    assert fh.tuples["node-01"].value == node_value
    del fh
    gc.collect()
    assert resolver() is None


def test_a_dropped_result_frees_its_view_at_once() -> None:
    """A result read and dropped takes its history view (rows, counter matrices) and scoring context with
    it before any gc pass: nothing in a result refers back to it (its tuples mapping did, a cycle that kept
    a view per cycle alive until the collector ran)."""
    (sim, pol), = _fleets()[:1]
    h = SignalHistory(pol)
    s = Scorer()
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            h.add(sim.step())
            view = h.view(sim.t + 1.0)
            fh = s.score(view, pol, sim.t + 1.0)
            assert fh.tuples["node-01"].entity == "node-01" and len(list(fh)) == len(fh)
            gone = weakref.ref(view), weakref.ref(fh), weakref.ref(fh.meta)
            h.add(sim.step())
            s.score(h.view(sim.t + 1.0), pol, sim.t + 1.0)  # the scorer's memory moves on to the next view
            del view, fh
            assert [r() for r in gone] == [None, None, None]
    finally:
        gc.enable()
