"""The controller loop, its config and its HTTP endpoint, driven with a fake clock and hand-made sources.

The sources here are small in-process classes implementing the Source protocol (they stand in for
exporters; the end-to-end test with a real Prometheus is test_controller_e2e.py). The HTTP endpoint is
served for real by uvicorn on a loopback port and read with httpx.
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleethealth.auth.access import Guard, StaticTokens
from fleethealth.controller.api import ApiServer, render_metrics
from fleethealth.controller.config import ConfigError, load_config, parse_config
from fleethealth.controller.loop import Controller
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import Event
from fleethealth.policy import default_policy
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.base import failed_snapshot
from prom_harness import free_port


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


class FleetSource:
    """Six nodes of eight GPUs; ``xid`` puts an Xid on n0/gpu1, ``down`` makes the source fail."""

    name = "fleet"

    def __init__(self, nodes: int = 6) -> None:
        self.nodes = nodes
        self.xid = 0
        self.down = False
        self.down_nodes: set[str] = set()
        self.reads = 0

    def read(self, now: float) -> Snapshot:
        self.reads += 1
        if self.down:
            return failed_snapshot(now, self.name, "cannot connect")
        b = SnapshotBuilder()
        for n in range(self.nodes):
            if f"n{n}" in self.down_nodes:
                continue
            for g in range(8):
                lab = {"Hostname": f"n{n}", "gpu": str(g), "UUID": f"GPU-{n}-{g}", "modelName": "H100",
                       "pool": "a", "pci_bus_id": f"00000000:{g + 16:02X}:00.0"}
                b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0 + g * 0.1, now)
                b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, now)
                b.add("DCGM_FI_DEV_XID_ERRORS", lab, float(self.xid if (n, g) == (0, 1) else 0), now)
                b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 0.0, now)
        return b.build(now)


def make(interval: float = 15.0, nodes: int = 6) -> tuple[Controller, FleetSource, FakeClock]:
    src = FleetSource(nodes)
    clock = FakeClock()
    return Controller(default_policy(), [src], interval_s=interval, clock=clock), src, clock


def run_for(ctl: Controller, clock: FakeClock, seconds: float) -> None:
    end = clock.t + seconds
    while clock.t < end:
        ctl.cycle()
        clock.t += ctl.interval_s


def test_healthy_fleet_takes_no_action() -> None:
    ctl, _, clock = make()
    run_for(ctl, clock, 120)
    assert ctl.cycles_total == 8
    states = {e.entity: e.state for e in ctl.state.entities.values()}
    assert states and set(states.values()) == {State.READY}
    remediation = {IntentKind.QUARANTINE, IntentKind.DRAIN, IntentKind.SCHEDULE_RESET}
    assert not [i for i in ctl.recent_intents if i["intent"] in remediation]


def test_fatal_xid_becomes_a_transition_and_intents() -> None:
    ctl, src, clock = make()
    run_for(ctl, clock, 60)
    src.xid = 79
    rep = ctl.cycle()
    assert [(t.entity, t.to_state) for t in rep.transitions] == [("n0", State.QUARANTINED)]
    kinds = {(i.kind, i.entity) for i in rep.intents}
    # Xid 79 is a reboot-class fault (catalog bucket): the repair ladder asks for the reboot first, its
    # active test verifies it afterwards
    assert (IntentKind.QUARANTINE, "n0") in kinds and (IntentKind.SCHEDULE_RESET, "n0") in kinds
    [reboot] = [i for i in rep.intents if i.kind == IntentKind.SCHEDULE_RESET]
    assert reboot.params["action"] == "NODE_REBOOT" and reboot.params["ladder"] == "reboot-class"
    assert ctl.published.health is not None and ctl.published.health.tuples["n0"].reason == "gate:xid"


def test_failing_source_goes_stale_and_freezes_remediation() -> None:
    ctl, src, clock = make()
    run_for(ctl, clock, 60)
    src.down = True
    run_for(ctl, clock, 300)
    st = ctl.source_status["fleet"]
    assert not st.up and st.last_error and "cannot connect" in st.last_error and st.errors_total >= 10
    h = ctl.published.health
    assert h is not None and h.tuples["n0"].value is None  # unknown, never healthy
    assert ctl.state.frozen  # fleet-wide confidence drop: telemetry problem
    intents = [i["intent"] for i in ctl.recent_intents]
    assert "fleet_alert" in intents and "quarantine" not in intents and "drain" not in intents
    # the source comes back: confidence returns and the freeze lifts
    src.down = False
    run_for(ctl, clock, 60)
    assert not ctl.state.frozen


def test_gpu_vanishing_is_a_hardware_signal_end_to_end() -> None:
    ctl, src, clock = make()
    run_for(ctl, clock, 60)

    orig = src.read

    def without_gpu3(now: float) -> Snapshot:
        snap = orig(now)
        keep = [("gpu", "3") not in snap.labelsets[s] or ("Hostname", "n2") not in snap.labelsets[s]
                for s in snap.series_ids.tolist()]
        import numpy as np

        k = np.asarray(keep)
        return Snapshot(now, snap.metrics, snap.labelsets, snap.metric_ids[k], snap.series_ids[k],
                        snap.values[k], snap.ts[k])

    src.read = without_gpu3  # type: ignore[method-assign]
    run_for(ctl, clock, 120)  # its last samples age past max_age_s (90 s)
    h = ctl.published.health
    assert h is not None and h.tuples["n2"].reason == "gate:gpus_missing"
    assert ctl.state.entities["n2"].state == State.QUARANTINED


def test_raising_source_is_contained() -> None:
    ctl, src, clock = make()

    class Broken:
        name = "broken"

        def read(self, now: float) -> Snapshot:
            raise RuntimeError("boom")

    ctl.sources.append(Broken())
    ctl.source_status["broken"] = type(ctl.source_status["fleet"])("broken")
    rep = ctl.cycle()
    assert any("boom" in e.reason for e in rep.source_errors)
    assert ctl.source_status["fleet"].up and not ctl.source_status["broken"].up


def test_overruns_are_reported_and_never_stacked() -> None:
    class Slow(FleetSource):
        def read(self, now: float) -> Snapshot:
            time.sleep(0.12)
            return super().read(now)

    src = Slow(1)
    ctl = Controller(default_policy(), [src], interval_s=0.05)  # real clock
    starts: list[float] = []
    ctl.on_cycle = lambda r: starts.append(time.time())
    t0 = time.time()
    ctl.run(max_cycles=3)
    assert ctl.cycles_total == 3 and ctl.overruns_total == 3
    assert ctl.skipped_ticks_total >= 3  # ticks it ran over were skipped, not queued
    # one at a time, never stacked: each cycle ends (>= 0.12 s of reading) before the next begins
    assert all(b - a >= 0.12 for a, b in zip([t0, *starts], starts, strict=False))
    assert "fleethealth_cycle_overruns_total 3" in render_metrics(ctl)


def test_run_stops_promptly() -> None:
    ctl, _, _ = make(interval=30.0, nodes=1)
    ctl.clock = type(ctl.clock)()  # keep fake; replaced below with the system clock
    from fleethealth.controller.loop import SystemClock

    ctl.clock = SystemClock(ctl.stop_event)
    th = threading.Thread(target=ctl.run)
    th.start()
    deadline = time.time() + 5
    while ctl.cycles_total < 1 and time.time() < deadline:
        time.sleep(0.01)
    ctl.stop()
    th.join(2)
    assert not th.is_alive() and ctl.cycles_total == 1


# ---- config ----------------------------------------------------------------------------------


def test_config_parses_and_resolves_relative_paths(tmp_path: Path) -> None:
    p = tmp_path / "ctl.yaml"
    p.write_text(textwrap.dedent("""\
        interval_s: 5
        policy: pol.yaml
        state_db: state.db
        sources:
          prometheus: {url: "http://127.0.0.1:9090"}
          scrape:
            targets:
              - http://127.0.0.1:9400/metrics
              - {url: "http://127.0.0.1:8000/metrics", labels: {replica: r0}}
          kernel_logs:
            - {path: kern.log, node: n1}
        actuation: {mode: enforce, enforce: [set_weight]}
        """))
    cfg = load_config(p)
    assert cfg.interval_s == 5 and cfg.policy == str(tmp_path / "pol.yaml")
    assert cfg.state_db == str(tmp_path / "state.db")
    assert cfg.sources.kernel_logs[0].path == str(tmp_path / "kern.log")
    assert cfg.sources.scrape is not None and cfg.sources.scrape.targets[1].labels == {"replica": "r0"}
    assert cfg.actuation.enforces(IntentKind.SET_WEIGHT) and not cfg.actuation.enforces(IntentKind.QUARANTINE)
    assert cfg.listen_host_port == ("127.0.0.1", 9108)


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("sources:\n  prometheus:\n    url: ftp://x\n", ":3: sources.prometheus.url: must be an http"),
        ("sources:\n  prometheus:\n    urll: http://x\n", ":3: sources.prometheus.urll: Extra inputs"),
        ("interval_s: -1\nsources: {files: [a]}\n", ":1: interval_s: Input should be greater than 0"),
        ("sources: {files: [a]}\nactuation:\n  enforce: [quarantin]\n", ":3: actuation.enforce[0]"),
        ("sources: {}\n", "configure at least one of"),
        ("sources:\n  kernel_logs:\n    - {node: x}\n", ":3: sources.kernel_logs[0]: give exactly one"),
        ("listen: nowhere\nsources: {files: [a]}\n", ":1: listen: must be HOST:PORT"),
        ("sources:\n  prometheus:\n    url: http://x\n    extra_metrics: [ok_total, 'bad name']\n",
         ":4: sources.prometheus.extra_metrics: not valid metric names: bad name"),
        ("sources: [\n", "not valid YAML"),
        ("- a\n", "a YAML mapping"),
    ],
)
def test_config_errors_name_key_and_line(text: str, expect: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "ctl.yaml")
    assert expect in str(e.value)
    assert "Traceback" not in str(e.value)


def test_missing_config_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config: No such file"):
        load_config(tmp_path / "nope.yaml")


# ---- HTTP endpoint -----------------------------------------------------------------------------


SRE_TOKEN = "sre-token-0123456789abcdef"
SRE = {"Authorization": f"Bearer {SRE_TOKEN}"}


def sre_guard() -> Guard:
    return Guard([StaticTokens.parse(f'tokens: [{{user: sre, token: "{SRE_TOKEN}", verbs: ["*"]}}]')])


@pytest.fixture()
def served() -> Iterator[tuple[Controller, FleetSource, FakeClock, str]]:
    ctl, src, clock = make()
    srv = ApiServer(ctl, "127.0.0.1", free_port(), guard=sre_guard()).start()
    try:
        yield ctl, src, clock, srv.url
    finally:
        srv.stop()


def test_http_endpoint(served: tuple[Controller, FleetSource, FakeClock, str]) -> None:
    ctl, src, clock, url = served
    assert httpx.get(f"{url}/healthz").status_code == 503  # no cycle yet
    run_for(ctl, clock, 60)
    src.xid = 79
    ctl.cycle()
    text = httpx.get(f"{url}/metrics").text
    assert 'fleethealth_health{entity="n0",kind="node",reason="gate:xid",worst="hardware"} 0.0' in text
    assert 'fleethealth_state{entity="n0",kind="node",state="QUARANTINED"} 1.0' in text
    assert 'fleethealth_confidence{entity="n1/gpu0",kind="gpu"}' in text
    assert 'fleethealth_transitions_total{from="READY",to="QUARANTINED"} 1' in text
    assert 'fleethealth_source_up{source="fleet"} 1.0' in text
    # an Xid 79 (off the bus) is physical evidence of dead hardware: it spends its own budget (max(3, 10% of
    # 6)), neither the rate one nor the hard-gate one a bad driver's gates spend
    assert 'fleethealth_budget_remaining{kind="node",pool="a"} 1.0' in text
    assert 'fleethealth_hard_gate_budget_remaining{kind="node",pool="a"} 3.0' in text
    assert 'fleethealth_physical_budget_remaining{kind="node",pool="a"} 2.0' in text
    assert "fleethealth_cycle_duration_seconds " in text and "fleethealth_cycle_overruns_total 0" in text
    from prometheus_client.parser import text_string_to_metric_families

    assert len(list(text_string_to_metric_families(text))) > 10  # valid exposition

    tuples = httpx.get(f"{url}/api/v1/health", params={"kind": "node"}).json()["tuples"]
    assert {t["entity"] for t in tuples} == {f"n{i}" for i in range(6)}
    one = httpx.get(f"{url}/api/v1/health", params={"entity": "n0", "details": 1}).json()["tuples"][0]
    assert one["reason"] == "gate:xid" and one["details"]
    assert httpx.get(f"{url}/api/v1/health", params={"entity": "nope"}).status_code == 404
    states = httpx.get(f"{url}/api/v1/states").json()
    assert {e["entity"]: e["state"] for e in states["entities"]}["n0"] == "QUARANTINED"
    intents = httpx.get(f"{url}/api/v1/intents", params={"entity": "n0"}).json()["intents"]
    assert "quarantine" in {i["intent"] for i in intents} and all(i["key"] for i in intents)
    assert httpx.get(f"{url}/api/v1/weights").json()["replicas"] == {}
    st = httpx.get(f"{url}/api/v1/status").json()
    assert st["counters"]["cycles_total"] == 5 and st["sources"][0]["name"] == "fleet"

    # a human acknowledgement goes to the loop, not straight into the state
    r = httpx.post(f"{url}/api/v1/events", json={"kind": "ack", "entity": "n0", "to": "READY", "actor": "x"},
                   headers=SRE)
    assert r.status_code == 202 and r.json()["accepted"]["actor"] == "sre"  # the token's user, not the body's
    assert httpx.post(f"{url}/api/v1/events", json={"kind": "bogus", "entity": "n0"}, headers=SRE).status_code == 400
    assert ctl._pending_events and isinstance(ctl._pending_events[0], Event)
    assert httpx.post(f"{url}/api/v1/kill", headers=SRE).status_code == 409  # no runner configured
    assert httpx.get(f"{url}/healthz").status_code == 503  # the last cycle's clock is far in the past
    clock.t = time.time()
    ctl.cycle()
    assert httpx.get(f"{url}/healthz").json()["ok"] is True


def test_example_config_is_valid() -> None:
    cfg = load_config(Path(__file__).parent.parent / "examples" / "controller.yaml")
    # out of the box it watches `fleethealth sim serve --port 9400` through its service discovery
    assert cfg.actuation.mode == "advise" and cfg.sources.scrape is not None
    assert cfg.sources.scrape.sd == ["http://127.0.0.1:9400/sd"]


def test_kill_switch_through_the_api(tmp_path: Path) -> None:
    from fleethealth.act.ledger import Ledger
    from fleethealth.act.runner import ActuationRunner

    ctl, src, clock = make()
    runner = ActuationRunner({}, Ledger(tmp_path / "actions.db"))
    ctl.runner = runner
    srv = ApiServer(ctl, "127.0.0.1", free_port(), runner=runner, guard=sre_guard()).start()
    try:
        ctl.cycle()
        assert httpx.post(f"{srv.url}/api/v1/kill", content=b"bad rollout", headers=SRE).json() == {"killed": True}
        assert runner.killed
        assert "fleethealth_actuation_killed 1.0" in httpx.get(f"{srv.url}/metrics").text
        assert httpx.get(f"{srv.url}/api/v1/status").json()["actuation"]["kill"]["reason"] == "bad rollout"
        assert httpx.post(f"{srv.url}/api/v1/resume", headers=SRE).json() == {"killed": False}
    finally:
        srv.stop()


def test_build_routes_intents_to_the_configured_actuators(tmp_path: Path) -> None:
    from fleethealth.controller.build import build

    cfg = parse_config(textwrap.dedent("""\
        state_db: state.db
        sources:
          prometheus: {url: "http://127.0.0.1:9"}
          files: [x.prom]
        alertmanager: {url: "http://127.0.0.1:9093"}
        evidence: {dir: evidence}
        """), "ctl.yaml", base_dir=tmp_path)
    asm = build(cfg)
    try:
        routes = {k: [a.name for a in v] for k, v in asm.runner.routes.items()}
        assert routes[IntentKind.PAGE] == ["alertmanager"] and routes[IntentKind.FLEET_ALERT] == ["alertmanager"]
        assert routes[IntentKind.CAPTURE_EVIDENCE] == ["evidence"]
        assert routes[IntentKind.QUARANTINE][0] == "evidence"  # the bundle before any isolation
        assert routes[IntentKind.SET_WEIGHT] == ["router"]
        assert [s.name for s in asm.controller.sources][0].startswith("prometheus:")
        assert asm.runner.config.mode == "advise"
        assert (tmp_path / "state.actions.db").exists()
    finally:
        asm.close()
