"""Invariants of the pure hardening rules (hypothesis): an escaped PromQL string never ends early and
decodes to the input; redaction never leaves a URL's password; entity names are refused exactly when
they hold control characters; the body limit answers 413 exactly when the body is over it."""

from __future__ import annotations

import asyncio
import re
import unicodedata

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from hypothesis import given
from hypothesis import strategies as st

from fleethealth.act.evidence import promql_string, re2_escape
from fleethealth.auth.access import entity_problem, is_loopback
from fleethealth.auth.http import BodyLimit
from fleethealth.auth.redact import redact_text, redact_url

_GO_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def _go_unquote(body: str) -> str:
    """The inside of a PromQL double-quoted string decoded as Prometheus' lexer does (the escapes we use);
    an unescaped quote or a control character is an error."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == '"' or ord(c) < 0x20:
            raise ValueError(f"string ends or breaks at {i}")
        if c == "\\":
            n = body[i + 1]
            if n == "x":
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            if n not in _GO_ESCAPES:
                raise ValueError(f"unknown escape \\{n}")
            out.append(_GO_ESCAPES[n])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


@given(st.text(max_size=60))
def test_promql_strings_round_trip_and_never_end_early(s: str) -> None:
    assert _go_unquote(promql_string(s)) == s
    # the regex form, once unquoted, matches the name literally (RE2 and Python agree on these escapes)
    rx = _go_unquote(promql_string(re2_escape(s)))
    assert re.fullmatch(rx, s, flags=re.DOTALL)


_userinfo = st.text(st.characters(codec="ascii", categories=("L", "N"), include_characters="-_.~!$&'()*+,;="),
                    min_size=4, max_size=20)


@given(_userinfo, _userinfo, st.sampled_from(["host:9100", "10.0.0.1", "[::1]:80"]),
       st.sampled_from(["", "/metrics", "/a/b?x=1"]))
def test_redaction_never_leaves_the_password(user: str, pw: str, host: str, path: str) -> None:
    pw = pw[:2] + "@" + pw[2:]  # a raw @ in a password (urlsplit takes the last one as the separator)
    url = f"http://{user}:{pw}@{host}{path}"
    for out in (redact_url(url), redact_text(f"cannot connect to '{url}': refused")):
        assert f"{user}:{pw}" not in out and pw not in out and "***@" in out
        assert host in out


@given(st.text(max_size=40))
def test_entity_names_refused_exactly_for_control_characters(name: str) -> None:
    bad = any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name)
    why = entity_problem(name)
    if not name.strip():
        assert why == "entity is empty"
    else:
        assert (why is not None) == bad


def _echo_app(limit: int) -> BodyLimit:
    app = FastAPI()

    @app.post("/x")
    async def x(request: Request) -> JSONResponse:
        return JSONResponse({"n": len(await request.body())})

    return BodyLimit(app, limit)


@given(st.integers(1024, 8192), st.lists(st.integers(0, 3000), max_size=6), st.booleans())
def test_body_limit_is_413_exactly_when_over(limit: int, chunks: list[int], declared: bool) -> None:
    total = sum(chunks)

    async def body():  # type: ignore[no-untyped-def]
        for n in chunks:
            yield b"a" * n

    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_echo_app(limit)), base_url="http://t") as c:
            if declared:
                return await c.post("/x", content=b"a" * total)
            return await c.post("/x", content=body())

    r = asyncio.run(call())
    if total > limit:
        assert r.status_code == 413 and f"larger than {limit} bytes" in r.json()["detail"]
    else:
        assert r.status_code == 200 and r.json() == {"n": total}


def test_loopback_peers() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.8.9.1", "::1", "::ffff:127.0.0.1", "localhost"]))
    assert not any(map(is_loopback, ["10.0.0.1", "::ffff:10.0.0.1", "0.0.0.0", "", None, "example.com"]))
