"""The README is part of the product: its derived parts must match the code."""

from __future__ import annotations

import re
from pathlib import Path

from fleethealth import policy as policy_mod

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_lifecycle_diagram_is_generated_from_the_table() -> None:
    namespace: dict = {"__name__": "gen_readme"}
    exec(compile((ROOT / "scripts" / "gen-readme").read_text(), "gen-readme", "exec"), namespace)
    assert namespace["render"](README) == README, "README diagram is stale: run python scripts/gen-readme"


def test_policy_reference_names_every_key() -> None:
    models = {
        "": policy_mod.Policy, "freshness.": policy_mod.Freshness, "peer.": policy_mod.PeerDefaults,
        "slo.": policy_mod.SloDefaults, "xid.": policy_mod.XidPolicy, "lifecycle.": policy_mod.Lifecycle,
        "budgets.": policy_mod.Budgets, "fleet.": policy_mod.Fleet, "attribution.": policy_mod.Attribution,
        "router.": policy_mod.Router,
    }
    missing = []
    for prefix, model in models.items():
        for name in model.model_fields:
            if name not in README:
                missing.append(prefix + name)
    for name in policy_mod.SignalSpec.model_fields:
        if f"`{name}`" not in README:
            missing.append("signals[]." + name)
    assert not missing, f"README policy reference lacks: {missing}"


def test_quick_start_is_two_commands_and_ci_runs_the_test_command() -> None:
    block = re.search(r"## Quick start\s+```bash\n(.*?)```", README, re.S)
    assert block
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(lines) == 2 and "fleethealth demo" in lines[0]
    test_cmd = lines[1].split("#")[0].strip()
    assert test_cmd in (ROOT / ".ci" / "run").read_text()
