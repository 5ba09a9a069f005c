"""`fleethealth demo`: a simulated fleet with scripted faults through the full loop (signals, scores,
decisions, intents) at accelerated time, with a live terminal view and an HTML report at the end. No
network, no GPU."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from fleethealth.cli.common import fail, load_policy_or_fail


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        scenario: Annotated[str | None, typer.Option("--scenario", "-s", help="built-in scenario or YAML file "
                                                     "(default: the demo's own 256-GPU fleet, 4 h)")] = None,
        duration: Annotated[str | None, typer.Option("--duration", help="override the simulated duration "
                                                     "(e.g. 30m)")] = None,
        speed: Annotated[float, typer.Option("--speed", help="at most this many times real time "
                                             "(0: as fast as the machine goes)")] = 0.0,
        cycle: Annotated[float, typer.Option("--cycle", help="decision cycle, simulated seconds (two scrapes, as a live controller runs)")] = 30.0,
        live: Annotated[bool, typer.Option("--live/--no-live", help="live terminal view, or plain lines "
                                           "for CI and logs")] = True,
        report: Annotated[Path, typer.Option("--report", help="where to write the HTML report")]
        = Path("fleethealth-demo.html"),
        baseline: Annotated[list[str] | None, typer.Option(
            "--baseline", "-b", help="baselines in the report (default: the two rule baselines, which cost "
                                     "nothing; 'all' adds the engine variants, 'none')")] = None,
        policy: Annotated[Path | None, typer.Option("--policy", help="policy YAML")] = None,
    ) -> None:
        """Run a simulated fleet with injected faults through fleethealth and show what it does."""
        from fleethealth.backtest import evaluate, run_backtest
        from fleethealth.backtest.demo import demo_scenario, live_state_for, pacer, plain_line, render_live
        from fleethealth.backtest.report import write_report
        from fleethealth.cli.cmd_backtest import load_inputs, parse_baselines
        from fleethealth.sim.scenario import parse_duration

        if cycle <= 0:
            fail("--cycle must be positive")
        if scenario is not None:
            sc, pol = load_inputs(scenario, policy, duration, None)
        else:
            sc = demo_scenario()
            if duration is not None:
                try:
                    sc = sc.with_overrides(duration=parse_duration(duration))
                except ValueError as e:
                    fail(f"--duration: {e}")
            pol = load_policy_or_fail(policy)
        bl = parse_baselines(baseline) if baseline else ["static-rules", "liveness-only"]
        ls = live_state_for(sc, pol)
        pace = pacer(speed, sc.start)
        gpus = sum(p.nodes for p in sc.fleet.pools) * sc.fleet.gpus_per_node
        head = (f"fleethealth demo: {sc.name}, {gpus} GPUs, {sc.duration / 3600:.1f} h simulated, "
                f"{len(sc.faults)} injected faults; decisions every {cycle:.0f} s")
        wall0 = time.perf_counter()
        live_ctx: Any = None
        if live:
            from rich.console import Console
            from rich.live import Live

            console = Console()
            console.print(head)
            live_ctx = Live(render_live(ls, sc), console=console, refresh_per_second=4, transient=False)
            live_ctx.start()
        else:
            typer.echo(head)

        def on_cycle(now: float, res: Any, log: Any) -> None:
            ls.update(now, res)
            if live_ctx is not None:
                live_ctx.update(render_live(ls, sc))
            else:
                for line in plain_line(ls, res):
                    typer.echo(line)
            pace(now)

        try:
            run = run_backtest(sc, pol, bl, cycle_s=cycle, on_cycle=on_cycle)
        except ValueError as e:
            fail(f"{sc.name}: {e}")
        finally:
            if live_ctx is not None:
                live_ctx.stop()
        result = evaluate(run)
        try:
            path = write_report(run, result, report)
        except OSError as e:
            fail(f"{report}: cannot write report: {e.strerror or e}")
        wall = time.perf_counter() - wall0
        _final(result, str(path.resolve()), wall, live)


def _final(result: dict[str, Any], path: str, wall: float, live: bool) -> None:
    arms = ["fleethealth"] + list(result.get("baselines", {}))
    rows = []
    per = {a: {(r["fault"], r["node"], r["onset_s"]): r for r in
               (result if a == "fleethealth" else result["baselines"][a]).get("incidents", [])} for a in arms}
    for r in result.get("incidents", []):
        k = (r["fault"], r["node"], r["onset_s"])
        cells = []
        for a in arms:
            x = per[a].get(k)
            if x is None:
                cells.append("-")
            elif x["response_s"] is None:
                cells.append("missed")
            else:
                cells.append(("ok " if x["action_ok"] else "wrong ") + f"{x['response_s']:.0f}s")
        where = ", ".join(r["entities"][:2])
        rows.append((r["fault"], where, f"{r['onset_s'] / 3600:.2f}h", r["expected"], cells))
    fq = {a: (result if a == "fleethealth" else result["baselines"][a])["false_quarantines"] for a in arms}
    prec = "n/a" if result["precision"] is None else f"{result['precision']:.2f}"  # n/a: nothing quarantined
    summary = (f"precision {prec}, recall {result['recall']:.2f}, "
               f"median detection {result['detection_s'] or 0:.0f}s, removal {result['removal_s'] or 0:.0f}s, "
               f"false quarantines {result['false_quarantines']}, pages {result['pages']}")
    if live:
        from rich.console import Console
        from rich.table import Table

        t = Table(title="injected vs detected (response time from onset; 'ok' = the right action)")
        for c in ("fault", "where", "onset", "right action", *arms):
            t.add_column(c)
        for f, w, o, e, cells in rows:
            t.add_row(f, w, o, e, *cells)
        t.add_row("false quarantines", "", "", "none", *[str(fq[a]) for a in arms])
        c = Console()
        c.print(t)
        c.print(f"fleethealth: {summary}")
        c.print(f"finished in {wall:.1f} s wall; report: {path}")
    else:
        sys.stdout.write("\ninjected vs detected:\n")
        sys.stdout.write(f"  {'fault':<24} {'where':<28} {'onset':>6} {'right action':<16} "
                         + " ".join(f"{a:>14}" for a in arms) + "\n")
        for f, w, o, e, cells in rows:
            sys.stdout.write(f"  {f:<24} {w:<28} {o:>6} {e:<16} " + " ".join(f"{x:>14}" for x in cells) + "\n")
        sys.stdout.write(f"  {'false quarantines':<24} {'':<28} {'':>6} {'none':<16} "
                         + " ".join(f"{fq[a]:>14}" for a in arms) + "\n")
        sys.stdout.write(f"fleethealth: {summary}\nfinished in {wall:.1f} s wall\nreport: {path}\n")
