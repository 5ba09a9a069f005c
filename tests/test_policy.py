import re
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
    assert "gpu_temp" in msg and "crit (95) must be above warn (185)" in msg
    line = int(msg.split("mine.yaml:")[1].split(":")[0])
    assert bad.splitlines()[line - 1].strip().startswith("crit:")  # the line of the key named


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


# --- issue 14 item 5 and issue 15: policy checks that catch typos and nonsense ---------------------------

_SIG = "signals:\n  - name: a\n    metric: {metric}\n    category: c\n    shape: {shape}\n{extra}"


def _line_of(msg: str, source: str) -> int:
    return int(msg.split(source + ":")[1].split(":")[0])


def test_a_metric_no_exporter_emits_is_a_warning_naming_its_line() -> None:
    from fleethealth.policy import policy_warnings

    assert policy_warnings(default_policy_text(), default_policy(), "d.yaml") == []  # all known
    text = default_policy_text().replace("metric: DCGM_FI_DEV_GPU_TEMP", "metric: DCGM_FI_DEV_GPU_TMP", 1)
    got = policy_warnings(text, parse_policy(text), "mine.yaml")
    assert len(got) == 1 and "'DCGM_FI_DEV_GPU_TMP' is not a metric any known exporter emits" in got[0]
    assert "did you mean 'DCGM_FI_DEV_GPU_TEMP'?" in got[0]
    assert "metric: DCGM_FI_DEV_GPU_TMP" in text.splitlines()[_line_of(got[0], "mine.yaml") - 1]
    for name in ("vllm:kv_cache_usage_perc", "sglang:num_queue_reqs", "fleethealth_kernel_xid_total",
                 "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L11", "vllm:e2e_request_latency_seconds_bucket"):
        t = _SIG.format(metric=name, shape="gate", extra="    above: 1\n")
        assert policy_warnings(t, parse_policy(t)) == [], name
    t = _SIG.format(metric="my_own_exporter_metric", shape="gate", extra="    above: 1\n")
    (w,) = policy_warnings(t, parse_policy(t), "o.yaml")
    assert w.startswith("o.yaml:3: signals[0](a).metric:") and "never have data" in w


@pytest.mark.parametrize(("extra", "key", "why"), [
    ("    peer_by: [model]\n    k_warn: 4\n    k_crit: 2\n", "k_crit", "k_crit (2) must be greater than k_warn (4)"),
    ("    peer_by: [model]\n    k_warn: -3\n", "k_warn", "greater than 0"),
    ("    peer_by: [model]\n    k_crit: 0\n", "k_crit", "greater than 0"),
])
def test_nonsense_peer_thresholds_are_errors_naming_key_and_line(extra: str, key: str, why: str) -> None:
    text = _SIG.format(metric="DCGM_FI_DEV_SM_CLOCK", shape="peer", extra=extra)
    with pytest.raises(PolicyError) as e:
        parse_policy(text, "p.yaml")
    msg = str(e.value)
    assert why in msg and f"signals[0](a).{key}" in msg
    assert text.splitlines()[_line_of(msg, "p.yaml") - 1].strip().startswith(key + ":")


def test_nonsense_defaults_and_windows_are_errors() -> None:
    base = default_policy_text()
    for old, new, why in [
        ("k_warn: 3.0", "k_warn: 7.0", "k_crit (6) must be greater than k_warn (7)"),
        ("k_warn: 3.0", "k_warn: -1.0", "greater than 0"),
        ("short_s: 300", "short_s: 7200", "the short window (7200 s) must be shorter than the long one (3600 s)"),
    ]:
        assert old in base, old
        with pytest.raises(PolicyError, match=re.escape(why)):
            parse_policy(base.replace(old, new, 1), "d.yaml")
    ramp = _SIG.format(metric="DCGM_FI_DEV_GPU_TEMP", shape="ramp", extra="    worse_if: lower\n    warn: 10\n    crit: 20\n")
    with pytest.raises(PolicyError, match=r"r.yaml:8: signals\[0\]\(a\).crit: crit \(20\) must be below warn \(10\)"):
        parse_policy(ramp, "r.yaml")


def test_deep_yaml_and_duplicate_keys_are_errors_with_the_line() -> None:
    deep = "signals:\n" + "".join("  " * i + f"  - k{i}:\n" for i in range(1000))
    with pytest.raises(PolicyError, match=r"deep.yaml:\d+: YAML nested deeper than 64 levels"):
        parse_policy(deep, "deep.yaml")
    flow = "signals: " + "[" * 5000 + "]" * 5000
    with pytest.raises(PolicyError, match="nested deeper"):
        parse_policy(flow, "flow.yaml")
    dup = default_policy_text().replace("lifecycle:\n", "lifecycle:\n  degraded_below: 0.1\n", 1)
    with pytest.raises(PolicyError) as e:
        parse_policy(dup, "dup.yaml")
    msg = str(e.value)
    assert "key 'degraded_below' given twice in one mapping" in msg and "silently" in msg
    lines = dup.splitlines()
    first = int(msg.split("first on line ")[1].split(")")[0])
    assert lines[first - 1].strip() == "degraded_below: 0.1"
    assert lines[_line_of(msg, "dup.yaml") - 1].strip().startswith("degraded_below:")
    # the same rules for every YAML the project reads (controller config, scenarios)
    from fleethealth.policy import load_yaml_strict

    with pytest.raises(ValueError, match=r"c.yaml:2: key 'a' given twice"):
        load_yaml_strict("a: 1\na: 2\n", "c.yaml", ValueError)
    assert load_yaml_strict("base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n", "m.yaml", ValueError)[1]["other"] == {"x": 1, "y": 2}


def test_policy_check_on_a_binary_file_is_one_line_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fleethealth.cli.main import app

    runner = CliRunner()
    for name, data in [("core.bin", b"\x7fELF\x02\x01\x00\x00" + bytes(range(256))), ("nul.yaml", b"signals: []\x00\n")]:
        f = tmp_path / name
        f.write_bytes(data)
        res = runner.invoke(app, ["policy", "check", str(f)])
        assert res.exit_code == 2, res.output
        assert res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "binary data" in res.stderr and "Traceback" not in res.output
    ok = tmp_path / "typo.yaml"
    ok.write_text(default_policy_text().replace("metric: DCGM_FI_DEV_GPU_TEMP", "metric: DCGM_FI_DEV_GPU_TMP", 1))
    res = runner.invoke(app, ["policy", "check", str(ok)])
    assert res.exit_code == 0 and res.stdout.startswith("ok: ")
    assert "warning:" in res.stderr and "DCGM_FI_DEV_GPU_TMP" in res.stderr
