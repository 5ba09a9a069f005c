"""`fleethealth bench scoring`: how long the vectorised engine takes to score a fleet snapshot, against
the seed's scalar per-node algorithm on the same signals (and a check that both agree)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from fleethealth.bench.fleet import synthetic_fleet
from fleethealth.policy import Policy, default_policy
from fleethealth.score.engine import Scorer, score_snapshot
from fleethealth.score.reference import score_reference


def compare(fh: Any, ref: dict[str, Any], tol: float = 1e-9) -> list[str]:
    bad = []
    for entity, r in ref.items():
        t = fh.get(entity)
        if t is None:
            bad.append(f"{entity}: missing from the engine")
            continue
        same_v = (t.value is None and r.value is None) or (
            t.value is not None and r.value is not None and abs(t.value - r.value) <= tol
        )
        if not same_v or abs(t.confidence - r.confidence) > tol or t.reason != r.reason:
            bad.append(f"{entity}: engine {t.value} {t.confidence:.3f} {t.reason} vs scalar {r.value} "
                       f"{r.confidence:.3f} {r.reason}")
    return bad


def bench_scoring(gpus: int, repeats: int = 5, policy: Policy | None = None, scalar: bool = True,
                  seed: int = 0) -> dict[str, Any]:
    pol = policy or default_policy()
    snap = synthetic_fleet(gpus, seed=seed)
    now = snap.at
    scorer = Scorer()  # one stream: what the engine keeps between cycles lives here
    scorer.score(snap, pol, now)  # warm-up: first call resolves label sets (kept across cycles)
    times = []
    cpu = []
    fh = None
    for _ in range(repeats):
        scorer.forget_evaluations()
        t0, c0 = time.perf_counter(), time.process_time()
        fh = scorer.score(snap, pol, now)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    out: dict[str, Any] = {
        "gpus": gpus,
        "signals": len(snap),
        "score_s": statistics.median(times),
        # CPU seconds of this one-threaded process: the one-core figure, robust to other tenants
        "score_cpu_s": statistics.median(cpu),
    }
    # cold: a new snapshot whose label sets the engine has never resolved (a fresh scorer per call)
    snap2 = synthetic_fleet(gpus, seed=seed)
    t0 = time.perf_counter()
    score_snapshot(snap2, pol, now)
    out["score_cold_s"] = time.perf_counter() - t0
    if scalar:
        t0 = time.perf_counter()
        ref = score_reference(snap, pol, now)
        out["scalar_s"] = time.perf_counter() - t0
        mismatches = compare(fh, ref)
        out["equal"] = not mismatches
        out["mismatches"] = mismatches[:10]
        out["compared_entities"] = len(ref)
        out["speedup"] = out["scalar_s"] / out["score_s"] if out["score_s"] > 0 else None
    return out
