"""Kill between commit and act, for real: a ``fleethealth run`` subprocess scraping the simulator's HTTP
exporter, SIGKILLed by its own failpoint, restarted, and every intent applied exactly once.

1. ``FLEETHEALTH_FAILPOINT=after-commit``: a GPU falls off the bus (Xid 79); the cycle that decides the
   quarantine commits it and the process dies before acting. The store holds the intents ``pending``;
   no evidence bundle exists, the ledger has no action.
2. ``after-apply:1``: the restarted controller drains the outbox at start-up; it dies right after the
   first evidence capture succeeded, before the ledger recorded it ("applied but crashed before marking").
3. No failpoint: the next start drains again. The capture is re-applied (the ledger said ``started``) and
   the collector reuses the bundle of its key: one bundle per key. Every intent ends ``applied`` in the
   store, each (key, actuator) once in the ledger, and nothing is pending.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from act_support import wait_until

sim_server = pytest.importorskip("fleethealth.sim.server", reason="simulator exporter not available")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def q(db: Path, sql: str) -> list[tuple[object, ...]]:
    if not db.exists():
        return []
    con = sqlite3.connect(db, timeout=5)
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def test_kill_between_commit_and_act_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    from fleethealth.sim.scenario import Scenario
    from fleethealth.sim.simulation import Simulation

    scenario = Scenario.model_validate({"name": "outbox", "seed": 7, "duration": "1d", "fleet": {"pools": [
        {"name": "train-a", "nodes": 6, "workload": "training", "jobs": [{"name": "pretrain", "pp": 1}]}]}})
    sim = Simulation(scenario)
    nodes = list(sim.fleet.nodes)
    exporter = sim_server.SimExporterServer(sim).start()
    state, ledger, evidence = tmp_path / "state.db", tmp_path / "state.actions.db", tmp_path / "evidence"
    targets = "\n".join(f"      - url: {exporter.node_url(n)}" for n in nodes)
    (tmp_path / "controller.yaml").write_text(f"""
interval_s: 0.3
state_db: state.db
listen: null
sources:
  scrape:
    timeout_s: 2
    targets:
{targets}
evidence:
  dir: evidence
  window_s: 60
actuation:
  mode: enforce
  enforce: [capture_evidence, quarantine]
""")
    cmd = [sys.executable, "-m", "fleethealth.cli.main", "run", "--config", str(tmp_path / "controller.yaml")]

    def start(failpoint: str | None, *extra: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k != "FLEETHEALTH_FAILPOINT"}
        env["PYTHONUNBUFFERED"] = "1"
        if failpoint:
            env["FLEETHEALTH_FAILPOINT"] = failpoint
        return subprocess.Popen(cmd + list(extra), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    try:
        # -- 1. healthy cycles, then the fault; the deciding cycle commits and the process dies ----------
        p = start("after-commit")
        try:
            wait_until(lambda: p.poll() is None and q(state, "SELECT COUNT(*) FROM cycles")[0][0] >= 3, 60,
                       what="three healthy cycles committed")
        except TimeoutError:
            p.kill()
            raise AssertionError(p.communicate()[1][-3000:]) from None
        assert not q(state, "SELECT key FROM intents WHERE kind='quarantine'")
        exporter.inject({"kind": "xid79_off_bus", "target": "node-02/gpu3", "onset": 0})
        exporter.advance(scenario.step)
        rc = p.wait(60)
        err = p.stderr.read() if p.stderr else ""
        assert rc == -signal.SIGKILL, err[-3000:]
        assert "failpoint after-commit reached" in err
        intents = q(state, "SELECT key, kind, entity, status FROM intents ORDER BY seq")
        assert ("quarantine", "node-02") in {(k, e) for _, k, e, _ in intents}
        assert {s for *_, s in intents} == {"pending"}  # committed, never acted on
        assert q(ledger, "SELECT COUNT(*) FROM actions")[0][0] == 0
        assert not evidence.exists() or not [d for d in evidence.iterdir() if d.is_dir()]
        keys = [k for k, *_ in intents]

        # -- 2. restart: the start-up drain captures evidence and dies before recording it -------------
        p = start("after-apply:1")
        rc = p.wait(60)
        err = p.stderr.read() if p.stderr else ""
        assert rc == -signal.SIGKILL and "failpoint after-apply reached" in err, err[-3000:]
        started = q(ledger, "SELECT key, actuator FROM actions WHERE status='started'")
        assert len(started) == 1  # applied, but the ledger never heard back
        bundles = [d for d in evidence.iterdir() if d.is_dir()]
        assert len(bundles) == 1

        # -- 3. restart without a failpoint: drained, each key applied once -----------------------------
        t0 = time.monotonic()
        p = start(None, "--cycles", "4")
        rc = p.wait(90)
        err = p.stderr.read() if p.stderr else ""
        assert rc == 0, err[-3000:]
        print(f"\nrestart to drained and 4 cycles: {time.monotonic() - t0:.2f} s; intents: "
              + json.dumps(dict(Counter(k for _, k, _, _ in intents))))
        assert "re-applying" in err  # the one call whose result was never recorded, done again
        final = dict(q(state, "SELECT key, status FROM intents"))
        assert all(final[k] in ("applied", "unrouted") for k in keys), final
        assert [k for k, s in final.items() if s == "pending"] == []
        acts = q(ledger, "SELECT key, actuator, status FROM actions")
        assert Counter((k, a) for k, a, _ in acts).most_common(1)[0][1] == 1
        assert {s for *_, s in acts} <= {"applied", "unrouted"}
        # effects: one evidence bundle per capture key, however many times it was applied
        per_key = Counter(k for (k,) in q(evidence / "index.db", "SELECT intent_key FROM evidence"))
        captures = [k for k, kind, _, _ in intents if kind == "capture_evidence"]
        assert captures and all(per_key[k] == 1 for k in captures), per_key
        assert len([d for d in evidence.iterdir() if d.is_dir()]) == len(per_key)
        q_keys = [k for k, kind, e, _ in intents if kind == "quarantine" and e == "node-02"]
        assert [s for k, a, s in acts if k == q_keys[0]] == ["applied"]
    finally:
        exporter.stop()
