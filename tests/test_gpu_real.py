"""fleethealth's GPU-facing parts on a real NVIDIA GPU: NVML source, node agent, sidecar /gpuz, the real
PyTorch OOM message, and the rank timer's CUDA-event clock.

Everything else in the suite replaces NVML with FakeNvml because CI has no GPU; these tests are the check
that the real driver answers the way the fakes say. They skip (with the reason) where there is no NVIDIA
driver or no CUDA PyTorch, so CI skips them. Run on a GPU node:

    python -m pytest -q tests/test_gpu_real.py

With ``FLEETHEALTH_GPU_REPORT=DIR`` each test also writes what it saw (metrics page, tuples, timings) to
DIR as JSON, for the record of a hardware check.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from act_support import free_port
from fleethealth.policy import default_policy
from fleethealth.serve.gpu import nvml_present
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot

HAS_NVML = nvml_present()


def _cuda_torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


needs_nvml = pytest.mark.skipif(not HAS_NVML, reason="no NVIDIA driver here (NVML does not load): GPU-only check")
needs_cuda = pytest.mark.skipif(
    not HAS_NVML or _cuda_torch() is None, reason="no CUDA-enabled PyTorch and GPU here: GPU-only check"
)


def _report(name: str, data: Any) -> None:
    out = os.environ.get("FLEETHEALTH_GPU_REPORT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def _latest(snap: Snapshot) -> dict[tuple[str, str], float]:
    """(metric, gpu index) -> value."""
    return {(m, labels.get("gpu", "")): v for m, labels, v, _ in snap.rows()}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from fleethealth.cli.main import main; main()", *args]


@needs_nvml
def test_nvml_source_reads_every_gpu_with_dcgm_names_and_sane_units() -> None:
    from fleethealth.sources.nvml import NvmlSource

    src = NvmlSource(hostname="gpu-node-1")
    t0 = time.perf_counter()
    snap = src.read(1000.0)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    snap = src.read(1015.0)
    second_s = time.perf_counter() - t0
    try:
        assert not snap.source_errors, snap.source_errors
        assert src.gpus, "NVML found no GPU"
        v = _latest(snap)
        for g in src.gpus:
            gi = str(g.index)
            temp = v[("DCGM_FI_DEV_GPU_TEMP", gi)]
            assert 5.0 <= temp <= 110.0
            assert v[("DCGM_FI_DEV_SM_CLOCK", gi)] > 0.0
            assert 10.0 <= v[("DCGM_FI_DEV_POWER_USAGE", gi)] <= 2000.0  # watts, not milliwatts
            used, free = v[("DCGM_FI_DEV_FB_USED", gi)], v[("DCGM_FI_DEV_FB_FREE", gi)]
            assert 1_000 < used + free < 1_000_000  # MiB, as dcgm-exporter reports it
        # No NaN, no DCGM blank sentinel, no negative value ever leaves the source.
        for (metric, _), x in v.items():
            assert math.isfinite(x) and 0.0 <= x < 1e15, (metric, x)
        labels = next(ls for m, ls, _, _ in snap.rows() if m == "DCGM_FI_DEV_GPU_TEMP")
        assert {"gpu", "UUID", "pci_bus_id", "modelName", "Hostname"} <= set(labels)
        assert labels["UUID"].startswith("GPU-")
    finally:
        _report("nvml_source", {
            "gpus": [g.__dict__ if hasattr(g, "__dict__") else repr(g) for g in src.gpus],
            "driver": src.driver, "errors": {f"{p}:{e}": c for (p, e), c in src.errors.items()},
            "first_read_s": first_s, "second_read_s": second_s,
            "samples": {f"{m}{{gpu={g}}}": x for (m, g), x in sorted(_latest(snap).items())},
        })
        src.close()


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("agent") / "kern.log"
    log.write_text("")
    port = free_port()
    proc = subprocess.Popen(
        _cli("agent", "--listen", f"127.0.0.1:{port}", "--interval", "1", "--kernel-log", str(log),
             "--hostname", "gpu-node-1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/metrics", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            proc.kill()
            pytest.fail("agent did not serve /metrics: " + (proc.stdout.read().decode() if proc.stdout else ""))
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@needs_nvml
def test_agent_page_parses_like_prometheus_client_and_scores_a_known_gpu(agent_url: str) -> None:
    from fleethealth.bench.parse import our_rows, prom_client_rows
    from fleethealth.score.engine import score_snapshot
    from fleethealth.sources.exposition import parse_exposition

    policy = default_policy()
    hist = SignalHistory(policy)
    pages: list[str] = []
    now = time.time()
    for i in range(4):  # counters need several scrapes to become rates
        body = httpx.get(agent_url + "/metrics", timeout=5).text
        pages.append(body)
        now = time.time()
        hist.add(parse_exposition(body, default_ts=now, source=f"agent#{i}"))
        time.sleep(1.2)
    ours = parse_exposition(pages[-1], default_ts=0.0, source="agent")
    assert not ours.issues, ours.issues[:3]
    # prometheus-client renames a TYPE counter `x` to `x_total`; prom_client_rows undoes that, as the parse
    # benchmark does, so both sides name samples as Prometheus stores them.
    theirs = sorted(r[:3] for r in prom_client_rows(pages[-1]))
    assert sorted(r[:3] for r in our_rows(ours)) == theirs
    assert len(theirs) >= 20
    fh = score_snapshot(hist.view(now), policy, now, consumer="remediation")
    gpus = fh.by_kind("gpu")
    node = fh.tuples["gpu-node-1"]
    _report("agent", {"page": pages[-1], "node": node.to_dict(), "gpus": [t.to_dict() for t in gpus]})
    assert gpus
    for t in gpus:
        # A working GPU read through the real driver is known and not gated. A single GPU has no peers, so
        # peer-relative signals are not scored and confidence is below 1: that is the design, not a fault.
        assert t.value is not None, t.reason
        assert not t.reason.startswith("gate:"), t.reason
        assert 0.0 < t.confidence <= 1.0
    assert node.value is not None


def _matmul_load(torch: Any, seconds: float) -> int:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        n += 20
    return n


@needs_cuda
def test_nvml_source_sees_load_as_clock_power_and_utilisation() -> None:
    from fleethealth.sources.nvml import NvmlSource

    torch = _cuda_torch()
    src = NvmlSource(hostname="gpu-node-1")
    idle = _latest(src.read(0.0))
    during: list[dict[tuple[str, str], float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            during.append(_latest(src.read(time.time())))

    th = threading.Thread(target=sample)
    th.start()
    try:
        products = _matmul_load(torch, 8.0)
    finally:
        done.set()
        th.join()
    gi = str(torch.cuda.current_device())
    peak = {m: max(d.get((m, gi), float("nan")) for d in during)
            for m in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP")}
    base = {m: idle.get((m, gi)) for m in peak}
    _report("load", {"idle": base, "peak": peak, "matmuls_8192_bf16": products, "samples": len(during)})
    src.close()
    assert peak["DCGM_FI_DEV_GPU_UTIL"] >= 50.0
    assert peak["DCGM_FI_DEV_POWER_USAGE"] > (base["DCGM_FI_DEV_POWER_USAGE"] or 0.0) + 50.0


@needs_cuda
def test_real_pytorch_oom_message_is_read_and_classified() -> None:
    from fleethealth.decide.oom import OomClass, OomEvent, classify_oom, is_oom_text, parse_torch_oom

    torch = _cuda_torch()
    total = torch.cuda.get_device_properties(0).total_memory
    keep = torch.empty(int(total * 0.5), dtype=torch.uint8, device="cuda")  # something allocated
    ask = int(total * 0.8)
    try:
        with pytest.raises(torch.OutOfMemoryError) as err:
            torch.empty(ask, dtype=torch.uint8, device="cuda")
    finally:
        del keep
        torch.cuda.empty_cache()
    text = str(err.value)
    nums = parse_torch_oom(text)
    ev = OomEvent(ts=0.0, requested_bytes=nums.requested_bytes, free_bytes=nums.free_bytes,
                  reserved_bytes=nums.reserved_unallocated_bytes, allocated_bytes=nums.allocated_bytes,
                  total_bytes=nums.total_bytes)
    verdict = classify_oom(ev)
    _report("oom", {"message": text, "numbers": nums.__repr__(), "verdict": verdict.cls.value,
                    "why": getattr(verdict, "reason", None), "torch": torch.__version__})
    assert is_oom_text(text)
    assert nums.requested_bytes is not None and abs(nums.requested_bytes - ask) / ask < 0.01
    assert nums.total_bytes is not None and abs(nums.total_bytes - total) / total < 0.02
    assert nums.free_bytes is not None and nums.free_bytes < ask
    assert nums.allocated_bytes is not None and nums.allocated_bytes >= int(total * 0.5) * 0.99
    # Half the memory really is allocated and the ask cannot fit in what is free or cached: not
    # fragmentation, and no Xid or context error: not a device fault.
    assert verdict.cls not in (OomClass.FRAGMENTATION, OomClass.DEVICE_FAULT), verdict


def _sleep_cycles_per_s(torch: Any) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10_000)  # warm the kernel
    start.record()
    torch.cuda._sleep(200_000_000)
    end.record()
    end.synchronize()
    return 200_000_000 / (start.elapsed_time(end) / 1000.0)


@needs_cuda
def test_rank_timer_measures_gpu_time_with_cuda_events_under_ddp() -> None:
    """One-rank DDP over NCCL on the GPU. Steps that make the GPU busy for an extra ~80 ms (a device-side
    sleep kernel in forward, as a throttled GPU would be slow) must show ~80 ms more compute time, although
    the host returns from launching that kernel at once: CUDA events measure the device, not the launch."""
    torch = _cuda_torch()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from fleethealth.training.rank_timer import RankTimer

    cycles_per_s = _sleep_cycles_per_s(torch)
    extra_s = 0.08
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        slow = {"on": False}

        class Net(torch.nn.Module):  # type: ignore[name-defined,misc]
            def __init__(self) -> None:
                super().__init__()
                self.a = torch.nn.Linear(2048, 2048)
                self.b = torch.nn.Linear(2048, 2048)

            def forward(self, x: Any) -> Any:
                if slow["on"]:
                    torch.cuda._sleep(int(extra_s * cycles_per_s))
                return self.b(torch.relu(self.a(x)))

        model = DistributedDataParallel(Net().cuda(), bucket_cap_mb=4)
        timer = RankTimer(job="gpu-check", peer_group="dp", node="gpu-node-1").attach(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(256, 2048, device="cuda")
        launch_s: list[float] = []
        for step in range(12):
            slow["on"] = step >= 6
            timer.step_begin()
            t0 = time.perf_counter()
            model(x).sum().backward()
            launch_s.append(time.perf_counter() - t0)
            opt.step()
            opt.zero_grad()
            timer.step_end()
        timer.flush()
        steps = list(timer.history)
        fast = sorted(s.compute_s for s in steps[2:6] if s.compute_s is not None)
        slowed = sorted(s.compute_s for s in steps[8:12] if s.compute_s is not None)
        _report("rank_timer", {"cycles_per_s": cycles_per_s, "extra_s": extra_s,
                               "steps": [s.__repr__() for s in steps], "host_launch_s": launch_s})
        assert len(steps) == 12 and all(s.collectives >= 1 for s in steps)
        gap = slowed[len(slowed) // 2] - fast[len(fast) // 2]
        assert 0.7 * extra_s <= gap <= 1.5 * extra_s, (fast, slowed)
    finally:
        dist.destroy_process_group()


@needs_nvml
def test_sidecar_gpuz_answers_from_the_real_gpu(tmp_path: Path) -> None:
    port = free_port()
    dead = free_port()  # no engine behind it: /gpuz is about the GPU, not the engine
    proc = subprocess.Popen(
        _cli("sidecar", "--upstream", f"http://127.0.0.1:{dead}", "--listen", f"127.0.0.1:{port}", "--nvml",
             "--gpu-node", "gpu-node-1", "--log-level", "warning"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    seen: list[Any] = []
    try:
        deadline = time.monotonic() + 40
        body: dict[str, Any] = {}
        code = 0
        while time.monotonic() < deadline:
            try:
                r = httpx.get(url + "/gpuz", timeout=5)
                code, body = r.status_code, r.json()
                seen.append({"code": code, "body": body})
                if body.get("ok") is not None or body.get("gpu", {}).get("ok") is not None:
                    break
            except (httpx.HTTPError, ValueError):
                if proc.poll() is not None:
                    pytest.fail("sidecar exited: " + (proc.stdout.read().decode()[-2000:] if proc.stdout else ""))
            time.sleep(1.0)
        ready = httpx.get(url + "/readyz", timeout=5)
        _report("sidecar", {"gpuz": seen[-3:], "readyz": [ready.status_code, ready.text[:500]]})
        verdict = body.get("gpu", body)
        assert code == 200, seen[-1:]
        assert verdict.get("ok") is True, verdict
        assert verdict.get("gpus"), verdict
        # The engine is gone, so the replica must not be ready, whatever the GPU says.
        assert ready.status_code == 503
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
