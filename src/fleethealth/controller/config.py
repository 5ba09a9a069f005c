"""The controller's config file (`fleethealth run --config FILE`), validated like the policy: unknown keys
are errors, and every error names the key and its line in the file.

```yaml
interval_s: 15                 # one cycle every interval; an overrun is reported, never stacked
policy: my-policy.yaml         # default: the shipped policy
state_db: /var/lib/fleethealth/state.db   # SQLite, one replica; postgresql://user@host/db for two or more
listen: 127.0.0.1:9108         # /metrics, /healthz, /api/v1/...; null disables the endpoint
sources:
  prometheus: {url: http://prometheus:9090, timeout_s: 10}
  scrape:
    timeout_s: 5
    concurrency: 64
    targets:
      - http://node-1:9400/metrics
      - {url: http://vllm-0:8000/metrics, labels: {replica: vllm-0}}
  kernel_logs:
    - {path: /var/log/kern.log, node: node-1}
  files: [/run/fleethealth/extra.prom]
  gpu_capacity: {node-1: 8}     # expected GPUs per node (Kubernetes nvidia.com/gpu capacity)
actuation:                      # fleethealth.act.config.ActuationConfig
  mode: advise                  # advise (default) | enforce
  enforce: [set_weight, no_new_work]
  kill_switch: false
kubernetes: {}                  # optional: node actions, drains, active tests, inventory, leader election
                                # (lease_duration_s: 15: a standby takes over within it plus one cycle)
alertmanager: {url: http://alertmanager:9093}   # optional: pages
evidence: {dir: /var/lib/fleethealth/evidence}  # optional: bundles before drain/quarantine
shards:                         # optional: several replicas, one Kubernetes Lease per shard
  shards:
    - {name: a, pools: [pool-1, pool-2]}
    - {name: b, matcher: 'pool=~"gpu-.*"'}
    - {name: rest, rest: true}
api:                            # who may use the API (verbs: fleethealth.auth.access)
  token_file: /etc/fleethealth/tokens.yaml   # without Kubernetes; with it, TokenReview + RBAC
  read: loopback                # loopback (default) | open | authenticated: GET /api/v1/*
  metrics: open                 # open | authenticated
  docs: false                   # /docs, /redoc, /openapi.json
  max_body_bytes: 1048576       # larger request bodies: 413
```
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleethealth.act.config import ActuationConfig
from fleethealth.policy import validate_yaml


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return v


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrometheusConfig(_Strict):
    url: str
    timeout_s: float = Field(default=10.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    matchers: str = ""  # extra label matchers for every selector, e.g. 'cluster="a"'
    gauge_mode: Literal["raw", "instant"] = "raw"
    extra_metrics: list[str] = Field(default_factory=list)

    @field_validator("extra_metrics")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", m)]
        if bad:
            raise ValueError(f"not valid metric names: {', '.join(bad)}")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)


class ScrapeTargetConfig(_Strict):
    url: str
    labels: dict[str, str] = Field(default_factory=dict)
    job: str = "fleethealth"
    honor_labels: bool | None = None  # None: the scrape section's honor_labels

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)


class ScrapeConfig(_Strict):
    targets: list[ScrapeTargetConfig] = Field(default_factory=list)
    # Prometheus HTTP service discovery URLs (http_sd_configs' format: [{targets, labels}]), e.g.
    # `fleethealth sim serve`'s /sd; `fleethealth run` resolves them into targets when it starts.
    sd: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=5.0, gt=0)
    concurrency: int = Field(default=64, ge=1)
    # A page's own job/instance/labels win over the target's (Prometheus' honor_labels: true): a per-rank
    # exporter's `job` is the training job, which the rank signal's peers and the rank entities key on.
    honor_labels: bool = True

    @field_validator("sd")
    @classmethod
    def _sd_urls(cls, v: list[str]) -> list[str]:
        return [_http_url(x) for x in v]

    @model_validator(mode="after")
    def _some_target(self) -> ScrapeConfig:
        if not self.targets and not self.sd:
            raise ValueError("give 'targets' or 'sd' (a service discovery URL)")
        return self

    @field_validator("targets", mode="before")
    @classmethod
    def _plain_urls(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"url": x} if isinstance(x, str) else x for x in v]
        return v


class KernelLogConfig(_Strict):
    path: str | None = None
    command: list[str] | None = None  # e.g. [journalctl, -k, -f, -o, short-iso]
    node: str | None = None  # for lines that carry no host name

    @model_validator(mode="after")
    def _one(self) -> KernelLogConfig:
        if (self.path is None) == (self.command is None):
            raise ValueError("give exactly one of 'path' or 'command'")
        return self


class SourcesConfig(_Strict):
    prometheus: PrometheusConfig | None = None
    scrape: ScrapeConfig | None = None
    kernel_logs: list[KernelLogConfig] = Field(default_factory=list)
    files: list[str] = Field(default_factory=list)  # exposition or table files, re-read every cycle
    gpu_capacity: dict[str, int] = Field(default_factory=dict)


class NodeRemediationConfig(_Strict):
    """How a node reboot (a repair ladder's reboot_node step) is carried out: a Medik8s remediation resource
    named after the node (SelfNodeRemediation by default; FenceAgentsRemediation or Metal3Remediation by
    their kind and plural), or a Job from a template ("{node}" is replaced by the node's name)."""

    via: Literal["medik8s", "job"] = "medik8s"
    api_version: str = "self-node-remediation.medik8s.io/v1alpha1"
    kind: str = "SelfNodeRemediation"
    plural: str = "selfnoderemediations"
    namespace: str = "medik8s"
    spec: dict[str, Any] = Field(default_factory=lambda: {"remediationStrategy": "Automatic"})
    job_template: dict[str, Any] | None = None


class KubernetesConfig(_Strict):
    """Kubernetes actuation and inventory (node GPU capacity, pods, jobs); in-cluster config when running
    in a pod, else the kubeconfig file."""

    kubeconfig: str | None = None
    context: str | None = None
    host: str | None = None  # direct API URL (tests, proxies); with `token`
    token: str | None = None
    verify_ssl: bool = True
    inventory_every_s: float = Field(default=60.0, gt=0)
    leader_election: bool = True
    lease_name: str = "fleethealth-controller"
    lease_namespace: str = "fleethealth-system"
    # A standby takes over at most this long (plus one interval) after the leader last renewed.
    lease_duration_s: float = Field(default=15.0, ge=1)
    identity: str | None = None  # default: hostname and pid
    # node reboots through the cluster's remediator (None: a reboot is only requested as a Node annotation)
    node_remediation: NodeRemediationConfig | None = Field(default_factory=NodeRemediationConfig)


class ShardConfig(_Strict):
    """One shard (controller.shards): exactly one of ``pools``, ``matcher`` or ``rest``."""

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")  # in Lease and schema names
    pools: list[str] = Field(default_factory=list)
    matcher: str = ""  # one PromQL label matcher, e.g. 'pool=~"gpu-.*"'
    rest: bool = False  # every pool no other shard names (and series without the label)

    @model_validator(mode="after")
    def _one(self) -> ShardConfig:
        from fleethealth.controller.shards import valid_matcher

        if sum((bool(self.pools), bool(self.matcher), self.rest)) != 1:
            raise ValueError("give exactly one of 'pools', 'matcher' or 'rest: true'")
        if self.matcher and not valid_matcher(self.matcher):
            raise ValueError(f'matcher {self.matcher!r} is not one PromQL label matcher (e.g. pool=~"a|b")')
        return self


class ShardsConfig(_Strict):
    """Several replicas share the fleet: one Kubernetes Lease per shard (README: Shards)."""

    shards: list[ShardConfig] = Field(min_length=1)
    label: str = Field(default="pool", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # the label pools are named by
    lease_prefix: str = Field(default="fleethealth", pattern=r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$")
    # a shard's published confidence counts as all low after this long unchanged (default: the lease
    # duration plus three intervals, longer than a take-over, so a take-over alone does not freeze)
    stale_after_s: float | None = Field(default=None, gt=0)
    # a shard free this long is taken by any replica, fair share or not (default: two retry periods)
    grace_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _disjoint(self) -> ShardsConfig:
        names = [s.name for s in self.shards]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"shard names must be unique: {', '.join(dup)}")
        seen: dict[str, str] = {}
        for s in self.shards:
            for p in s.pools:
                if p in seen and seen[p] != s.name:
                    raise ValueError(f"pool {p!r} is in two shards ({seen[p]}, {s.name}): it would be decided twice")
                seen[p] = s.name
        if sum(s.rest for s in self.shards) > 1:
            raise ValueError("at most one shard may be the rest")
        from fleethealth.controller.shards import matches

        for m in (s for s in self.shards if s.matcher):
            both = sorted(p for p, owner in seen.items() if matches(m.matcher, {self.label: p}))
            if both:
                raise ValueError(f"pool {both[0]!r} is in shard {seen[both[0]]} and matched by shard {m.name}'s "
                                 "matcher: it would be decided twice")
        return self


class AlertmanagerConfig(_Strict):
    url: str

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)


class EvidenceConfig(_Strict):
    dir: str
    window_s: float = Field(default=1800.0, gt=0)


class ApiConfig(_Strict):
    """Who may use the HTTP API (fleethealth.auth.access documents the verbs) and its limits."""

    token_file: str | None = None  # static tokens (user, verbs) for setups without Kubernetes
    kubernetes_auth: bool = True  # with a `kubernetes` section: TokenReview + SubjectAccessReview
    audiences: list[str] = Field(default_factory=list)  # TokenReview audiences (default: the apiserver's)
    read: Literal["loopback", "open", "authenticated"] = "loopback"  # GET /api/v1/*: who needs a token
    metrics: Literal["open", "authenticated"] = "open"  # /metrics (Prometheus); /healthz is always open
    docs: bool = False  # /docs, /redoc, /openapi.json
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    audit_events: bool = True  # each operator action also as a Kubernetes Event (with `kubernetes`)


class ControllerConfig(_Strict):
    interval_s: float = Field(default=15.0, gt=0)
    policy: str | None = None
    state_db: str | None = "fleethealth-state.db"
    listen: str | None = "127.0.0.1:9108"
    history_s: float = Field(default=3600.0, gt=0)  # how long a vanished entity stays visible (as stale)
    sources: SourcesConfig
    actuation: ActuationConfig = Field(default_factory=ActuationConfig)
    kubernetes: KubernetesConfig | None = None
    alertmanager: AlertmanagerConfig | None = None
    evidence: EvidenceConfig | None = None
    api: ApiConfig = Field(default_factory=ApiConfig)
    shards: ShardsConfig | None = None  # several replicas, one Lease per shard (controller.sharded)

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str | None) -> str | None:
        if v is None:
            return v
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:9108")
        return v

    @model_validator(mode="after")
    def _some_source(self) -> ControllerConfig:
        s = self.sources
        if not (s.prometheus or s.scrape or s.kernel_logs or s.files):
            raise ValueError("sources: configure at least one of prometheus, scrape, kernel_logs, files")
        if self.shards is not None and (self.kubernetes is None or s.prometheus is None):
            raise ValueError("shards: need a 'kubernetes' section (one Lease per shard) and sources.prometheus "
                             "(each shard reads its pools by label matchers)")
        return self

    @property
    def listen_host_port(self) -> tuple[str, int] | None:
        if self.listen is None:
            return None
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class ConfigError(Exception):
    """A config that cannot be used; the message names the key and the line."""


def parse_config(text: str, source: str = "<config>", base_dir: Path | None = None) -> ControllerConfig:
    cfg = validate_yaml(text, source, ControllerConfig, ConfigError, what="controller config",
                        hint="a controller config is a YAML mapping with at least a 'sources' section")
    if base_dir is not None:
        cfg = _resolve_paths(cfg, base_dir)
    return cfg


def _resolve_paths(cfg: ControllerConfig, base: Path) -> ControllerConfig:
    """Relative paths in a config file are relative to the file, not to wherever the controller starts."""

    def rel(p: str | None) -> str | None:
        if p is None or Path(p).is_absolute() or "://" in p or p == ":memory:":
            return p
        return str((base / p).resolve())

    srcs = cfg.sources.model_copy(update={
        "files": [rel(f) or f for f in cfg.sources.files],
        "kernel_logs": [k.model_copy(update={"path": rel(k.path)}) for k in cfg.sources.kernel_logs],
    })
    upd: dict[str, Any] = {"policy": rel(cfg.policy), "state_db": rel(cfg.state_db), "sources": srcs}
    if cfg.evidence is not None:
        upd["evidence"] = cfg.evidence.model_copy(update={"dir": rel(cfg.evidence.dir)})
    if cfg.api.token_file is not None:
        upd["api"] = cfg.api.model_copy(update={"token_file": rel(cfg.api.token_file)})
    if cfg.kubernetes is not None and cfg.kubernetes.kubeconfig is not None:
        upd["kubernetes"] = cfg.kubernetes.model_copy(update={"kubeconfig": rel(cfg.kubernetes.kubeconfig)})
    return cfg.model_copy(update=upd)


def load_config(path: str | Path) -> ControllerConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config: {e.strerror or e}") from None
    return parse_config(text, str(p), base_dir=p.parent)
