"""`fleethealth sidecar`: the serving sidecar in front of an OpenAI-compatible engine in the same pod."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from fleethealth.cli.common import fail, load_policy_or_fail


def _host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        fail(f"--listen must be HOST:PORT with a port from 0 to 65535, got {listen!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def _token(path: Path | None) -> str | None:
    if path is not None:
        try:
            tok = path.read_text().strip()
        except OSError as e:
            fail(f"cannot read --admin-token-file {path}: {e.strerror or e}")
        if not tok:
            fail(f"--admin-token-file {path} is empty")
        return tok
    return os.environ.get("FLEETHEALTH_ADMIN_TOKEN") or None


def register(app: typer.Typer) -> None:
    @app.command("sidecar")
    def sidecar(
        upstream: str = typer.Option(..., help="The engine's base URL, e.g. http://127.0.0.1:8000"),
        listen: str = typer.Option("0.0.0.0:8080", help="HOST:PORT for the proxy, probes and admin"),
        admin_token_file: Path | None = typer.Option(
            None, help="File holding the admin bearer token (else env FLEETHEALTH_ADMIN_TOKEN; none: admin refuses)"),
        admin_allow_remote: bool = typer.Option(
            False, help="Let non-loopback clients call /admin/* (they still need the token)"),
        admin_tokens_file: Path | None = typer.Option(
            None, help="Token file for /admin/*: tokens: [{user, token|token_sha256, verbs: [drain, undrain, get]}]"),
        admin_kubernetes_auth: bool = typer.Option(
            False, help="Check /admin/* bearer tokens with TokenReview and the cluster's RBAC (SubjectAccessReview: "
                        "verbs drain/undrain/get on fleethealth.io replicas/<replica>)"),
        admin_read: str = typer.Option("loopback", help="Who may read /admin/state: loopback, open or authenticated"),
        audit_log: Path | None = typer.Option(
            None, help="Append-only JSON Lines audit log of admin actions (rotated at --audit-max-bytes)"),
        audit_max_bytes: int = typer.Option(10 << 20, min=1024, help="Rotate the audit log at this size"),
        audit_keep: int = typer.Option(3, min=1, help="Rotated audit log files kept"),
        kube_events: bool = typer.Option(
            True, help="Audit admin actions as Kubernetes Events on this pod (in a cluster)"),
        max_drain_seconds: float = typer.Option(30.0, min=0.0, help="After this, streams still running are ended"),
        policy: Path | None = typer.Option(None, help="Policy file (default: the shipped policy)"),
        replica: str | None = typer.Option(None, help="Replica name (default: $POD_NAME or the hostname)"),
        max_concurrency: int = typer.Option(256, min=1, help="Requests forwarded to the engine at once"),
        queue_limit: int = typer.Option(512, min=0, help="Requests waiting in the proxy before 503"),
        ready_queue_limit: int = typer.Option(64, min=1, help="/readyz fails at this many queued"),
        liveness_timeout: float = typer.Option(30.0, min=0.1, help="Running work without a token this long fails /livez"),
        gpu_metrics_url: str | None = typer.Option(None, help="The node's exporter /metrics (dcgm-exporter)"),
        gpu_node: str | None = typer.Option(None, help="This node's name in the exporter (default: $NODE_NAME)"),
        nvml: bool | None = typer.Option(
            None, "--nvml/--no-nvml",
            help="Read the local GPUs through NVML (default: when the library loads and no --gpu-metrics-url)"),
        engine_log: Path | None = typer.Option(None, help="Engine log file to tail for CUDA errors and Xids"),
        evidence_dir: Path | None = typer.Option(None, help="Directory for evidence bundles written on drain"),
        no_redact_prompts: bool = typer.Option(False, help="Keep prompts in evidence request samples"),
        max_batch_tokens: int | None = typer.Option(None, help="The engine's batch token budget (OOM classes)"),
        kv_capacity_tokens: int | None = typer.Option(None, help="Tokens the engine's KV cache holds (OOM classes)"),
        clip_oversized: bool = typer.Option(False, help="Clip max_tokens of oversized requests instead of 400"),
        degraded_max_tokens: int | None = typer.Option(
            None, help="While DEGRADED, refuse new requests with max_tokens above this (503, retry elsewhere)"),
        docs: bool = typer.Option(False, "--docs", help="Serve /docs, /redoc and /openapi.json (off by default)"),
        max_body_bytes: int = typer.Option(16 << 20, min=1024, help="Larger request bodies are refused (413)"),
        log_level: str = typer.Option("info", help="uvicorn log level"),
    ) -> None:
        """Proxy the OpenAI-compatible API and tell Kubernetes the truth: /livez (engine making progress),
        /readyz (may take requests), /gpuz (GPU trusted), /metrics, /admin/{drain,undrain,state}."""
        from fleethealth.serve.config import SidecarConfig, default_replica_name
        from fleethealth.serve.server import run_sidecar

        host, port = _host_port(listen)
        pol = load_policy_or_fail(policy)
        if not upstream.startswith(("http://", "https://")):
            fail(f"--upstream must be an http(s) URL, got {upstream!r}")
        if admin_read not in ("loopback", "open", "authenticated"):
            fail(f"--admin-read must be loopback, open or authenticated, got {admin_read!r}")
        cfg = SidecarConfig(
            upstream=upstream, replica=replica or default_replica_name(), admin_token=_token(admin_token_file),
            admin_loopback_only=not admin_allow_remote, admin_tokens_file=admin_tokens_file,
            admin_kubernetes_auth=admin_kubernetes_auth, admin_read=admin_read,  # type: ignore[arg-type]
            audit_log=audit_log, audit_max_bytes=audit_max_bytes, audit_keep=audit_keep, audit_events=kube_events,
            max_drain_seconds=max_drain_seconds,
            max_concurrency=max_concurrency, queue_limit=queue_limit, ready_queue_limit=ready_queue_limit,
            liveness_timeout_s=liveness_timeout, gpu_metrics_url=gpu_metrics_url,
            gpu_node=gpu_node or os.environ.get("NODE_NAME"), use_nvml=nvml, engine_log=engine_log,
            evidence_dir=evidence_dir, redact_prompts=not no_redact_prompts, max_batch_tokens=max_batch_tokens,
            kv_capacity_tokens=kv_capacity_tokens, oom_clip_max_tokens=clip_oversized,
            degraded_max_tokens=degraded_max_tokens, docs=docs, max_body_bytes=max_body_bytes,
            gpu_fail_below=pol.lifecycle.quarantine_below, policy=pol,
        )
        from fleethealth.auth.access import TokenFileError
        from fleethealth.auth.audit_log import AuditLogError
        from fleethealth.serve.admin_security import build_admin_security

        try:
            build_admin_security(cfg)  # the same checks create_app makes, as one line before anything starts
        except (TokenFileError, AuditLogError, ValueError) as e:
            fail(str(e))
        if cfg.admin_token is None and cfg.admin_tokens_file is None and not cfg.admin_kubernetes_auth:
            typer.echo("warning: no admin credential (--admin-token-file, FLEETHEALTH_ADMIN_TOKEN, --admin-tokens-file "
                       "or --admin-kubernetes-auth): /admin/drain and /admin/undrain will refuse every call", err=True)
        run_sidecar(cfg, host, port, log_level)
