"""The sidecar's HTTP hardening (issue 15): no /docs, /redoc or /openapi.json unless enabled; request
bodies over the limit are 413 (on Content-Length before reading, chunked as soon as the limit is crossed,
so a 300 MB body does not grow the process); credentials are masked in log records."""

from __future__ import annotations

import logging

import httpx

from fake_engine import running_pair
from test_api_auth import _raw, _rss_mb


def test_docs_are_off_unless_enabled() -> None:
    with running_pair() as p:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert httpx.get(p.url + path).status_code == 404
    with running_pair(docs=True) as p:
        assert httpx.get(p.url + "/openapi.json").json()["info"]["title"] == "fleethealth sidecar"
        assert httpx.get(p.url + "/docs").status_code == 200


def test_large_bodies_are_413_and_do_not_grow_the_process() -> None:
    with running_pair(max_body_bytes=1 << 20) as p:
        port = int(p.url.rsplit(":", 1)[1])
        ok = httpx.post(p.url + "/v1/completions", json={"model": "m", "prompt": "x" * 1000, "max_tokens": 2})
        assert ok.status_code == 200, ok.text
        ans = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 314572800\r\n\r\n{")
        assert ans.startswith(b"HTTP/1.1 413") and b"larger than 1048576 bytes" in ans, ans[:300]
        rss0 = _rss_mb()
        ans = _raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n", chunks=300, chunk=b" " * (1 << 20))
        assert ans.startswith(b"HTTP/1.1 413"), ans[:300]
        assert _rss_mb() - rss0 < 64, f"RSS grew from {rss0:.0f} to {_rss_mb():.0f} MB"
        assert p.engine.behavior is not None
        again = httpx.post(p.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
        assert again.status_code == 200  # the server is fine afterwards


def test_log_records_never_carry_url_credentials(caplog: object) -> None:
    from fleethealth.auth.redact import RedactingFilter, redact_headers, redact_url

    rec = logging.LogRecord("x", logging.WARNING, __file__, 1, "source %s: cannot connect to %s", (
        "scrape", "http://scraper:s3cret@10.0.0.1:9400/metrics?token=abc&x=1"), None)
    assert RedactingFilter().filter(rec)
    assert rec.getMessage() == "source scrape: cannot connect to http://***@10.0.0.1:9400/metrics?token=***&x=1"
    assert redact_url("https://u:p@h/p?api_key=k&a=b") == "https://***@h/p?api_key=***&a=b"
    assert redact_headers({"Authorization": "Bearer x", "Accept": "*/*"}) == {"Authorization": "***",
                                                                              "Accept": "*/*"}


def test_installed_redaction_covers_the_handlers_in_use() -> None:
    import io

    from fleethealth.auth.redact import install_log_redaction

    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    logging.getLogger("uvicorn.error").addHandler(h)
    try:
        install_log_redaction()
        logging.getLogger("uvicorn.error").warning("GET /x?token=abc via http://u:pw@h:1/")
        assert buf.getvalue().strip() == "GET /x?token=*** via http://***@h:1/"
    finally:
        logging.getLogger("uvicorn.error").removeHandler(h)


def test_admin_drain_reason_with_control_characters_is_refused() -> None:
    with running_pair() as p:
        r = httpx.post(p.url + "/admin/drain", headers=p.auth, params={"reason": "x\nINFO forged"})
        assert r.status_code == 400 and r.json()["detail"].startswith("reason contains a control character")
        assert p.sc.state.value == "READY"
