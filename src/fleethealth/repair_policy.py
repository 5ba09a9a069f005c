"""The remediation ladder's part of the policy file (``remediation:``), validated like the rest of it.

A *ladder* says, for the faults it matches, which repairs to try in order and what must hold before and
after each. ``when`` tokens match what the scoring engine reports on a node or its GPUs:

* ``recovery:ACTION``  the driver's recovery action (Xid 154 / DCGM field 1523): GPU_RESET, NODE_REBOOT,
  DRAIN_AND_RESET, DRAIN_P2P;
* ``catalog:BUCKET``   an Xid whose immediate resolution bucket in NVIDIA's catalog is BUCKET (RESET_GPU,
  RESTART_BM, RESTART_VM, ...);
* ``xid:N``            that Xid; ``flag:NAME`` any flag (``row_remap_pending``); ``reason:PREFIX`` the
  tuple's reason code starts with PREFIX (``gate:ecc``).

Each step has an ``action`` (restart_worker, reset_gpu, reboot_node, replace), the preconditions its
executor checks before acting (drained, no_gpu_process, tp_peers_handled), a ``timeout_s`` for the action's
result, and the ``verify`` that must pass before the entity may go back (active_test, cleared: the
triggering flags gone on fresh data, none). ``replace`` is the last resort: a person with the evidence.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Action = Literal["restart_worker", "reset_gpu", "reboot_node", "replace"]
Precondition = Literal["drained", "no_gpu_process", "tp_peers_handled"]
Verify = Literal["active_test", "cleared", "none"]
When = Literal["after_drain", "next_safe_point"]
_TOKEN = re.compile(r"^(recovery|catalog|xid|flag|reason):[A-Za-z0-9_.:-]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RepairStep(_Strict):
    action: Action
    requires: list[Precondition] = Field(default_factory=list)
    timeout_s: float = Field(default=900.0, gt=0)  # the action's result must come back within this
    verify: Verify = "active_test"
    verify_timeout_s: float = Field(default=1800.0, gt=0)
    # when the executor acts: once the node is drained (an isolated node), or at the next safe point of
    # its work (a node that stays in service: a pending row remap's reset between jobs)
    at: When = "after_drain"


class Ladder(_Strict):
    name: str = Field(min_length=1)
    when: list[str] = Field(min_length=1)
    steps: list[RepairStep] = Field(min_length=1)

    @field_validator("when")
    @classmethod
    def _tokens(cls, v: list[str]) -> list[str]:
        for t in v:
            if not _TOKEN.match(t):
                raise ValueError(f"{t!r}: expected recovery:ACTION, catalog:BUCKET, xid:N, flag:NAME or"
                                 " reason:PREFIX")
        return v

    @model_validator(mode="after")
    def _replace_last(self) -> Ladder:
        for s in self.steps[:-1]:
            if s.action == "replace":
                raise ValueError("replace hands the node to a person: it can only be the last step")
        return self


def _default_ladders() -> list[Ladder]:
    test: Verify = "active_test"
    return [
        Ladder(name="reboot-class", when=["recovery:NODE_REBOOT", "catalog:RESTART_BM", "catalog:RESTART_VM"],
               steps=[RepairStep(action="reboot_node", requires=["drained"], timeout_s=1800.0, verify=test),
                      RepairStep(action="replace", verify="none")]),
        Ladder(name="reset-class", when=["recovery:GPU_RESET", "recovery:DRAIN_AND_RESET", "catalog:RESET_GPU"],
               steps=[RepairStep(action="reset_gpu", requires=["drained", "no_gpu_process"], timeout_s=900.0,
                                 verify=test),
                      RepairStep(action="reboot_node", requires=["drained"], timeout_s=1800.0, verify=test),
                      RepairStep(action="replace", verify="none")]),
        # a pending row remap on a node in service: reset at the next safe point, the remap must clear
        Ladder(name="row-remap", when=["flag:row_remap_pending", "xid:63"],
               steps=[RepairStep(action="reset_gpu", requires=["drained", "no_gpu_process"], timeout_s=86400.0,
                                 verify="cleared", verify_timeout_s=1800.0, at="next_safe_point"),
                      RepairStep(action="reboot_node", requires=["drained"], timeout_s=86400.0, verify="cleared",
                                 verify_timeout_s=1800.0, at="next_safe_point"),
                      RepairStep(action="replace", verify="none")]),
    ]


class RepairBudget(_Strict):
    """Repair actions per pool per ``budgets.window_s``: each ladder step that resets or reboots spends one;
    exhausted, the step waits (one ``budget_exhausted`` incident pages) until the window frees one."""

    reset_gpu: int = Field(default=4, ge=0)
    reboot_node: int = Field(default=2, ge=0)
    restart_worker: int = Field(default=8, ge=0)


class Remediation(_Strict):
    """Repairs of isolated nodes (QUARANTINED or DRAINING), tried in order, each verified."""

    enabled: bool = True
    ladders: list[Ladder] = Field(default_factory=_default_ladders)
    budget: RepairBudget = Field(default_factory=RepairBudget)

    @model_validator(mode="after")
    def _unique(self) -> Remediation:
        names = [lad.name for lad in self.ladders]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"ladder names must be unique: {', '.join(sorted(dup))}")
        return self
