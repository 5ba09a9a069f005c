"""Actuators: carry out the decisions layer's intents in the systems operators already run.

Every actuator has ``name``, ``kinds`` (the intent kinds it handles) and ``apply(intent) -> Outcome``;
ActuationRunner (runner.py) routes intents to them, in advise mode by default, with per-kind enforcement,
a kill switch, an SQLite ledger keyed by ``intent.key`` (never acts twice) and recorded retries.

| intent kind                         | actuator (module)                 | effect                                   |
|-------------------------------------|-----------------------------------|------------------------------------------|
| no_new_work                         | KubeNodeActuator (kube.py)        | cordon, NoSchedule taint, labels, cond.  |
| quarantine, drain (node tier)       | EvidenceCollector, then KubeNode  | bundle; cordon+taint+condition; evict    |
| drain (pod tier), rebuild_worker    | KubeNodeActuator                  | evict the replica's pod (PDB honoured)   |
| release, allow_new_work             | KubeNodeActuator                  | uncordon (only our own cordon), untaint  |
|                                     |                                   | release needs a passed active test       |
| set_condition                       | KubeNodeActuator                  | node condition (params.condition/status) |
| schedule_reset                      | KubeNodeActuator                  | reset-requested annotations for the agent|
| run_active_test                     | ActiveTests (active_test.py)      | Jobs pinned to the node                  |
| set_weight                          | RouterActuator (router.py)        | weight board (JSON, EDS), readiness gate |
| page, fleet_alert                   | AlertmanagerPager (pager.py)      | POST /api/v2/alerts                      |
| capture_evidence                    | EvidenceCollector (evidence.py)   | bundle dir + evidence index              |

Intent params read here (all optional): ``node`` (else the entity's part before ``/``), ``state``,
``value``/``confidence`` or ``tuple`` (a HealthTuple.to_dict()), ``drain_timeout_s``, ``tests``, ``gpus``,
``image``; for set_weight ``weight``, ``state``, ``address``, ``port``, ``zone``, ``namespace``, ``pod``;
for pages ``severity``, ``page_kind``, ``summary``, ``evidence``, ``version_label``/``version``.
"""
