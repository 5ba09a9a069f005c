"""The controller API's access rules and hardening on a real loopback server (issue 15): 401 without a
valid token, 403 without the verb, allowed actions audited in the store with who and from where; reads
open to loopback only by default; 413 for large bodies without reading them; control characters refused;
no /docs unless enabled; no credentials in /api/v1/status. Kubernetes TokenReview/SubjectAccessReview
against a real kube-apiserver: tests/test_api_auth_k8s.py."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleethealth.auth.access import Guard, StaticTokens, TokenFileError, entity_problem, event_verb
from fleethealth.auth.audit import Auditor
from fleethealth.controller.api import ApiServer
from fleethealth.controller.config import ApiConfig
from fleethealth.controller.loop import Controller
from fleethealth.policy import default_policy
from fleethealth.store.sqlite import SqliteStore
from prom_harness import free_port
from test_controller import FakeClock, make, run_for

ADMIN = "admin-token-0123456789abcdef"
ACKER = "acker-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
TOKENS = f"""\
tokens:
  - {{user: alice, token: "{ADMIN}", verbs: ["*"]}}
  - {{user: bob, token_sha256: "{hashlib.sha256(ACKER.encode()).hexdigest()}", verbs: [ack, report]}}
  - {{user: dash, token: "{READER}", verbs: [get]}}
