"""One grammar for method strings: what the parser takes is what the schema's pattern documents."""

from __future__ import annotations

import re

import pytest
from blendserve.core.online_rule import OnlineRule
from blendserve.core.options import Option, parse_spec
from blendserve.core.policies import PolicySpec, policy_pattern

SERVED = ("hedge", "blend", "asc", "ppr", "esc", "sc")


@pytest.mark.parametrize(
    "text",
    ["blend", "asc:cap=16", "asc:cap=none", "esc:window=8", "hedge:floor=0.25,stop=0.0001,probe=3"],
)
def test_a_policy_the_parser_takes_matches_the_schema_pattern(text: str) -> None:
    assert PolicySpec.parse(text).name == text.partition(":")[0]
    assert re.fullmatch(policy_pattern(SERVED), text)


@pytest.mark.parametrize("text", ["asc:cap=x", "asc:size=3", "asc:cap", "nope"])
def test_a_policy_neither_takes_is_refused_by_both(text: str) -> None:
    with pytest.raises(ValueError):
        PolicySpec.parse(text)
    assert not re.fullmatch(policy_pattern(SERVED), text)


def test_the_online_rule_reads_the_same_grammar() -> None:
    rule = OnlineRule.parse("online:score=ppr,cap=4,first=0.5")
    assert (rule.score, rule.cap, rule.first) == ("ppr", 4.0, 0.5)
    for bad in ("online:score=mode", "online:cap=0.5", "online:speed=2", "asc"):
        with pytest.raises(ValueError):
            OnlineRule.parse(bad)


def test_a_bad_value_names_its_option() -> None:
    with pytest.raises(ValueError, match="for size"):
        parse_spec("m:size=big", {"size": Option(int, "[0-9]+")})
