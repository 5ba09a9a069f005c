"""`fleethealth backtest`: a scenario through the product's decision loop and the baselines, scored against
ground truth."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from fleethealth.cli.common import fail, load_policy_or_fail, load_scenario_or_fail

METRIC_ROWS = [
    ("precision", "{:.3f}"), ("recall", "{:.3f}"), ("detection_s", "dur"), ("removal_s", "dur"),
    ("quarantines", "{}"), ("false_quarantines", "{}"), ("flaps_per_node_day", "{:.3f}"),
    ("transitions_per_node_day", "{:.3f}"), ("pages", "{}"), ("tickets", "{}"),
    ("budget_exhaustions", "{}"), ("job_slowdown_gpu_h", "{:.1f}"),
]
# Rows printed under another name than their JSON key.
METRIC_LABELS = {"job_slowdown_gpu_h": "job GPU-h lost, slow undetected"}


def _fmt(v: Any, f: str) -> str:
    if v is None:
        return "n/a" if f == "{:.3f}" else "-"  # precision with nothing quarantined
    if f == "dur":
        return dur(v)
    return f.format(v)


def dur(s: float) -> str:
    """Seconds for people: 45s, 12.5 min, 6.5 h."""
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def load_inputs(scenario: str, policy: Path | None, duration: str | None, seed: int | None,
                nodes: int | None = None) -> tuple[Any, Any]:

    sc = load_scenario_or_fail(scenario, duration, seed, nodes)
    return sc, load_policy_or_fail(policy)


def parse_baselines(values: list[str] | None) -> list[str]:
    from fleethealth.backtest.arms import BASELINES

    if not values:
        return list(BASELINES)
    out: list[str] = []
    for v in values:
        for b in v.split(","):
            b = b.strip()
            if not b:
                continue
            if b == "none":
                return []
            if b == "all":
                return list(BASELINES)
            if b not in BASELINES:
                fail(f"unknown baseline {b!r}: expected {', '.join(BASELINES)}, all or none")
            out.append(b)
    return out


def print_table(result: dict[str, Any]) -> None:
    arms = [("fleethealth", result)] + list(result.get("baselines", {}).items())
    typer.echo(f"scenario {result['scenario']}: {result['gpus']} GPUs, {result['simulated_s'] / 3600:.1f} h simulated, "
               f"decisions every {result['cycle_s']:.0f} s; {result['cpu_s']:.1f} CPU s "
               f"({result['gpu_hours_per_cpu_s']:.0f} GPU-h per CPU s); "
               + (f"closed loop, {result.get('world_actions', 0)} actions applied to fleethealth's world"
                  if result.get("closed_loop") else "open loop"))
    w = max(12, *(len(n) for n, _ in arms))
    kw = max(len(METRIC_LABELS.get(k, k)) for k, _ in METRIC_ROWS) + 2
    typer.echo(f"{'metric':<{kw}}" + "".join(f"{n:>{w + 2}}" for n, _ in arms))
    for key, f in METRIC_ROWS:
        typer.echo(f"{METRIC_LABELS.get(key, key):<{kw}}" + "".join(f"{_fmt(m.get(key), f):>{w + 2}}" for _, m in arms))
    typer.echo("")
    for name, m in arms:
        t = m.get("targets", {})
        bad = [k for k, ok in t.items() if not ok]
        typer.echo(f"{name:<16} targets: {'all met' if not bad else 'MISSED ' + ', '.join(bad)}")
    incs = result.get("incidents", [])
    if incs:
        typer.echo("\ninjected faults (fleethealth):")
        for r in incs:
            resp = "no response" if r["response_s"] is None else f"response {dur(r['response_s'])}"
            rem = "" if r["removal_s"] is None else f", removed {dur(r['removal_s'])}"
            typer.echo(f"  {'ok ' if r['action_ok'] else 'MISS'} {r['fault']:<26} {r['node']:<10} "
                       f"onset {r['onset_s'] / 3600:5.2f}h expect {r['expected']:<16} {resp}{rem}")
    for q in result.get("false_quarantine_list", []):
        typer.echo(f"  false quarantine {q['entity']} at {q['ts_s'] / 3600:.2f}h: {q['why']}")


def print_kpis(result: dict[str, Any]) -> None:
    from fleethealth.review.kpis import summary_table, text_table

    kpis = result.get("kpis")
    if kpis:
        typer.echo("\nfleet KPIs (fleethealth):")
        typer.echo(text_table(summary_table(kpis)))
        typer.echo("node GPU-hours lost: GPU-hours of nodes isolated, of unknown health or slow (DEGRADED), what "
                   "removing a node costs;\njob GPU-h lost, slow undetected (above): what the jobs lost while a "
                   "faulty node ran slow and was not yet removed.")


def load_result(path: Path) -> dict[str, Any]:
    """A backtest's JSON output (``--format json``); a file that is not one is a one-line error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror or e}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"{path}: not a backtest JSON file ({e.__class__.__name__}: {str(e).splitlines()[0][:120]})")
    if not isinstance(data, dict) or not isinstance(data.get("kpis"), dict):
        fail(f"{path}: no fleet KPIs in it (write it with `fleethealth backtest -s NAME --format json`)")
    return data


