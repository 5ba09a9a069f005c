"""Kubernetes node actuator: cordon, taints, labels, the GPUHealthy condition, drain via Eviction.

Every write is computed as a difference from what the node already has: a second apply of the same
intent writes nothing (the node's resourceVersion does not move). Node spec patches carry the
resourceVersion they were computed from, so a concurrent writer yields 409 (retried), never a lost
update. Drain honours PodDisruptionBudgets through the Eviction API: a 429 is retried with backoff until
the drain limit, then the pods still there are reported (deleted only if the config allows it).

Fencing (act.fence): with a fence bound (``bind_fence``), every node write also records the leader's epoch
in the annotation ``<prefix>/leader-epoch``, carries the resourceVersion it was computed from, and is
refused (``StaleEpoch``: nothing written) when the node already carries a newer epoch, i.e. a newer leader
wrote it; the runner also checks the Lease itself before every call.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleethealth.act.config import ActuationConfig
from fleethealth.act.fence import EPOCH_ANNOTATION, Fence, StaleEpoch, stale_epoch
from fleethealth.act.kube_api import Kube, KubeError
from fleethealth.act.outcome import Outcome, is_retryable_status, node_of
from fleethealth.decide.model import Intent, IntentKind, State, Tier

MANAGER = "fleethealth"


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def score_band(value: float | None) -> str:
    """Coarse band for a label (labels want few distinct values; the exact score is in the condition)."""
    if value is None:
        return "unknown"
    if value >= 0.9:
        return "high"
    if value >= 0.7:
        return "medium"
    if value >= 0.3:
        return "low"
    return "critical"


def label_value(s: str) -> str:
    """A valid Kubernetes label value: [A-Za-z0-9._-], at most 63, alphanumeric at both ends."""
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in s)[:63]
    return out.strip("._-")


def intent_state(intent: Intent) -> str:
    st = intent.params.get("state")
    if isinstance(st, str) and st:
        return st
    if intent.kind == IntentKind.NO_NEW_WORK and "value" in intent.params and intent.params["value"] is None:
        return "UNKNOWN"  # no fresh data: nothing new goes there, but nothing says it is degraded
    return {
        IntentKind.QUARANTINE: State.QUARANTINED, IntentKind.NO_NEW_WORK: State.DEGRADED,
        IntentKind.DRAIN: State.DRAINING, IntentKind.RELEASE: State.RECOVERING,
        IntentKind.ALLOW_NEW_WORK: State.READY,
    }.get(intent.kind, State.DEGRADED).value


def tuple_facts(intent: Intent) -> tuple[float | None, float | None, str]:
    """(value, confidence, reason) from the intent's params or the health tuple it carries."""
    t = intent.params.get("tuple") if isinstance(intent.params.get("tuple"), Mapping) else {}
    assert isinstance(t, Mapping)
    value = intent.params.get("value", t.get("value"))
    conf = intent.params.get("confidence", t.get("confidence"))
    reason = intent.reason or str(t.get("reason", ""))
    return (None if value is None else float(value)), (None if conf is None else float(conf)), reason


# -- taints and conditions (pure) ------------------------------------------------------------------------
def with_taints(existing: list[dict[str, Any]], key: str, value: str, effects: list[str]) -> list[dict[str, Any]]:
    """Our key with exactly these effects, every other taint untouched."""
    keep = [t for t in existing if t.get("key") != key]
    ours = [{"key": key, "value": label_value(value), "effect": e} for e in effects]
    return keep + ours


