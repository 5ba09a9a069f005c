"""RankTimer: step bookkeeping with an injected clock, the exports (HTTP and textfile), and real DDP and FSDP
training on the CPU with the gloo backend in several processes, one rank artificially slowed."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from act_support import free_port
from fleethealth.training import COMPUTE_METRIC, STEP_METRIC, RankTimer


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_step_timing_from_first_and_last_collective_entry() -> None:
    clock = FakeClock()
    t = RankTimer(job="j", rank=3, node="n1", gpu="2", clock=clock)
    t.step_begin()
    clock.t += 1.0
    t.mark_collective()
    clock.t += 0.5
    t.mark_collective()
    clock.t += 0.25
    t.mark_collective()
    clock.t += 2.0  # waiting for the slowest peer
    timing = t.step_end()
    assert timing is not None
    assert (timing.first_collective_s, timing.compute_s, timing.step_s, timing.collectives) == (1.0, 1.75, 3.75, 3)
    assert t.last == timing


def test_without_step_begin_a_step_starts_at_the_previous_end_and_missing_collectives_read_none() -> None:
    clock = FakeClock()
    t = RankTimer(job="j", rank=0, node="n", gpu="0", clock=clock)
    assert t.step_end() is None  # never begun
    clock.t += 1.0
    t.mark_collective()
    clock.t += 1.0
    first = t.step_end()
    assert first is not None and first.compute_s == 1.0 and first.step_s == 2.0
    clock.t += 0.5
    no_sync = t.step_end()  # a gradient-accumulation step with no collective
    assert no_sync is not None and no_sync.compute_s is None and no_sync.step_s == 0.5


def test_exported_value_is_the_median_of_recent_steps() -> None:
    clock = FakeClock()
    t = RankTimer(job="j", rank=0, node="n", gpu="0", clock=clock, smooth_steps=3)
    for compute in (1.0, 9.0, 1.2, 1.1):
        t.step_begin()
        clock.t += compute
        t.mark_collective()
        t.step_end()
    assert t.compute_seconds() == pytest.approx(1.2)  # median of 9.0, 1.2, 1.1


class FakeGpuClock:
    """Stands in for CUDA events (no GPU here): a mark is a host time that the 'device' reaches once
    ``device_t`` passes it; reading one before that counts as a device sync."""

    def __init__(self) -> None:
        self.t = 0.0
        self.device_t = 0.0
        self.syncs = 0

    def mark(self) -> float:
        return self.t

    def ready(self, mark: float) -> bool:
        return mark <= self.device_t

    def seconds(self, start: float, end: float) -> float:
        if end > self.device_t:
            self.syncs += 1
            self.device_t = end
        return end - start


def test_gpu_steps_are_read_when_the_device_passes_them_without_a_sync_per_step() -> None:
    from fleethealth.training.rank_timer import MAX_PENDING_STEPS

    t = RankTimer(job="j", rank=0, node="n", gpu="0")
    gpu = FakeGpuClock()
    t._clock = gpu  # type: ignore[assignment]  # the CUDA clock's stand-in
    results = []
    for _ in range(6):
        t.step_begin()
        gpu.t += 1.0
        t.mark_collective()
        gpu.t += 0.5
        results.append(t.step_end())
        # the device runs one step behind the host
        gpu.device_t = gpu.t - 1.5
    assert results[0] is None  # still running on the device when the host closed it
    assert gpu.syncs == 0
    # each step is read at the first step_end after the device passed it; the last two are still pending
    assert [h.step for h in t.history] == list(range(4))
    assert len(t._pending) == MAX_PENDING_STEPS
    t.flush()
    assert [h.compute_s for h in t.history] == [1.0] * 6 and gpu.syncs == 1


def _families(text: str) -> dict[str, list[Any]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_exports_over_http_and_textfile(tmp_path: Path) -> None:
    clock = FakeClock()
    seen: list[Any] = []
    t = RankTimer(job="llama", peer_group="stage0", rank=5, node="node-7", gpu="3", clock=clock,
                  on_step=seen.append)
    port = t.serve(0, addr="127.0.0.1")
    try:
        for _ in range(2):
            t.step_begin()
            clock.t += 1.5
            t.mark_collective()
            clock.t += 0.5
            t.step_end()
        fams = _families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
        (sample,) = fams[COMPUTE_METRIC]
        assert sample.value == pytest.approx(1.5)
        assert sample.labels == {"job": "llama", "rank": "5", "node": "node-7", "gpu": "3", "peer_group": "stage0"}
        assert fams[STEP_METRIC][0].value == pytest.approx(2.0)
        assert [s.value for s in fams["fleethealth_rank_steps"] if s.name.endswith("_total")] == [2.0]
        assert len(seen) == 2
        out = tmp_path / "rank.prom"
        t.write_textfile(str(out))
        assert _families(out.read_text())[COMPUTE_METRIC][0].value == pytest.approx(1.5)
    finally:
        t.close()


def test_attach_rejects_a_plain_module() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    with pytest.raises(TypeError, match="mark_collective"):
        RankTimer(job="j", rank=0).attach(torch.nn.Linear(2, 2))


# --- real multi-process training ---------------------------------------------------------------------

WORLD = 3
SLOW_RANK = 1
SLEEP_S = 0.3
STEPS = 6


def _worker(rank: int, world: int, rdzv: str, out_dir: str) -> None:
    """Runs in a spawned process: DDP, FSDP then FSDP2, each rank timing its steps; rank SLOW_RANK sleeps inside
    its forward (after any collective of the forward, as a throttled GPU would be slow)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # Over 1 MB of parameters: DDP's first bucket holds 1 MB, so there are several buckets.
            self.a = torch.nn.Linear(32, 512)
            self.b = torch.nn.Linear(512, 512)
            self.c = torch.nn.Linear(512, 512)
            self.d = torch.nn.Linear(512, 8)

        def forward(self, x: Any) -> Any:
            if rank == SLOW_RANK:
                time.sleep(SLEEP_S)
            return self.d(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x)))))))

    results: dict[str, list[dict[str, Any]]] = {}
    torch.manual_seed(0)
    wrappers = {
        # A tiny bucket cap gives several buckets per step, as real models have.
        "ddp": lambda m: DistributedDataParallel(m, bucket_cap_mb=0.5),
        "fsdp": lambda m: FullyShardedDataParallel(m, device_id=torch.device("cpu")),
        "fsdp2": fully_shard,
    }
    for kind, wrap in wrappers.items():
        model = wrap(Net())
        timer = RankTimer(job="test", peer_group="dp", node=f"node{rank}").attach(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = []
        for _ in range(STEPS):
            timer.step_begin()
            model(torch.randn(16, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
            timing = timer.step_end()
            assert timing is not None
            steps.append({"compute": timing.compute_s, "step": timing.step_s, "first": timing.first_collective_s,
                          "collectives": timing.collectives})
            # Everyone leaves the step together, as a real loop does at its next forward's sync points.
            dist.barrier()
        results[kind] = steps
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rank": timer.rank, "results": results}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, list[dict[str, Any]]]]:
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    import torch.multiprocessing as mp

    d = tmp_path_factory.mktemp("ranks")
    # Children must import this test module by name to find _worker.
    sys.path.insert(0, str(Path(__file__).parent))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    started = time.monotonic()
    mp.spawn(_worker, args=(WORLD, str(d / "rdzv"), str(d)), nprocs=WORLD, join=True)
    out = {}
    for r in range(WORLD):
        data = json.loads((d / f"rank{r}.json").read_text())
        assert data["rank"] == r
        out[r] = data["results"]
    print(f"spawned {WORLD} ranks, DDP+FSDP, in {time.monotonic() - started:.1f}s")
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["ddp", "fsdp", "fsdp2"])
def test_slow_rank_has_larger_compute_time_while_step_time_is_equal(
    trained: dict[int, dict[str, list[dict[str, Any]]]], kind: str
) -> None:
    compute = {r: statistics.median(s["compute"] for s in res[kind][1:]) for r, res in trained.items()}
    step = {r: statistics.median(s["step"] for s in res[kind][1:]) for r, res in trained.items()}
    fast = [compute[r] for r in compute if r != SLOW_RANK]
    # The slowed rank computes ~SLEEP_S longer before entering the collective...
    assert compute[SLOW_RANK] > max(fast) + 0.6 * SLEEP_S, compute
    # ...while every rank's whole step is the same: the fast ones wait at the collective.
    assert max(step.values()) - min(step.values()) < 0.4 * SLEEP_S, step
    assert all(step[r] >= compute[r] for r in step)
    if kind == "ddp":
        # several buckets per step once DDP has rebuilt them after the first step
        assert all(s["collectives"] > 1 for s in trained[0][kind][1:])


def test_exported_pages_scored_by_the_engine_flag_the_slow_rank_and_its_gpu() -> None:
    """16 ranks (two 8-GPU nodes) export their pages; rank 5 computes 0.3 s longer. Whole steps are equal."""
    from prometheus_client import generate_latest

    from fleethealth.policy import default_policy
    from fleethealth.score.engine import score_snapshot
    from fleethealth.signals.snapshot import merge_snapshots
    from fleethealth.sources.exposition import parse_exposition

    now = 1_700_000_000.0
    pages = []
    for r in range(16):
        clock = FakeClock()
        t = RankTimer(job="train", peer_group="stage0", rank=r, node=f"node{r // 8}", gpu=str(r % 8), clock=clock)
        for s in range(5):
            t.step_begin()
            compute = 1.82 + 0.003 * ((r * 7 + s) % 5) + (0.3 if r == 5 else 0.0)
            clock.t += compute
            t.mark_collective()
            clock.t += 2.5 - compute  # waits for the slowest
            t.step_end()
        pages.append(parse_exposition(generate_latest(t.registry()), default_ts=now, source=f"rank{r}"))
    health = score_snapshot(merge_snapshots(pages, now), default_policy(), now, consumer="training")
    ranks = {h.entity: h for h in health.by_kind("rank")}
    assert len(ranks) == 16
    assert ranks["train/rank5"].value == 0.0 and ranks["train/rank5"].worst == "performance"
    assert all(h.value == 1.0 for e, h in ranks.items() if e != "train/rank5")
    assert health.tuples["node0/gpu5"].value == 0.0
    assert health.tuples["node1"].value == 1.0


# --- compute in flight: a hung rank's step never ends -----------------------------------------------------


def _steps(t: RankTimer, clock: FakeClock, computes: list[float], collectives: int = 3) -> None:
    for compute in computes:
        t.step_begin()
        for _ in range(collectives):
            clock.t += compute / collectives
            t.mark_collective()
        clock.t += 0.5  # waiting for the slowest peer
        t.step_end()


def test_compute_in_flight_grows_until_the_rank_has_entered_its_collectives() -> None:
    clock = FakeClock()
    t = RankTimer(job="j", rank=0, node="n", gpu="0", clock=clock, smooth_steps=3)
    t.step_begin()
    clock.t += 50.0
    assert t.compute_in_flight() is None  # no step with a collective has ended: the count is unknown
    t.mark_collective()
    t.step_end()
    _steps(t, clock, [1.0, 1.2, 1.1])
    clock.t += 30.0  # a slow data loader between step_end() and step_begin(): not a step
    assert t.compute_in_flight() is None
    t.step_begin()
    clock.t += 0.4
    t.mark_collective()
    assert t.compute_in_flight() == pytest.approx(0.4)
    assert t.exported_compute_seconds() == pytest.approx(1.1)  # within its recent spread: the median
    clock.t += 0.85
    assert t.exported_compute_seconds() == pytest.approx(1.25)  # longer than every recent step: in flight
    clock.t += 100.0
    assert t.exported_compute_seconds() == pytest.approx(101.25)  # hung: grows at every read
    t.mark_collective()
    t.mark_collective()  # all three entered: it waits for its peers, its compute is over
    clock.t += 30.0
    assert t.compute_in_flight() is None and t.exported_compute_seconds() == pytest.approx(1.1)
    t.step_end()
    assert t.compute_seconds() == pytest.approx(1.2)  # the long step counts once it ended (median of 3)


def test_without_step_begin_the_step_in_flight_starts_at_the_previous_end() -> None:
    clock = FakeClock()
    t = RankTimer(job="j", rank=0, node="n", gpu="0", clock=clock)
    for _ in range(3):
        clock.t += 1.0
        t.mark_collective()
        clock.t += 0.5
        t.step_end()
    clock.t += 7.0  # the next step, never begun explicitly, still has not entered its collective
    assert t.compute_in_flight() == pytest.approx(7.0) and t.exported_compute_seconds() == pytest.approx(7.0)


def test_the_engine_flags_a_hung_rank_from_its_compute_in_flight() -> None:
    """16 ranks export their pages while rank 5 hangs before its collective (no error, no step ends) and the
    other 15 wait for it inside the collective: only the in-flight reading tells them apart."""
    from prometheus_client import generate_latest

    from fleethealth.policy import default_policy
    from fleethealth.score.engine import score_snapshot
    from fleethealth.signals.snapshot import merge_snapshots
    from fleethealth.sources.exposition import parse_exposition

    now = 1_700_000_000.0
    pages = []
    for r in range(16):
        clock = FakeClock()
        t = RankTimer(job="train", peer_group="stage0", rank=r, node=f"node{r // 8}", gpu=str(r % 8), clock=clock)
        _steps(t, clock, [1.82 + 0.003 * ((r * 7 + s) % 5) for s in range(5)], collectives=2)
        t.step_begin()
        clock.t += 1.0
        t.mark_collective()
        if r != 5:
            clock.t += 0.8
            t.mark_collective()  # done: waiting in the collective for rank 5
        clock.t += 120.0  # two minutes of hang
        pages.append(parse_exposition(generate_latest(t.registry()), default_ts=now, source=f"rank{r}"))
    health = score_snapshot(merge_snapshots(pages, now), default_policy(), now, consumer="training")
    ranks = {h.entity: h for h in health.by_kind("rank")}
    assert ranks["train/rank5"].value == 0.0 and ranks["train/rank5"].worst == "performance"
    assert all(h.value == 1.0 for e, h in ranks.items() if e != "train/rank5")
    assert health.tuples["node0/gpu5"].value == 0.0


HANG_AT = 3  # the step in which rank 1 hangs


def _hang_worker(rank: int, world: int, rdzv: str, out_dir: str) -> None:
    """Runs in a spawned process: DDP on gloo, each rank serving its timer over HTTP; in step HANG_AT rank 1
    hangs in its forward (before any collective) until the test releases it, while rank 0 enters its
    collectives and waits there for rank 1, as a silent hang looks from outside."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world)
    out = Path(out_dir)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(32, 512)
            self.b = torch.nn.Linear(512, 8)
            self.step = 0

        def forward(self, x: Any) -> Any:
            if rank == 1 and self.step == HANG_AT:
                (out / "hung").write_text("1")
                deadline = time.monotonic() + 120
                while not (out / "release").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    net = Net()
    model = DistributedDataParallel(net, bucket_cap_mb=0.02)
    timer = RankTimer(job="hang", peer_group="dp", node=f"node{rank}", gpu="0").attach(model)
    port = timer.serve(0, addr="127.0.0.1")
    (out / f"port{rank}").write_text(str(port))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    done = []
    for s in range(HANG_AT + 1):
        net.step = s
        timer.step_begin()
        model(torch.randn(16, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
        timing = timer.step_end()
        assert timing is not None
        done.append(timing.compute_s)
        dist.barrier()
    (out / f"done{rank}").write_text(json.dumps(done))
    timer.close()
    dist.destroy_process_group()


def _scrape(port: int) -> float | None:
    samples = _families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text).get(COMPUTE_METRIC, [])
    return samples[0].value if samples else None


@pytest.mark.timeout(240)
def test_a_hung_ddp_rank_scraped_over_http_reports_its_compute_in_flight(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    import multiprocessing

    sys.path.insert(0, str(Path(__file__).parent))  # the children import this module by name
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hang_worker, args=(r, 2, str(tmp_path / "rdzv"), str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 180  # a wait for the processes to get there, not an assertion on time
        while not ((tmp_path / "hung").exists() and (tmp_path / "port0").exists()
                   and (tmp_path / "port1").exists()):
            assert time.monotonic() < deadline and all(p.is_alive() for p in procs), "workers did not start"
            time.sleep(0.05)
        port0, port1 = (int((tmp_path / f"port{r}").read_text()) for r in range(2))
        # rank 0 finished its computes and waits in the collective: its reading is its finished steps'
        # median and stays there; rank 1's compute in flight overtakes it and keeps growing
        waiting = _scrape(port0)
        hung = _scrape(port1)
        while hung is None or waiting is None or hung <= 3 * waiting:
            assert time.monotonic() < deadline, (waiting, hung)
            time.sleep(0.05)
            waiting, hung = _scrape(port0), _scrape(port1)
        time.sleep(0.05)
        later = _scrape(port1)
        assert later is not None and later > hung
        assert _scrape(port0) == waiting
        (tmp_path / "release").write_text("1")
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
        finished = [json.loads((tmp_path / f"done{r}").read_text()) for r in range(2)]
        assert waiting == pytest.approx(statistics.median(finished[0][:HANG_AT][-5:]))
        # the hung step, once released, is recorded as the long compute it was
        assert finished[1][HANG_AT] > hung
    finally:
        (tmp_path / "release").write_text("1")
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
