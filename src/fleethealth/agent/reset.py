"""The node agent's repair executor: reset a drained GPU when the controller asks, and say how it went.

Theory of operation
-------------------
The controller's repair ladder asks for a GPU reset with a SCHEDULE_RESET intent; the Kubernetes
actuator writes it on the Node as annotations (``fleethealth.io/reset-requested`` = GPU_RESET,
``reset-request-key`` = the intent's idempotency key, ``reset-gpus`` = the GPUs). ``ResetWatcher.poll``
(one call per agent interval) reads its own Node, and for a request key it has not answered yet:

1. checks the preconditions the ladder named: ``drained`` (the node is cordoned and no pod that
   requests ``nvidia.com/gpu`` still runs on it, daemon sets aside), and per GPU through NVML that no
   compute process holds it and persistence mode is off (or, with ``allow_persistence_off``, turns it off
   for the reset and back on after);
2. resets each GPU with ``nvidia-smi --gpu-reset -i BUS_ID`` (NVML has no reset call), then checks that
   NVML sees the device again;
3. on any failure, collects a bug-report bundle (``nvidia-bug-report.sh`` when installed, else the
   agent's own: ``nvidia-smi -q`` and what NVML reads) under ``bundle_dir``;
4. reports: annotations ``reset-result`` (passed / failed / refused), ``reset-result-key`` and
   ``reset-result-detail`` on the Node, and a ``reset`` event to the controller's authenticated events
   endpoint (bearer token), which moves the ladder on. A refused reset (a process still holds the GPU,
   persistence mode) is reported as a failure with its reason: the ladder escalates (a reboot does not
   need the GPU idle) instead of waiting. A request ``reset-when: next_safe_point`` (a pending row
   remap's, on a node that stays in service) is not refused while GPU work runs: the agent waits for
   the safe point (no GPU pod left on the node; it need not be cordoned, the NVML process check still
   guards the reset) and answers then; the ladder's step timeout bounds the wait.

A request is answered once: the result key on the Node is the record, so an agent restarted mid-reset
does not reset twice, and a new request (a new key) is a new reset. Never run against a real GPU in
tests: they use ``FakeNvml`` and a fake ``nvidia-smi``.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleethealth.act.remediation import gpu_work
from fleethealth.sources.nvml import NvmlApi, error_name

log = logging.getLogger("fleethealth.agent.reset")

PREFIX = "fleethealth.io"
REQUEST = f"{PREFIX}/reset-requested"
REQUEST_KEY = f"{PREFIX}/reset-request-key"
REQUEST_GPUS = f"{PREFIX}/reset-gpus"
REQUEST_WHEN = f"{PREFIX}/reset-when"
RESULT = f"{PREFIX}/reset-result"
RESULT_KEY = f"{PREFIX}/reset-result-key"
RESULT_DETAIL = f"{PREFIX}/reset-result-detail"

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def run_command(cmd: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)


@dataclass(frozen=True, slots=True)
class ResetResult:
    status: str  # passed | failed | refused
    detail: str
    gpus: tuple[str, ...] = ()
    bundle: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class GpuResetter:
    """Resets GPUs of this node by index, after checking NVML for what would make a reset unsafe."""

    nvml: NvmlApi
    run: Runner = run_command
    smi: str = "nvidia-smi"
    bug_report: str = "nvidia-bug-report.sh"
    bundle_dir: Path = field(default_factory=lambda: Path("/var/lib/fleethealth/bundles"))
    allow_persistence_off: bool = False
    reset_timeout_s: float = 120.0
    node: str = ""
    clock: Callable[[], float] = time.time

    def _bus_id(self, handle: Any) -> str:
        return _text(self.nvml.nvmlDeviceGetPciInfo(handle).busId)

    def reset(self, indices: Sequence[int]) -> ResetResult:
        names = tuple(f"gpu{i}" for i in indices)
        handles: list[tuple[int, Any, str]] = []
        try:
            count = self.nvml.nvmlDeviceGetCount()
            for i in indices:
                if not 0 <= i < count:
                    return ResetResult("refused", f"gpu{i}: no such GPU on this node ({count} GPUs)", names)
                h = self.nvml.nvmlDeviceGetHandleByIndex(i)
                handles.append((i, h, self._bus_id(h)))
        except Exception as e:  # pynvml's errors: a GPU off the bus cannot be reset from here
            return self._failed(names, f"NVML cannot reach the GPU ({error_name(e)}): a reset cannot help, reboot")
        turned_off: list[str] = []
        for i, h, bus in handles:
            try:
                procs = list(self.nvml.nvmlDeviceGetComputeRunningProcesses(h))
            except Exception as e:
                return self._failed(names, f"gpu{i}: cannot list its processes ({error_name(e)})")
            if procs:
                pids = ", ".join(str(getattr(p, "pid", "?")) for p in procs[:5])
                return ResetResult("refused", f"gpu{i} ({bus}): {len(procs)} process(es) still hold it (pid {pids}):"
                                   " drain the node's GPU work first", names)
            try:
                pm = int(self.nvml.nvmlDeviceGetPersistenceMode(h))
            except Exception:
                pm = 0  # not supported: nothing to turn off
            if pm:
                if not self.allow_persistence_off:
                    return ResetResult("refused", f"gpu{i} ({bus}): persistence mode is on and the agent may not"
                                       " turn it off (--reset-persistence-off)", names)
                r = self.run([self.smi, "-i", bus, "-pm", "0"], 30.0)
                if r.returncode != 0:
                    return self._failed(names, f"gpu{i}: cannot turn persistence mode off: {_first(r)}")
                turned_off.append(bus)
        try:
            for i, _, bus in handles:
                try:
                    r = self.run([self.smi, "--gpu-reset", "-i", bus], self.reset_timeout_s)
                except subprocess.TimeoutExpired:
                    return self._failed(names, f"gpu{i}: nvidia-smi --gpu-reset did not finish in"
                                               f" {self.reset_timeout_s:g} s")
                except OSError as e:
                    return self._failed(names, f"cannot run {self.smi}: {e.strerror or e}")
                if r.returncode != 0:
                    return self._failed(names, f"gpu{i} ({bus}): reset failed: {_first(r)}")
            for i, _, _bus in handles:  # NVML sees the device again
                try:
                    self.nvml.nvmlDeviceGetHandleByIndex(i)
                except Exception as e:
                    return self._failed(names, f"gpu{i}: gone after the reset ({error_name(e)})")
        finally:
            for bus in turned_off:
                self.run([self.smi, "-i", bus, "-pm", "1"], 30.0)
        return ResetResult("passed", f"reset {', '.join(names)}", names)

    def _failed(self, names: tuple[str, ...], detail: str) -> ResetResult:
        return ResetResult("failed", detail, names, self.collect_bundle(detail))

    def collect_bundle(self, why: str) -> str | None:
        """``nvidia-bug-report.sh`` when installed, else the agent's own bundle. Returns its path."""
        try:
            self.bundle_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("cannot write bug-report bundles to %s: %s", self.bundle_dir, e)
            return None
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        base = self.bundle_dir / f"{self.node or 'node'}-{stamp}"
        if shutil.which(self.bug_report):
            out = Path(f"{base}-nvidia-bug-report.log.gz")
            try:
                r = self.run([self.bug_report, "--output-file", str(out).removesuffix(".gz")], 600.0)
                if r.returncode == 0:
                    return str(out)
            except (OSError, subprocess.TimeoutExpired) as e:
                log.warning("nvidia-bug-report failed: %s", e)
        bundle: dict[str, Any] = {"node": self.node, "ts": self.clock(), "why": why}
        try:
            q = self.run([self.smi, "-q"], 60.0)
            bundle["nvidia_smi_q"] = q.stdout[-200_000:]
            bundle["nvidia_smi_q_rc"] = q.returncode
        except (OSError, subprocess.TimeoutExpired) as e:
            bundle["nvidia_smi_q_error"] = str(e)
        path = Path(f"{base}-bundle.json")
        path.write_text(json.dumps(bundle, indent=1, default=str))
        return str(path)


