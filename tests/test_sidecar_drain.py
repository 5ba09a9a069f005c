"""Drain under many concurrent streams, with the official `openai` client through the sidecar to the real
fake engine: no stream that started decoding is lost, every queued request gets a retryable 503 with
Retry-After, and nothing hangs past max_drain_seconds."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from fake_engine import running_pair, wait_until
from fleethealth.decide.model import State


async def _one_stream(client: openai.AsyncOpenAI, i: int, max_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {"i": i, "chunks": 0, "finish": None, "status": None, "retry_after": None,
                           "stream_error": None, "t_end": None}
    try:
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"secret prompt number {i}"}],
            stream=True, max_tokens=max_tokens)
        async for chunk in stream:
            out["chunks"] += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                out["finish"] = chunk.choices[0].finish_reason
    except openai.APIStatusError as e:
        out["status"] = e.status_code
        out["retry_after"] = e.response.headers.get("retry-after")
    except openai.APIError as e:  # the sidecar's final SSE error event
        out["stream_error"] = e.message
    out["t_end"] = time.monotonic()
    return out


def _drain(url: str, auth: dict[str, str]) -> None:
    r = httpx.post(url + "/admin/drain", headers=auth, timeout=5)
    assert r.status_code == 202, r.text


def test_drain_under_40_streams_loses_no_decoding_request(tmp_path: Path) -> None:
    with running_pair(max_concurrency=30, queue_limit=100, max_drain_seconds=5.0, evidence_dir=tmp_path) as p:
        # 40 streams: 30 forwarded (20 decode at once in the engine, 10 wait there without a first token),
        # 10 wait in the sidecar's own admission queue.
        p.engine.set(token_delay_s=0.05, max_running=20)

        async def scenario() -> tuple[list[dict[str, Any]], float, float]:
            client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0, timeout=30)
            tasks = [asyncio.create_task(_one_stream(client, i, 40)) for i in range(40)]
            await asyncio.to_thread(wait_until, lambda: p.engine.running == 20 and p.sc.admission.queued == 10, 10)
            t_drain = time.monotonic()
            await asyncio.to_thread(_drain, p.url, p.auth)
            results = await asyncio.gather(*tasks)
            await client.close()
            return results, t_drain, time.monotonic()

        results, t_drain, t_done = asyncio.run(scenario())
        wait_until(lambda: p.sc.drain is not None and p.sc.drain.evidence_path is not None, 5)
        bundle_text = Path(p.sc.drain.evidence_path).read_text()
        bundle = json.loads(bundle_text)
        at_start = bundle["drain"]["at_start"]
        completed = [r for r in results if r["finish"] == "length"]
        rejected = [r for r in results if r["status"] == 503]
        # Nothing lost, nothing cut: each request either ran to its end or got a retryable 503.
        assert len(completed) + len(rejected) == 40, results
        assert all(r["chunks"] == 40 and r["stream_error"] is None for r in completed)
        # Exactly the streams that were decoding when the drain began ran to their end (on a loaded box a
        # few may have finished before the drain call landed: those are not the drain's) ...
        outcomes = bundle["drain"]["outcomes"]
        assert at_start["decoding"] >= 10 and at_start["queued"] + at_start["sent"] >= 10, at_start
        assert outcomes.get("completed", 0) == at_start["decoding"], (at_start, outcomes)
        assert "cut_at_deadline" not in outcomes and "client_gone" not in outcomes, outcomes
        # ... and everything else (the proxy's queue and the engine's) got 503 + Retry-After at once.
        assert len(rejected) == at_start["queued"] + at_start["sent"], (at_start, outcomes)
        assert len(completed) - outcomes["completed"] + len(rejected) + at_start["decoding"] == 40
        assert all(r["retry_after"] == "3" for r in rejected)
        # "At once": every retryable answer arrived before any decoding stream finished (those take 2 s).
        assert max(r["t_end"] for r in rejected) < min(r["t_end"] for r in completed if r["t_end"] > t_drain)
        assert t_done - t_drain < 5.0 + 2.0  # never past max_drain_seconds (plus scheduling slack)
        assert p.sc.state is State.DRAINING
        # New requests are refused, readiness is down, and the drain left evidence without prompts.
        r = httpx.post(p.url + "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert httpx.get(p.url + "/readyz").status_code == 503
        assert "secret prompt" not in bundle_text and bundle["prompts_redacted"] is True
        assert len(bundle["request_samples"]) >= 40 and bundle["metrics_window"]
        # Undrain of an admin-only drain goes straight back to READY.
        assert httpx.post(p.url + "/admin/undrain", headers=p.auth).json()["state"] == "READY"
        assert httpx.get(p.url + "/readyz").status_code == 200


def test_drain_deadline_ends_streams_cleanly_never_hangs() -> None:
    with running_pair(max_drain_seconds=1.0) as p:
        p.engine.set(token_delay_s=0.05)  # 200 tokens: 10 s, far past the deadline

        async def scenario() -> tuple[list[dict[str, Any]], float]:
            client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0, timeout=30)
            tasks = [asyncio.create_task(_one_stream(client, i, 200)) for i in range(8)]
            await asyncio.to_thread(
                wait_until, lambda: sum(1 for r in p.sc.active if r.phase.value == "decoding") == 8, 10)
            t_drain = time.monotonic()
            await asyncio.to_thread(_drain, p.url, p.auth)
            results = await asyncio.gather(*tasks)
            await client.close()
            return results, t_drain

        results, t_drain = asyncio.run(scenario())
        for r in results:
            assert r["stream_error"] and "deadline" in r["stream_error"], r
            assert 1 <= r["chunks"] < 200
            assert r["t_end"] - t_drain < 1.0 + 2.0  # max_drain_seconds plus scheduling slack

    # The raw stream ends with an error event and [DONE], on an SSE event boundary.
    with running_pair(max_drain_seconds=0.5) as p:
        p.engine.set(token_delay_s=0.05)
        body = {"model": "fake-model", "prompt": "hello", "max_tokens": 100, "stream": True}
        with httpx.stream("POST", p.url + "/v1/completions", json=body, timeout=10) as resp:
            it = resp.iter_raw()
            first = next(it)
            assert first.startswith(b"data: ")
            _drain(p.url, p.auth)
            rest = b"".join(it)
        events = [e for e in (first + rest).split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        assert json.loads(events[-2][len(b"data: "):])["error"]["code"] == "stream_ended_by_sidecar"
        assert all(e.startswith(b"data: ") for e in events)


def test_engine_crash_mid_stream_ends_the_stream_with_an_error_event() -> None:
    with running_pair() as p:
        assert httpx.get(p.url + "/v1/models").json()["data"][0]["id"] == "fake-model"  # passthrough
        p.engine.set(token_delay_s=0.02)
        client = openai.OpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0, timeout=10)
        stream = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                                stream=True, max_tokens=500)
        got = 0
        t0 = time.monotonic()
        try:
            for _ in stream:
                got += 1
                if got == 5:
                    p.engine.set(mode="crash")
            raise AssertionError("the stream should have ended with an error")
        except openai.APIError as e:
            assert "engine failed" in e.message
        assert 5 <= got < 500 and time.monotonic() - t0 < 5
        wait_until(lambda: p.sc.outcomes["upstream_failed"] == 1, 5)  # recorded after the last byte went out


def test_a_client_that_stops_reading_cannot_hold_the_drain_open() -> None:
    import socket

    with running_pair(max_drain_seconds=0.5) as p:
        p.engine.set(token_padding=65536, token_delay_s=0.0)  # 64 KiB per token: socket buffers fill up
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", p.sidecar_srv.port))
        body = json.dumps({"model": "fake-model", "prompt": "x", "max_tokens": 400, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert s.recv(1024).startswith(b"HTTP/1.1 200")
        wait_until(lambda: any(r.phase.value == "decoding" for r in p.sc.active), 5)
        time.sleep(0.5)  # the client reads nothing more: the sidecar's writer blocks
        t0 = time.monotonic()
        _drain(p.url, p.auth)
        wait_until(lambda: not p.sc.active, 10)
        assert time.monotonic() - t0 < 0.5 + 1.0 + 5.0  # deadline, grace for final events, loaded-box slack
        assert p.sc.outcomes["cut_at_deadline"] == 1
        s.settimeout(10)
        while s.recv(1 << 20):  # the connection is closed, not left hanging
            pass
        s.close()