"""


def bearer(t: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {t}"}


class Served:
    def __init__(self, ctl: Controller, clock: FakeClock, url: str, store: SqliteStore, runner: Any) -> None:
        self.ctl, self.clock, self.url, self.store, self.runner = ctl, clock, url, store, runner


def serve(tmp_path: Path, api: ApiConfig | None = None, guard: Guard | None = None,
          host: str = "127.0.0.1") -> tuple[Served, ApiServer]:
    from fleethealth.act.ledger import Ledger
    from fleethealth.act.runner import ActuationRunner

    ctl, src, clock = make()
    runner = ActuationRunner({}, Ledger(tmp_path / "actions.db"))
    store = SqliteStore(tmp_path / "state.db")
    api = api or ApiConfig()
    g = guard or Guard([StaticTokens.parse(TOKENS)], read=api.read)
    srv = ApiServer(ctl, host, free_port(), runner=runner, guard=g, auditor=Auditor(store, clock=clock.now),
                    api=api).start()
    run_for(ctl, clock, 30)
    return Served(ctl, clock, srv.url, store, runner), srv


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[Served]:
    s, srv = serve(tmp_path)
    try:
        yield s
    finally:
        srv.stop()
        s.store.close()


def test_anonymous_and_bad_tokens_are_401_with_one_line_and_nothing_happens(served: Served) -> None:
    ack = {"kind": "ack", "entity": "n0", "to": "READY"}
    for headers in ({}, {"Authorization": "Basic YWxpY2U6eA=="}, bearer("not-a-token-at-all-xxxxxxxx")):
        for path, kw in (("/api/v1/events", {"json": ack}), ("/api/v1/kill", {"content": b"x"}),
                         ("/api/v1/resume", {})):
            r = httpx.post(served.url + path, headers=headers, **kw)
            assert r.status_code == 401, (path, headers, r.text)
            assert "\n" not in r.json()["detail"] and r.headers["www-authenticate"].startswith("Bearer")
    # even a malformed body is 401 first: nothing about the API is told to an anonymous caller
    assert httpx.post(served.url + "/api/v1/events", content=b"{").status_code == 401
    assert not served.ctl._pending_events and not served.runner.killed
    assert served.store.audit_log() == []  # anonymous refusals are only counted
    assert 'fleethealth_api_refused_total{code="401"} 10.0' in httpx.get(served.url + "/metrics").text


def test_a_token_without_the_verb_is_403_and_the_refusal_is_audited(served: Served) -> None:
    r = httpx.post(served.url + "/api/v1/events", json={"kind": "ack", "entity": "n0", "to": "READY"},
                   headers=bearer(ACKER))
    assert r.status_code == 403
    assert r.json()["detail"] == ("bob may not ready nodes/n0 (fleethealth.io): the token file does not grant "
                                  "'bob' the verb 'ready'")
    assert httpx.post(served.url + "/api/v1/kill", headers=bearer(ACKER)).status_code == 403
    assert httpx.post(served.url + "/api/v1/kill", headers=bearer(READER)).status_code == 403
    assert not served.ctl._pending_events and not served.runner.killed
    rows = served.store.audit_log()
    assert [(r["actor"], r["verb"], r["target"], r["allowed"]) for r in rows] == [
        ("bob", "ready", "node/n0", False), ("bob", "kill", "fleet", False), ("dash", "kill", "fleet", False)]
    assert rows[0]["remote"].startswith("127.0.0.1:") and "refused" in rows[0]["detail"]


def test_allowed_actions_are_audited_with_who_what_when_where(served: Served) -> None:
    served.clock.t += 5
    r = httpx.post(served.url + "/api/v1/events", headers=bearer(ACKER),
                   json={"kind": "ack", "entity": "n1", "to": "QUARANTINED", "actor": "somebody-else"})
    assert r.status_code == 202 and r.json()["accepted"]["actor"] == "bob"
    assert served.ctl._pending_events[-1].actor == "bob"
    r = httpx.post(served.url + "/api/v1/events", headers=bearer(ACKER),
                   json={"kind": "active_test", "entity": "n2", "passed": True})
    assert r.status_code == 202
    assert httpx.post(served.url + "/api/v1/kill", content=b"bad rollout", headers=bearer(ADMIN)).status_code == 200
    assert served.runner.killed
    assert httpx.post(served.url + "/api/v1/resume", headers=bearer(ADMIN)).json() == {"killed": False}
    rows = served.store.audit_log()
    assert [(r["actor"], r["verb"], r["target"], r["allowed"], r["detail"]) for r in rows] == [
        ("bob", "ack", "node/n1", True, {"kind": "ack", "to": "QUARANTINED"}),
        ("bob", "report", "node/n2", True, {"kind": "active_test", "passed": True}),
        ("alice", "kill", "fleet", True, {"reason": "bad rollout"}),
        ("alice", "resume", "fleet", True, {}),
    ]
    assert all(r["ts"] == served.clock.t and r["remote"].startswith("127.0.0.1:") for r in rows)
    assert httpx.get(served.url + "/api/v1/audit").json()["audit"] == rows  # readable like the rest


def test_an_action_that_cannot_be_audited_is_not_done(tmp_path: Path) -> None:
    class Broken:
        def audit(self, *a: Any) -> None:
            raise RuntimeError("database is locked")

    ctl, src, clock = make()
    g = Guard([StaticTokens.parse(TOKENS)])
    srv = ApiServer(ctl, "127.0.0.1", free_port(), guard=g, auditor=Auditor(Broken())).start()
    try:
        r = httpx.post(srv.url + "/api/v1/events", json={"kind": "ack", "entity": "n0"}, headers=bearer(ADMIN))
        assert r.status_code == 503 and "nothing was done" in r.json()["detail"]
        assert not ctl._pending_events
    finally:
        srv.stop()


def test_without_any_authority_every_post_is_refused(tmp_path: Path) -> None:
    ctl, src, clock = make()
    srv = ApiServer(ctl, "127.0.0.1", free_port()).start()
    try:
        r = httpx.post(srv.url + "/api/v1/events", json={"kind": "ack", "entity": "n0"}, headers=bearer(ADMIN))
        assert r.status_code == 401 and "no authentication is configured" in r.json()["detail"]
        assert httpx.get(srv.url + "/api/v1/states").status_code == 200  # loopback reads stay open
    finally:
        srv.stop()


def _non_loopback_address() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface's address
        addr = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if addr.startswith("127.") else addr


@pytest.mark.parametrize("mode", ["loopback", "authenticated", "open"])
def test_reads_need_a_token_except_where_configured_open(tmp_path: Path, mode: str) -> None:
    addr = _non_loopback_address()
    if mode == "loopback" and addr is None:
        pytest.skip("no non-loopback address on this machine to read from")
    s, srv = serve(tmp_path, api=ApiConfig(read=mode), host="0.0.0.0")  # type: ignore[arg-type]
    port = srv.port
    try:
        local = f"http://127.0.0.1:{port}"
        remote = f"http://{addr}:{port}" if addr else None
        paths = ("/api/v1/health", "/api/v1/states", "/api/v1/intents", "/api/v1/transitions",
                 "/api/v1/weights", "/api/v1/status", "/api/v1/audit")
        for p in paths:
            if mode == "loopback":
                assert httpx.get(local + p).status_code == 200
                assert remote is not None and httpx.get(remote + p).status_code == 401
                assert httpx.get(remote + p, headers=bearer(READER)).status_code == 200
            elif mode == "authenticated":
                assert httpx.get(local + p).status_code == 401
                assert httpx.get(local + p, headers=bearer(READER)).status_code == 200
                assert httpx.get(local + p, headers=bearer(ACKER)).status_code == 403  # bob has no 'get'
            else:
                assert httpx.get(local + p).status_code == 200
        assert httpx.get(local + "/healthz").status_code in (200, 503)  # probes never need a token
        assert httpx.get(local + "/metrics").status_code == 200  # api.metrics: open by default
    finally:
        srv.stop()
        s.store.close()


def test_metrics_can_require_a_token(tmp_path: Path) -> None:
    s, srv = serve(tmp_path, api=ApiConfig(metrics="authenticated"))
    try:
        assert httpx.get(s.url + "/metrics").status_code == 401
        assert "fleethealth_cycles_total" in httpx.get(s.url + "/metrics", headers=bearer(READER)).text
    finally:
        srv.stop()
        s.store.close()


def _raw(port: int, head: bytes, chunks: int = 0, chunk: bytes = b"") -> bytes:
    """Send a request by hand (a Content-Length that lies, or a chunked body) and read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sk:
        sk.sendall(head)
        try:
            for _ in range(chunks):
                sk.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if chunks:
                sk.sendall(b"0\r\n\r\n")
        except OSError:  # the server answered 413 and closed while we were still sending
            pass
        out = b""
        try:
            while True:
                b = sk.recv(65536)
                if not b:
                    break
                out += b
        except OSError:
            pass
        return out


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_large_bodies_are_413_without_being_read(served: Served) -> None:
    port = int(served.url.rsplit(":", 1)[1])
    auth = f"Authorization: Bearer {ADMIN}\r\n".encode()
    # a declared 300 MB body: refused on its Content-Length, before a byte of it is read
    ans = _raw(port, b"POST /api/v1/events HTTP/1.1\r\nHost: x\r\n" + auth +
               b"Content-Type: application/json\r\nContent-Length: 314572800\r\n\r\n{")
    assert ans.startswith(b"HTTP/1.1 413") and b"larger than 1048576 bytes" in ans, ans[:300]
    # a chunked 300 MB body: reading stops at the limit, the process does not grow
    rss0 = _rss_mb()
    t0 = time.monotonic()
    ans = _raw(port, b"POST /api/v1/events HTTP/1.1\r\nHost: x\r\n" + auth +
               b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
               chunks=300, chunk=b"[" + b" " * (1 << 20 - 1))
    assert ans.startswith(b"HTTP/1.1 413"), ans[:300]
    assert _rss_mb() - rss0 < 64, f"RSS grew from {rss0:.0f} to {_rss_mb():.0f} MB"
    assert time.monotonic() - t0 < 60
    assert not served.ctl._pending_events
    # the same for the kill switch's free-text body, and small bodies still work
    r = httpx.post(served.url + "/api/v1/kill", content=b"x" * (2 << 20), headers=bearer(ADMIN))
    assert r.status_code == 413 and not served.runner.killed
    assert httpx.post(served.url + "/api/v1/kill", content=b"ok", headers=bearer(ADMIN)).status_code == 200


