"""The world's side of the loop in a backtest: simulator events turned into decision events, the answers
the world gives to the decisions' requests (active tests, resets), and, closed loop, what the decisions do
to the world.

Closed loop (the default): each arm's decisions change its own copy of the simulated world, as they would
in production. A quarantined or drained node stops running work (its GPUs idle, its ranks leave the job,
its replicas get no traffic) until it is released; a drained replica gets no traffic; a concurrency limit
stops an overload from piling up (no more overload OOMs); rejecting oversized requests stops those OOMs; a
rebuilt worker starts with a clean heap; a reset clears what a reset fixes (a pending row remap). Open loop
(``closed=False``): the decisions never change the telemetry; only the answers below are modelled.

Answers, from ground truth: an active test requested at ``t`` reports after ``test_s`` (a replica's probe
after ``probe_s``) and passes unless a real hardware fault is active on that node then
(``Simulation.active_test``, evaluated when the answer is due, so a reset or repair in between counts); a
drain-and-reset reports after ``reset_s``; a repair ladder's reset after ``reset_s`` and its reboot after
``reboot_s``, that the action ran (closed loop, the world is reset or rebooted then: ``Simulation.apply_action``).
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


# Lifecycle states in which an entity runs no work, and the ones that put it back.
OUT_OF_SERVICE = frozenset({State.QUARANTINED, State.DRAINING, State.FAILED})
BACK_IN_SERVICE = frozenset({State.READY, State.RECOVERING})
# Intents whose effect is immediate (a config push): the simulator action they map to.
IMMEDIATE = {IntentKind.LIMIT_CONCURRENCY: "limit_concurrency", IntentKind.REJECT_REQUEST: "reject_oversized"}


@dataclass(slots=True)
class World:
    """Answers one arm's requests from ground truth and, when ``closed``, turns its decisions into
    simulator actions (``Simulation.apply_action``). ``healthy(node, t)`` is the active-test oracle
    (``sim.active_test`` of the arm's world when ``sim`` is set); ``node_of`` maps a replica to its node;
    ``nodes`` names the nodes (intents about anything else, a pool or a job, change nothing here)."""

    healthy: Any  # Callable[[str, float], bool] | None
    node_of: dict[str, str]
    test_s: float = 600.0  # DCGM diag r2 (~2 min) and an NCCL bandwidth check, plus scheduling
    probe_s: float = 60.0  # a replica's probe inference
    reset_s: float = 600.0  # drain, GPU reset, back
    reboot_s: float = 900.0  # drain, node reboot (firmware, driver load), back
    rebuild_s: float = 60.0  # a serving worker torn down and started again
    closed: bool = False
    nodes: frozenset[str] = frozenset()
    sim: Any = None  # the arm's Simulation (closed loop), set by the runner
    requests: list[tuple[float, str, str, str]] = field(default_factory=list)  # (at, kind, entity, node)
    actions: list[tuple[float, int, str, str]] = field(default_factory=list)  # (at, seq, entity, action)
    out: set[str] = field(default_factory=set)  # entities out of service by lifecycle
    applied: int = 0
    _seq: int = 0

    def _oracle(self, node: str, at: float) -> bool:
        if self.sim is not None:
            return bool(self.sim.active_test(node, at))
        return bool(self.healthy(node, at))

    def _action_s(self, it: Intent) -> float:
        return self.reboot_s if it.params.get("action") == "NODE_REBOOT" else self.reset_s

    def _known(self, entity: str) -> bool:
        return entity in self.node_of or entity.split("/")[0] in self.nodes

    def _act(self, at: float, entity: str, action: str) -> None:
        self.actions.append((at, self._seq, entity, action))
        self._seq += 1

    def react(self, transitions: Iterable[Transition], intents: Iterable[Intent]) -> bool:
        """Schedule the answers to this cycle's requests and, closed loop, the world's changes. Returns
        whether anything will change the world."""
        transitions = list(transitions)
        draining = {t.entity for t in transitions if t.to_state == State.DRAINING}
        moved = {t.entity for t in transitions}
        n0 = len(self.actions)
        for it in intents:
            if it.kind == IntentKind.RUN_ACTIVE_TEST:
                node = self.node_of.get(it.entity, it.entity)
                delay = self.probe_s if it.entity in self.node_of else self.test_s
                self.requests.append((it.ts + delay, "active_test", it.entity, node))
            elif it.kind == IntentKind.SCHEDULE_RESET and ("ladder" in it.params or it.entity in draining):
                # A repair ladder's step and a drain-and-reset wait for the executor's result; a reset at
                # the next safe point of a pending row remap changes no lifecycle state (the flag clears
                # when the remap is done). The executor reports that the action ran; whether it fixed the
                # fault is the step's verification (an active test, judged from the world then).
                node = self.node_of.get(it.entity, it.entity)
                kind = "repair_step" if "ladder" in it.params else "reset"
                self.requests.append((it.ts + self._action_s(it), kind, it.entity, node))
            if not self.closed or not self._known(it.entity):
                continue
            if it.kind in IMMEDIATE:
                self._act(it.ts, it.entity, IMMEDIATE[it.kind])
            elif it.kind == IntentKind.SCHEDULE_RESET:
                reboot = it.params.get("action") == "NODE_REBOOT"
                self._act(it.ts + self._action_s(it), it.entity.split("/")[0] if reboot else it.entity,
                          "reboot" if reboot else "reset")
            elif it.kind == IntentKind.DRAIN and it.entity not in moved:
                self._act(it.ts, it.entity, "drain")  # a pod-tier drain before a rebuild, no state change
            elif it.kind == IntentKind.REBUILD_WORKER:
                self._act(it.ts + self.rebuild_s, it.entity, "rebuild")
                self._act(it.ts + self.rebuild_s, it.entity, "rejoin")
        if self.closed:
            for t in transitions:
                if not self._known(t.entity):
                    continue
                if t.to_state in OUT_OF_SERVICE and t.entity not in self.out:
                    self.out.add(t.entity)
                    self._act(t.ts, t.entity, "drain")
                elif t.to_state in BACK_IN_SERVICE and t.entity in self.out:
                    self.out.discard(t.entity)
                    self._act(t.ts, t.entity, "release")
        return len(self.actions) > n0

    def apply_due(self, sim: Any, t: float) -> None:
        """Apply the world changes due by ``t`` to ``sim`` (before it generates the step at ``t``)."""
        if not self.actions or min(a[0] for a in self.actions) > t:
            return
        due = sorted(a for a in self.actions if a[0] <= t)
        self.actions = [a for a in self.actions if a[0] > t]
        for at, _, entity, action in due:
            if action == "rejoin":
                # a rebuilt worker takes traffic again, unless its lifecycle took it out meanwhile
                if entity in self.out:
                    continue
                action = "release"
            sim.apply_action(entity, action, at)
            self.applied += 1

    def due(self, now: float) -> list[Event]:
        """The answers due by ``now``, judged from the world as it is when each one is due."""
        if not self.requests:
            return []
        ready = sorted((r for r in self.requests if r[0] <= now), key=lambda r: (r[0], r[2], r[1]))
        if not ready:
            return []
        self.requests = [r for r in self.requests if r[0] > now]
        # an active test (and a plain drain-and-reset) passes unless a real fault is present; a repair
        # ladder's step reports that its action ran, and the step's active test then judges the repair
        return [Event(at, "reset", entity, passed=True, actor="sim/repair-step") if kind == "repair_step" else
                Event(at, kind, entity, passed=self._oracle(node, at), actor=f"sim/{kind.replace('_', '-')}")
                for at, kind, entity, node in ready]
