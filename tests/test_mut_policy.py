"""The policy's loading errors as an operator reads them (issue 21): the exact file, line and key path of
each problem, one line per problem, never a traceback; the version tag stamped on every decision; the
signal lookup and metric families."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from fleethealth.policy import (
    Policy,
    PolicyError,
    SignalSpec,
    default_policy,
    default_policy_text,
    load_policy,
    parse_policy,
    validate_yaml,
)

ONE = "signals:\n  - name: temp\n    metric: DCGM_FI_DEV_GPU_TEMP\n    category: thermal\n    shape: ramp\n"


def errors(text: str, source: str = "p.yaml") -> list[str]:
    with pytest.raises(PolicyError) as e:
        parse_policy(text, source)
    lines = str(e.value).splitlines()
    assert lines[0] == "invalid policy"
    return [ln.strip() for ln in lines[1:]]


def test_each_problem_is_one_line_with_file_line_and_key() -> None:
    text = ONE + "    warn: 90\n    crit: 80\n  - name: gate1\n    metric: m\n    category: c\n    shape: gate\n"
    assert errors(text) == [
        "p.yaml:7: signals[0](temp).crit: crit (80) must be above warn (90) for a ramp that is worse when higher",
        "p.yaml:8: signals[1](gate1): a gate needs 'above' or 'values'",
    ]


def test_nested_key_line_is_the_key_not_its_parent() -> None:
    text = ONE + "    warn: 80\n    crit: 90\nlifecycle:\n  min_confidence: 0.5\n  drain_timeout_s: -1\n"
    assert errors(text) == ["p.yaml:10: lifecycle.drain_timeout_s: Input should be greater than 0"]
    text2 = ONE + "    warn: 80\n    crit: 90\n    match:\n      status: '5[0-9'\n"
    (msg,) = errors(text2)
    assert msg.startswith("p.yaml:8: signals[0](temp).match: match.status: not a regular expression:")


def test_line_of_a_list_item_and_of_a_missing_key() -> None:
    # the second signal lacks 'category': the line is the item's first line, the path names the item
    text = ONE + "    warn: 80\n    crit: 90\n  - name: b\n    metric: m\n    shape: flag\n    flag: f\n"
    assert errors(text) == ["p.yaml:8: signals[1](b).category: a scored signal needs a category (or score: false "
                            "for a signal only read)"]
    # a list item that is not a mapping: no name in the path
    text2 = ONE + "    warn: 80\n    crit: 90\n  - 7\n"
    (msg,) = errors(text2)
    assert msg.startswith("p.yaml:8: signals[1]: ")
    # an entity list entry past the YAML list's end cannot happen; a wrong entry is named by index
    text3 = ONE + "    warn: 80\n    crit: 90\n    entities: [gpu, disk]\n"
    (msg3,) = errors(text3)
    assert msg3.startswith("p.yaml:8: signals[0](temp).entities[1]: Input should be ")


def test_top_level_problems() -> None:
    assert errors("version: x\n") == ["p.yaml:1: signals: Field required"]
    assert errors(ONE + "    warn: 80\n    crit: 90\nbogus: 1\n") == ["p.yaml:8: bogus: Extra inputs are not permitted"]
    with pytest.raises(PolicyError) as e:
        parse_policy("- a\n- b\n", "list.yaml")
    assert str(e.value) == "list.yaml: a policy is a YAML mapping with at least a 'signals' list"
    with pytest.raises(PolicyError) as e:
        parse_policy("", "empty.yaml")
    assert str(e.value) == "empty.yaml: a policy is a YAML mapping with at least a 'signals' list"


def test_bad_yaml_names_the_line() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy("version: a\nsignals:\n  - name: [\n", "z.yaml")
    assert str(e.value).startswith("z.yaml:4: not valid YAML: ")
    assert "Traceback" not in str(e.value)


def test_the_default_source_name() -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy("version: x\n")
    assert "<policy>:1: signals: Field required" in str(e.value)


def test_load_from_a_file_and_its_errors(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(ONE + "    warn: 80\n    crit: 90\nversion: mine-3\n")
    p = load_policy(f)
    assert p.version == "mine-3" and [s.name for s in p.signals] == ["temp"]
    assert load_policy(str(f)).version == "mine-3"
    f.write_text(ONE)
    with pytest.raises(PolicyError) as e:
        load_policy(f)
    assert str(e.value).splitlines()[1].strip() == f"{f}:2: signals[0](temp): a ramp needs both 'warn' and 'crit'"
    with pytest.raises(PolicyError) as e:
        load_policy(tmp_path / "nope.yaml")
    assert str(e.value) == f"{tmp_path / 'nope.yaml'}: cannot read policy: No such file or directory"
    assert load_policy() is default_policy()
    assert load_policy(None).version == "default-1"


def test_version_tag_and_digest_follow_the_content() -> None:
    p = parse_policy(ONE + "    warn: 80\n    crit: 90\nversion: v7\n")
    tag = p.version_tag
    assert tag.startswith("v7@") and len(tag) == len("v7@") + 12
    assert p.digest == tag.split("@")[1] and p.digest == p.digest
    assert all(c in "0123456789abcdef" for c in p.digest)
    # the same text gives the same digest; another threshold gives another one
    assert parse_policy(ONE + "    warn: 80\n    crit: 90\nversion: v7\n").digest == p.digest
    other = parse_policy(ONE + "    warn: 80\n    crit: 91\nversion: v7\n")
    assert other.digest != p.digest and other.version_tag != tag
    # an updated copy is another policy: its digest is recomputed, the original's kept
    c = p.model_copy(update={"version": "v8"})
    assert c.version_tag.startswith("v8@") and c.digest != p.digest
    assert p.version_tag == tag
    same = p.model_copy()
    assert same.digest == p.digest


def test_signal_lookup_and_family() -> None:
    p = default_policy()
    assert p.signal("gpu_temp").name == "gpu_temp"
    assert p.signal("xid").shape == "xid"
    with pytest.raises(KeyError, match="no_such_signal"):
        p.signal("no_such_signal")
    s = SignalSpec(name="a", metric="DCGM_FI_DEV_GPU_TEMP", category="c", shape="gate", above=1)
    assert s.family_name == "DCGM"
    assert SignalSpec(name="a", metric="vllm:num_requests", category="c", shape="gate", above=1).family_name == "vllm"
    assert SignalSpec(name="a", metric="x_y:z", category="c", shape="gate", above=1).family_name == "x"
    assert SignalSpec(name="a", metric="m", category="c", shape="gate", above=1, family="dcgm").family_name == "dcgm"


def test_default_policy_text_is_the_shipped_file() -> None:
    text = default_policy_text()
    assert text.startswith("#") or "version: default-1" in text
    assert parse_policy(text).digest == default_policy().digest


class _Cfg(BaseModel):
    name: str
    items: list[int | str]


class _CfgError(Exception):
    pass


def test_validate_yaml_for_other_documents_and_dropped_union_branches() -> None:
    cfg = validate_yaml("name: a\nitems: [1, x]\n", "c.yaml", _Cfg, _CfgError, what="config", hint="a mapping")
    assert cfg.items == [1, "x"]
    with pytest.raises(_CfgError) as e:
        validate_yaml("name: a\nitems: [1, [2]]\n", "c.yaml", _Cfg, _CfgError, what="config", hint="h",
                      drop_loc=("int", "str"))
    assert str(e.value).splitlines()[0] == "invalid config"
    assert {ln.strip() for ln in str(e.value).splitlines()[1:]} == {
        "c.yaml:2: items[1]: Input should be a valid integer",
        "c.yaml:2: items[1]: Input should be a valid string",
    }
    with pytest.raises(_CfgError) as e:
        validate_yaml("7", "c.yaml", _Cfg, _CfgError, what="config", hint="a config is a mapping")
    assert str(e.value) == "c.yaml: a config is a mapping"


def test_duplicate_signal_names() -> None:
    text = ONE + "    warn: 80\n    crit: 90\n" + ONE.removeprefix("signals:\n") + "    warn: 80\n    crit: 90\n"
    assert errors(text) == ["p.yaml:1: signals: signal name 'temp' is used twice"]


def test_policy_is_frozen() -> None:
    p = default_policy()
    with pytest.raises(Exception, match="frozen"):
        p.version = "x"  # type: ignore[misc]
    assert isinstance(p, Policy)


def test_default_aggregation_per_consumer() -> None:
    p = parse_policy(ONE + "    warn: 80\n    crit: 90\n")
    assert p.aggregation == {"training": "min", "remediation": "min", "serving": "gmean"}


def test_a_nul_byte_is_named_by_its_line() -> None:
    from fleethealth.policy import load_yaml_strict

    with pytest.raises(ValueError) as e:
        load_yaml_strict("a: 1\nb: 2\nc: x\0y\nd: \0\n", "bin.yaml", ValueError)
    assert str(e.value) == "bin.yaml: not YAML: binary data (a NUL byte on line 3)"
    with pytest.raises(ValueError) as e:
        load_yaml_strict("\0", "b.yaml", ValueError)
    assert str(e.value) == "b.yaml: not YAML: binary data (a NUL byte on line 1)"
    with pytest.raises(ValueError, match="line 1\\)"):
        load_yaml_strict("x\0\n", "b.yaml", ValueError)
    with pytest.raises(ValueError, match="line 2\\)"):
        load_yaml_strict("\nx\0\n", "b.yaml", ValueError)


def _nested(levels: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(levels)) + "  " * levels + "v: 1\n"


def test_nesting_exactly_at_the_limit_is_read_one_more_is_refused() -> None:
    from fleethealth.policy import MAX_YAML_DEPTH, load_yaml_strict

    assert MAX_YAML_DEPTH == 64
    # n keys nested in a document: n + 1 mappings
    _, data = load_yaml_strict(_nested(63), "ok.yaml", ValueError)
    assert isinstance(data, dict) and "k0" in data
    with pytest.raises(ValueError) as e:
        load_yaml_strict(_nested(64), "deep.yaml", ValueError)
    assert str(e.value) == "deep.yaml:65: YAML nested deeper than 64 levels"
    # siblings do not add up: depth goes back down at each mapping's end
    wide = "".join(f"a{i}:\n  b: {{c: [1, 2]}}\n" for i in range(100))
    assert len(load_yaml_strict(wide, "w.yaml", ValueError)[1]) == 100
    seq = "- " + "[" * 63 + "]" * 63 + "\n"
    assert load_yaml_strict(seq, "s.yaml", ValueError)[1] is not None


def test_yaml_errors_name_the_line_and_the_problem() -> None:
    from fleethealth.policy import load_yaml_strict

    with pytest.raises(ValueError) as e:
        load_yaml_strict("a: 1\nb: [1, 2\n", "y.yaml", ValueError)
    assert str(e.value) == "y.yaml:3: not valid YAML: expected ',' or ']', but got '<stream end>'"
    with pytest.raises(ValueError) as e:
        load_yaml_strict("a: *nope\n", "y.yaml", ValueError)
    assert str(e.value) == "y.yaml:1: not valid YAML: found undefined alias 'nope'"
    # a safe loader: no Python objects from a policy
    with pytest.raises(ValueError, match="not valid YAML"):
        load_yaml_strict("a: !!python/object:os.system {}\n", "y.yaml", ValueError)


def test_a_key_given_twice_anywhere_and_merge_keys() -> None:
    from fleethealth.policy import load_yaml_strict

    with pytest.raises(ValueError) as e:
        load_yaml_strict("top:\n  - x: 1\n    y: 2\n    x: 3\n", "d.yaml", ValueError)
    assert str(e.value) == ("d.yaml:4: key 'x' given twice in one mapping (first on line 2); YAML would silently "
                            "keep only the last")
    # two merge keys are not a duplicate
    _, data = load_yaml_strict("a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: *a\n  <<: *b\n", "m.yaml", ValueError)
    assert data["c"] == {"x": 1, "y": 2}
    # the same key in two mappings is fine
    assert load_yaml_strict("a: {x: 1}\nb: {x: 2}\n", "m.yaml", ValueError)[1] == {"a": {"x": 1}, "b": {"x": 2}}


def test_a_file_that_is_not_utf8_text(tmp_path: Path) -> None:
    from fleethealth.policy import read_policy_text

    f = tmp_path / "latin1.yaml"
    f.write_bytes("version: caf\xe9\n".encode("latin-1"))
    with pytest.raises(PolicyError) as e:
        read_policy_text(f)
    assert str(e.value) == f"{f}: cannot read policy: binary data, not YAML text (not UTF-8)"
    g = tmp_path / "nul.yaml"
    g.write_bytes(b"version: a\x00\n")
    with pytest.raises(PolicyError) as e:
        read_policy_text(g)
    assert str(e.value) == f"{g}: cannot read policy: binary data, not YAML text (a NUL byte)"
    h = tmp_path / "ok.yaml"
    h.write_text("version: caf\u00e9\n", encoding="utf-8")
    assert read_policy_text(h) == "version: caf\u00e9\n"


def test_warnings_for_every_unknown_metric_even_when_the_text_no_longer_parses() -> None:
    from fleethealth.policy import policy_warnings

    text = ("signals:\n  - name: a\n    metric: my_metric_one\n    category: c\n    shape: gate\n    above: 1\n"
            "  - name: b\n    metric: DCGM_FI_DEV_GPU_TEMP\n    category: c\n    shape: gate\n    above: 1\n"
            "  - name: c\n    metric: my_metric_two\n    category: c\n    shape: slo\n    requests_metric: my_reqs\n")
    p = parse_policy(text)
    got = policy_warnings(text, p)
    assert [w.split(":")[0:2] for w in got] == [["<policy>", "3"], ["<policy>", "13"], ["<policy>", "16"]]
    assert got[0] == ("<policy>:3: signals[0](a).metric: 'my_metric_one' is not a metric any known exporter emits "
                      "(DCGM, dcgm-exporter, vLLM, SGLang, fleethealth); the signal will never have data unless "
                      "your own exporter provides it")
    assert got[2].startswith("<policy>:16: signals[2](c).requests_metric: 'my_reqs' is not a metric")
    # the policy object known, its text broken (edited since): the lines are unknown, the warnings are not
    broken = policy_warnings("signals: [\n", p, "e.yaml")
    assert len(broken) == 3 and all(w.startswith("e.yaml:?: signals[") for w in broken)


def test_union_branches_in_an_error_path_without_drop_loc() -> None:
    with pytest.raises(_CfgError) as e:
        validate_yaml("name: a\nitems: [1, [2]]\n", "c.yaml", _Cfg, _CfgError, what="config", hint="h")
    lines = {ln.strip() for ln in str(e.value).splitlines()[1:]}
    assert lines == {"c.yaml:2: items[1].int: Input should be a valid integer",
                     "c.yaml:2: items[1].str: Input should be a valid string"}


def test_error_without_a_line_and_at_the_top() -> None:
    class _Top(BaseModel):
        a: int

        def model_post_init(self, _: object) -> None:
            if self.a < 0:
                raise ValueError("a must not be negative")

    with pytest.raises(_CfgError) as e:
        validate_yaml("a: -1\n", "t.yaml", _Top, _CfgError, what="config", hint="h")
    assert str(e.value).splitlines()[1].strip() == "t.yaml:1: <top>: a must not be negative"


def test_a_control_character_is_named_without_a_position_mark() -> None:
    from fleethealth.policy import load_yaml_strict

    with pytest.raises(ValueError) as e:
        load_yaml_strict("a: \x07\n", "x.yaml", ValueError)
    msg = str(e.value)
    assert msg.startswith("x.yaml:1: not valid YAML: character U+0007, which YAML does not allow")
    assert "None" not in msg and "\n" not in msg


def test_depth_goes_back_down_after_a_nested_mapping_closes() -> None:
    from fleethealth.policy import load_yaml_strict

    # inside 'a' (depth 2) a closed {b: {}} must not lower the count below 2: 'c' then nests 63 deeper
    deep = "".join("  " * (i + 1) + f"k{i}:\n" for i in range(62)) + "  " * 63 + "v: 1\n"
    text = "a:\n  b: {x: {}}\n  c:\n" + "".join("  " + ln + "\n" for ln in deep.splitlines())
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        load_yaml_strict(text, "d.yaml", ValueError)


def test_an_unknown_request_counter_behind_a_known_metric_is_warned_about() -> None:
    from fleethealth.policy import policy_warnings

    text = ("signals:\n  - name: e\n    metric: vllm:request_success_total\n    category: serving\n    shape: slo\n"
            "    requests_metric: my_requests_total\n")
    (w,) = policy_warnings(text, parse_policy(text), "s.yaml")
    assert w.startswith("s.yaml:6: signals[0](e).requests_metric: 'my_requests_total' is not a metric")
