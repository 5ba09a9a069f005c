"""``attribution.physical_xids`` names only Xids that gate a node (issue 16): physical evidence is read only
on a gated node, so an Xid that never gates (92 high SBE rate, 63 pending remap, 13 an application Xid, an
Xid whose catalog action needs no reset) could never count, and a policy that lists one is refused with the
file, the line and the key."""

from __future__ import annotations

from importlib import resources

import pytest

from fleethealth.policy import PolicyError, parse_policy

SHIPPED = (resources.files("fleethealth") / "data" / "default-policy.yaml").read_text()
LINE = "physical_xids: [48, 64, 79, 95, 140]"


def test_the_shipped_physical_xids_all_gate() -> None:
    assert parse_policy(SHIPPED).attribution.physical_xids == [48, 64, 79, 95, 140]


@pytest.mark.parametrize(("xids", "idle"), [("[79, 92]", "[92]"), ("[63, 79]", "[63]"), ("[13, 48]", "[13]")])
def test_an_xid_that_never_gates_is_refused_naming_the_key_and_line(xids: str, idle: str) -> None:
    assert LINE in SHIPPED
    with pytest.raises(PolicyError) as e:
        parse_policy(SHIPPED.replace(LINE, f"physical_xids: {xids}"), "mine.yaml")
    msg = str(e.value)
    # the key's own line, not the section's (attribution:)
    line = SHIPPED[:SHIPPED.index(LINE)].count("\n") + 1
    assert f"mine.yaml:{line}: attribution.physical_xids: {idle} do not gate a node" in msg


def test_an_xid_gated_by_the_policys_own_gate_list_is_accepted() -> None:
    text = SHIPPED.replace(LINE, "physical_xids: [79, 92]").replace(
        "gate_xids: [", "gate_xids: [92, ", 1)
    assert 92 in parse_policy(text).xid.gate_xids
    assert parse_policy(text).attribution.physical_xids == [79, 92]


def test_an_unknown_physical_gate_points_at_its_own_key_and_line() -> None:
    text = SHIPPED.replace("physical_gates: [gpus_missing,", "physical_gates: [no_such_signal, gpus_missing,")
    with pytest.raises(PolicyError) as e:
        parse_policy(text, "mine.yaml")
    line = text[:text.index("physical_gates: [no_such")].count("\n") + 1
    assert f"mine.yaml:{line}: attribution.physical_gates: ['no_such_signal'] are not signals" in str(e.value)
