"""A control character in a YAML file (policy, controller config, token file) is one line naming the
file, the line and the key, not PyYAML's two-line reader message (found by the mutation run, docs/mutation.md)."""

from __future__ import annotations

import pytest

from fleethealth.auth.access import StaticTokens, TokenFileError
from fleethealth.policy import PolicyError, parse_policy


def test_control_character_in_a_policy_value_is_one_line_with_line_and_key() -> None:
    text = "version: 1\nname: \"fleet\x07\"\n"
    with pytest.raises(PolicyError) as e:
        parse_policy(text, "mine.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("mine.yaml:2: ") and "U+0007" in msg and "'name'" in msg


def test_control_character_in_a_nested_list_names_the_path() -> None:
    text = "tokens:\n  - user: alice\n    token: \"abcdefghijklmnop\x01q\"\n    verbs: [ack]\n"
    with pytest.raises(TokenFileError) as e:
        StaticTokens.parse(text, "tokens.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("tokens.yaml:3: ") and "U+0001" in msg and "'tokens[0].token'" in msg


@pytest.mark.parametrize("char", ["\x01", "\x1b", "\x7f", "\ufffe"])
def test_any_refused_character_is_one_line(char: str) -> None:
    with pytest.raises(TokenFileError) as e:
        StaticTokens.parse(f"a: 1\nb: x{char}\n", "t.yaml")
    assert "\n" not in str(e.value) and str(e.value).startswith("t.yaml:2: ")
