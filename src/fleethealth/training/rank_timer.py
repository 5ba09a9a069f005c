"""Per-rank compute time up to the gradient collective, the signal that finds a slow rank.

In synchronous data parallelism every rank waits for the slowest at the gradient collective, so whole-step
time is the same everywhere and hides the culprit. What differs is how long each rank *computes* before it
hands its gradients to the collective. ``RankTimer`` measures that from the training process itself:

* **DDP**: a communication hook (``DistributedDataParallel.register_comm_hook``) wraps the stock allreduce
  hook and notes when each gradient bucket is handed to the collective. Buckets fire as backward produces
  gradients, without waiting for peers, so the entry time of the *last* bucket of a step is when this rank
  finished its local forward+backward: that is ``compute_seconds``. The first bucket's entry is kept too
  (``first_collective_seconds``: forward plus the tail of backward).
* **FSDP (``FullyShardedDataParallel``)**: the same idea through FSDP's ``register_comm_hook``; the hook
  wraps the stock reduce-scatter (sharded) or allreduce (``NO_SHARD``) hook, called once per FSDP unit in
  backward. It must be registered on the root FSDP module before the first forward. Caveat: FSDP's
  parameter all-gathers (in forward, and in backward for resharded units) synchronise ranks too, so time a
  slow rank spends *before* an all-gather turns into waiting inside its peers' measured compute. The
  measurement is exact for one FSDP unit (all-gather, then compute, then reduce-scatter, as in the test)
  and an underestimate of the gap with nested units, where GPU-side signals (SM clock, throttling) should
  back it up. The same holds for FSDP2.
* **FSDP2 (``fully_shard``)** has no comm hook: ``attach`` installs, on every ``fully_shard`` module, a
  custom reduce-scatter (``set_custom_reduce_scatter``) that is FSDP2's default one plus the entry mark.
  Elsewhere (Megatron, DeepSpeed, a hand-written loop) call ``tracker.mark_collective()`` yourself where
  the loop enters its gradient collective.

Times: on the GPU, CUDA events recorded on the current stream (kernels are asynchronous, so host clocks
would measure launch time, not compute), read once the GPU has passed them so the timer adds no device
sync to the step (the host may run up to ``MAX_PENDING_STEPS`` ahead); on the CPU, ``time.perf_counter``. A step runs from
``step_begin()`` (or, if it is not called, the previous ``step_end()``) to ``step_end()``.

Compute in flight: a rank that hangs never ends its step, so its finished steps alone would keep reporting the
healthy compute time they had while its job stands still (silent-hang detection reads the hung rank's growing
compute, as the simulator's hung ranks report it). While a step has begun (its ``step_begin()``; without that
call, the previous ``step_end()``; a loop that calls it spends the time between ``step_end()`` and
``step_begin()``, its data loading, outside any step) and the rank has not yet entered as many collectives as
its last step that entered any did, its compute is still running: ``compute_in_flight()`` is the host time
since the step began. A rank that has entered them all is waiting for its peers at the collective: its compute
is over, nothing is in flight. Before the first step with a collective has ended the count is unknown, and
nothing is in flight either (a first step's compilation is not a hang). Host time: exact on the CPU; with CUDA
events it is the host's view (the host runs at most ``MAX_PENDING_STEPS`` ahead of the device, and a device
that hangs stops the host at its next wait, where its step then stays in flight).

Export: ``fleethealth_rank_compute_seconds{job, rank, node, gpu, peer_group}``, read at every scrape: the
median of the last ``smooth_steps`` steps (so one data-loader hiccup does not flag a rank), or the compute
in flight once it is longer than every one of those steps (so a step within the rank's usual spread reads
as the median; a hung rank's value grows from one scrape to the next), plus ``..._step_seconds``,
``..._first_collective_seconds`` and ``fleethealth_rank_steps_total``, through a prometheus-client
registry served on a port (``serve``), a node-exporter textfile (``write_textfile``), or a callback
(``on_step``). Values are also in-process: ``last``, ``history``.

Peers are ranks doing the same work: set ``peer_group`` to the pipeline stage (or the job when there is no
pipeline parallelism), never mix stages.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

COMPUTE_METRIC = "fleethealth_rank_compute_seconds"
STEP_METRIC = "fleethealth_rank_step_seconds"
FIRST_COLLECTIVE_METRIC = "fleethealth_rank_first_collective_seconds"
STEPS_METRIC = "fleethealth_rank_steps_total"
LABELS = ("job", "rank", "node", "gpu", "peer_group")


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One step of one rank. ``compute_s`` and ``first_collective_s`` are None when no collective was
    entered in the step (e.g. a ``no_sync`` gradient-accumulation micro-step)."""

    step: int
    compute_s: float | None
    first_collective_s: float | None
    step_s: float
    collectives: int


