"""`fleethealth record`: a recording of what the policy reads, from Prometheus range queries, for replay
and backtest."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from fleethealth.cli.common import fail, load_policy_or_fail


def _when(text: str, now: float) -> float:
    """Unix seconds, or a negative offset from now (``-3600``, ``-6h``)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip()
    if t == "now":
        return now
    mult = 1.0
    if t and t[-1] in units:
        mult = units[t[-1]]
        t = t[:-1]
    try:
        v = float(t) * mult
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected unix seconds, 'now' or an offset like -6h") from None
    return now + v if v < 0 else v


def register(app: typer.Typer) -> None:
    @app.command("record")
    def record(
        prometheus: str = typer.Option(..., "--prometheus", help="Base URL of a Prometheus-compatible API."),
        out: Path = typer.Option(..., "--out", "-o", help="Table to write (.parquet, .csv, .jsonl, + .gz)."),
        start: str = typer.Option("-1h", "--start", help="Unix seconds or an offset from now (-6h)."),
        end: str = typer.Option("now", "--end", help="Unix seconds, 'now' or an offset."),
        step: float = typer.Option(15.0, "--step", help="Seconds between evaluations."),
        policy: Path | None = typer.Option(None, "--policy", help="Policy whose series to record."),
        timeout: float = typer.Option(60.0, "--timeout", help="Seconds per range query."),
    ) -> None:
        """Record every series the policy reads between START and END (range queries, one per chunk of
        metric names); replay it with `fleethealth replay`."""
        from fleethealth.sources.prometheus import PromQueryError, record_policy_range
        from fleethealth.sources.tables import InputError, write_table

        now = time.time()
        t0, t1 = _when(start, now), _when(end, now)
        if not t1 > t0:
            fail(f"--end ({t1:.0f}) must be after --start ({t0:.0f})")
        if step <= 0:
            fail("--step must be positive")
        pol = load_policy_or_fail(policy)
        try:
            snap = record_policy_range(prometheus, pol, t0, t1, step, timeout_s=timeout)
        except PromQueryError as e:
            fail(f"{prometheus}: {e}")
        try:
            write_table(snap, out)
        except InputError as e:
            fail(str(e))
        typer.echo(f"recorded {len(snap)} samples of {len(snap.metrics)} metrics, {len(snap.labelsets)} series, "
                   f"{t0:.0f}..{t1:.0f} every {step:g} s -> {out}")
        for issue in snap.issues[:5]:
            typer.echo(f"note: {issue}", err=True)
