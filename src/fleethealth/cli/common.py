"""Shared helpers for commands: clean one-line errors with exit code 2, never a traceback."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from pathlib import Path

    from fleethealth.policy import Policy
    from fleethealth.sim.scenario import Scenario

from rich.console import Console

err_console = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    sys.exit(code)


def load_scenario_or_fail(scenario: str, duration: str | None = None, seed: int | None = None,
                          nodes: int | None = None) -> Scenario:
    """A built-in scenario or YAML file, with an optional duration ("6h"), seed and fleet size (nodes:
    sim.sizes.resize); a bad one is a clean one-line error."""
    from fleethealth.sim.scenario import ScenarioError, load_scenario, parse_duration
    from fleethealth.sim.sizes import resize

    try:
        sc = load_scenario(scenario)
        over: dict[str, object] = {}
        if duration is not None:
            over["duration"] = parse_duration(duration)
        if seed is not None:
            over["seed"] = seed
        sc = sc.with_overrides(**over) if over else sc
    except (ScenarioError, ValueError) as e:
        fail(str(e))
    if nodes is None:
        return sc
    try:
        return resize(sc, nodes)
    except ValueError as e:
        fail(f"--nodes: {e}")


def load_policy_or_fail(path: str | Path | None) -> Policy:
    """The policy file (None: the default); an unreadable or invalid one is a clean one-line error."""
    from fleethealth.policy import PolicyError, load_policy

    try:
        return load_policy(path)
    except PolicyError as e:
        fail(str(e))
