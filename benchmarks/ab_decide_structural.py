"""Old vs new decisions and structural signals, side by side in one process on the same inputs.

    python benchmarks/ab_decide_structural.py --rev REV [--scenario noise-only] [--hours 1] [--baselines ...]

Extracts ``src/fleethealth`` at git revision REV into a temporary package ``fleethealth_ref``, runs the
backtest with the working tree's code, and on every decision cycle hands the very same FleetHealth (and
view) to the reference ``Decider.decide`` (with its own state) and ``StructuralTracker.observe`` as well,
alternating which runs first. It stops at the first cycle where the transitions, intents, the whole
decision state, or the derived structural samples (bit for bit), issues and reports differ, and prints
the CPU milliseconds per call of each (median and mean after a few warm-up calls) with a calibration
loop's CPU time (about 13 ms on this machine idle). Scoring and the history are the working tree's for
both: only the decider and the tracker are compared.
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleethealth.bench.calibration import cpu_calibration_ms

WARMUP = 5


def _reference_package(rev: str, into: Path) -> None:
    data = subprocess.run(["git", "archive", rev, "src/fleethealth"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    src = into / "src" / "fleethealth"
    dst = into / "fleethealth_ref"
    src.rename(dst)
    for f in dst.rglob("*.py"):
        text = f.read_text()
        text = re.sub(r"\bfleethealth\.(\w)", r"fleethealth_ref.\1", text)
        text = text.replace("from fleethealth import", "from fleethealth_ref import")
        f.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", required=True, help="git revision of the reference code")
    ap.add_argument("--scenario", default="noise-only")
    ap.add_argument("--hours", type=float, default=1.0, help="noise-only: its duration; others: compressed, "
                    "this long after the last fault")
    ap.add_argument("--baselines", nargs="*", default=[])
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fh-ab-"))
    _reference_package(a.rev, tmp)
    sys.path.insert(0, str(tmp))
    ref_decider: Any = importlib.import_module("fleethealth_ref.decide.decider")
    ref_structural: Any = importlib.import_module("fleethealth_ref.sources.structural")
    ref_policy: Any = importlib.import_module("fleethealth_ref.policy")
    from fleethealth.backtest import run_backtest
    from fleethealth.backtest.runner import compress
    from fleethealth.decide.decider import Decider
    from fleethealth.policy import default_policy
    from fleethealth.signals import history
    from fleethealth.sim import load_scenario
    from fleethealth.sources.structural import StructuralTracker

    if hasattr(ref_structural, "shape_token"):
        ref_structural.shape_token = history.shape_token  # the reference's registry holds no live history
    pol_ref = ref_policy.default_policy()
    times: dict[str, list[float]] = {"decide_new": [], "decide_ref": [], "observe_new": [], "observe_ref": []}
    flips = {"decide": False, "observe": False}
    counts = {"transitions": 0, "intents": 0}

    def both(kind: str, new: Any, ref: Any) -> tuple[Any, Any]:
        flips[kind] = not flips[kind]
        order = ((new, f"{kind}_new"), (ref, f"{kind}_ref"))
        out = {}
        for fn, key in order if flips[kind] else order[::-1]:
            t = time.process_time()
            out[key] = fn()
            times[key].append(time.process_time() - t)
        return out[f"{kind}_new"], out[f"{kind}_ref"]

    new_decide = Decider.decide

    def decide(self: Any, state: Any, health: Any, now: float, events: Any = (), serving: Any = None,
               labels_key: Any = None) -> Any:
        if not hasattr(self, "_ab_ref"):
            self._ab_ref = ref_decider.Decider(pol_ref)
            self._ab_state = ref_decider.DecisionState()
        d, r = both("decide", lambda: new_decide(self, state, health, now, events, serving, labels_key),
                    lambda: self._ab_ref.decide(self._ab_state, health, now, events, serving, labels_key))
        self._ab_state = r.state
        mine = ([x.to_dict() for x in d.transitions], [x.to_dict() for x in d.intents], d.state.to_dict())
        theirs = ([x.to_dict() for x in r.transitions], [x.to_dict() for x in r.intents], r.state.to_dict())
        if mine != theirs:
            part = ["transitions", "intents", "state"][next(k for k in range(3) if mine[k] != theirs[k])]
            raise SystemExit(f"decide differs at {now}: {part}")
        counts["transitions"] += len(d.transitions)
        counts["intents"] += len(d.intents)
        return d

    new_observe = StructuralTracker.observe

    def observe(self: Any, view: Any, now: float, gpu_capacity: Any = None) -> Any:
        if not hasattr(self, "_ab_ref"):
            self._ab_ref = ref_structural.StructuralTracker(
                self.node_labels, self.max_age_s, self.gpu_labels, self.gpu_metric_prefix, self.slow_scrape_s,
                self.future_skew_s)
        r, o = both("observe", lambda: new_observe(self, view, now, gpu_capacity),
                    lambda: self._ab_ref.observe(view, now, gpu_capacity))
        x, y = r.snapshot, o.snapshot
        same = (x.metrics == y.metrics and x.labelsets == y.labelsets and x.issues == y.issues
                and x.source_errors == y.source_errors
                and all(np.array_equal(getattr(x, f), getattr(y, f)) for f in ("metric_ids", "series_ids", "values", "ts"))
                and (r.gpus_now, r.gpus_expected, r.targets_down, r.scrape_seconds)
                == (o.gpus_now, o.gpus_expected, o.targets_down, o.scrape_seconds)
                and self.max_gpus == self._ab_ref.max_gpus and self.target_nodes == self._ab_ref.target_nodes)
        if not same:
            raise SystemExit(f"structural differs at {now}")
        return r

    Decider.decide = decide  # type: ignore[method-assign]
    StructuralTracker.observe = observe  # type: ignore[method-assign]

    sc = load_scenario(a.scenario)
    sc = sc.with_overrides(duration=a.hours * 3600) if not sc.faults or a.scenario == "noise-only" \
        else compress(sc, tail_s=a.hours * 3600, gap_s=3600)
    cal0 = cpu_calibration_ms()
    run_backtest(sc, default_policy(), a.baselines)
    cal1 = cpu_calibration_ms()
    print(f"{a.scenario}, {sc.duration / 3600:.2f} h, baselines {a.baselines or 'none'}; reference {a.rev}; "
          f"calibration {cal0:.0f}/{cal1:.0f} ms")
    for kind in ("decide", "observe"):
        new = np.array(times[f"{kind}_new"][WARMUP:]) * 1000
        ref = np.array(times[f"{kind}_ref"][WARMUP:]) * 1000
        if not new.size:
            continue
        print(f"  {kind}: {len(times[f'{kind}_new'])} calls; ms per call new median {np.median(new):.2f} "
              f"mean {new.mean():.2f}, reference median {np.median(ref):.2f} mean {ref.mean():.2f}; "
              f"reference/new median {np.median(ref) / np.median(new):.2f} mean {ref.mean() / new.mean():.2f}")
    print(f"  identical every cycle ({counts['transitions']} transitions, {counts['intents']} intents, state, "
          "structural samples)")


if __name__ == "__main__":
    main()
