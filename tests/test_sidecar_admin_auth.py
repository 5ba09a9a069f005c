"""The sidecar's /admin/* through the shared auth module, with a token file (no Kubernetes): who may drain
and undrain by the file's verbs, one-line 401/403, and every action in the local append-only JSON Lines
audit log (who, what, when, from where) before it is done; the log is bounded by rotation; an action that
cannot be audited is refused (503) and not done. A real sidecar on loopback, real HTTP."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_engine import ADMIN_TOKEN, running_pair, wait_until
from fleethealth.auth.audit_log import JsonlAuditLog
from fleethealth.serve.admin_security import STATIC_USER

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"


def token_file(tmp_path: Path) -> Path:
    p = tmp_path / "admin-tokens.yaml"
    p.write_text(
        "tokens:\n"
        f"  - {{user: alice, token_sha256: {hashlib.sha256(ALICE.encode()).hexdigest()}, verbs: [drain, undrain]}}\n"
        f"  - {{user: bob, token: {BOB}, verbs: [get]}}\n")
    return p


def bearer(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_token_file_verbs_decide_and_every_action_is_audited(tmp_path: Path) -> None:
    audit = tmp_path / "audit" / "admin.jsonl"
    with running_pair(admin_tokens_file=token_file(tmp_path), audit_log=audit) as p:
        # bob may read, not drain: 403 with one line naming who, the verb and the replica; audited
        r = httpx.post(p.url + "/admin/drain", headers=bearer(BOB), params={"reason": "bob tries"})
        assert r.status_code == 403
        assert r.json()["detail"] == ("bob may not drain replicas/replica-0 (fleethealth.io): "
                                      "the token file does not grant 'bob' the verb 'drain'")
        assert p.sc.state.value == "READY"
        # alice may drain and undrain
        r = httpx.post(p.url + "/admin/drain", headers=bearer(ALICE), params={"reason": "maintenance"})
        assert r.status_code == 202
        wait_until(lambda: p.sc.state.value == "DRAINING", 10)
        assert httpx.post(p.url + "/admin/undrain", headers=bearer(ALICE)).status_code == 200
        # the legacy static admin token is one credential among them (all verbs)
        r = httpx.post(p.url + "/admin/drain", headers=p.auth, params={"reason": "preStop", "wait": True},
                       timeout=20)
        assert r.status_code == 200
        # 401s are counted, not audited
        assert httpx.post(p.url + "/admin/undrain", headers=bearer("nope")).status_code == 401
    recs = records(audit)
    got = [(r["actor"], r["verb"], r["target"], r["allowed"]) for r in recs]
    assert got == [("bob", "drain", "replica/replica-0", False), ("alice", "drain", "replica/replica-0", True),
                   ("alice", "undrain", "replica/replica-0", True),
                   (STATIC_USER, "drain", "replica/replica-0", True)]
    for r in recs:
        assert str(r["remote"]).startswith("127.0.0.1:") and float(str(r["ts"])) > 0 and str(r["time"]).endswith("Z")
    assert recs[1]["detail"] == {"reason": "maintenance", "wait": False}
    assert "refused" in recs[0]["detail"]  # type: ignore[operator]
    assert ADMIN_TOKEN not in audit.read_text() and ALICE not in audit.read_text()  # no secrets in the trail
    assert oct(audit.stat().st_mode & 0o777) == "0o600"


def test_an_action_that_cannot_be_audited_is_refused_and_not_done(tmp_path: Path) -> None:
    audit = tmp_path / "admin.jsonl"
    with running_pair(audit_log=audit) as p:
        audit.unlink()
        audit.mkdir()  # the log path is now a directory: the append fails
        r = httpx.post(p.url + "/admin/drain", headers=p.auth, params={"reason": "x"})
        assert r.status_code == 503 and r.json()["detail"].endswith("; nothing was done")
        assert "cannot write the audit log" in r.json()["detail"]
        assert p.sc.state.value == "READY"


def test_no_credential_configured_refuses_every_action_in_one_line() -> None:
    with running_pair(admin_token=None) as p:
        r = httpx.post(p.url + "/admin/drain", headers=bearer("anything"))
        assert r.status_code == 401 and "no authentication is configured" in r.json()["detail"]
        assert "\n" not in r.json()["detail"]


def test_the_audit_log_is_append_only_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonlAuditLog(path, max_bytes=2048, keep=2)
    for i in range(200):
        log.audit(1000.0 + i, "alice", "drain", "replica/r", "127.0.0.1:1", True, {"i": i})
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["a.jsonl", "a.jsonl.1", "a.jsonl.2"]
    assert all(f.stat().st_size <= 2048 for f in files)  # at most (keep + 1) * max_bytes on disk
    kept = log.audit_log(limit=0)
    idx = [r["detail"]["i"] for r in kept]
    assert idx == list(range(idx[0], 200))  # the newest records, in order, none lost inside the window
    assert log.audit_log(since=1195.0) == kept[-5:]


def test_an_unwritable_audit_log_is_an_error_at_start(tmp_path: Path) -> None:
    from fleethealth.auth.audit_log import AuditLogError

    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores the mode bits
            pytest.skip("running as root: a read-only directory is writable")
        with pytest.raises(AuditLogError, match="cannot open the audit log"):
            JsonlAuditLog(ro / "x.jsonl")
    finally:
        os.chmod(ro, 0o700)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=60),
       keep=st.integers(min_value=1, max_value=3))
def test_rotation_never_loses_a_recent_record_and_stays_bounded(tmp_path_factory: pytest.TempPathFactory,
                                                                sizes: list[int], keep: int) -> None:
    """Any record sizes: the files stay within (keep + 1) * max_bytes, records come back in order, and every
    record newer than the oldest one kept is there (rotation drops whole old files, never one inside)."""
    d = tmp_path_factory.mktemp("audit")
    log = JsonlAuditLog(d / "a.jsonl", max_bytes=2048, keep=keep)
    for i, n in enumerate(sizes):
        log.audit(float(i), "u", "drain", "replica/r", "127.0.0.1:1", True, {"pad": "x" * n})
    files = list(d.iterdir())
    assert len(files) <= keep + 1
    # a record larger than max_bytes alone may exceed it; otherwise each file is within the bound
    assert all(f.stat().st_size <= 2048 or len(f.read_text().splitlines()) == 1 for f in files)
    got = [int(r["ts"]) for r in log.audit_log(limit=0)]
    assert got == list(range(got[0], len(sizes))) and got[-1] == len(sizes) - 1