def _first(r: subprocess.CompletedProcess[str]) -> str:
    text = (r.stderr or r.stdout or "").strip().splitlines()
    return (text[0] if text else f"exit status {r.returncode}")[:300]


def gpu_indices(spec: str, node: str) -> list[int] | None:
    """``node-1/gpu3,node-1/gpu5`` or ``3,5`` -> [3, 5]; empty -> None (every GPU of the node)."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        tail = part.rsplit("/", 1)[-1]
        tail = tail.removeprefix("gpu")
        if not tail.isdigit():
            raise ValueError(f"{part!r}: not a GPU of {node}")
        out.append(int(tail))
    return out or None


@dataclass
class ResetWatcher:
    """Answers the controller's reset requests for one node (``poll`` once per agent interval)."""

    node: str
    kube: Any  # fleethealth.act.kube_api.Kube
    resetter: GpuResetter
    report: Callable[[dict[str, Any]], None] | None = None  # POSTs an event to the controller
    answered: set[str] = field(default_factory=set)
    waiting: set[str] = field(default_factory=set)  # next-safe-point requests seen, not yet answerable

    def _drained(self, node_obj: dict[str, Any]) -> str | None:
        if not (node_obj.get("spec") or {}).get("unschedulable"):
            return "the node is not cordoned"
        busy = gpu_work(self.kube, self.node)
        return None if not busy else f"GPU pods still on the node: {', '.join(busy[:5])}"

    def poll(self) -> ResetResult | None:
        obj = self.kube.get_node(self.node)
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        key = ann.get(REQUEST_KEY)
        if not key or ann.get(REQUEST) != "GPU_RESET" or key in self.answered or ann.get(RESULT_KEY) == key:
            return None  # nothing asked, a reboot (not ours), or already answered (also before a restart)
        try:
            indices = gpu_indices(ann.get(REQUEST_GPUS, ""), self.node)
        except ValueError as e:
            res = ResetResult("refused", str(e))
        else:
            why = self._drained(obj)
            if why is not None and ann.get(REQUEST_WHEN) == "next_safe_point":
                busy = gpu_work(self.kube, self.node)
                if busy:
                    if key not in self.waiting:
                        self.waiting.add(key)
                        log.info("reset request %s on %s waits for the next safe point: GPU pods %s", key,
                                 self.node, ", ".join(busy[:5]))
                    return None
                why = None  # no GPU work left: the safe point
            if why is not None:
                res = ResetResult("refused", f"not drained: {why}")
            else:
                if indices is None:
                    indices = list(range(self.resetter.nvml.nvmlDeviceGetCount()))
                res = self.resetter.reset(indices)
        self.answered.add(key)
        detail = res.detail + (f" (bundle {res.bundle})" if res.bundle else "")
        self.kube.patch_node(self.node, {"metadata": {"annotations": {
            RESULT: res.status, RESULT_KEY: key, RESULT_DETAIL: detail[:1000]}}})
        log.info("reset request %s on %s: %s: %s", key, self.node, res.status, detail)
        if self.report is not None:
            try:
                self.report({"kind": "reset", "entity": self.node, "passed": res.passed,
                             "actor": f"agent/{self.node}",
                             "payload": {"action": "GPU_RESET", "key": key, "status": res.status,
                                         "detail": detail, "bundle": res.bundle, "gpus": list(res.gpus)}})
            except Exception as e:  # the annotation is the record; the controller also reads it
                log.warning("cannot report the reset to the controller: %s", e)
        return res


def controller_reporter(url: str, token: str | None, timeout_s: float = 10.0) -> Callable[[dict[str, Any]], None]:
    """POST one event to the controller's events endpoint with the agent's bearer token."""
    import httpx

    def post(event: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = httpx.post(url.rstrip("/") + "/api/v1/events", json=event, headers=headers,
                       timeout=timeout_s)
        r.raise_for_status()

    return post
