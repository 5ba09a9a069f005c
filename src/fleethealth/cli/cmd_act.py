"""`fleethealth act ...`: the actuation ledger, the kill switch, Envoy EDS from the controller's weights,
and the Kubernetes inventory."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from fleethealth.cli.common import fail


def register(app: typer.Typer) -> None:
    act_app = typer.Typer(help="Actuation: ledger, kill switch, Envoy EDS, Kubernetes inventory.",
                          no_args_is_help=True)

    @act_app.command("ledger")
    def ledger(
        db: str = typer.Option(..., "--db", help="The actuation ledger: a SQLite file or the postgresql:// URL."),
        entity: str | None = typer.Option(None, help="Only this entity."),
        status: str | None = typer.Option(None, help="advised | applied | retrying | failed | killed"),
        limit: int = typer.Option(100, min=1),
    ) -> None:
        """Print recorded actions, newest first, one JSON object per line."""
        from fleethealth.act.ledger import Ledger
        from fleethealth.store import StoreError
        from fleethealth.store.db import is_postgres_url

        if not is_postgres_url(db) and not Path(db).exists():
            fail(f"no ledger at {db}")
        try:
            led = Ledger(db)
        except StoreError as e:
            fail(str(e))
        for rec in led.actions(entity=entity, status=status, limit=limit):
            typer.echo(json.dumps(rec.to_dict(), sort_keys=True, default=str))

    @act_app.command("kill")
    def kill(db: str = typer.Option(..., "--db", help="The actuation ledger: a SQLite file or postgresql:// URL."),
             reason: str = typer.Option("cli", help="Why (recorded).")) -> None:
        """Engage the kill switch: every runner on this ledger stops acting at its next attempt."""
        from fleethealth.act.ledger import Ledger
        from fleethealth.act.runner import KILL_SETTING

        Ledger(db).set_setting(KILL_SETTING, json.dumps({"reason": reason, "ts": time.time()}))
        typer.echo("killed")

    @act_app.command("resume")
    def resume(db: str = typer.Option(..., "--db", help="The actuation ledger: a SQLite file or postgresql:// URL.")
               ) -> None:
        """Lift the run-time kill switch (a kill_switch: true in the config still holds)."""
        from fleethealth.act.ledger import Ledger
        from fleethealth.act.runner import KILL_SETTING

        Ledger(db).set_setting(KILL_SETTING, None)
        typer.echo("resumed")

    @act_app.command("eds")
    def eds(
        cluster: str = typer.Option(..., help="Envoy cluster name."),
        weights: str = typer.Option(..., help="The controller's weights: a URL (/api/v1/weights) or a JSON file."),
        out: Path | None = typer.Option(None, help="Write here (atomically) for Envoy's path-based EDS; "
                                                   "default stdout."),
        base_weight: int = typer.Option(100, min=1, help="The routing policy's weight that health scales."),
    ) -> None:
        """Envoy EDS DiscoveryResponse (ClusterLoadAssignment) from replica weights: weight = base x health,
        health_status HEALTHY / DEGRADED / DRAINING."""
        import httpx

        from fleethealth.act.router import ReplicaWeight, eds_discovery_response

        try:
            if weights.startswith(("http://", "https://")):
                doc = httpx.get(weights, timeout=10).json()
            else:
                doc = json.loads(Path(weights).read_text())
        except (OSError, ValueError, httpx.HTTPError) as e:
            fail(f"cannot read weights from {weights}: {e}")
        reps = doc.get("replicas", doc) if isinstance(doc, dict) else {}
        table = {}
        for r, w in reps.items():
            if not isinstance(w, dict):
                continue
            table[r] = ReplicaWeight(
                replica=r, weight=float(w.get("weight", 0.0)), state=str(w.get("state", "READY")),
                address=w.get("address"), port=None if w.get("port") is None else int(w["port"]),
                zone=w.get("zone"))
        version = str(doc.get("ts", time.time())) if isinstance(doc, dict) else "0"
        body = json.dumps(eds_discovery_response(cluster, table, version,
                                                 base_weights={r: base_weight for r in table}), indent=1)
        if out is None:
            typer.echo(body)
        else:
            tmp = out.with_suffix(out.suffix + ".tmp")
            tmp.write_text(body)
            tmp.replace(out)  # Envoy watches the path with a move, never a partial file

    @act_app.command("inventory")
    def inventory(kubeconfig: str | None = typer.Option(None, help="Default: in-cluster, then ~/.kube/config."),
                  context: str | None = typer.Option(None)) -> None:
        """Nodes (GPU capacity, cordon, taints), pods, jobs and tensor-parallel groups per node, as JSON."""
        from fleethealth.act.inventory import read_inventory
        from fleethealth.act.kube_api import Kube, KubeError, OfficialKubeApi

        try:
            kube = Kube(OfficialKubeApi.from_config(kubeconfig, context))
            inv = read_inventory(kube, with_events=False)
        except KubeError as e:
            fail(f"kubernetes: {e}")
        except Exception as e:  # kubeconfig problems come as several exception types
            fail(f"kubernetes config: {e}")
        typer.echo(json.dumps(inv.to_dict(), indent=1, sort_keys=True))

    app.add_typer(act_app, name="act")