@pytest.mark.parametrize("name", ["n0\x00", "n0\nINFO forged log line", "n\x1b[31m0", "n0\u202e", ""])
def test_entity_names_with_control_characters_are_refused(served: Served, name: str) -> None:
    r = httpx.post(served.url + "/api/v1/events", json={"kind": "ack", "entity": name}, headers=bearer(ADMIN))
    assert r.status_code == 400 and "entity" in r.json()["detail"]
    assert not served.ctl._pending_events
    if name:
        assert httpx.get(served.url + "/api/v1/health", params={"entity": name}).status_code == 400
        assert httpx.get(served.url + "/api/v1/intents", params={"entity": name}).status_code == 400


def test_docs_are_off_unless_enabled(tmp_path: Path) -> None:
    for docs in (False, True):
        s, srv = serve(tmp_path / str(docs), api=ApiConfig(docs=docs))
        try:
            for p in ("/docs", "/redoc", "/openapi.json"):
                assert httpx.get(s.url + p).status_code == (200 if docs else 404)
        finally:
            srv.stop()
            s.store.close()


def test_status_and_metrics_never_show_credentials_of_a_scrape_url(tmp_path: Path) -> None:
    from fleethealth.sources.scrape import ScrapeSource, ScrapeTarget

    url = f"http://scraper:s3cret-pw@127.0.0.1:{free_port()}/metrics?token=t0ps3cret"
    src = ScrapeSource([ScrapeTarget(url)], timeout_s=1)
    ctl = Controller(default_policy(), [src], interval_s=15, clock=FakeClock())
    srv = ApiServer(ctl, "127.0.0.1", free_port()).start()
    try:
        ctl.cycle()
        text = httpx.get(srv.url + "/api/v1/status").text
        assert "127.0.0.1" in text and "s3cret" not in text and "t0ps3cret" not in text
        assert "s3cret" not in httpx.get(srv.url + "/metrics").text
    finally:
        srv.stop()
        src.close()


