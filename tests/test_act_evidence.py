"""Evidence bundles: a metrics window from a real Prometheus (scraping a tiny prometheus-client exporter),
errors and Xids, tuple history, redaction of secrets and prompts, and the SQLite index."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleethealth.act.config import ActuationConfig
from fleethealth.act.evidence import REDACTED, EvidenceCollector, EvidenceIndex, PrometheusRange, redact
from fleethealth.act.ledger import Ledger
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.model import Intent, IntentKind, Tier
from prom_harness import PROMETHEUS, ExporterServer, FakeFleet, PrometheusServer

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"


def test_redaction_of_keys_tokens_and_prompts() -> None:
    doc = {
        "authorization": "Bearer abc.def", "api_key": "sk-live-1234567890abcdef", "prompt": "my secret plan",
        "messages": [{"role": "user", "content": "tell me about zebras"}], "empty_token": "",
        "log": f"request failed token={JWT} for user; header Authorization: Bearer xyz123",
        "nested": [{"password": "hunter2", "ok": "value"}, "key sk-proj-ABCDEFGHIJKLMNOP rest"],
        "xid": 79, "note": "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
    }
    out = redact(doc)
    text = json.dumps(out)
    for secret in ("abc.def", "sk-live", "my secret plan", "hunter2", JWT, "xyz123", "sk-proj", "MIIE", "zebras"):
        assert secret not in text, secret
    assert out["nested"][0]["ok"] == "value" and out["xid"] == 79
    assert out["empty_token"] == ""  # nothing to hide
    assert out["authorization"] == REDACTED


@pytest.fixture(scope="module")
def prom() -> Iterator[tuple[PrometheusServer, FakeFleet]]:
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (scripts/install-deps installs it)")
    fleet = FakeFleet({"node-a": 2, "node-b": 2})
    with ExporterServer(fleet) as exp:
        srv = PrometheusServer([(f"127.0.0.1:{exp.port}", "/metrics", {})]).start()
        try:
            fleet.set("node-a", 1, "DCGM_FI_DEV_XID_ERRORS", 79.0)
            srv.wait_for('DCGM_FI_DEV_XID_ERRORS{Hostname="node-a"} > 0')
            yield srv, fleet
        finally:
            srv.stop()


def test_bundle_from_real_prometheus_is_written_redacted_and_indexed(
        prom: tuple[PrometheusServer, FakeFleet], tmp_path: Path) -> None:
    import time

    srv, _ = prom
    index = EvidenceIndex(tmp_path / "state.db")
    history = [{"ts": 1.0, "value": 0.9, "flags": []},
               {"ts": 2.0, "value": 0.1, "flags": ["xid:79"], "labels": {"api_token": "t0ps3cret"}}]
    col = EvidenceCollector(tmp_path / "evidence", index, prometheus=PrometheusRange(srv.url),
                            tuple_history=lambda e: history,
                            errors=lambda e: [{"line": f"NVRM: Xid (PCI:0000:18:00): 79 Authorization: Bearer {JWT}"}],
                            window_s=120)
    it = Intent(time.time(), IntentKind.CAPTURE_EVIDENCE, "node-a", "gate:xid_79", {"n": 1}, Tier.NODE)
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.CAPTURE_EVIDENCE}))
    runner = ActuationRunner({IntentKind.CAPTURE_EVIDENCE: [col]}, Ledger(tmp_path / "l.db"), cfg)
    [res] = runner.submit(it)
    assert res.status == "applied", res
    d = Path(res.detail["path"])
    assert sorted(p.name for p in d.iterdir()) == ["errors.json", "events.json", "manifest.json", "metrics.json",
                                                   "node.json", "tuples.json"]
    metrics = json.loads((d / "metrics.json").read_text())
    q = metrics["queries"]['{Hostname="node-a"}']
    assert q["series"] > 0
    names = {s["metric"]["__name__"] for s in q["result"]}
    assert "DCGM_FI_DEV_GPU_TEMP" in names and all(s["metric"]["Hostname"] == "node-a" for s in q["result"])
    errors = json.loads((d / "errors.json").read_text())
    assert errors["xids"] and errors["xids"][0]["last"][1] == 79.0
    assert errors["xid_flags"] == ["xid:79"]
    everything = "".join(p.read_text() for p in d.iterdir())
    assert JWT not in everything and "t0ps3cret" not in everything
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["entity"] == "node-a" and manifest["reason"] == "gate:xid_79"
    assert "no kubernetes" not in " ".join(manifest["problems"])
    [row] = index.list("node-a")
    assert row["path"] == str(d) and row["reason"] == "gate:xid_79"
    assert col.link("node-a/gpu1") == str(d)  # pages about a GPU link to its node's bundle
    # A quarantine right after reuses the fresh bundle instead of taking another.
    again = col.apply(Intent(time.time(), IntentKind.QUARANTINE, "node-a", "gate:xid_79", {"n": 2}, Tier.NODE))
    assert again.detail["reused"] and len(index.list("node-a")) == 1


def test_bundle_is_still_written_when_prometheus_is_down(tmp_path: Path) -> None:
    from act_support import free_port

    index = EvidenceIndex(tmp_path / "state.db")
    located: dict[str, str] = {}
    col = EvidenceCollector(tmp_path / "ev", index, prometheus=PrometheusRange(f"http://127.0.0.1:{free_port()}",
                                                                              timeout_s=1.0),
                            on_captured=located.__setitem__)
    it = Intent(5.0, IntentKind.CAPTURE_EVIDENCE, "node-x", "min:thermal", {"n": 1})
    out = col.apply(it)
    assert located == {it.key: out.detail["path"]}
    assert out.ok and out.detail["problems"]
    manifest = json.loads((Path(out.detail["path"]) / "manifest.json").read_text())
    assert any("prometheus" in p for p in manifest["problems"])


def test_entity_names_are_escaped_in_promql(prom: tuple[PrometheusServer, FakeFleet], tmp_path: Path) -> None:
    """Every evidence query parses on a real Prometheus, whatever the node is called: a plain 'node-a' (whose
    regex escape once made '\\-', no valid PromQL escape), a name with quotes and backslashes from an
    exporter label (it matches its own series and nothing else), and one shaped as PromQL injection."""
    import time

    from fleethealth.act.evidence import promql_string

    srv, fleet = prom
    weird = 'we"ird\\node'
    with fleet.lock:
        fleet.gpus[weird] = {0}
    srv.wait_for("DCGM_FI_DEV_GPU_TEMP{Hostname=\"" + promql_string(weird) + "\"}")
    col = EvidenceCollector(tmp_path / "ev", EvidenceIndex(tmp_path / "i.db"), prometheus=PrometheusRange(srv.url),
                            window_s=60)
    for name in ("node-a", weird, 'x"} or vector(1) or {a="', "n\n0"):
        path, problems = col.capture(name, "test", time.time())
        assert problems == [], (name, problems)
        queries = json.loads((path / "metrics.json").read_text())["queries"]
        assert len(queries) == 3
        hosts = {s["metric"].get("Hostname", s["metric"].get("node")) for q in queries.values() for s in q["result"]}
        assert hosts <= {name}, (name, hosts)  # never another node's series, never vector(1)
        if name in ("node-a", weird):
            assert queries["{Hostname=\"" + promql_string(name) + "\"}"]["series"] > 0
