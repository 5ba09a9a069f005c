"""/livez, /readyz and /gpuz against the real fake engine: a hung engine fails liveness within its timeout
while an idle one passes; readiness follows state, queue protection and the GPU."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from act_support import free_port
from fake_engine import ServerThread, running_pair, wait_until
from fleethealth.decide.model import State
from fleethealth.serve.app import create_app
from fleethealth.serve.config import SidecarConfig


def _status(url: str) -> int:
    return httpx.get(url, timeout=5).status_code


def test_idle_engine_passes_livez_and_hung_engine_fails_within_timeout() -> None:
    with running_pair(liveness_timeout_s=1.0, max_drain_seconds=0.5) as p:
        time.sleep(1.5)  # idle for longer than the timeout: still alive
        assert _status(p.url + "/livez") == 200
        p.engine.set(token_delay_s=0.02)
        body = {"model": "fake-model", "prompt": "hello", "max_tokens": 10_000, "stream": True}
        hung_at: list[float] = []

        def client() -> None:
            # A stream that starts fine, then the engine hangs (its /health stays 200, like vLLM's).
            try:
                with httpx.stream("POST", p.url + "/v1/completions", json=body, timeout=30) as r:
                    for i, _ in enumerate(r.iter_raw()):
                        if i == 5:
                            p.engine.set(mode="hang")
                            hung_at.append(time.monotonic())
            except httpx.HTTPError:
                pass

        t = threading.Thread(target=client, daemon=True)
        t.start()
        wait_until(lambda: bool(hung_at), 10)
        assert httpx.get(p.engine_srv.url + "/health").status_code == 200
        wait_until(lambda: _status(p.url + "/livez") == 503, 5, 0.05)
        failed_after = time.monotonic() - hung_at[0]
        assert 0.9 <= failed_after <= 1.0 + 1.5, failed_after  # the timeout, plus probe slack
        body_json = httpx.get(p.url + "/livez").json()
        assert body_json["reasons"] and "no progress" in body_json["reasons"][0]
        # The engine resumes: progress again, alive again.
        p.engine.set(mode="normal")
        wait_until(lambda: _status(p.url + "/livez") == 200, 5, 0.05)
        # Drain so the long stream ends and the servers can stop.
        httpx.post(p.url + "/admin/drain", headers=p.auth, params={"wait": True}, timeout=15)
        t.join(10)


def test_hung_non_streaming_work_seen_through_engine_metrics() -> None:
    with running_pair(liveness_timeout_s=0.8, max_drain_seconds=0.5) as p:
        p.engine.set(mode="hang")
        t = threading.Thread(target=lambda: httpx.post(
            p.url + "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 5}, timeout=30),
            daemon=True)
        t.start()
        wait_until(lambda: p.engine.running == 1, 5)
        wait_until(lambda: _status(p.url + "/livez") == 503, 5, 0.05)
        p.engine.set(mode="normal")
        t.join(10)
        wait_until(lambda: _status(p.url + "/livez") == 200, 5, 0.05)


def test_hung_non_streaming_work_without_engine_metrics() -> None:
    # An engine with no token counter: a non-streaming request past the timeout is the sign of a hang.
    with running_pair(liveness_timeout_s=0.8, max_drain_seconds=0.5) as p:
        p.engine.set(export_metrics=False, mode="hang")
        t = threading.Thread(target=lambda: httpx.post(
            p.url + "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 5}, timeout=30),
            daemon=True)
        t.start()
        wait_until(lambda: _status(p.url + "/livez") == 503, 5, 0.05)
        p.engine.set(mode="normal")
        t.join(10)
        wait_until(lambda: _status(p.url + "/livez") == 200, 5, 0.05)


def test_not_ready_while_starting_and_alive_before_engine_ever_came_up() -> None:
    cfg = SidecarConfig(upstream=f"http://127.0.0.1:{free_port()}", replica="r", probe_interval_s=0.05,
                        admin_token="t")
    with ServerThread(create_app(cfg)) as s:
        time.sleep(0.3)
        r = httpx.get(s.url + "/readyz")
        assert r.status_code == 503 and r.json()["state"] == "STARTING"
        assert _status(s.url + "/livez") == 200  # the startupProbe covers slow model loads, not liveness
        resp = httpx.post(s.url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert resp.status_code == 503 and "retry-after" in resp.headers


def test_readyz_fails_when_queue_is_past_its_protection_level() -> None:
    with running_pair(max_concurrency=1, ready_queue_limit=2, max_drain_seconds=0.5) as p:
        p.engine.set(token_delay_s=0.05)
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 60, "stream": True}
        threads = [threading.Thread(target=lambda: httpx.post(p.url + "/v1/completions", json=body, timeout=30),
                                    daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        wait_until(lambda: p.sc.admission.queued == 2, 5)
        r = httpx.get(p.url + "/readyz")
        assert r.status_code == 503 and "queued" in r.json()["reasons"][0]
        assert p.sc.state is State.READY  # overload protection is not a state change
        httpx.post(p.url + "/admin/drain", headers=p.auth, params={"wait": True}, timeout=10)
        for t in threads:
            t.join(10)


def test_engine_crash_leaves_ready_and_comes_back_through_the_canary() -> None:
    with running_pair() as p:
        p.engine.set(mode="crash")
        wait_until(lambda: p.sc.state is State.STARTING, 5)
        assert _status(p.url + "/readyz") == 503
        p.engine.set(mode="normal")
        # Back after a crash: warm-up, then RECOVERING (canary), not straight to READY.
        wait_until(lambda: p.sc.state is State.RECOVERING, 5)
        path = [(t.from_state.value, t.to_state.value) for t in p.sc.transitions]
        assert path[-3:] == [("READY", "STARTING"), ("STARTING", "WARMING"), ("WARMING", "RECOVERING")]


DCGM_OK = """# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="node-1",modelName="NVIDIA H100"} 60
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-z",Hostname="node-9",modelName="NVIDIA H100"} 99
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a",Hostname="node-1",modelName="NVIDIA H100"} @XID@
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-z",Hostname="node-9",modelName="NVIDIA H100"} 79
"""


def test_gpuz_scores_the_node_exporter_and_a_fatal_xid_drains() -> None:
    exporter = FastAPI()
    xid = {"v": "0"}

    @exporter.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(DCGM_OK.replace("@XID@", xid["v"]))

    with ServerThread(exporter) as ex, running_pair(gpu_metrics_url=ex.url + "/metrics", gpu_node="node-1") as p:
        wait_until(lambda: p.sc.score is not None, 5)
        r = httpx.get(p.url + "/gpuz")
        assert r.status_code == 200 and r.json()["trusted"] is True  # node-9's fault is not ours
        assert r.json()["score"] == 1.0
        xid["v"] = "79"  # fallen off the bus on our GPU
        wait_until(lambda: _status(p.url + "/gpuz") == 503, 5, 0.05)
        wait_until(lambda: p.sc.state is State.QUARANTINED, 5)
        assert _status(p.url + "/readyz") == 503
        intents = [i.kind.value for i in p.sc.intents]
        assert "drain" in intents and "quarantine" in intents
        assert "xid:79" in httpx.get(p.url + "/gpuz").json()["flags"]


def test_gpuz_unknown_without_signals_does_not_fail() -> None:
    with running_pair() as p:
        r = httpx.get(p.url + "/gpuz")
        assert r.status_code == 200 and r.json()["trusted"] is None


def test_cuda_error_in_engine_log_fails_gpuz_and_drains(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    # An old engine's error already in the (append-only) log is history, not a reason to drain.
    log.write_text("ERROR CUDA error: an illegal memory access was encountered (previous engine)\nINFO starting engine\n")
    with running_pair(engine_log=log, evidence_dir=tmp_path / "ev") as p:
        time.sleep(0.3)
        assert p.sc.state is State.READY and _status(p.url + "/gpuz") == 200
        with log.open("a") as f:
            f.write("ERROR RuntimeError: CUDA error: an illegal memory access was encountered\n")
        wait_until(lambda: p.sc.state is State.QUARANTINED, 5)
        assert _status(p.url + "/gpuz") == 503
        bundle = next((tmp_path / "ev").glob("evidence-*.json")).read_text()
        assert "illegal memory access" in bundle and "starting engine" in bundle  # log tail kept


def test_gpuz_reads_nvml_through_the_project_source() -> None:
    # FakeNvml is the project's stand-in for the NVIDIA library (no GPU on these machines); it raises
    # pynvml's own errors, so the real NvmlSource code path runs.
    from fleethealth.serve.gpu import NvmlGpuReader
    from fleethealth.sources.nvml import FakeGpu, FakeNvml

    gpu = FakeGpu(0)
    reader = NvmlGpuReader("node-1", nvml=FakeNvml([gpu]))
    with running_pair(gpu_reader=reader) as p:
        wait_until(lambda: p.sc.score == 1.0, 5)
        gpu.values["temperature"] = 99  # past the policy's critical temperature
        wait_until(lambda: _status(p.url + "/gpuz") == 503, 5, 0.05)
        wait_until(lambda: p.sc.state in (State.DRAINING, State.QUARANTINED), 5)


def test_a_gpu_check_that_raises_is_unknown_and_says_why() -> None:
    # A reader that breaks (a bug, a driver call that throws) must not leave /gpuz frozen at "no GPU signals
    # yet": the verdict stays unknown (a telemetry fault is not a GPU fault) and names the error.
    class BrokenReader:
        async def read(self, now: float) -> object:
            raise RuntimeError("driver call exploded")

    with running_pair(gpu_reader=BrokenReader()) as p:
        wait_until(lambda: "GPU check failed" in p.sc.gpu.last.reason, 5)
        r = httpx.get(p.url + "/gpuz", timeout=5)
        assert r.status_code == 200 and r.json()["trusted"] is None
        assert "driver call exploded" in r.json()["reason"]
        assert p.sc.state is State.READY
