"""`fleethealth policy show|check`: print the default policy or validate a policy file."""

from __future__ import annotations

from pathlib import Path

import typer

from fleethealth.cli.common import err_console, fail, load_policy_or_fail
from fleethealth.policy import default_policy_text


def register(app: typer.Typer) -> None:
    policy_app = typer.Typer(help="Show or validate the health policy.", no_args_is_help=True)

    @policy_app.command("show")
    def show() -> None:
        """Print the documented default policy (a starting point for your own)."""
        typer.echo(default_policy_text(), nl=False)

    @policy_app.command("check")
    def check(path: Path) -> None:
        """Validate a policy file; errors name the key and the line (exit 2), warnings (a metric no known
        exporter emits) too."""
        from fleethealth.policy import PolicyError, policy_warnings, read_policy_text

        p = load_policy_or_fail(path)
        try:
            text = read_policy_text(path)
        except PolicyError as e:
            fail(str(e))
        for w in policy_warnings(text, p, str(path)):
            err_console.print(f"[yellow]warning:[/] {w}", soft_wrap=True, markup=True, highlight=False)
        typer.echo(f"ok: {path}: {len(p.signals)} signals, version {p.version_tag}")

    app.add_typer(policy_app, name="policy")
