"""The world's side of the loop in a backtest: simulator events turned into decision events, and the
answers the world gives to the decisions' requests (active tests, resets).

The backtest runs open loop: the decisions never change the simulated telemetry, so every arm (the
product and each baseline) sees exactly the same signals. What the world *answers* is still modelled,
from ground truth: an active test requested at ``t`` reports after ``test_s`` and passes unless a real
hardware fault is active on that node then (``Simulation.active_test``); a drain-and-reset reports after
``reset_s``. Pure apart from reading the simulation's fault list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleethealth.decide.model import Intent, IntentKind, State, Transition
from fleethealth.decide.state import Event
from fleethealth.sim.truth import SimEvent

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What a serving sidecar knows about its engine and passes along with every OOM (the simulator's
    OOM context carries the request and allocator side only)."""

    model_max_len: int = 131072  # Llama 3.x context
    max_batch_tokens: int = 65536  # vLLM max_num_batched_tokens as deployed
    total_bytes: int = 80 * GiB


def oom_event(ev: SimEvent, limits: EngineLimits = EngineLimits()) -> Event:
    """A simulator ``cuda_oom`` event as the decisions layer's ``oom`` event (OomEvent fields)."""
    c = ev.context
    payload: dict[str, Any] = {"model": c.get("model", ""), "model_max_len": limits.model_max_len,
                               "max_batch_tokens": limits.max_batch_tokens, "total_bytes": limits.total_bytes}

    def put(dst: str, src: str, scale: float = 1.0, cast: type = int) -> None:
        v = c.get(src)
        if v is not None:
            payload[dst] = cast(v * scale) if scale != 1.0 else cast(v)

    put("prompt_tokens", "prompt_tokens")
    put("max_tokens", "max_tokens")
    put("batch_tokens", "num_batched_tokens")
    put("running_requests", "batch_size")
    put("kv_cache_usage", "kv_cache_usage", cast=float)
    put("requested_bytes", "tried_to_allocate_mib", MiB)
    put("reserved_bytes", "reserved_unallocated_mib", MiB)
    if "reserved_unallocated_mib" in c:
        # The allocator's report of a fragmented heap: little truly free, much reserved but unusable.
        payload["free_bytes"] = 512 * MiB
    payload["recent_xids"] = [int(x) for x in c.get("recent_xids", [])]
    if c.get("cuda_error"):
        payload["cuda_errors"] = [str(c["cuda_error"])]
    return Event(ev.ts, "oom", ev.entity, payload=payload, actor="sim")


@dataclass(slots=True)
class World:
    """Answers one arm's requests from ground truth. ``healthy(node, t)`` is the active-test oracle;
    ``node_of`` maps a replica to its node."""

    healthy: Any  # Callable[[str, float], bool]
    node_of: dict[str, str]
    test_s: float = 600.0  # DCGM diag r2 (~2 min) and an NCCL bandwidth check, plus scheduling
    probe_s: float = 60.0  # a replica's probe inference
    reset_s: float = 600.0  # drain, GPU reset, back
    pending: list[Event] = field(default_factory=list)

    def react(self, transitions: Iterable[Transition], intents: Iterable[Intent]) -> None:
        """Schedule the answers to this cycle's requests."""
        draining = {t.entity for t in transitions if t.to_state == State.DRAINING}
        for it in intents:
            if it.kind == IntentKind.RUN_ACTIVE_TEST:
                node = self.node_of.get(it.entity, it.entity)
                delay = self.probe_s if it.entity in self.node_of else self.test_s
                at = it.ts + delay
                self.pending.append(Event(at, "active_test", it.entity, passed=bool(self.healthy(node, at)),
                                          actor="sim/active-test"))
            elif it.kind == IntentKind.SCHEDULE_RESET and it.entity in draining:
                # Only a drain-and-reset waits for a result; a reset at the next safe point of a pending
                # row remap changes no lifecycle state, and open loop it would never clear the flag.
                node = self.node_of.get(it.entity, it.entity)
                at = it.ts + self.reset_s
                self.pending.append(Event(at, "reset", it.entity, passed=bool(self.healthy(node, at)),
                                          actor="sim/reset"))

    def due(self, now: float) -> list[Event]:
        out = [e for e in self.pending if e.ts <= now]
        if out:
            self.pending = [e for e in self.pending if e.ts > now]
        return sorted(out, key=lambda e: e.ts)
