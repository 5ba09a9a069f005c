"""The `fleethealth` command. Each command lives in its own ``cmd_*.py`` module with a
``register(app)`` function; this file only discovers and wires them, so adding a command never edits it.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

app = typer.Typer(
    name="fleethealth",
    help="Health scores and the self-healing loop for LLM GPU fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    import fleethealth.cli as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("cmd_"):
            module = importlib.import_module(f"fleethealth.cli.{mod.name}")
            module.register(app)


_register_commands()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
