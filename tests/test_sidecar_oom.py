"""CUDA OOMs seen in the engine's answers, handled per class through the sidecar (never a blind restart)."""

from __future__ import annotations

import httpx
import openai
import pytest

from fake_engine import running_pair, wait_until
from fleethealth.decide.model import State


def _oom_count(metrics_text: str, cls: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith("fleethealth_sidecar_ooms_total{") and f'class="{cls}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no ooms_total line for {cls}")


def test_oversized_request_gets_a_clear_400_and_is_refused_before_the_engine() -> None:
    with running_pair(kv_capacity_tokens=3000) as p:
        p.engine.set(mode="oom", oom_over_tokens=2500)
        client = openai.OpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as ei:
            client.completions.create(model="fake-model", prompt="p" * 400, max_tokens=3500)
        assert ei.value.status_code == 400
        msg = str(ei.value)
        assert "too large" in msg and "max_tokens" in msg
        assert p.engine.oom_count == 1
        # The same request again never reaches the engine; a smaller one is served normally.
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="fake-model", prompt="p" * 400, max_tokens=3500)
        assert p.engine.oom_count == 1
        ok = client.completions.create(model="fake-model", prompt="short", max_tokens=4)
        assert ok.choices[0].text.startswith("t0")
        assert p.sc.state is State.READY  # the replica is fine
        m = httpx.get(p.url + "/metrics")
        assert m.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert _oom_count(m.text, "oversized_request") == 1
        assert [i.kind.value for i in p.sc.intents] == ["reject_request"]
        # The OOM event is published in the shape the decisions layer reads (OomEvent's fields).
        from fleethealth.decide.oom import OomClass, OomEvent, classify_oom

        ev = httpx.get(p.url + "/admin/state", headers=p.auth).json()["oom_events"][0]["event"]
        again = OomEvent(**{k: tuple(v) if isinstance(v, list) else v for k, v in ev.items()})
        assert classify_oom(again).cls is OomClass.OVERSIZED_REQUEST and again.kv_capacity_tokens == 3000


def test_oversized_request_clipped_when_configured() -> None:
    with running_pair(kv_capacity_tokens=3000, oom_clip_max_tokens=True) as p:
        p.engine.set(mode="oom", oom_over_tokens=2500)
        r1 = httpx.post(p.url + "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 3500})
        assert r1.status_code == 400
        p.engine.set(mode="normal", token_delay_s=0.0)
        r2 = httpx.post(p.url + "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 3500},
                        timeout=30)
        assert r2.status_code == 200  # max_tokens clipped below the size that ran out of memory
        assert r2.json()["usage"]["completion_tokens"] < 3500


def test_batch_overload_lowers_concurrency_and_stays_ready() -> None:
    with running_pair(max_concurrency=64) as p:
        p.engine.set(mode="oom", kv_cache_usage=0.97)
        wait_until(lambda: p.sc.engine.get("vllm:kv_cache_usage_perc") == 0.97, 5)
        r = httpx.post(p.url + "/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 8})
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "oom_batch_overload"
        assert p.sc.admission.limit < 64
        assert p.sc.state is State.READY
        assert [i.kind.value for i in p.sc.intents] == ["limit_concurrency"]


def test_fragmentation_drains_and_asks_for_a_worker_rebuild() -> None:
    with running_pair() as p:
        # 2 GiB failed while 1 GiB was free and 6 GiB reserved-but-unallocated: fragmented.
        p.engine.set(mode="oom", oom_free_gib=1.0, oom_reserved_gib=6.0, oom_request_gib=2.0)
        r = httpx.post(p.url + "/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 8})
        assert r.status_code == 503 and r.json()["error"]["code"] == "oom_fragmentation"
        wait_until(lambda: p.sc.state is State.QUARANTINED, 5)
        kinds = [(i.kind.value, i.tier and i.tier.value) for i in p.sc.intents]
        assert ("rebuild_worker", "pod") in kinds and ("quarantine", "node") not in kinds
        # The engine restarting (the rebuild) brings it back through the canary, not straight to READY.
        p.engine.set(mode="crash")
        wait_until(lambda: not p.sc.engine_up, 5)
        p.engine.set(mode="normal")
        wait_until(lambda: p.sc.state is State.RECOVERING, 5)


def test_oom_with_cuda_context_error_is_a_device_fault(tmp_path: pytest.TempPathFactory) -> None:
    with running_pair() as p:
        p.engine.set(mode="error")  # illegal memory access
        r = httpx.post(p.url + "/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 8})
        assert r.status_code == 503 and r.json()["error"]["code"] == "cuda_error"
        p.engine.set(mode="oom")
        wait_until(lambda: p.sc.state is State.QUARANTINED, 5)
        # /gpuz serves the periodic GPU check's verdict: the OOM path can quarantine before the next check
        wait_until(lambda: httpx.get(p.url + "/gpuz").status_code == 503, 5)
        assert any(i.kind.value == "quarantine" and i.tier and i.tier.value == "node" for i in p.sc.intents)
        # Quarantined at node tier: an engine restart alone does not re-admit it.
        p.engine.set(mode="crash")
        wait_until(lambda: not p.sc.engine_up, 5)
        p.engine.set(mode="normal")
        wait_until(lambda: p.sc.engine_up, 5)
        assert p.sc.state is State.QUARANTINED
