"""`fleethealth run --config FILE`: the live controller (reconcile loop + HTTP endpoint)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import typer

from fleethealth.cli.common import fail

SD_WAIT_S = 30.0


def sd_targets(groups: Any, url: str) -> list[dict[str, Any]]:
    """Prometheus http_sd target groups (``[{"targets": ["host:port"], "labels": {...}}]``) as scrape
    targets: ``__scheme__`` and ``__metrics_path__`` make the URL, the other ``__`` labels are dropped,
    the rest are added to every sample (``instance`` included, as Prometheus does)."""
    if not isinstance(groups, list):
        raise ValueError(f"{url}: not a service discovery answer (expected a JSON list of target groups)")
    out: list[dict[str, Any]] = []
    for g in groups:
        if not isinstance(g, dict) or not isinstance(g.get("targets"), list):
            raise ValueError(f"{url}: a target group without 'targets'")
        labels = {str(k): str(v) for k, v in (g.get("labels") or {}).items()}
        scheme = labels.get("__scheme__", "http")
        path = labels.get("__metrics_path__", "/metrics")
        extra = {k: v for k, v in labels.items() if not k.startswith("__")}
        out += [{"url": f"{scheme}://{t}{path}", "labels": extra} for t in g["targets"]]
    return out


def resolve_sd(cfg: Any, wait_s: float = SD_WAIT_S) -> Any:
    """The config with ``sources.scrape.sd`` resolved into targets (once, at start; a source that is still
    starting, such as `fleethealth sim serve`, is waited for up to ``wait_s``). Raises ValueError, one line."""
    import time

    import httpx

    scrape = cfg.sources.scrape
    if scrape is None or not scrape.sd:
        return cfg
    found: list[dict[str, Any]] = []
    for url in scrape.sd:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                r = httpx.get(url, timeout=5.0)
                r.raise_for_status()
                break
            except httpx.HTTPError as e:  # not up yet, or answering errors: wait a little
                if time.monotonic() > deadline:
                    raise ValueError(f"sources.scrape.sd: cannot read {url}: {e}") from None
                time.sleep(1.0)
        try:
            body = r.json()
        except ValueError:
            raise ValueError(f"sources.scrape.sd: {url} did not answer JSON (is it an http_sd endpoint?)") from None
        found += sd_targets(body, url)
    logging.getLogger("fleethealth.controller").info("service discovery: %d targets from %s", len(found),
                                                     ", ".join(scrape.sd))
    data = cfg.model_dump()
    data["sources"]["scrape"]["targets"] += found
    return type(cfg).model_validate(data)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        config: Path = typer.Option(..., "--config", "-c", help="Controller config YAML (documented in examples/controller.yaml)."),
        once: bool = typer.Option(False, "--once", help="Run one cycle, print its report as JSON, exit."),
        cycles: int = typer.Option(0, "--cycles", help="Stop after N cycles (0: run until stopped)."),
        listen: str | None = typer.Option(None, "--listen", help="Override the config's HOST:PORT."),
        kernel_log: list[Path] = typer.Option([], "--kernel-log", help="Also follow this kernel log (repeatable)."),
        node: str | None = typer.Option(None, "--node", help="Node name for kernel-log lines without a host."),
        log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
    ) -> None:
        """Every interval: read the sources, score, decide, persist and emit intents (advise mode unless
        the config enables enforcement per intent kind). Serves /metrics, /healthz and /api/v1/*."""
        from fleethealth.controller.api import ApiServer
        from fleethealth.controller.build import build
        from fleethealth.controller.config import ConfigError, load_config
        from fleethealth.policy import PolicyError

        logging.basicConfig(
            level=getattr(logging, log_level.upper(), logging.INFO), stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        # one line per HTTP request (every query, every scrape) would drown the decisions in the log
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        from fleethealth.auth.redact import install_log_redaction

        install_log_redaction()  # credentials in a configured URL never reach the log
        try:
            cfg = load_config(config)
            if listen is not None or kernel_log:
                data = cfg.model_dump()
                if listen is not None:
                    data["listen"] = listen
                data["sources"]["kernel_logs"] += [{"path": str(p.resolve()), "node": node} for p in kernel_log]
                cfg = type(cfg).model_validate(data)  # overrides are validated like the file
        except ConfigError as e:
            fail(str(e))
        except Exception as e:  # a bad override
            fail(f"invalid option: {e}")
        try:
            # FLEETHEALTH_SD_WAIT_S: how long to wait for service discovery to answer at start (default 30)
            cfg = resolve_sd(cfg, float(os.environ.get("FLEETHEALTH_SD_WAIT_S") or SD_WAIT_S))
        except ValueError as e:
            fail(str(e).splitlines()[0])
        if cfg.shards is not None:  # several replicas, one Lease per shard: controller.sharded
            _run_sharded(cfg, once or cycles > 0)
            return
        try:
            asm = build(cfg)
        except PolicyError as e:
            fail(str(e))
        except Exception as e:  # store or Kubernetes connection problems: one line, exit 2
            fail(f"cannot start the controller: {type(e).__name__}: {e}")
        ctl = asm.controller
        server = None
        hp = cfg.listen_host_port
        if hp is not None and not once:
            from fleethealth.auth.access import TokenFileError
            from fleethealth.controller.security import build_security

            try:
                sec = build_security(cfg, asm.store)
                asm.closers.append(sec.close)
                server = ApiServer(ctl, hp[0], hp[1], runner=asm.runner, guard=sec.guard, auditor=sec.auditor,
                                   api=cfg.api).start()
            except (RuntimeError, TokenFileError) as e:
                asm.close()
                fail(str(e))
            except Exception as e:  # the audit store or the Kubernetes client: one line
                asm.close()
                fail(f"cannot start the API: {type(e).__name__}: {e}")
            if not sec.guard.configured:
                logging.getLogger("fleethealth.controller").warning(
                    "no API authentication configured (api.token_file or kubernetes): every POST is refused")
            logging.getLogger("fleethealth.controller").info("serving on %s", server.url)

        def stop(signum: int, frame: Any) -> None:
            ctl.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        mode = cfg.actuation.mode
        enforced = ", ".join(sorted(str(k) for k in cfg.actuation.enforce)) or "nothing"
        logging.getLogger("fleethealth.controller").info(
            "fleethealth controller: every %gs, %d source(s), mode %s (enforcing %s), policy %s",
            cfg.interval_s, len(ctl.sources), mode, enforced if mode == "enforce" else "nothing",
            asm.policy.version_tag,
        )
        try:
            if once:
                ctl.warm_up = False  # one cycle asked for: decide on what this one scrape shows
                rep = ctl.cycle()
                typer.echo(json.dumps({**rep.to_dict(), "intents": [i.to_dict() for i in rep.intents],
                                       "transitions_detail": [t.to_dict() for t in rep.transitions]}))
            else:
                ctl.run(max_cycles=cycles or None)
        finally:
            if server is not None:
                server.stop()
            asm.close()


def _run_sharded(cfg: Any, bounded: bool) -> None:
    from fleethealth.controller.sharded import ShardedReplica
    from fleethealth.policy import PolicyError

    if bounded:
        fail("--once and --cycles run one controller; a config with 'shards' runs until stopped")
    try:
        replica = ShardedReplica(cfg)
    except PolicyError as e:
        fail(str(e))
    except Exception as e:  # the Kubernetes client: one line, exit 2
        fail(f"cannot start the sharded controller: {type(e).__name__}: {e}")
    signal.signal(signal.SIGTERM, lambda signum, frame: replica.request_stop())
    signal.signal(signal.SIGINT, lambda signum, frame: replica.request_stop())
    names = ", ".join(s.name for s in replica.specs)
    logging.getLogger("fleethealth.controller").info(
        "fleethealth controller: sharded replica %s, every %gs, shards %s (Lease prefix %s)",
        replica.identity, cfg.interval_s, names, cfg.shards.lease_prefix)
    hp = cfg.listen_host_port
    server = None
    if hp is not None:
        try:
            server = replica.serve(hp[0], hp[1])
        except OSError as e:
            fail(f"cannot listen on {cfg.listen}: {e.strerror or e}")
        logging.getLogger("fleethealth.controller").info("serving /healthz, /metrics and /api/v1 (routed to the shards this replica holds) on %s", cfg.listen)
    try:
        replica.run()
    finally:
        if server is not None:
            server.shutdown()
