"""One controller replica's actuation side, as a process the leader-election test can SIGKILL: it renews
the Lease every 0.2 s and, while leading, submits the intent it was given (once per loop; the ledger makes
repeats no-ops). Prints one JSON line per event. Usage: act_replica.py HOST TOKEN IDENTITY LEDGER INTENT_JSON"""

from __future__ import annotations

import json
import sys
import time

from fleethealth.act.config import ActuationConfig
from fleethealth.act.kube import KubeNodeActuator
from fleethealth.act.kube_api import Kube, OfficialKubeApi
from fleethealth.act.lease import LeaseElector
from fleethealth.act.ledger import Ledger, intent_from_dict
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.model import IntentKind


def main() -> None:
    host, token, identity, ledger, intent_json = sys.argv[1:6]
    kube = Kube(OfficialKubeApi.from_host(host, token=token, verify_ssl=False, timeout_s=2.0))
    elector = LeaseElector(kube, identity, name="fh-replica-lease", lease_duration_s=2.0, renew_deadline_s=1.5)
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.NO_NEW_WORK}))
    runner = ActuationRunner([KubeNodeActuator(kube, cfg)], Ledger(ledger), cfg, is_leader=elector.is_leader)
    intent = intent_from_dict(json.loads(intent_json))
    was = False
    while True:
        lead = elector.step()
        if lead != was:
            print(json.dumps({"leader": lead, "identity": identity}), flush=True)
            was = lead
        for r in runner.submit(intent):
            if r.status != "not_leader":
                print(json.dumps({"status": r.status, "identity": identity, "detail": r.detail}), flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