def test_token_file_errors_name_the_line() -> None:
    with pytest.raises(TokenFileError, match=r"t\.yaml:4: tokens\[0\]\.verbs"):
        StaticTokens.parse('tokens:\n  - user: a\n    token: "0123456789abcdefgh"\n    verbs: [fly]\n', "t.yaml")
    with pytest.raises(TokenFileError, match="exactly one"):
        StaticTokens.parse("tokens: [{user: a, verbs: [ack]}]", "t.yaml")


def test_verbs_of_events() -> None:
    assert event_verb("ack", "READY") == "ready" and event_verb("ack", "ready") == "ready"
    assert event_verb("ack", "QUARANTINED") == "ack" and event_verb("ack", None) == "ack"
    assert event_verb("active_test", None) == event_verb("reset", None) == event_verb("oom", None) == "report"
    assert entity_problem("node-1/gpu0") is None and entity_problem(7) == "entity must be a string"
    assert entity_problem("x" * 600) is not None


def test_the_node_agents_reset_reports_carry_its_token(served: Served) -> None:
    from fleethealth.agent.reset import controller_reporter

    event = {"kind": "reset", "entity": "n3", "passed": True, "actor": "agent/n3", "payload": {"status": "done"}}
    with pytest.raises(httpx.HTTPStatusError) as exc:
        controller_reporter(served.url, None)(event)
    assert exc.value.response.status_code == 401
    controller_reporter(served.url, ACKER)(event)  # bob may report
    ev = served.ctl._pending_events[-1]
    assert (ev.kind, ev.entity, ev.passed, ev.actor) == ("reset", "n3", True, "bob")
    assert served.store.audit_log()[-1]["verb"] == "report"