def compare_results(before: Path, after: Path, fmt: str) -> None:
    from fleethealth.review.kpis import compare, compare_table, text_table

    a, b = load_result(before), load_result(after)
    rows = compare(a["kpis"], b["kpis"])
    if not rows:
        fail(f"{before} and {after} have no pool in common")
    if fmt == "json":
        typer.echo(json.dumps({"before": str(before), "after": str(after), "rows": rows}, indent=1))
        return
    typer.echo(f"before: {before} (scenario {a.get('scenario', '?')}, policy {a.get('policy_version', '?')})")
    typer.echo(f"after:  {after} (scenario {b.get('scenario', '?')}, policy {b.get('policy_version', '?')})")
    typer.echo(text_table(compare_table(rows)))
    worse = sum(1 for r in rows if r["verdict"] == "worse")
    better = sum(1 for r in rows if r["verdict"] == "better")
    typer.echo(f"\n{better} figures better, {worse} worse")


def progress_printer(total_s: float, label: str, every_s: float = 3600.0) -> Callable[[float], None]:
    """Prints to stderr (never into --format json's stdout) each time another ``every_s`` of simulated
    time has passed: how far, and how long it has taken so far."""
    t0 = time.monotonic()
    state: dict[str, float | None] = {"first": None, "next": every_s}

    def tick(now: float) -> None:
        if state["first"] is None:
            state["first"] = now
        done = now - float(state["first"] or now)
        nxt = float(state["next"] or every_s)
        if done + 1e-9 >= nxt:
            state["next"] = (done // every_s + 1) * every_s
            pct = 100.0 * done / total_s if total_s > 0 else 0.0
            sys.stderr.write(f"backtest {label}: {done / 3600:.0f} h of {total_s / 3600:.3g} h simulated "
                             f"({pct:.0f}%), {time.monotonic() - t0:.0f} s so far\n")
            sys.stderr.flush()

    return tick


def parse_decision_arms(values: list[str] | None, baselines: list[str]) -> list[str]:
    """Arms whose decisions ``--decisions`` writes: the product's by default; ``all`` is the product and
    every baseline run. A baseline asked for here is run even if ``--baseline`` left it out."""
    from fleethealth.backtest.arms import BASELINES, PRODUCT

    out: list[str] = []
    for v in values or [PRODUCT]:
        for a in (x.strip() for x in v.split(",")):
            if not a:
                continue
            if a == "all":
                return [PRODUCT] + [b for b in BASELINES if b in baselines]
            if a != PRODUCT and a not in BASELINES:
                fail(f"--decisions-arm: unknown arm {a!r}: expected {PRODUCT}, {', '.join(BASELINES)} or all")
            if a not in out:
                out.append(a)
    return out


def _json_safe(v: Any) -> Any:
    """Intent params as JSON: numpy numbers as plain numbers, NaN/inf as null (strict JSON has neither)."""
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def write_decisions(records: list[dict[str, Any]], path: Path) -> None:
    """One JSON object per line, keys sorted: the same run writes the same bytes."""
    try:
        with path.open("w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(_json_safe(r), sort_keys=True, allow_nan=False) + "\n")
    except OSError as e:
        fail(f"{path}: cannot write decisions: {e.strerror or e}")


def register(app: typer.Typer) -> None:
    @app.command("backtest")
    def backtest(
        scenario: Annotated[str | None, typer.Option("--scenario", "-s", help="built-in scenario name or YAML file")]
        = None,
        policy: Annotated[Path | None, typer.Option("--policy", help="policy YAML (default: the shipped one)")]
        = None,
        baseline: Annotated[list[str] | None, typer.Option(
            "--baseline", "-b",
            help="baselines to compare (repeat or comma-separate): static-rules, liveness-only, weighted-mean, "
                 "no-confidence; 'all' (default) or 'none'")] = None,
        fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
        compare_files: Annotated[tuple[Path, Path] | None, typer.Option(
            "--compare", help="compare the fleet KPIs of two earlier runs' JSON outputs (before, after), pool "
                              "by pool; no scenario is run")] = None,
        progress: Annotated[bool, typer.Option(
            "--progress/--no-progress", help="report progress on stderr every simulated hour")] = True,
        report: Annotated[Path | None, typer.Option("--report", help="write a self-contained HTML report")] = None,
        decisions: Annotated[Path | None, typer.Option(
            "--decisions", help="write the decision log (every transition and intent, time-ordered, with "
                                "reason and params) as JSON lines")] = None,
        decisions_arm: Annotated[list[str] | None, typer.Option(
            "--decisions-arm", help="whose decisions --decisions writes (repeat or comma-separate): "
                                    "fleethealth (default), a baseline's name, or all")] = None,
        duration: Annotated[str | None, typer.Option("--duration", help="override the scenario's duration")]
        = None,
        seed: Annotated[int | None, typer.Option("--seed", help="override the scenario's seed")] = None,
        nodes: Annotated[int | None, typer.Option(
            "--nodes", help="run the scenario on a fleet of about this many nodes (pools scaled, rounded to "
                            "whole racks; each fault on the same place of its pool)")] = None,
        cycle: Annotated[float, typer.Option("--cycle", help="decision cycle in simulated seconds (plus one "
                                                             "on every Xid/OOM event)")] = 60.0,
        compress_gaps: Annotated[str | None, typer.Option(
            "--compress", help="cut quiet hours: faults start 30 min in, at most this far apart, and the run "
                               "ends this long after the last one (e.g. 90m); for quick runs")] = None,
        open_loop: Annotated[bool, typer.Option(
            "--open-loop", help="decisions do not act on the simulated world (every arm sees the same "
                                "telemetry); default: closed loop, each arm's actions change its own world")]
        = False,
    ) -> None:
        """Replay a scenario through the same decision loop as production and score the outcome against
        ground truth: quarantine precision/recall, detection and removal times, flapping, pages, budgets,
        GPU-hours lost; baselines side by side on the same telemetry."""
        if fmt not in ("table", "json"):
            fail(f"--format must be table or json, not {fmt!r}")
        if compare_files is not None:
            compare_results(compare_files[0], compare_files[1], fmt)
            return
        if scenario is None:
            fail("give a scenario (--scenario NAME or FILE), or --compare BEFORE.json AFTER.json")
        if cycle <= 0:
            fail("--cycle must be positive")
        if decisions_arm and decisions is None:
            fail("--decisions-arm chooses whose decisions --decisions FILE writes: give --decisions FILE too")
        from fleethealth.backtest import BASELINES, evaluate, run_backtest
        from fleethealth.backtest.report import write_report
        from fleethealth.review.kpis import SloSampler

        sc, pol = load_inputs(scenario, policy, duration, seed, nodes)
        if compress_gaps is not None:
            from fleethealth.backtest.runner import compress
            from fleethealth.sim.scenario import parse_duration

            try:
                gap = parse_duration(compress_gaps)
            except ValueError as e:
                fail(f"--compress: {e}")
            sc = compress(sc, tail_s=gap, gap_s=gap)
        bl = parse_baselines(baseline)
        dec_arms = parse_decision_arms(decisions_arm, bl)
        bl += [a for a in dec_arms if a in BASELINES and a not in bl]  # asked for: run it
        from fleethealth.sim.fleet import build_fleet

        fleet = build_fleet(sc.fleet, sc.seed)  # the same fleet the run builds: replicas and their pools
        slo = SloSampler({r.name: fleet.node_pool[r.node] for r in fleet.replicas})
        tick = progress_printer(sc.duration, sc.name) if progress else None

        def on_cycle(now: float, res: Any, _log: Any) -> None:
            slo.observe(now, res.health)
            if tick is not None:
                tick(now)

        try:
            run = run_backtest(sc, pol, bl, cycle_s=cycle, closed_loop=not open_loop, on_cycle=on_cycle)
        except ValueError as e:
            fail(f"{sc.name}: {e}")
        result = evaluate(run, slo=slo.attainment())
        if decisions is not None:
            from fleethealth.backtest.runner import decision_records

            write_decisions(decision_records(run, dec_arms), decisions)
            result["decisions"] = str(decisions)
        if report is not None:
            try:
                p = write_report(run, result, report)
            except OSError as e:
                fail(f"{report}: cannot write report: {e.strerror or e}")
            result["report"] = str(p)
        if fmt == "json":
            typer.echo(json.dumps(result, indent=1, default=str))
        else:
            print_table(result)
            print_kpis(result)
            if report is not None:
                typer.echo(f"\nreport: {result['report']}")
            if decisions is not None:
                typer.echo(f"decisions ({', '.join(dec_arms)}): {decisions}")
