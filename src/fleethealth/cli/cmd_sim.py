"""`fleethealth sim list|show|truth|run|serve`: the fleet simulator from the command line."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from fleethealth.cli.common import fail, load_scenario_or_fail


def _sim(sc):  # type: ignore[no-untyped-def]
    from fleethealth.sim.simulation import Simulation

    try:
        return Simulation(sc)
    except ValueError as e:
        fail(f"{sc.name}: {e}")


def register(app: typer.Typer) -> None:
    sim_app = typer.Typer(help="Simulated fleets with injected faults and ground truth.", no_args_is_help=True)

    @sim_app.command("list")
    def list_() -> None:
        """The built-in scenarios with their fleet size, duration and faults."""
        from fleethealth.sim.scenario import builtin_names, load_scenario

        for name in builtin_names():
            sc = load_scenario(name)
            gpus = sum(p.nodes for p in sc.fleet.pools) * sc.fleet.gpus_per_node
            kinds: list[str] = sorted({str(f.kind) for f in sc.faults}) or ["none"]
            typer.echo(f"{name:26s} {gpus:5d} GPUs {sc.duration / 3600:6.1f} h  {', '.join(kinds)}")

    @sim_app.command("faults")
    def faults() -> None:
        """The fault kinds a scenario can inject, with what each does."""
        from fleethealth.sim.faults import FAULT_CLASSES

        for kind, cls in FAULT_CLASSES.items():
            doc = " ".join((cls.__doc__ or "").split())
            typer.echo(f"{kind:26s} {doc}")

    @sim_app.command("show")
    def show(scenario: str) -> None:
        """Print a built-in scenario's YAML (a starting point for your own)."""
        from fleethealth.sim.scenario import builtin_names, builtin_text

        if scenario in builtin_names():
            typer.echo(builtin_text(scenario), nl=False)
        elif Path(scenario).exists():
            load_scenario_or_fail(scenario)
            typer.echo(Path(scenario).read_text(), nl=False)
        else:
            fail(f"no scenario {scenario!r} (try `fleethealth sim list`)")

    @sim_app.command("truth")
    def truth(
        scenario: Annotated[str, typer.Option("--scenario", "-s", help="built-in name or YAML file")],
        fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
        nodes: Annotated[int | None, typer.Option(
            "--nodes", help="on a fleet of about this many nodes (pools scaled in whole racks)")] = None,
    ) -> None:
        """The scenario's ground truth: which entity is faulty, from when, and the right action."""
        sim = _sim(load_scenario_or_fail(scenario, nodes=nodes))
        rows = sim.ground_truth
        if fmt == "json":
            typer.echo(json.dumps([g.to_dict() for g in rows], indent=1))
            return
        for g in rows:
            end = "-" if g.end is None else f"{(g.end - sim.start) / 3600:.2f}h"
            typer.echo(f"{g.entity:28s} {g.kind:7s} {g.fault:26s} onset {(g.onset - sim.start) / 3600:6.2f}h "
                       f"end {end:>7s} faulty={'yes' if g.faulty else 'no ':3s} -> {g.expected_action}")

    @sim_app.command("run")
    def run(
        scenario: Annotated[str, typer.Option("--scenario", "-s", help="built-in name or YAML file")],
        out: Annotated[Path | None, typer.Option(help="write the recorded signal table (.parquet or .csv)")] = None,
        duration: Annotated[str | None, typer.Option(help="override the duration, e.g. 2h")] = None,
        seed: Annotated[int | None, typer.Option(help="override the seed")] = None,
        every: Annotated[int, typer.Option(help="record every N-th step")] = 1,
        events: Annotated[Path | None, typer.Option(help="write non-metric events (OOMs, Xid lines) as JSONL")] = None,
        nodes: Annotated[int | None, typer.Option(
            "--nodes", help="on a fleet of about this many nodes (pools scaled in whole racks)")] = None,
    ) -> None:
        """Run a scenario; report generation speed; optionally write a recording."""
        sc = load_scenario_or_fail(scenario, duration, seed, nodes)
        sim = _sim(sc)
        if every < 1:
            fail("--every must be at least 1")
        t0 = time.perf_counter()
        c0 = time.process_time()
        if out is not None:
            from fleethealth.sim.recording import write_recording

            try:
                stats = write_recording(sim, out, every=every)
            except OSError as e:
                fail(f"{out}: cannot write: {e.strerror or e}")
            steps, rows = stats.steps, stats.rows
        else:
            steps = rows = 0
            for _, snap in sim.steps():
                steps += 1
                rows += len(snap)
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        gpus = sim.fleet.n_gpus
        gpu_h = gpus * steps * sim.step_s / 3600
        typer.echo(f"{sc.name}: {steps} steps x {gpus} GPUs ({sc.step:g}s resolution, "
                   f"{steps * sim.step_s / 3600:.1f} h simulated) in {dt:.2f} s = {steps / max(dt, 1e-9):.0f} steps/s, "
                   f"{gpu_h / max(dt, 1e-9):,.0f} GPU-hours/s, {rows:,} samples (CPU {cpu:.2f} s)")
        if out is not None:
            typer.echo(f"recording: {out} ({rows:,} rows)")
        if events is not None:
            with events.open("w") as fh:
                for ev in sim.all_events:
                    fh.write(json.dumps(ev.to_dict(), default=str) + "\n")
            typer.echo(f"events: {events} ({len(sim.all_events)})")

    @sim_app.command("serve")
    def serve(
        scenario: Annotated[str, typer.Option("--scenario", "-s", help="built-in name or YAML file")],
        port: Annotated[int, typer.Option(help="port (0: any free one)")] = 9400,
        host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
        speed: Annotated[float, typer.Option(help="simulated seconds per wall second")] = 1.0,
        seed: Annotated[int | None, typer.Option(help="override the seed")] = None,
        nodes: Annotated[int | None, typer.Option(
            "--nodes", help="on a fleet of about this many nodes (pools scaled in whole racks)")] = None,
    ) -> None:
        """Serve every node's metrics over HTTP (/metrics/<node>, /sd for Prometheus http_sd)."""
        from fleethealth.sim.server import SimExporterServer

        sc = load_scenario_or_fail(scenario, None, seed, nodes)
        sim = _sim(sc)
        if speed <= 0:
            fail("--speed must be positive")
        if not 0 <= port <= 65535:
            fail(f"--port {port}: a port is 0 to 65535 (0: any free one)")
        try:
            srv = SimExporterServer(sim, host=host, port=port, speed=speed)
        except (OSError, OverflowError) as e:
            fail(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}")
        typer.echo(f"serving {sc.name} ({sim.fleet.n_nodes} nodes) on {srv.url}/metrics/<node>; "
                   f"targets: {srv.url}/sd; inject: POST {srv.url}/control/fault")
        sys.stdout.flush()  # the address must reach a parent reading our pipe before we block
        with contextlib.suppress(KeyboardInterrupt):
            srv.serve_forever()

    app.add_typer(sim_app, name="sim")
