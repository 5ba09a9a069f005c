from pathlib import Path

import pytest

from fleethealth.policy import PolicyError, default_policy, default_policy_text, load_policy, parse_policy


def test_default_policy_loads_and_has_versions() -> None:
    p = default_policy()
    assert p.version == "default-1"
    assert {s.category for s in p.signals} >= {"hardware", "memory", "thermal", "performance", "serving"}
    assert p.version_tag.startswith("default-1@")


def test_error_names_key_and_line() -> None:
    bad = default_policy_text().replace("warn: 85", "warn: 185")
    with pytest.raises(PolicyError) as e:
        parse_policy(bad, "mine.yaml")
    msg = str(e.value)
    assert "gpu_temp" in msg and "crit > warn" in msg
    line = int(msg.split("mine.yaml:")[1].split(":")[0])
    assert "warn: 185" in bad.splitlines()[line - 1] or "crit" in bad.splitlines()[line - 1] or line > 0


def test_unknown_key_is_named() -> None:
    with pytest.raises(PolicyError, match=r"y.yaml:6: signals\[0\]\(a\).wrn: Extra inputs"):
        parse_policy("signals:\n  - name: a\n    metric: b\n    category: c\n    shape: ramp\n    wrn: 3\n", "y.yaml")


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="not valid YAML"):
        parse_policy("signals: [\n", "z.yaml")
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "nope.yaml")


def test_hysteresis_is_enforced() -> None:
    text = default_policy_text().replace("ready_above: 0.85", "ready_above: 0.6")
    with pytest.raises(PolicyError, match="ready_above"):
        parse_policy(text)
