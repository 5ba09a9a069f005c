"""`fleethealth tune`: sweep thresholds and dwell times over scenarios and labelled recordings; print the
precision / detection-time trade-off (the Pareto front) with the policy diff of each point. Never writes
the policy in place: candidates go to ``--out-dir``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from fleethealth.cli.common import fail, load_policy_or_fail, load_scenario_or_fail

DEFAULT_PARAMS = ["lifecycle.quarantine_dwell_s=120,300,600", "lifecycle.degraded_dwell_s=60,120,300"]


def _fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f} s" if x < 5400 else f"{x / 3600:.1f} h"


def _diff(ov: dict[str, Any]) -> str:
    return "current policy" if not ov else ", ".join(f"{k}={v}" for k, v in ov.items())


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune(
        scenario: list[str] = typer.Option([], "--scenario", "-s", help="Built-in scenario or YAML (repeat)."),
        recording: list[Path] = typer.Option([], "--recording", help="A recording to replay (repeat; needs"
                                                                     " --labels)."),
        labels: Path | None = typer.Option(None, "--labels", help="`fleethealth review --format json` output whose"
                                                                  " labelled incidents judge the recordings."),
        param: list[str] = typer.Option([], "--param", "-p", help="PATH=V1,V2,... (repeat), e.g."
                                        " lifecycle.quarantine_dwell_s=120,300 or signals.sm_clock.k_warn=2.5,3"),
        policy: Path | None = typer.Option(None, "--policy", help="The policy to start from (default: shipped)."),
        compress_gaps: str | None = typer.Option("90m", "--compress", help="Cut scenarios' quiet hours (faults"
                                                 " 30 min in, at most this far apart); 'none' for full length."),
        jobs: int = typer.Option(0, "--jobs", "-j", help="Parallel processes (default: the CPU count)."),
        cycle: float = typer.Option(60.0, "--cycle", help="Decision cycle in simulated seconds."),
        fmt: str = typer.Option("table", "--format", help="table or json."),
        out_dir: Path | None = typer.Option(None, "--out-dir", help="Write each front point's policy here."),
    ) -> None:
        """Sweep the policy's thresholds and dwell times and show the precision / detection-time trade-off."""
        from fleethealth.review.tune import (
            Inputs,
            Param,
            TuneError,
            candidate_yaml,
            labels_from_review,
            sweep,
            with_overrides,
        )

        if fmt not in ("table", "json"):
            fail(f"--format must be table or json, not {fmt!r}")
        if not scenario and not recording:
            fail("nothing to tune on: give --scenario and/or --recording with --labels")
        if recording and labels is None:
            fail("--recording needs --labels (a `fleethealth review --format json` file with labelled incidents)")
        pol = load_policy_or_fail(policy)
        try:
            params = [Param.parse(p) for p in (param or DEFAULT_PARAMS)]
        except TuneError as e:
            fail(str(e))
        for p in params:  # a path that does not exist fails before any point runs
            try:
                with_overrides(pol, {p.path: p.values[0]})
            except TuneError as e:
                if "the policy has no" in str(e) or "no signal named" in str(e):  # any missing path part
                    fail(str(e))
        scs = [load_scenario_or_fail(s) for s in scenario]
        if compress_gaps and compress_gaps != "none":
            from fleethealth.backtest.runner import compress
            from fleethealth.sim.scenario import parse_duration

            try:
                gap = parse_duration(compress_gaps)
            except ValueError as e:
                fail(f"--compress: {e}")
            scs = [compress(sc, tail_s=gap, gap_s=gap) for sc in scs]
        recs: list[tuple[str, Any, tuple[Any, ...]]] = []
        if recording:
            from fleethealth.cli.cmd_replay import read_recording

            try:
                labelled = tuple(labels_from_review(json.loads(Path(str(labels)).read_text())))
            except (OSError, ValueError, KeyError, TypeError) as e:
                fail(f"{labels}: not a review JSON document: {e}")
            if not labelled:
                fail(f"{labels}: no labelled incident (label some with `fleethealth review-label`)")
            for r in recording:
                try:
                    recs.append((str(r), read_recording([str(r)]), labelled))
                except Exception as e:  # the readers raise one-line errors
                    fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
        n_jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
        inputs = Inputs(tuple(scs), tuple(recs), cycle)

        def progress(pt: Any, total: int) -> None:
            if fmt == "table":
                typer.echo(f"  point {pt.index + 1}/{total} done", err=True)

        points = sweep(pol, params, inputs, jobs=n_jobs, progress=progress)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            for pt in points:
                if pt.front and pt.error is None:
                    cand = pol if not pt.overrides else with_overrides(pol, pt.overrides,
                                                                       f"{pol.version}+tune{pt.index}")
                    (out_dir / f"point-{pt.index}.yaml").write_text(candidate_yaml(cand, pt.overrides, (
                        f"precision {_fmt_pct(pt.precision)}, recall {_fmt_pct(pt.recall)}, median detection"
                        f" {_fmt_s(pt.detection_s)} on {', '.join(i.name for i in pt.inputs)}")))
        if fmt == "json":
            typer.echo(json.dumps({"inputs": [s.name for s in scs] + [r[0] for r in recs],
                                   "points": [p.to_dict() for p in points]}, indent=1))
            return
        typer.echo(f"tuned on {', '.join([s.name for s in scs] + [r[0] for r in recs])}: {len(points)} points")
        typer.echo(f"{'':2}{'#':>3}  {'precision':>9}  {'recall':>6}  {'detection':>9}  {'quar.':>5}  policy change")
        for pt in points:
            mark = ("*" if pt.front else " ") + ("=" if pt.index == 0 else " ")
            if pt.error is not None:
                typer.echo(f"{mark}{pt.index:>3}  {'invalid':>9}  {'':>6}  {'':>9}  {'':>5}  {_diff(pt.overrides)}:"
                           f" {pt.error}")
                continue
            typer.echo(f"{mark}{pt.index:>3}  {_fmt_pct(pt.precision):>9}  {_fmt_pct(pt.recall):>6}  "
                       f"{_fmt_s(pt.detection_s):>9}  {pt.quarantines:>5}  {_diff(pt.overrides)}")
        typer.echo("* on the Pareto front (precision up, detection down, recall no lower); = the current policy")
        cur = points[0]
        better = [p for p in points if p.front and p.index != 0 and p.error is None
                  and (p.precision or 1.0) >= (cur.precision or 1.0) and (p.recall or 0) >= (cur.recall or 0)
                  and (p.detection_s or 0.0) < (float("inf") if cur.detection_s is None else cur.detection_s)]
        if cur.front and not better:
            typer.echo("suggestion: keep the current policy (it is on the front and nothing beats it on all three)")
        elif better:
            b = min(better, key=lambda p: p.detection_s or 0.0)
            typer.echo(f"suggestion: point {b.index} ({_diff(b.overrides)}): detection {_fmt_s(b.detection_s)} vs"
                       f" {_fmt_s(cur.detection_s)}, precision {_fmt_pct(b.precision)} vs {_fmt_pct(cur.precision)},"
                       f" recall {_fmt_pct(b.recall)} vs {_fmt_pct(cur.recall)}"
                       + (f"; candidate {out_dir / f'point-{b.index}.yaml'}" if out_dir else ""))
        else:
            typer.echo("suggestion: none dominates the current policy on all three; pick a front point by what a"
                       " false quarantine costs you against a slower detection")
