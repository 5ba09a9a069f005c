"""Canary re-admission, the lifecycle table and the other pure parts of the sidecar."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_engine import running_pair, wait_until
from fleethealth.decide.model import State
from fleethealth.serve.admission import Admission, Rejected
from fleethealth.serve.canary import Canary, CanaryConfig, Observation, ShareGate, Verdict
from fleethealth.serve.lifecycle import TABLE, Event, ReplicaLifecycle, admits, next_state, state_diagram
from fleethealth.serve.progress import ProgressWatch
from fleethealth.serve.sidecar import engine_values

# ---- pure parts ------------------------------------------------------------------------------------


def test_canary_probe_then_ramp_then_pass() -> None:
    c = Canary(100.0, CanaryConfig(probes_required=2, stable_window_s=60, initial_share=0.1, min_requests=3))
    assert c.step(Observation(probe_successes=1), 101).verdict is Verdict.CONTINUE
    d = c.step(Observation(probe_successes=2), 102)
    assert d.phase == "ramp" and d.weight == pytest.approx(0.1)
    mid = c.step(Observation(probe_successes=2, requests=2), 132)
    assert 0.1 < mid.weight < 1.0 and mid.verdict is Verdict.CONTINUE
    # Window over but too few requests to judge: keep going.
    assert c.step(Observation(probe_successes=2, requests=2), 163).verdict is Verdict.CONTINUE
    d = c.step(Observation(probe_successes=2, requests=5, mean_ttft_s=0.1, mean_itl_s=0.01, gpu_ok=True), 170)
    assert d.verdict is Verdict.PASS and d.weight == 1.0


@pytest.mark.parametrize(("obs", "why"), [
    (Observation(probe_failures=1), "probe"),
    (Observation(probe_successes=2, requests=20, errors=3), "error rate"),
    (Observation(probe_successes=2, requests=1, mean_ttft_s=5.0), "TTFT"),
    (Observation(probe_successes=2, requests=1, mean_itl_s=1.0), "inter-token"),
    (Observation(probe_successes=2, gpu_ok=False), "GPU"),
    (Observation(probe_successes=2, memory_released=False), "memory"),
])
def test_canary_fails_on_any_bad_signal(obs: Observation, why: str) -> None:
    c = Canary(0.0, CanaryConfig())
    c.ramp_started_at = None if why == "probe" else 0.0
    d = c.step(obs, 10.0)
    assert d.verdict is Verdict.FAIL and why in d.reason and d.weight == 0.0


def test_canary_probe_timeout_fails() -> None:
    c = Canary(0.0, CanaryConfig(probes_required=2, probe_timeout_s=30))
    assert c.step(Observation(probe_successes=1), 31).verdict is Verdict.FAIL


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=0.0, max_value=1.0), st.integers(min_value=1, max_value=500))
def test_share_gate_admits_the_weight_share(weight: float, n: int) -> None:
    g = ShareGate()
    admitted = sum(g.admit(weight) for _ in range(n))
    assert abs(admitted - weight * n) <= 1.0


def test_lifecycle_table_is_the_only_way_and_ignores_unknown_pairs() -> None:
    lc = ReplicaLifecycle("r")
    assert lc.step(Event.CANARY_PASSED, 1.0, "x") is None and lc.state is State.STARTING
    path = [Event.ENGINE_UP, Event.WARMED, Event.FAULT, Event.DRAINED_AFTER_FAULT, Event.UNDRAIN,
            Event.CANARY_FAILED, Event.UNDRAIN, Event.CANARY_FAILED_REPEATEDLY]
    states = []
    for i, ev in enumerate(path):
        t = lc.step(ev, float(i), str(ev))
        assert t is not None and t.reason == str(ev)
        states.append(lc.state.value)
    assert states == ["WARMING", "READY", "DRAINING", "QUARANTINED", "RECOVERING", "QUARANTINED", "RECOVERING",
                      "FAILED"]
    # FAILED needs a human: nothing automatic leaves it.
    for ev in Event:
        if ev is not Event.UNDRAIN:
            assert next_state(State.FAILED, ev) is None
    assert not admits(State.DRAINING) and admits(State.RECOVERING)
    diagram = state_diagram()
    assert diagram.count("-->") == len(TABLE) + 1 and "RECOVERING --> READY: canary_passed" in diagram


def test_progress_watch_idle_vs_hung() -> None:
    w = ProgressWatch(timeout_s=10, last_progress=0.0)
    assert w.alive(1000.0)  # idle for ages: alive
    w.set_proxy_active(1, 1000.0)
    assert w.alive(1009.0) and not w.alive(1011.0)  # work appeared at 1000; no token since
    w.progress(1011.0)
    assert w.alive(1020.0)
    w.observe_engine(1021.0, running=2, gen_tokens_total=50)
    w.observe_engine(1025.0, running=2, gen_tokens_total=80)  # the engine's counter moved: progress
    assert w.stalled_for(1030.0) == pytest.approx(5.0)
    w.set_proxy_active(0, 1031.0)
    w.observe_engine(1031.0, running=0, gen_tokens_total=80)
    assert w.stalled_for(5000.0) == 0.0


def test_engine_values_sums_series() -> None:
    text = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="a",engine="0"} 3\n'
            'vllm:num_requests_running{model_name="a",engine="1"} 2\nvllm:generation_tokens_total 1.5e3\n'
            'other_metric 7\n')
    assert engine_values(text) == {"vllm:num_requests_running": 5.0, "vllm:generation_tokens_total": 1500.0}


def test_admission_queue_limit_and_reject_waiting() -> None:
    async def run() -> None:
        a = Admission(limit=1, queue_limit=2)
        await a.acquire(1.0)
        waiters = [asyncio.create_task(a.acquire(5.0)) for _ in range(2)]
        await asyncio.sleep(0)
        assert a.queued == 2
        with pytest.raises(Rejected, match="full"):
            await a.acquire(1.0)
        assert a.reject_waiting("draining") == 2
        for w in waiters:
            with pytest.raises(Rejected, match="draining"):
                await w
        a.release()
        assert a.active == 0
        with pytest.raises(Rejected, match="queued"):
            await a.acquire(1.0) or await asyncio.wait_for(a.acquire(0.05), 1)
        # A lowered limit holds new requests until enough finish.
        a2 = Admission(limit=4, queue_limit=10)
        for _ in range(3):
            await a2.acquire(1)
        a2.set_limit(2)
        t = asyncio.create_task(a2.acquire(5))
        await asyncio.sleep(0.01)
        assert not t.done()
        a2.release()
        a2.release()
        await asyncio.wait_for(t, 1)
        assert a2.active == 2

    asyncio.run(run())


# ---- through the sidecar, with an injected clock ----------------------------------------------------


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start
        self.lock = threading.Lock()

    def now(self) -> float:
        with self.lock:
            return self.t

    def advance(self, s: float) -> None:
        with self.lock:
            self.t += s


def _fragment(p: object) -> None:
    pair = p  # type: ignore[assignment]
    pair.engine.set(mode="oom", oom_free_gib=1.0, oom_reserved_gib=6.0)
    httpx.post(pair.url + "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 4})
    pair.engine.set(mode="normal")
    wait_until(lambda: pair.sc.state is State.QUARANTINED, 5)


def test_canary_ramps_weight_and_admits_only_a_share_of_short_requests() -> None:
    clock = FakeClock()
    cfg = CanaryConfig(probes_required=2, stable_window_s=60, initial_share=0.1, min_requests=3, short_max_tokens=16)
    with running_pair(clock=clock, canary=cfg) as p:
        _fragment(p)
        undrained = httpx.post(p.url + "/admin/undrain", headers=p.auth).json()
        assert undrained["state"] == "RECOVERING"
        assert undrained["weight"] == 0.0  # no traffic before the probe inferences pass (/readyz fails)
        wait_until(lambda: p.sc.canary is not None and p.sc.canary.ramp_started_at is not None, 5)
        wait_until(lambda: httpx.get(p.url + "/readyz").status_code == 200, 5)
        assert httpx.get(p.url + "/readyz").json()["weight"] == pytest.approx(0.1)
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 4}
        with httpx.Client(base_url=p.url) as c:
            codes = [c.post("/v1/completions", json=body).status_code for _ in range(20)]
        assert 1 <= codes.count(200) <= 3 and codes.count(503) >= 17
        long = httpx.post(p.url + "/v1/completions", json={**body, "max_tokens": 500})
        assert long.status_code == 503 and long.json()["error"]["code"] == "canary"
        clock.advance(30)
        wait_until(lambda: 0.5 < p.sc.weight() < 0.6, 5)
        assert 'fleethealth_sidecar_weight{replica="replica-0"} 0.5' in httpx.get(p.url + "/metrics").text
        clock.advance(31)
        wait_until(lambda: p.sc.state is State.READY, 5)
        assert p.sc.weight() == 1.0
        assert httpx.post(p.url + "/v1/completions", json={**body, "max_tokens": 500}).status_code == 200


def test_repeated_canary_failures_end_in_failed() -> None:
    clock = FakeClock()
    with running_pair(clock=clock, canary=CanaryConfig(max_failures=3, failure_window_s=3600)) as p:
        _fragment(p)
        for attempt in range(3):
            p.engine.set(mode="oom")  # every probe inference fails
            assert httpx.post(p.url + "/admin/undrain", headers=p.auth).json()["state"] == "RECOVERING"
            want = State.FAILED if attempt == 2 else State.QUARANTINED
            wait_until(lambda want=want: p.sc.state is want, 5)
            clock.advance(60)
        assert any(i.kind.value == "page" for i in p.sc.intents)
        assert httpx.get(p.url + "/readyz").status_code == 503
        # A human (admin undrain) may try again once the engine is fixed.
        p.engine.set(mode="normal")
        assert httpx.post(p.url + "/admin/undrain", headers=p.auth).json()["state"] == "RECOVERING"


def test_degraded_with_hysteresis_publishes_lower_weight_and_refuses_long_requests() -> None:
    from fleethealth.serve.gpu import NvmlGpuReader
    from fleethealth.sources.nvml import FakeGpu, FakeNvml

    clock = FakeClock()
    gpu = FakeGpu(0)
    reader = NvmlGpuReader("node-1", nvml=FakeNvml([gpu]))
    with running_pair(clock=clock, gpu_reader=reader, degraded_max_tokens=64) as p:
        # Wait until the throttle counters have rates (readings at two times): thermal then averages both.
        clock.advance(1)
        wait_until(lambda: p.sc.gpu.last.gpus and p.sc.gpu.last.gpus[0]["categories"].get("power") is not None, 5)
        gpu.values["temperature"] = 93  # thermal category 0.6 (temperature 0.2, no throttling 1.0): not a /gpuz failure
        wait_until(lambda: p.sc.score is not None and p.sc.score < 0.7, 5)
        assert p.sc.state is State.READY  # not before the dwell time
        clock.advance(121)
        wait_until(lambda: p.sc.state is State.DEGRADED, 5)
        assert httpx.get(p.url + "/readyz").json()["weight"] == pytest.approx(p.sc.score)
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 8}
        assert httpx.post(p.url + "/v1/completions", json=body).status_code == 200
        long = httpx.post(p.url + "/v1/completions", json={**body, "max_tokens": 1000})
        assert long.status_code == 503 and long.json()["error"]["code"] == "degraded_long_request"
        # The way back is stricter: a good score must hold for the (longer) ready dwell.
        gpu.values["temperature"] = 45
        wait_until(lambda: p.sc.score == 1.0, 5)
        clock.advance(300)
        import time

        time.sleep(0.2)
        assert p.sc.state is State.DEGRADED
        clock.advance(301)
        wait_until(lambda: p.sc.state is State.READY, 5)


def test_readme_diagram_is_generated_from_the_table() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "deploy" / "sidecar" / "README.md").read_text()
    assert state_diagram() in readme, "regenerate the diagram in deploy/sidecar/README.md from state_diagram()"


def test_canary_fails_when_gpu_memory_is_not_released() -> None:
    from fleethealth.serve.gpu import NvmlGpuReader
    from fleethealth.sources.nvml import FakeGpu, FakeNvml

    clock = FakeClock()
    gpu = FakeGpu(0)
    reader = NvmlGpuReader("node-1", nvml=FakeNvml([gpu]))
    with running_pair(clock=clock, gpu_reader=reader, canary=CanaryConfig(probes_required=50)) as p:
        wait_until(lambda: p.sc.fb_baseline_mib is not None, 5)
        _fragment(p)
        # The rebuilt worker comes back but a leaked allocation still holds 20% more GPU memory.
        gpu.values["fb_used"] = int(gpu.values["fb_used"] * 1.2)
        assert httpx.post(p.url + "/admin/undrain", headers=p.auth).json()["state"] == "RECOVERING"
        wait_until(lambda: p.sc.state is State.QUARANTINED, 5)
        assert "memory was not released" in p.sc.transitions[-1].reason
