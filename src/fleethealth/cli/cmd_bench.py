"""`fleethealth bench ...`: figures operators use to size their own controller."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from fleethealth.cli.common import fail

bench_app = typer.Typer(help="Benchmarks: scoring and parsing speed on a synthetic fleet.", no_args_is_help=True)


@bench_app.command("scoring")
def scoring(
    gpus: Annotated[int, typer.Option(help="Fleet size in GPUs (8 per node)")] = 100_000,
    repeats: Annotated[int, typer.Option(help="Timed runs; the median is reported")] = 5,
    scalar: Annotated[bool, typer.Option(help="Also run the scalar reference and compare")] = True,
    fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
) -> None:
    """Median time to score a fleet snapshot, the scalar path's time, the speed-up, and equality."""
    from fleethealth.bench.scoring import bench_scoring

    if gpus < 8:
        fail("--gpus must be at least 8")
    r = bench_scoring(gpus, repeats=repeats, scalar=scalar)
    if fmt == "json":
        typer.echo(json.dumps(r))
    else:
        c = Console(highlight=False)
        c.print(f"gpus {r['gpus']:,}  signals {r['signals']:,}")
        c.print(f"vectorised engine: {r['score_s'] * 1000:.1f} ms median wall, {r['score_cpu_s'] * 1000:.1f} ms CPU "
                f"(cold, label sets unresolved: {r['score_cold_s'] * 1000:.1f} ms)")
        if scalar:
            c.print(f"scalar seed algorithm: {r['scalar_s']:.2f} s  -> speed-up x{r['speedup']:.1f}")
            c.print("results equal: " + ("yes" if r["equal"] else f"NO ({len(r['mismatches'])} shown)"))
            for m in r["mismatches"]:
                c.print("  " + m, markup=False)
    if scalar and not r["equal"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