class _CpuClock:
    """Marks are host times."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def mark(self) -> Any:
        return self.clock()

    def ready(self, mark: Any) -> bool:
        return True

    def seconds(self, start: Any, end: Any) -> float:
        return float(end - start)


class _CudaClock:
    """Marks are CUDA events on the current stream; read once the GPU has passed them."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def mark(self) -> Any:
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def seconds(self, start: Any, end: Any) -> float:
        start.synchronize()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0


@dataclass(slots=True)
class _Pending:
    step: int
    begin: Any
    first: Any
    last: Any
    end: Any
    collectives: int


# Steps the GPU may lag behind the host before step_end() waits for it: reading CUDA events as soon as the
# GPU passes them keeps the host's run-ahead (no device sync per step) with bounded memory.
MAX_PENDING_STEPS = 2


def _is_fsdp(model: Any) -> bool:
    # FSDP's module is heavy to import; a DDP user never pays for it.
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def _fsdp2_modules(model: Any) -> list[Any]:
    """The ``fully_shard`` modules in ``model`` (each has its own reduce-scatter), or [] if none."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    modules = getattr(model, "modules", None)
    return [m for m in modules() if isinstance(m, FSDPModule)] if modules is not None else []


def _timed_reduce_scatter(timer: RankTimer) -> Any:
    """FSDP2's default reduce-scatter, noting each call's entry on ``timer``. FSDP2 has no comm hook;
    ``set_custom_reduce_scatter`` is its public way to own the collective."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
    except ImportError as e:  # pragma: no cover - the private module moved in another torch version
        raise TypeError("this torch version hides FSDP2's default reduce-scatter: call "
                        "RankTimer.mark_collective() where the gradient reduce-scatter starts") from e

    class TimedReduceScatter(DefaultReduceScatter):  # type: ignore[misc, valid-type]
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                     async_op: bool = False) -> Any:
            timer.mark_collective()
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    return TimedReduceScatter()


