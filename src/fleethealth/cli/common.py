"""Shared helpers for commands: clean one-line errors with exit code 2, never a traceback."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console

err_console = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    sys.exit(code)
