"""`fleethealth agent`: the node-local exporter (NVML + kernel-log Xids) for nodes without DCGM."""

from __future__ import annotations

import logging
import signal
import socket
from pathlib import Path

import typer

from fleethealth.cli.common import fail

# Kernel-log shorthands for --kernel-log: follow the kernel ring buffer or the journal instead of a file.
_COMMANDS = {
    "dmesg": ["dmesg", "-w"],
    "journal": ["journalctl", "-k", "-f", "-n", "all", "-o", "short-iso-precise"],
}


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        fail(f"--listen must be HOST:PORT (e.g. 0.0.0.0:9400), got {listen!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent(
        listen: str = typer.Option("0.0.0.0:9400", help="HOST:PORT to serve /metrics and /healthz on."),
        kernel_log: str | None = typer.Option(
            None, "--kernel-log",
            help="Kernel log to watch for Xids: /dev/kmsg (read directly), a FILE (e.g. /var/log/kern.log), "
                 "'dmesg' (dmesg -w) or 'journal' (journalctl -k -f).",
        ),
        interval: float = typer.Option(15.0, help="Seconds between collections.", min=0.1),
        xid_hold: float = typer.Option(
            300.0, "--xid-hold", min=0.0,
            help="Seconds DCGM_FI_DEV_XID_ERRORS shows a GPU's last Xid before returning to 0 (the Xid "
                 "counters keep the full record)."),
        hostname: str | None = typer.Option(
            None, help="Hostname label (default: this machine's name; use the Kubernetes node name there)."),
        fake_nvml: Path | None = typer.Option(
            None, "--fake-nvml", hidden=True,
            help="JSON spec of fake GPUs (fleethealth.sources.nvml.FakeNvml.from_json) for demos and tests."),
        reset_requests: bool = typer.Option(
            False, "--reset-requests",
            help="Answer the controller's GPU reset requests for this node (Node annotations; needs the "
                 "Kubernetes API: in-cluster config or --kubeconfig)."),
        controller: str | None = typer.Option(
            None, "--controller", help="Controller URL to report reset results to (POST /api/v1/events)."),
        token_file: Path | None = typer.Option(
            Path("/var/run/secrets/kubernetes.io/serviceaccount/token"), "--token-file",
            help="Bearer token the reports carry (default: the pod's service account token)."),
        kubeconfig: str | None = typer.Option(None, "--kubeconfig", help="Kubeconfig (default: in-cluster)."),
        reset_persistence_off: bool = typer.Option(
            False, "--reset-persistence-off",
            help="Let a reset turn persistence mode off for the reset (and back on after)."),
        bundle_dir: Path = typer.Option(Path("/var/lib/fleethealth/bundles"), "--bundle-dir",
                                        help="Where a failed reset's bug-report bundle goes."),
    ) -> None:
        """Serve dcgm-exporter-compatible GPU metrics from NVML and Xids from the kernel log.

        Exits with status 2 and one line on a machine without an NVIDIA driver."""
        from fleethealth.agent.server import Agent
        from fleethealth.sources.kernel_log import KernelLogSource
        from fleethealth.sources.nvml import FakeNvml, NvmlSource, NvmlUnavailable

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        host, port = _parse_listen(listen)
        node = hostname or socket.gethostname()
        nvml = NvmlSource(node, FakeNvml.from_json(fake_nvml)) if fake_nvml else NvmlSource(node)
        try:
            nvml.start()
        except NvmlUnavailable as e:
            fail(f"{e}; `fleethealth agent` needs an NVIDIA GPU and driver (use dcgm-exporter or "
                 "Prometheus sources elsewhere)")
        klog: KernelLogSource | None = None
        if kernel_log:
            cmd = _COMMANDS.get(kernel_log)
            klog = (KernelLogSource(command=cmd, node=node, from_start=True) if cmd is not None
                    else KernelLogSource(path=kernel_log, node=node))
        runner = Agent(nvml, klog, interval=interval, xid_hold_s=xid_hold)
        if reset_requests:
            _start_reset_watcher(node, nvml, interval, controller, token_file, kubeconfig, reset_persistence_off,
                                 bundle_dir, runner)
        try:
            bound = runner.start(host, port)
        except OSError as e:
            nvml.close()
            fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
        signal.signal(signal.SIGTERM, lambda *_: runner.request_stop())
        typer.echo(f"fleethealth agent: serving http://{bound[0]}:{bound[1]}/metrics "
                   f"({len(nvml.gpus)} GPUs, every {interval:g}s)", err=True)
        try:
            runner.wait()
        except KeyboardInterrupt:
            pass
        finally:
            runner.stop()


def _start_reset_watcher(node: str, nvml: object, interval: float, controller: str | None, token_file: Path | None,
                         kubeconfig: str | None, persistence_off: bool, bundle_dir: Path, runner: object) -> None:
    """Poll this node's reset requests on a thread, once per interval (errors are logged, never fatal)."""
    import threading
    import time

    from fleethealth.act.kube_api import Kube, OfficialKubeApi
    from fleethealth.agent.reset import GpuResetter, ResetWatcher, controller_reporter

    log = logging.getLogger("fleethealth.agent.reset")
    try:
        kube = Kube(OfficialKubeApi.from_config(kubeconfig))
    except Exception as e:  # no in-cluster config and no kubeconfig
        fail(f"--reset-requests needs the Kubernetes API: {' '.join(str(e).split())[:200]}")
    token = None
    if token_file is not None and token_file.is_file():
        token = token_file.read_text().strip()
    report = controller_reporter(controller, token) if controller else None
    api = getattr(nvml, "nvml", None)
    if api is None:
        fail("--reset-requests: this NVML source does not expose its NVML handle")
    watcher = ResetWatcher(node, kube, GpuResetter(api, node=node, allow_persistence_off=persistence_off,
                                                   bundle_dir=bundle_dir), report)

    def loop() -> None:
        stop = getattr(runner, "_stop", None)
        while stop is None or not stop.is_set():
            try:
                watcher.poll()
            except Exception as e:
                log.warning("reset requests: %s", " ".join(str(e).split())[:300])
            time.sleep(interval)

    threading.Thread(target=loop, name="reset-requests", daemon=True).start()