class RankTimer:
    """Measures one rank's compute time to its gradient collective; see the module doc.

    >>> tracker = RankTimer(job="llama-70b", peer_group="stage0")
    >>> tracker.attach(ddp_model)            # doctest: +SKIP
    >>> for batch in loader:                 # doctest: +SKIP
    ...     tracker.step_begin(); loss = ddp_model(batch).sum(); loss.backward(); opt.step(); tracker.step_end()
    """

    def __init__(
        self,
        job: str,
        peer_group: str = "",
        *,
        rank: int | None = None,
        node: str | None = None,
        gpu: str | None = None,
        smooth_steps: int = 5,
        history: int = 1000,
        on_step: Callable[[StepTiming], None] | None = None,
        use_cuda: bool | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.job = job
        self.peer_group = peer_group or job
        self._rank = rank
        self.node = node or os.environ.get("NODE_NAME") or socket.gethostname()
        self._gpu = gpu
        self.smooth_steps = max(1, smooth_steps)
        self.history: deque[StepTiming] = deque(maxlen=history)
        self.on_step = on_step
        self._use_cuda = use_cuda
        self._cpu_clock = _CpuClock(clock)
        self._clock: _CpuClock | _CudaClock = self._cpu_clock
        self._lock = threading.Lock()  # hooks run on autograd's thread, step_end on the caller's
        self._begin: Any = None
        self._boundary: Any = None
        # host times of the same marks, for the compute in flight (a CUDA event cannot be read while the
        # step it ends has not reached it)
        self._begin_host: float | None = None
        self._boundary_host: float | None = None
        self._step_collectives: int | None = None  # collectives of the last step that entered any
        self._calls_step_begin = False  # then the time between step_end() and step_begin() is not a step
        self._first: Any = None
        self._last: Any = None
        self._collectives = 0
        self._step = 0
        self._registry: Any = None
        self._gauges: dict[str, Any] = {}
        self._server: Any = None
        self._published_steps = 0
        self._pending: deque[_Pending] = deque()

    # -- identity -------------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        if self._rank is None:
            try:
                import torch.distributed as dist

                self._rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            except ImportError:
                self._rank = int(os.environ.get("RANK", "0"))
        return self._rank

    @property
    def gpu(self) -> str:
        if self._gpu is None:
            self._gpu = os.environ.get("LOCAL_RANK", "")
            if self._clock is not self._cpu_clock:
                import torch

                self._gpu = str(torch.cuda.current_device())
        return self._gpu

    def labels(self) -> dict[str, str]:
        return {"job": self.job, "rank": str(self.rank), "node": self.node, "gpu": self.gpu,
                "peer_group": self.peer_group}

    # -- attaching ------------------------------------------------------------------------------------

    def _pick_clock(self, module: Any) -> None:
        use_cuda = self._use_cuda
        if use_cuda is None:
            try:
                use_cuda = next(module.parameters()).is_cuda
            except (StopIteration, AttributeError):
                use_cuda = False
        if use_cuda:
            import torch

            self._clock = _CudaClock(torch)
        else:
            self._clock = self._cpu_clock

    def attach(self, model: Any, process_group: Any = None) -> RankTimer:
        """Register the timing comm hook on a DDP, FSDP or FSDP2 (``fully_shard``) model (replacing the
        default hook with the same collective). Call before the first forward. Returns self."""
        from torch.nn.parallel import DistributedDataParallel

        self._pick_clock(model)
        if isinstance(model, DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as ddp_hooks

            pg = process_group if process_group is not None else model.process_group

            # DDP rejects hooks whose annotations are not GradBucket/Future objects (strings here, under
            # postponed evaluation), so this one stays unannotated.
            def ddp_hook(state, bucket):  # type: ignore[no-untyped-def]
                self.mark_collective()
                return ddp_hooks.allreduce_hook(state, bucket)

            model.register_comm_hook(pg, ddp_hook)
        elif _is_fsdp(model):
            import torch.distributed as dist
            from torch.distributed.algorithms._comm_hooks import default_hooks as fsdp_hooks

            fsdp_pg: Any = process_group if process_group is not None else model.process_group or dist.group.WORLD
            state = fsdp_hooks.DefaultState(fsdp_pg)

            def fsdp_hook(state: Any, grad: Any, output: Any = None) -> Any:
                self.mark_collective()
                if output is None:
                    return fsdp_hooks.allreduce_hook(state, grad)
                return fsdp_hooks.reduce_scatter_hook(state, grad, output)

            model.register_comm_hook(state, fsdp_hook)
        elif (fsdp2_modules := _fsdp2_modules(model)):
            comm = _timed_reduce_scatter(self)
            for module in fsdp2_modules:
                module.set_custom_reduce_scatter(comm)
        else:
            raise TypeError(
                f"attach() takes a DistributedDataParallel, FullyShardedDataParallel or fully_shard model, not "
                f"{type(model).__name__}; for other setups call mark_collective() where the gradient "
                "collective starts"
            )
        return self

    # -- the step -------------------------------------------------------------------------------------

    def step_begin(self) -> None:
        host = self._cpu_clock.clock()
        with self._lock:
            self._begin = self._clock.mark()
            self._begin_host = host
            self._calls_step_begin = True
            self._first = self._last = None
            self._collectives = 0

    def mark_collective(self) -> None:
        """This rank is handing gradients to a collective now (hooks call it; call it yourself for FSDP2 or
        custom loops). The first and last calls of a step are kept."""
        mark = self._clock.mark()
        with self._lock:
            if self._begin is None:
                # No step_begin(): the step started where the previous one ended.
                self._begin = self._boundary
                self._begin_host = self._boundary_host
            if self._first is None:
                self._first = mark
            self._last = mark
            self._collectives += 1

    def step_end(self, wait: bool = False) -> StepTiming | None:
        """Close the step. Returns its timing when it is known now: always on the CPU; on the GPU once the
        device has passed the step's end (``wait=True`` waits for it, ``flush()`` for all). None if the
        step was never begun or is still running on the GPU; it then lands in ``history`` later."""
        end = self._clock.mark()
        host = self._cpu_clock.clock()
        with self._lock:
            begin = self._begin if self._begin is not None else self._boundary
            first, last, n = self._first, self._last, self._collectives
            self._boundary, self._boundary_host = end, host
            self._begin = self._first = self._last = self._begin_host = None
            self._collectives = 0
            if n > 0 and begin is not None:
                self._step_collectives = n
        if begin is None:
            return None
        pending = _Pending(self._step, begin, first, last, end, n)
        self._step += 1
        self._pending.append(pending)
        resolved = self._resolve(wait=wait)
        return resolved[-1] if resolved and resolved[-1].step == pending.step else None

    def flush(self) -> None:
        """Wait for the GPU and record every step still pending."""
        self._resolve(wait=True)

    def _resolve(self, wait: bool) -> list[StepTiming]:
        clock = self._clock
        done: list[StepTiming] = []
        while self._pending:
            p = self._pending[0]
            if not (wait or len(self._pending) > MAX_PENDING_STEPS or clock.ready(p.end)):
                break
            self._pending.popleft()
            step_s = clock.seconds(p.begin, p.end)  # first: once the end is reached, the other marks are
            timing = StepTiming(
                step=p.step,
                compute_s=clock.seconds(p.begin, p.last) if p.last is not None else None,
                first_collective_s=clock.seconds(p.begin, p.first) if p.first is not None else None,
                step_s=step_s,
                collectives=p.collectives,
            )
            self.history.append(timing)
            done.append(timing)
            if self.on_step is not None:
                self.on_step(timing)
        if done:
            self._publish()
        return done

    @contextmanager
    def step(self) -> Iterator[None]:
        self.step_begin()
        try:
            yield
        finally:
            self.step_end()

    # -- values -----------------------------------------------------------------------------------------

    @property
    def last(self) -> StepTiming | None:
        return self.history[-1] if self.history else None

    def compute_seconds(self) -> float | None:
        """Median compute time over the last ``smooth_steps`` finished steps."""
        return self._median("compute_s")

    def compute_in_flight(self) -> float | None:
        """Host seconds since the step in progress began, while this rank has not yet entered as many
        collectives as its last step with any did (its compute is still running, or hung); None when no
        step is in progress, when it has entered them all (it waits for its peers), or before the first
        step with a collective ended (see the module doc)."""
        now = self._cpu_clock.clock()
        with self._lock:
            began = self._begin_host
            if began is None and not self._calls_step_begin:
                began = self._boundary_host  # the step started where the previous one ended
            expected = self._step_collectives
            if began is None or expected is None or self._collectives >= expected:
                return None
            return max(0.0, now - began)

    def exported_compute_seconds(self) -> float | None:
        """What ``fleethealth_rank_compute_seconds`` reads now: the median of recent steps, or the compute
        in flight once it is longer than every one of them (a step within the rank's own recent spread
        is not news; a hung rank's value grows at every read)."""
        running = self.compute_in_flight()
        recent = [t.compute_s for t in list(self.history)[-self.smooth_steps:] if t.compute_s is not None]
        if running is not None and (not recent or running > max(recent)):
            return running
        return statistics.median(recent) if recent else None

    def _median(self, attr: str) -> float | None:
        recent = [getattr(t, attr) for t in list(self.history)[-self.smooth_steps:]]
        values = [v for v in recent if v is not None]
        return statistics.median(values) if values else None

    # -- export -----------------------------------------------------------------------------------------

    def registry(self) -> Any:
        """The prometheus-client registry holding this rank's gauges (created on first use)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry, Counter, Gauge

            reg = CollectorRegistry()
            names = list(LABELS)
            reg.register(_ComputeCollector(self))  # read at scrape time: the compute in flight moves
            self._gauges = {
                FIRST_COLLECTIVE_METRIC: Gauge(FIRST_COLLECTIVE_METRIC, "Time from step start to the first "
                                               "gradient bucket entering the collective.", names, registry=reg),
                STEP_METRIC: Gauge(STEP_METRIC, "Whole-step time (equal across synchronous ranks).", names,
                                   registry=reg),
                STEPS_METRIC: Counter(STEPS_METRIC.removesuffix("_total"), "Steps timed.", names, registry=reg),
            }
            self._registry = reg
            self._publish()
        return self._registry

    def _publish(self) -> None:
        if self._registry is None or not self.history:
            return
        labels = self.labels()
        values = {
            FIRST_COLLECTIVE_METRIC: self._median("first_collective_s"),
            STEP_METRIC: self._median("step_s"),
        }
        for name, value in values.items():
            if value is not None:
                self._gauges[name].labels(**labels).set(value)
        recorded = self.history[-1].step + 1
        self._gauges[STEPS_METRIC].labels(**labels).inc(recorded - self._published_steps)
        self._published_steps = recorded

    def serve(self, port: int = 0, addr: str = "0.0.0.0") -> int:
        """Serve /metrics on ``port`` (0: a free one) from a daemon thread; returns the port."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry())
        self._server = server
        return int(server.server_address[1])

    def write_textfile(self, path: str) -> None:
        """Write the gauges atomically for node-exporter's textfile collector."""
        from prometheus_client import write_to_textfile

        write_to_textfile(path, self.registry())

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _ComputeCollector:
    """``fleethealth_rank_compute_seconds`` for a prometheus-client registry, computed when scraped
    (``RankTimer.exported_compute_seconds``); no sample while nothing is known."""

    def __init__(self, timer: RankTimer) -> None:
        self.timer = timer

    def describe(self) -> list[Any]:
        return []  # computed at collect time; describing would call collect at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        fam = GaugeMetricFamily(COMPUTE_METRIC, "Compute time of a step up to its last entry into the gradient "
                                "collective (median of recent steps), or of the step still in flight when longer.",
                                labels=list(LABELS))
        value = self.timer.exported_compute_seconds()
        if value is not None:
            labels = self.timer.labels()
            fam.add_metric([labels[k] for k in LABELS], value)
        yield fam
