"""The control plane's own figures in the controller's /metrics (served over real HTTP): leadership,
the outbox (pending, settled, oldest pending age) and the state store (commit latency, busy errors)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleethealth.act.config import ActuationConfig
from fleethealth.act.ledger import Ledger
from fleethealth.act.router import RouterActuator, WeightBoard
from fleethealth.act.runner import ActuationRunner
from fleethealth.controller.api import ApiServer
from fleethealth.controller.loop import Controller
from fleethealth.decide.model import IntentKind
from fleethealth.policy import default_policy
from fleethealth.store.sqlite import SqliteStore
from prom_harness import free_port
from test_controller import SRE, FakeClock, FleetSource, run_for, sre_guard


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_outbox_store_and_leadership_figures_are_in_metrics(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    board = WeightBoard()
    # Every kind routed (advise mode: recorded, nothing changes), so intents settle only when not killed.
    runner = ActuationRunner({k: [RouterActuator(board)] for k in IntentKind}, Ledger(tmp_path / "l.db"),
                             ActuationConfig())
    src, clock = FleetSource(6), FakeClock()
    ctl = Controller(default_policy(), [src], interval_s=15.0, clock=clock, store=store, runner=runner)
    srv = ApiServer(ctl, "127.0.0.1", free_port(), runner=runner, guard=sre_guard()).start()
    try:
        run_for(ctl, clock, 60)
        runner.kill("test: hold the outbox")
        src.xid = 79
        ctl.cycle()  # intents committed, none carried out (killed): pending
        clock.t += 15
        ctl.cycle()
        m = samples(httpx.get(f"{srv.url}/metrics").text)
        assert m[("fleethealth_leader", ())] == 1.0
        pending = m[("fleethealth_outbox_intents", (("status", "pending"),))]
        assert pending >= 1
        assert m[("fleethealth_outbox_oldest_pending_age_seconds", ())] == 15.0  # one cycle since the commit
        assert m[("fleethealth_store_commits_total", ())] == store.stats["commits_total"] >= 3
        assert m[("fleethealth_store_commit_seconds", ())] > 0
        assert m[("fleethealth_store_busy_total", ())] == 0
        status = httpx.get(f"{srv.url}/api/v1/status").json()
        assert status["counters"]["leader"] is True

        # Another writer holds the database: the cycle is skipped and counted as busy.
        other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        clock.t += 15
        rep = ctl.cycle()
        other.execute("ROLLBACK")
        other.close()
        assert "busy" in rep.skipped or "locked" in rep.skipped
        m = samples(httpx.get(f"{srv.url}/metrics").text)
        assert m[("fleethealth_store_busy_total", ())] == 1
        assert m[("fleethealth_store_errors_total", ())] == 1

        # Resumed: the outbox drains; nothing pending, oldest age back to 0.
        assert httpx.post(f"{srv.url}/api/v1/resume", headers=SRE).status_code == 200
        clock.t += 15
        ctl.cycle()
        m = samples(httpx.get(f"{srv.url}/metrics").text)
        assert m[("fleethealth_outbox_intents", (("status", "pending"),))] == 0
        assert m[("fleethealth_outbox_intents", (("status", "advised"),))] >= pending
        assert m[("fleethealth_outbox_oldest_pending_age_seconds", ())] == 0
        assert m[("fleethealth_outbox_settled_total", (("result", "any"),))] >= pending
        assert m[("fleethealth_actuation_fenced_total", ())] == 0
    finally:
        srv.stop()
