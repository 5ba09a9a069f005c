"""Operators see a version hold (issue 16 rollout follow-up): ``/api/v1/states`` carries, per held node,
which version incident holds it, since when, whether a retest under the hold is out or failed, and what
releases it; ``fleethealth describe node`` prints it and the node page shows it. A real controller API
served by uvicorn on loopback, read with httpx and by the CLI as a separate process."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fleethealth.controller.api import ApiServer
from fleethealth.decide.model import State
from fleethealth.decide.state import DecisionState
from prom_harness import free_port
from test_controller import SRE_TOKEN, make, run_for, sre_guard

KEY = "version:node:driver_version=560.28.03"


def _held(pub: Any, retesting: bool) -> Any:
    """The published cycle with n0 QUARANTINED and held by the driver's incident (opened 40 min before)."""
    ents = dict(pub.state.entities)
    n0 = ents["n0"].copy()
    n0.state, n0.version_hold = State.QUARANTINED, KEY
    n0.labels = {**n0.labels, "driver_version": "560.28.03"}
    ents["n0"] = n0
    rec = {"entity": "version/driver_version=560.28.03", "reason": "version_correlation",
           "params": {"label": "driver_version", "value": "560.28.03", "kind": "node"}, "sig": 4,
           "opened": pub.ts - 2400.0, "seen": pub.ts - 60.0, "sent": pub.ts - 2400.0, "updates": 0,
           **({"retesting": ["n0"], "retest_sent": pub.ts - 60.0} if retesting else {})}
    st = DecisionState(entities=ents, ledger=list(pub.state.ledger), pages=dict(pub.state.pages),
                       incidents={KEY: rec}, seq=pub.state.seq, last_ts=pub.state.last_ts)
    return dataclasses.replace(pub, state=st)


@pytest.fixture()
def served() -> Iterator[tuple[Any, str]]:
    ctl, _, clock = make()
    run_for(ctl, clock, 60)
    srv = ApiServer(ctl, "127.0.0.1", free_port(), guard=sre_guard()).start()
    try:
        yield ctl, srv.url
    finally:
        srv.stop()


def _describe(url: str, node: str) -> str:
    env = {**os.environ, "FLEETHEALTH_SERVER": url, "FLEETHEALTH_TOKEN": SRE_TOKEN}
    r = subprocess.run([sys.executable, "-m", "fleethealth.cli.main", "describe", "node", node],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_held_node_shows_its_version_incident_since_when_and_what_releases_it(served: tuple[Any, str]) -> None:
    ctl, url = served
    ctl.published = _held(ctl.published, retesting=False)
    auth = {"Authorization": f"Bearer {SRE_TOKEN}"}
    states = httpx.get(f"{url}/api/v1/states", headers=auth).json()["entities"]
    detail = {e["entity"]: e.get("version_hold_detail") for e in states}
    assert detail["n1"] is None
    hold = detail["n0"]
    assert (hold["incident"], hold["version"], hold["opened"], hold["retesting"], hold["retest_failed"]) == (
        KEY, "driver_version=560.28.03", ctl.published.ts - 2400.0, False, False)
    assert "rollback or upgrade of driver_version" in hold["releases"]

    out = _describe(url, "n0")
    assert f"Held by:     version incident {KEY} (opened 40m ago)" in out
    assert "released by: a rollback or upgrade of driver_version on it" in out
    assert "Held by:" not in _describe(url, "n1")

    page = httpx.get(f"{url}/entity/n0", headers=auth).text
    assert 'id="version-hold"' in page and KEY in page and "opened 40m ago" in page
    fleet = httpx.get(f"{url}/", headers=auth).text  # the fleet view marks the held node, only it
    assert fleet.count('data-held="') == 1 and f'data-held="{KEY}"' in fleet and "held: version" in fleet


def test_a_retest_under_the_hold_is_shown_as_out(served: tuple[Any, str]) -> None:
    ctl, url = served
    ctl.published = _held(ctl.published, retesting=True)
    out = _describe(url, "n0")
    assert "retest under the hold: out" in out
    assert "released by: its retest under the hold passing" in out
