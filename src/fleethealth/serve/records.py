"""What the sidecar keeps about requests and drains, and the small pure helpers of its proxy.

Theory of operation. A proxied request is one ``RequestRecord`` from the moment it is parsed until it is
answered; its ``phase`` decides what a drain does to it:
- QUEUED: waiting in the proxy's admission queue. A drain answers it at once: 503 + Retry-After.
- SENT: forwarded, no byte of answer yet (for a stream: no first token). Nothing reached the client, so a
  drain cancels it upstream and answers 503 + Retry-After: the gateway retries elsewhere.
- DECODING: the first chunk went to the client. A drain lets it finish until ``max_drain_seconds``; then
  it ends cleanly with a final SSE ``data: {"error": ...}`` event and ``data: [DONE]``.
A non-streaming request has no visible first token: it stays SENT until its whole answer arrives, so it
runs until the drain deadline and then gets a 503 (still retryable: the client saw nothing).

``RequestRecord.abort(reason)`` is how the drain reaches a request: it records the reason and calls the
hook the request's forwarder installed (``on_abort``), which ends the request the way its phase says.
Answers the sidecar makes itself are ``Answer`` values (status, headers, body): data that either front
(the lean HTTP protocol or the ASGI app) writes out.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fleethealth.decide.model import Tier

# Headers that belong to one connection, not to the request or answer being relayed (plus the ones the
# proxy sets itself: host, length, accepted encodings, 100-continue). Content-Encoding passes: bodies are
# relayed as they are, so their encoding is the client's to know.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                        "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding", "expect"})
ENGINE_METRICS = ("vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:num_running_reqs",
                  "sglang:num_queue_reqs", "sglang:token_usage")

Headers = list[tuple[bytes, bytes]]


class Phase(StrEnum):
    QUEUED = "queued"
    SENT = "sent"
    DECODING = "decoding"
    DONE = "done"


@dataclass(slots=True)
class Answer:
    """A whole answer the sidecar gives itself (or relays whole): written as is by either front."""

    status: int
    body: bytes
    headers: Headers = field(default_factory=list)


def json_answer(status: int, obj: Any, headers: Headers | None = None) -> Answer:
    return Answer(status, json.dumps(obj).encode(), [(b"content-type", b"application/json"), *(headers or ())])


def error_json(message: str, etype: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "code": code}}


@dataclass(eq=False, slots=True)
class RequestRecord:
    id: int
    path: str
    stream: bool
    model: str
    max_tokens: int | None
    prompt_tokens_est: int
    prompt_digest: str
    prompt_chars: int
    prompt_text: str | None
    canary: bool
    started: float
    phase: Phase = Phase.QUEUED
    sent_at: float | None = None
    first_at: float | None = None
    last_chunk_at: float = 0.0
    chunks: int = 0
    itl_sum: float = 0.0
    status: int | None = None
    outcome: str = ""
    abort_reason: str | None = None
    released: bool = False
    on_abort: Callable[[str], None] | None = None  # installed by the forwarder once the request is admitted

    def abort(self, reason: str) -> None:
        if self.abort_reason is None:
            self.abort_reason = reason
            if self.on_abort is not None:
                self.on_abort(reason)

    def sample(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "path": self.path, "stream": self.stream, "model": self.model,
            "max_tokens": self.max_tokens, "prompt_tokens_est": self.prompt_tokens_est,
            "prompt_sha256": self.prompt_digest, "prompt_chars": self.prompt_chars, "canary": self.canary,
            "started": self.started, "phase": str(self.phase), "status": self.status, "outcome": self.outcome,
            "ttft_s": None if self.first_at is None or self.sent_at is None else round(self.first_at - self.sent_at, 6),
            "chunks": self.chunks,
        }
        if self.prompt_text is not None:
            d["prompt"] = self.prompt_text
        return d


@dataclass
class DrainProgress:
    started: float
    deadline: float
    reason: str
    fault: bool
    tier: Tier | None
    at_start: dict[str, int] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    finished: float | None = None
    evidence_path: str | None = None
    task: asyncio.Task[None] | None = None

    def to_dict(self, now: float, remaining: int) -> dict[str, Any]:
        return {
            "reason": self.reason, "fault": self.fault, "tier": None if self.tier is None else str(self.tier),
            "started": self.started, "deadline": self.deadline, "elapsed_s": round((self.finished or now) - self.started, 3),
            "finished": self.finished, "remaining": remaining, "at_start": dict(self.at_start),
            "outcomes": dict(self.outcomes), "evidence_path": self.evidence_path,
        }


def estimate_tokens(text: str) -> int:
    # No tokenizer in the sidecar: about 4 characters per token for English text; used only to compare
    # requests with each other (the oversize limit is learned with the same estimate).
    return max(1, (len(text) + 3) // 4)


def prompt_text(payload: dict[str, Any]) -> str:
    if "messages" in payload and isinstance(payload["messages"], list):
        parts = []
        for m in payload["messages"]:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts.extend(str(p.get("text", "")) for p in c if isinstance(p, dict))
        return "\n".join(parts)
    p = payload.get("prompt")
    if isinstance(p, list):
        return "\n".join(str(x) for x in p)
    return str(p) if p is not None else ""


def engine_values(text: str) -> dict[str, float]:
    """Sum per metric name of the few engine metrics the sidecar watches (classic text format)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end <= 0:
            continue
        name = line[:name_end]
        if name not in ENGINE_METRICS:
            continue
        rest = line[line.rfind("}") + 1:] if "{" in line[:name_end + 1] else line[name_end:]
        try:
            val = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + val
    return out
