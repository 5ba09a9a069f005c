"""Active tests as Kubernetes Jobs pinned to one node, and their results read back as events.

A quarantined node leaves quarantine only on a pass: the decisions layer consumes ActiveTestResult
events (QUARANTINED -> RECOVERING on "passed"), and the node actuator refuses RELEASE unless the latest
round of tests on that node passed. The Job is pinned with spec.nodeName (the scheduler, and so the
cordon, is bypassed on purpose) and tolerates our own taint, so it runs on the isolated node.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleethealth.act.config import ActuationConfig
from fleethealth.act.kube_api import Kube, KubeError
from fleethealth.act.outcome import Outcome, node_of
from fleethealth.decide.model import Intent, IntentKind, Tier

COMMANDS: dict[str, list[str]] = {
    "dcgm_diag_r1": ["dcgmi", "diag", "-r", "1"],
    "dcgm_diag_r2": ["dcgmi", "diag", "-r", "2"],
    "dcgm_diag_r3": ["dcgmi", "diag", "-r", "3"],
    "nccl_bandwidth": ["all_reduce_perf", "-b", "1G", "-e", "4G", "-f", "2", "-c", "1", "-g", "{gpus}"],
}


def dns_name(*parts: str, limit: int = 63) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if len(s) <= limit:
        return s
    h = hashlib.sha256(s.encode()).hexdigest()[:8]
    return s[: limit - 9].rstrip("-") + "-" + h


def job_manifest(node: str, test: str, namespace: str, intent_key: str, cfg: ActuationConfig,
                 gpus: int = 8, image: str | None = None, command: list[str] | None = None) -> dict[str, Any]:
    p = cfg.label_prefix
    cmd = [c.replace("{gpus}", str(gpus)) for c in (command or COMMANDS.get(test, ["false"]))]
    labels = {f"{p}/active-test": "true", f"{p}/test": test, f"{p}/node": dns_name(node),
              f"{p}/round": intent_key[:16]}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": dns_name("fh", test.replace("_", "-"), node, intent_key[:6]), "namespace": namespace,
                     "labels": labels, "annotations": {f"{p}/node-name": node, f"{p}/intent": intent_key}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(cfg.test_timeout_s),
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeName": node,
                    "tolerations": [{"key": cfg.taint_key, "operator": "Exists"},
                                    {"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [{
                        "name": "test", "image": image or cfg.test_images.get(test, "busybox"),
                        "command": cmd,
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                    }],
                },
            },
        },
    }


@dataclass(frozen=True, slots=True)
class ActiveTestResult:
    entity: str  # the node
    test: str
    verdict: str  # passed | failed | running
    job: str
    round: str
    ts: float

    def to_event(self) -> dict[str, Any]:
        """The event the decisions layer consumes (QUARANTINED -> RECOVERING only on passed)."""
        return {"type": "active_test", "entity": self.entity, "test": self.test, "verdict": self.verdict,
                "passed": self.verdict == "passed", "job": self.job, "round": self.round, "ts": self.ts}


def job_verdict(job: dict[str, Any]) -> str:
    st = job.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("status") == "True" and c.get("type") == "Complete":
            return "passed"
        if c.get("status") == "True" and c.get("type") == "Failed":
            return "failed"
    if st.get("failed"):
        return "failed"
    return "running"


class ActiveTests:
    """RUN_ACTIVE_TEST actuator, and the reader of the tests' results."""

    name = "active-test"
    kinds = frozenset({IntentKind.RUN_ACTIVE_TEST})

    def __init__(self, kube: Kube, config: ActuationConfig | None = None,
                 default_tests: list[str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.cfg = config or ActuationConfig()
        self.default_tests = default_tests or ["dcgm_diag_r2", "nccl_bandwidth"]
        self.clock = clock
        self._seen_rounds: set[tuple[str, str]] = set()

    def apply(self, intent: Intent) -> Outcome:
        if intent.tier in (Tier.POD, Tier.INSTANCE):
            # Replica probes (probe_inference) run in the serving layer, not as node Jobs.
            return Outcome.success(skipped=f"active test at {intent.tier} tier is not a node Job")
        node = node_of(intent)
        tests = intent.params.get("tests") or ([intent.params["test"]] if intent.params.get("test")
                                               else self.default_tests)
        ns = self.cfg.test_namespace
        try:
            self.kube.ensure_namespace(ns)
            gpus = int(intent.params.get("gpus") or self._node_gpus(node) or 1)
            created, existing = [], []
            for test in tests:
                job = job_manifest(node, str(test), ns, intent.key, self.cfg, gpus=gpus,
                                   image=intent.params.get("image"), command=intent.params.get("command"))
                try:
                    self.kube.create_job(ns, job)
                    created.append(job["metadata"]["name"])
                except KubeError as e:
                    if e.status != 409:  # AlreadyExists: this round was started before (idempotent)
                        raise
                    existing.append(job["metadata"]["name"])
        except KubeError as e:
            return Outcome.from_status(e.status, e.reason)
        return Outcome.success(node=node, created=created, existing=existing, round=intent.key[:16])

    def _node_gpus(self, node: str) -> int:
        try:
            cap = self.kube.get_node(node).get("status", {}).get("capacity", {})
        except KubeError:
            return 0
        try:
            return int(cap.get("nvidia.com/gpu", 0))
        except ValueError:
            return 0

    def results(self, node: str | None = None) -> list[ActiveTestResult]:
        sel = f"{self.cfg.label_prefix}/active-test=true"
        if node is not None:
            sel += f",{self.cfg.label_prefix}/node={dns_name(node)}"
        out = []
        for job in self.kube.list_jobs(self.cfg.test_namespace, label_selector=sel):
            md = job.get("metadata", {})
            labels = md.get("labels") or {}
            out.append(ActiveTestResult(
                entity=(md.get("annotations") or {}).get(f"{self.cfg.label_prefix}/node-name", labels.get(
                    f"{self.cfg.label_prefix}/node", "")),
                test=labels.get(f"{self.cfg.label_prefix}/test", ""), verdict=job_verdict(job),
                job=md.get("name", ""), round=labels.get(f"{self.cfg.label_prefix}/round", ""),
                ts=_ts(md.get("creationTimestamp")),
            ))
        return sorted(out, key=lambda r: (r.ts, r.job))

    def rounds(self, node: str | None = None) -> list[ActiveTestResult]:
        """One result per (node, round): a round is the set of tests one RUN_ACTIVE_TEST started, and it
        passes only when every test in it passed (fails as soon as one fails). Feed the decisions layer
        these, not the per-Job results: one Job passing must not release a node whose other test fails."""
        by: dict[tuple[str, str], list[ActiveTestResult]] = {}
        for r in self.results(node):
            by.setdefault((r.entity, r.round), []).append(r)
        out = []
        for (entity, rnd), rs in by.items():
            verdicts = {r.verdict for r in rs}
            verdict = "failed" if "failed" in verdicts else "passed" if verdicts == {"passed"} else "running"
            out.append(ActiveTestResult(entity=entity, test="+".join(sorted(r.test for r in rs)), verdict=verdict,
                                        job=",".join(sorted(r.job for r in rs)), round=rnd,
                                        ts=max(r.ts for r in rs)))
        return sorted(out, key=lambda r: (r.ts, r.job))

    def new_verdicts(self) -> list[ActiveTestResult]:
        """Rounds that finished (passed or failed) since the last call, each once: the controller turns
        them into ``active_test`` events for the decisions layer."""
        seen = self._seen_rounds
        out = []
        for r in self.rounds():
            if r.verdict in ("passed", "failed") and (r.entity, r.round) not in seen:
                seen.add((r.entity, r.round))
                out.append(r)
        return out

    def latest_verdict(self, node: str) -> str:
        """passed only if every test of the node's latest round passed; none if no test ever ran."""
        res = self.results(node)
        if not res:
            return "none"
        last_round = res[-1].round
        verdicts = {r.verdict for r in res if r.round == last_round}
        if "failed" in verdicts:
            return "failed"
        if verdicts == {"passed"}:
            return "passed"
        return "running"


def _ts(s: str | None) -> float:
    if not s:
        return 0.0
    from datetime import datetime

    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