def without_taints(existing: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [t for t in existing if t.get("key") != key]


def _taint_set(taints: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(str(t.get("key")), str(t.get("value", "")), str(t.get("effect"))) for t in taints}


def condition(node: dict[str, Any], ctype: str, healthy: bool | None, reason: str, message: str,
              now: float) -> dict[str, Any] | None:
    """The condition to write, or None when the node already says exactly this."""
    status = "Unknown" if healthy is None else "True" if healthy else "False"
    reason_cc = "".join(p[:1].upper() + p[1:] for p in _words(reason)) or "Unknown"
    old = next((c for c in node.get("status", {}).get("conditions", []) or [] if c.get("type") == ctype), None)
    if old and old.get("status") == status and old.get("reason") == reason_cc and old.get("message") == message:
        return None
    transition = old["lastTransitionTime"] if old and old.get("status") == status and old.get(
        "lastTransitionTime") else rfc3339(now)
    return {"type": ctype, "status": status, "reason": reason_cc, "message": message[:1024],
            "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": transition}


def _words(s: str) -> list[str]:
    # Condition reasons must be CamelCase identifiers: "gate:xid_79" -> "GateXid79".
    w, cur = [], ""
    for ch in s:
        if ch.isalnum():
            cur += ch
        elif cur:
            w.append(cur)
            cur = ""
    if cur:
        w.append(cur)
    return w


# -- drain planning (pure) ---------------------------------------------------------------------------------
@dataclass
class DrainPlan:
    groups: list[list[tuple[str, str]]] = field(default_factory=list)  # evicted together
    skipped: list[dict[str, str]] = field(default_factory=list)


def is_daemonset_pod(pod: dict[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" and o.get("controller", True)
               for o in pod.get("metadata", {}).get("ownerReferences", []) or [])


def is_mirror_pod(pod: dict[str, Any]) -> bool:
    return "kubernetes.io/config.mirror" in (pod.get("metadata", {}).get("annotations") or {})


def tolerates_quarantine(pod: dict[str, Any], taint_key: str) -> bool:
    """Pods that tolerate our own taint are meant to run on an isolated node: our active tests, the node
    agent, diagnostics. Draining them would undo the quarantine's purpose (and kill the test that decides
    the way out)."""
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if t.get("key") == taint_key or (not t.get("key") and t.get("operator") == "Exists"):
            return True
    return False


def tp_group_of(pod: dict[str, Any], tp_labels: tuple[str, ...]) -> tuple[str, str, str] | None:
    labels = pod.get("metadata", {}).get("labels") or {}
    for lab in tp_labels:
        if labels.get(lab):
            return pod["metadata"].get("namespace", "default"), lab, labels[lab]
    return None


def plan_drain(node_pods: list[dict[str, Any]], cfg: ActuationConfig,
               group_members: Callable[[str, str, str], list[dict[str, Any]]] | None = None) -> DrainPlan:
    """What draining a node means, as kubectl drain sees it, plus tensor-parallel groups.

    Skips DaemonSet pods (their controller would put them straight back) and mirror pods (static, owned
    by the kubelet; the API cannot remove them), pods that tolerate our quarantine taint (active tests,
    the agent), and pods already terminating or finished. Pods of one
    tensor-parallel group are evicted as one unit, with their members on other nodes: a group missing a
    rank cannot make progress and only holds GPUs elsewhere.
    """
    plan = DrainPlan()
    seen: set[tuple[str, str]] = set()
    for pod in sorted(node_pods, key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"])):
        md = pod["metadata"]
        ident = (md.get("namespace", "default"), md["name"])
        if ident in seen:
            continue
        if is_mirror_pod(pod):
            plan.skipped.append({"pod": "/".join(ident), "why": "mirror pod"})
            continue
        if cfg.ignore_daemonsets and is_daemonset_pod(pod):
            plan.skipped.append({"pod": "/".join(ident), "why": "daemonset pod"})
            continue
        if tolerates_quarantine(pod, cfg.taint_key) or (md.get("labels") or {}).get(
                f"{cfg.label_prefix}/active-test") == "true":
            plan.skipped.append({"pod": "/".join(ident), "why": "tolerates the quarantine taint"})
            continue
        if md.get("deletionTimestamp"):
            plan.skipped.append({"pod": "/".join(ident), "why": "already terminating"})
            continue
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            plan.skipped.append({"pod": "/".join(ident), "why": "finished"})
            continue
        grp = tp_group_of(pod, cfg.tp_group_labels)
        members = [ident]
        if grp is not None and group_members is not None:
            others = [(m["metadata"].get("namespace", "default"), m["metadata"]["name"])
                      for m in group_members(*grp) if not m["metadata"].get("deletionTimestamp")]
            members = sorted(set(members) | set(others))
        for m in members:
            seen.add(m)
        plan.groups.append(members)
    return plan


class KubeNodeActuator:
    """Node-tier intents on a Kubernetes cluster. Time and sleep are injected for tests."""

    name = "kubernetes"
    kinds = frozenset({IntentKind.NO_NEW_WORK, IntentKind.ALLOW_NEW_WORK, IntentKind.QUARANTINE,
                       IntentKind.RELEASE, IntentKind.DRAIN, IntentKind.SET_CONDITION,
                       IntentKind.SCHEDULE_RESET, IntentKind.REBUILD_WORKER})

    def __init__(self, kube: Kube, config: ActuationConfig | None = None, *,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 should_stop: Callable[[], bool] | None = None,
                 active_tests: Any = None, event_namespace: str = "default") -> None:
        self.kube = kube
        self.cfg = config or ActuationConfig()
        self.remediator: Any = None  # act.remediation.NodeRemediator: node reboots through Medik8s or a Job
        self.clock = clock
        self.sleep = sleep
        self._should_stop = should_stop
        # An ActiveTests instance: RELEASE needs its word that the node passed.
        self.active_tests = active_tests
        self.event_namespace = event_namespace
        self._drain_started: dict[str, float] = {}
        self.fence: Fence | None = None

    def bind_fence(self, fence: Fence) -> None:
        """The runner's fence: its epoch goes into every node write, and a node a newer leader wrote is
        left alone."""
        self.fence = fence

    def _epoch(self) -> int | None:
        return None if self.fence is None else self.fence.epoch

    def _check_epoch(self, node: str, md: dict[str, Any]) -> dict[str, str]:
        """Raise StaleEpoch when the node carries a newer leader's epoch; else the annotation to write
        with this change ({} when there is no epoch or it is already there)."""
        mine = self._epoch()
        key = f"{self.cfg.label_prefix}/{EPOCH_ANNOTATION}"
        have = (md.get("annotations") or {}).get(key)
        if stale_epoch(have, mine):
            raise StaleEpoch(f"node {node} was written by a newer leader (epoch {have}, this one {mine})")
        return {} if mine is None or have == str(mine) else {key: str(mine)}

    def should_stop(self) -> bool:
        return self._should_stop() if self._should_stop is not None else False

    def bind_stop(self, should_stop: Callable[[], bool]) -> None:
        """The runner hands over its kill switch and leadership (unless one was given explicitly), so a
        drain in progress stops at once when actuation is killed or leadership is lost."""
        if self._should_stop is None:
            self._should_stop = should_stop

    def apply(self, intent: Intent) -> Outcome:
        try:
            return self._apply(intent)
        except KubeError as e:
            return Outcome.from_status(e.status, e.reason, body=e.body[:300])

    # -- dispatch ------------------------------------------------------------------------------------
    def _apply(self, intent: Intent) -> Outcome:
        k = intent.kind
        if k == IntentKind.REBUILD_WORKER or (k == IntentKind.DRAIN and intent.tier == Tier.POD):
            return self._evict_one(intent)
        if intent.tier in (Tier.POD, Tier.INSTANCE):
            # A replica's instance-tier drain/release is a router weight (RouterActuator), not a node action.
            return Outcome.success(skipped=f"{k} at {intent.tier} tier is not a node action")
        node = node_of(intent)
        if k == IntentKind.QUARANTINE:
            changed = self._mark(intent, node, cordon=True, taint=True, healthy=False)
            res = self._drain(intent, node)
            return _merge(res, changed)
        if k == IntentKind.NO_NEW_WORK:
            # No fresh data is not evidence of a fault: the condition says Unknown, not False.
            unknown = intent_state(intent) == "UNKNOWN"
            return Outcome.success(**self._mark(intent, node, cordon=True, taint=True,
                                                healthy=None if unknown else False))
        if k == IntentKind.DRAIN:
            changed = self._mark(intent, node, cordon=True, taint=True, healthy=False)
            return _merge(self._drain(intent, node), changed)
        if k == IntentKind.RELEASE:
            if self.active_tests is not None and not intent.params.get("skip_test_check"):
                verdict = self.active_tests.latest_verdict(node)
                if verdict != "passed":
                    # A round still running may pass: try again later. Failed or none: never uncordon.
                    # (A running round ends: its Jobs carry activeDeadlineSeconds.)
                    return Outcome.failure(f"no passed active test for {node} (latest: {verdict})",
                                           retry=verdict == "running", in_progress=verdict == "running")
            return Outcome.success(**self._mark(intent, node, cordon=False, taint=False, healthy=True))
        if k == IntentKind.ALLOW_NEW_WORK:
            return Outcome.success(**self._mark(intent, node, cordon=False, taint=False, healthy=True))
        if k == IntentKind.SET_CONDITION:
            # params: condition (type, default GPUHealthy), status (True = the condition holds) or healthy.
            value, _, _ = tuple_facts(intent)
            ctype = str(intent.params.get("condition") or self.cfg.condition_type)
            holds: bool | None
            if "status" in intent.params:
                holds = None if intent.params["status"] is None else bool(intent.params["status"])
            elif "healthy" not in intent.params and value is None:
                holds = None  # no fresh data: Unknown
            else:
                healthy = bool(intent.params.get("healthy", value is not None and value >= 0.7))
                holds = healthy if ctype == self.cfg.condition_type else not healthy
            try:
                return Outcome.success(**self._mark(intent, node, cordon=None, taint=None, healthy=holds,
                                                    condition_type=ctype, state_label=False))
            except KubeError as e:
                if e.status == 404:  # a replica's flag, or a host outside this cluster: nothing to mark
                    return Outcome.success(skipped=f"no Kubernetes node {node}")
                raise
        if k == IntentKind.SCHEDULE_RESET:
            action = str(intent.params.get("action", "GPU_RESET"))
            if action == "NODE_REBOOT" and self.remediator is not None:
                if intent.params.get("when") == "next_safe_point":  # a node in service: not under GPU work
                    from fleethealth.act.remediation import gpu_work

                    busy = gpu_work(self.kube, node)
                    if busy:
                        return Outcome.failure(f"waiting for the next safe point: GPU pods {', '.join(busy[:5])}",
                                               retry=True, in_progress=True)
                # a reboot is the cluster's remediator's job (Medik8s resource or a Job): it reports back
                return Outcome.success(**self.remediator.request(node, intent.key, intent.reason))
            gpus = intent.params.get("gpus") or ([intent.params["gpu"]] if intent.params.get("gpu") else [])
            pre = self.cfg.label_prefix
            # the node agent answers the request key once (fleethealth.agent.reset.ResetWatcher)
            return Outcome.success(**self._annotate(node, {
                f"{pre}/reset-requested": action,
                f"{pre}/reset-reason": intent.reason,
                f"{pre}/reset-request-key": intent.key,
                f"{pre}/reset-gpus": ",".join(str(g) for g in gpus),
                f"{pre}/reset-gpu": str(intent.params.get("gpu", intent.entity)),
                # next_safe_point: the agent waits for the node to drain instead of refusing
                f"{pre}/reset-when": str(intent.params.get("when", "now")),
            }))
        return Outcome.failure(f"intent kind {k} is not a Kubernetes node action", retry=False)

    # -- node marking --------------------------------------------------------------------------------
    def _mark(self, intent: Intent, node: str, *, cordon: bool | None, taint: bool | None,
              healthy: bool | None, condition_type: str | None = None, state_label: bool = True) -> dict[str, Any]:
        """Cordon/taint/label the node and set the condition; write only what differs. Returns changes."""
        cfg = self.cfg
        state = intent_state(intent)
        value, conf, reason = tuple_facts(intent)
        changed: dict[str, Any] = {"node": node, "spec": False, "condition": False}
        for _ in range(3):
            obj = self.kube.get_node(node)
            md, spec = obj.get("metadata", {}), obj.get("spec", {})
            labels = md.get("labels") or {}
            annotations = md.get("annotations") or {}
            taints = list(spec.get("taints") or [])
            want_labels = {f"{cfg.label_prefix}/score-band": score_band(value)}
            if state_label:
                want_labels[f"{cfg.label_prefix}/state"] = label_value(state)
            patch_md: dict[str, Any] = {}
            if any(labels.get(k2) != v for k2, v in want_labels.items()):
                patch_md["labels"] = want_labels
            patch_spec: dict[str, Any] = {}
            cordoned_by_us = annotations.get(f"{cfg.label_prefix}/cordoned") == "true"
            if cordon is True and not spec.get("unschedulable"):
                patch_spec["unschedulable"] = True
                patch_md.setdefault("annotations", {})[f"{cfg.label_prefix}/cordoned"] = "true"
            elif cordon is False and spec.get("unschedulable") and cordoned_by_us:
                # Only lift a cordon we set: an operator's own cordon is theirs to lift.
                patch_spec["unschedulable"] = False
            if cordon is False and cordoned_by_us:
                patch_md.setdefault("annotations", {})[f"{cfg.label_prefix}/cordoned"] = None
            if taint is True:
                effects = ["NoSchedule"] + (["NoExecute"] if cfg.noexecute else [])
                new = with_taints(taints, cfg.taint_key, state, effects)
                if _taint_set(new) != _taint_set(taints):
                    patch_spec["taints"] = new
            elif taint is False:
                new = without_taints(taints, cfg.taint_key)
                if len(new) != len(taints):
                    patch_spec["taints"] = new
            epoch_ann = self._check_epoch(node, md)
            if not patch_md and not patch_spec:
                break
            if epoch_ann:
                patch_md.setdefault("annotations", {}).update(epoch_ann)
            body: dict[str, Any] = {"metadata": {**patch_md, "resourceVersion": md.get("resourceVersion")}}
            if patch_spec:
                body["spec"] = patch_spec
            try:
                # A merge patch replaces the taint list whole (we computed it from this resourceVersion).
                self.kube.patch_node(node, body, content_type="application/merge-patch+json")
            except KubeError as e:
                if e.status == 409:
                    continue  # someone else wrote the node: recompute from the fresh object
                raise
            changed["spec"] = sorted(list(patch_spec) + [f"metadata.{x}" for x in patch_md])
            break
        else:
            raise KubeError(409, "Conflict", f"node {node} kept changing under us")
        msg = f"state={state} score={'unknown' if value is None else f'{value:.3f}'}"
        if conf is not None:
            msg += f" confidence={conf:.2f}"
        msg += f" reason={reason or intent.reason} intent={intent.key}"
        for _ in range(3):
            obj = self.kube.get_node(node)
            cond = condition(obj, condition_type or cfg.condition_type, healthy, reason or str(intent.kind), msg,
                             self.clock())
            if cond is None:
                break
            md = obj.get("metadata", {})
            self._check_epoch(node, md)
            try:
                # conditional on the version just read: a newer leader's write in between is a 409
                self.kube.patch_node_status(node, {"metadata": {"resourceVersion": md.get("resourceVersion")},
                                                   "status": {"conditions": [cond]}})
            except KubeError as e:
                if e.status == 409:
                    continue  # the kubelet's status update, or another writer: recompute
                raise
            changed["condition"] = True
            break
        else:
            raise KubeError(409, "Conflict", f"node {node} status kept changing under us")
        if changed["spec"] or changed["condition"]:
            self._event(obj, intent, msg)
        return changed

    def _annotate(self, node: str, ann: dict[str, str]) -> dict[str, Any]:
        for _ in range(3):
            obj = self.kube.get_node(node)
            md = obj.get("metadata", {})
            have = md.get("annotations") or {}
            diff = {k: v for k, v in ann.items() if have.get(k) != v}
            epoch_ann = self._check_epoch(node, md)
            if not diff:
                break
            try:
                self.kube.patch_node(node, {"metadata": {"annotations": {**diff, **epoch_ann},
                                                         "resourceVersion": md.get("resourceVersion")}})
            except KubeError as e:
                if e.status == 409:
                    continue  # written meanwhile: recompute from the fresh object
                raise
            break
        else:
            raise KubeError(409, "Conflict", f"node {node} kept changing under us")
        return {"node": node, "annotations": sorted(diff)}

    def _event(self, node_obj: dict[str, Any], intent: Intent, message: str, reason: str | None = None) -> None:
        md = node_obj.get("metadata", {})
        now = rfc3339(self.clock())
        ev = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{md.get('name', 'node')}.fleethealth.", "namespace": self.event_namespace},
            "involvedObject": {"kind": "Node", "name": md.get("name"), "uid": md.get("uid"), "apiVersion": "v1"},
            "reason": reason or "FleetHealth" + "".join(w.capitalize() for w in str(intent.kind).split("_")),
            "message": message[:1024], "type": "Warning" if intent.kind != IntentKind.RELEASE else "Normal",
            "source": {"component": MANAGER}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        # Events are best effort; the ledger is the record.
        with contextlib.suppress(KubeError):
            self.kube.create_event(self.event_namespace, ev)

    # -- drain ---------------------------------------------------------------------------------------
    def _drain(self, intent: Intent, node: str) -> Outcome:
        cfg = self.cfg
        timeout = float(intent.params.get("drain_timeout_s", cfg.drain_timeout_s))
        pods = self.kube.list_pods(field_selector=f"spec.nodeName={node}")

        def members(ns: str, label: str, value: str) -> list[dict[str, Any]]:
            return self.kube.list_pods(namespace=ns, label_selector=f"{label}={value}")

        plan = plan_drain(pods, cfg, members)
        evicted: list[str] = []
        errors: dict[str, str] = {}
        pending = [list(g) for g in plan.groups]
        # The drain limit runs from the first attempt at this intent; one apply blocks at most drain_block_s
        # so the controller's cycle is never held for the whole limit: the runner calls again (in_progress).
        started = self._drain_started.setdefault(intent.key, self.clock())
        deadline = started + timeout
        block_until = min(deadline, self.clock() + cfg.drain_block_s)
        delay = min(1.0, cfg.backoff_initial_s) or 0.1
        blocked: dict[str, str] = {}
        while pending:
            still: list[list[tuple[str, str]]] = []
            for group in pending:
                left = []
                if len(group) > 1 and not self._group_evictable(group, blocked):
                    # A tensor-parallel group goes whole or not at all: evicting some ranks while a budget
                    # holds the others would only stop the job and keep its GPUs busy.
                    still.append(group)
                    continue
                for ns, name in group:
                    try:
                        self.kube.evict_pod(ns, name)
                        evicted.append(f"{ns}/{name}")
                    except KubeError as e:
                        if e.status == 404:
                            evicted.append(f"{ns}/{name}")  # already gone
                        elif e.status == 429 or is_retryable_status(e.status):
                            blocked[f"{ns}/{name}"] = f"{e.status} {e.reason}"
                            left.append((ns, name))
                        else:
                            errors[f"{ns}/{name}"] = f"{e.status} {e.reason}"
                if left:
                    still.append(left)
            pending = still
            if not pending or self.should_stop():
                break
            remaining = block_until - self.clock()
            if remaining <= 0:
                break
            self.sleep(min(delay, remaining))
            delay = min(delay * 2, 5.0)
        left_pods = [f"{ns}/{n}" for g in pending for ns, n in g]
        forced: list[str] = []
        expired = self.clock() >= deadline
        if left_pods and expired and cfg.force_delete_after_timeout and not self.should_stop():
            for p in left_pods:
                ns, n = p.split("/", 1)
                try:
                    self.kube.delete_pod(ns, n)
                    forced.append(p)
                except KubeError as e:
                    errors[p] = f"{e.status} {e.reason}"
            left_pods = [p for p in left_pods if p not in forced]
        detail = {"node": node, "evicted": sorted(set(evicted)), "skipped": plan.skipped,
                  "groups": [[f"{ns}/{n}" for ns, n in g] for g in plan.groups if len(g) > 1],
                  "not_evicted": left_pods, "blocked": {p: blocked[p] for p in left_pods if p in blocked},
                  "forced": forced, "errors": errors}
        if left_pods and not expired and not self.should_stop():
            return Outcome.failure(f"drain in progress: {len(left_pods)} pod(s) held (PodDisruptionBudget or API "
                                   f"refusal), limit in {deadline - self.clock():.0f}s", retry=True,
                                   in_progress=True, **detail)
        if left_pods:
            # Reported, never lost: the pods a budget still protects at the limit need a human.
            self._drain_started.pop(intent.key, None)
            with contextlib.suppress(KubeError):
                self._event(self.kube.get_node(node), intent, f"drain limit reached; still on the node: "
                            f"{', '.join(left_pods[:20])} ({'; '.join(sorted(set(blocked.values())))[:300]})",
                            reason="FleetHealthDrainBlocked")
            why = "stopped by the kill switch or lost leadership" if not expired else f"not evicted within {timeout:.0f}s"
            return Outcome.failure(f"drain incomplete: {len(left_pods)} pod(s) {why} "
                                   "(PodDisruptionBudget or API refusal)", retry=not expired, **detail)
        self._drain_started.pop(intent.key, None)
        if errors:
            return Outcome.failure(f"drain errors on {len(errors)} pod(s)", retry=False, **detail)
        return Outcome.success(**detail)

    def _group_evictable(self, group: list[tuple[str, str]], blocked: dict[str, str]) -> bool:
        """Dry-run every member's eviction; records the members a budget holds."""
        ok = True
        for ns, name in group:
            try:
                self.kube.evict_pod(ns, name, dry_run=True)
            except KubeError as e:
                if e.status == 404:
                    continue
                if e.status == 429 or is_retryable_status(e.status):
                    blocked[f"{ns}/{name}"] = f"{e.status} {e.reason} (group held)"
                    ok = False
                else:
                    raise
        if not ok:
            for ns, name in group:
                blocked.setdefault(f"{ns}/{name}", "group held by a member's disruption budget")
        return ok

    def _evict_one(self, intent: Intent) -> Outcome:
        pod = str(intent.params.get("pod", intent.entity))
        found = self.kube.find_pod(pod, intent.params.get("namespace"))
        if found is None:
            return Outcome.success(evicted=[], skipped=f"no pod {pod}")
        ns = found["metadata"].get("namespace", "default")
        try:
            self.kube.evict_pod(ns, pod)
        except KubeError as e:
            if e.status != 404:
                return Outcome.from_status(e.status, e.reason, pod=f"{ns}/{pod}")
        return Outcome.success(evicted=[f"{ns}/{pod}"])


def _merge(res: Outcome, changed: dict[str, Any]) -> Outcome:
    return Outcome(ok=res.ok, retry=res.retry, error=res.error, detail={**changed, **res.detail})
