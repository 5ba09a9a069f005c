"""`fleethealth bench parse`: the exposition reader's rate on dcgm-exporter text, next to prometheus-client.

Registered into the `bench` group that cmd_bench.py creates (modules load in name order, so it exists by
now); if that module is ever gone, this makes its own group so the command never disappears.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from fleethealth.cli.common import fail


def parse_cmd(
    gpus: Annotated[int, typer.Option(help="GPUs in the generated dcgm-exporter text (25 fields each)")] = 100_000,
    repeats: Annotated[int, typer.Option(help="Timed cold runs; the median is reported")] = 3,
    prom_gpus: Annotated[int, typer.Option(help="GPUs in the sample prometheus-client parses (it is slow)")] = 2000,
    warm: Annotated[bool, typer.Option(help="Also time a parse with label strings already cached")] = False,
    fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
) -> None:
    """Parse rate (samples/s, one core) against prometheus-client's parser, and whether both agree."""
    from fleethealth.bench.parse import bench_parse

    if gpus < 1 or repeats < 1 or prom_gpus < 1:
        fail("--gpus, --repeats and --prom-gpus must be at least 1")
    if fmt not in ("table", "json"):
        fail(f"--format must be table or json, not {fmt!r}")
    r = bench_parse(gpus, repeats=repeats, prom_sample_gpus=prom_gpus, warm=warm)
    if fmt == "json":
        typer.echo(json.dumps(r))
    else:
        c = Console(highlight=False)
        c.print(f"dcgm-exporter text: {r['gpus']:,} GPUs, {r['lines']:,} lines, {r['mb']:.0f} MB; "
                f"{r['samples']:,} samples kept, {r['dropped_with_issue']:,} dropped as issues (blank sentinels)")
        c.print(f"fleethealth parser: {r['parse_s']:.3f} s CPU, median of {len(r['parse_runs_s'])} cold runs -> "
                f"{r['samples_per_s']:,} samples/s (wall {r['wall_parse_s']:.3f} s, {r['wall_samples_per_s']:,}/s)")
        if "warm_samples_per_s" in r:
            c.print(f"  with label strings already cached (a controller's steady state): {r['warm_samples_per_s']:,}/s")
        c.print(f"prometheus-client: {r['prom_client_samples_per_s']:,} samples/s CPU, measured on "
                f"{r['prom_client_measured_on_gpus']:,} GPUs and extrapolated: {r['prom_client_extrapolated_s']:.1f} s "
                f"for this text -> speed-up x{r['speedup']}")
        c.print(f"same samples as prometheus-client on the {r['compared_samples']:,} compared: "
                + ("yes" if r["equal"] else "NO"))
        for d in r["differences"]:
            c.print("  " + d, markup=False)
        c.print(f"(machine check: sum(range(1e6)) took {r['cpu_calibration_ms']} ms CPU, median next to the runs "
                f"{r['cpu_calibration_runs_ms']}; about 13 ms on an idle core)")
    if not r["equal"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    try:
        from fleethealth.cli.cmd_bench import bench_app
    except ImportError:
        bench_app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
        app.add_typer(bench_app, name="bench")
    bench_app.command("parse")(parse_cmd)
