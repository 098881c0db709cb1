"""The service's side of reasoning models: the tags setting, and thoughts in ``/v1`` replies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from blendserve.answers import ReasoningTags
from blendserve.engines.base import Sample
from blendserve.engines.replay import ReplayEngine
from blendserve.service.jobs import JobDefaults, JobMaker, JobOptions
from blendserve.service.openai.render import Choice, Reply, choices_from_samples, usage_of
from blendserve.service.settings import Settings
from pydantic import ValidationError


def _chunks(reply: Reply, choices: list[Choice]) -> list[dict[str, Any]]:
    frames = list(reply.chunks(choices, usage_of(3, 9, 6), None))
    assert frames[-1] == "data: [DONE]\n\n"
    return [json.loads(frame.removeprefix("data: ")) for frame in frames[:-1]]


def test_the_tags_setting_reaches_every_keyer_and_must_be_two_tags() -> None:
    settings = Settings(reasoning_tags="<reasoning>, </reasoning>")
    maker = JobMaker(ReplayEngine([]), JobDefaults.from_settings(settings))
    keyer = maker.keyer(JobOptions())
    assert keyer.reasoning_tags == ReasoningTags("<reasoning>", "</reasoning>")
    assert JobDefaults.from_settings(Settings()).reasoning_tags == ReasoningTags()
    for bad in ("<think>", "<think>,<think>", ",</think>"):
        with pytest.raises(ValidationError, match="reasoning_tags"):
            Settings(reasoning_tags=bad)


def test_plain_samples_are_read_for_thoughts_as_voted_ones_are() -> None:
    samples = [
        Sample("<think>maybe 8</think>\n\nIt is 7.", "stop", 1, 1, "e"),
        Sample("<think>12*12 = 144. But let me", "stop", 1, 1, "e"),
        Sample("It is 7.", "stop", 1, 1, "e", reasoning="split upstream"),
        Sample("plain", "length", 1, 1, "e"),
    ]
    assert choices_from_samples(samples, 4) == [
        Choice(4, "It is 7.", "stop", "maybe 8"),
        Choice(5, "", "length", "12*12 = 144. But let me"),  # the thought never closed
        Choice(6, "It is 7.", "stop", "split upstream"),
        Choice(7, "plain", "length", None),
    ]
    tags = ReasoningTags("<r>", "</r>")
    assert choices_from_samples([Sample("<r>8</r>7", "stop", 1, 1, "e")], 0, tags) == [
        Choice(0, "7", "stop", "8")
    ]


def test_a_chat_reply_carries_the_thought_under_both_names_and_only_when_there_is_one() -> None:
    reply = Reply(True, "m")
    choices = [Choice(0, "7", "stop", "maybe 8"), Choice(1, "6", "stop", None)]
    body = reply.full(choices, usage_of(3, 9, 6), None).model_dump(mode="json")
    assert [c["message"] for c in body["choices"]] == [
        {
            "role": "assistant",
            "content": "7",
            "reasoning": "maybe 8",
            "reasoning_content": "maybe 8",
        },
        {"role": "assistant", "content": "6"},
    ]
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
    assert "completion_tokens_details" not in usage_of(3, 9).model_dump(mode="json")
    deltas = [
        (c["choices"][0]["index"], c["choices"][0]["delta"])
        for c in _chunks(reply, choices)
        if c["choices"]
    ]
    assert deltas == [
        (0, {"reasoning": "maybe 8", "reasoning_content": "maybe 8"}),
        (0, {"content": "7"}),
        (0, {}),
        (1, {"role": "assistant", "content": "6"}),
        (1, {}),
    ]


def test_a_text_reply_carries_the_thought_beside_its_text() -> None:
    reply = Reply(False, "m")
    choices = [Choice(0, "7", "stop", "maybe 8")]
    (choice,) = reply.full(choices, usage_of(3, 9), None).model_dump(mode="json")["choices"]
    assert (choice["text"], choice["reasoning"], choice["reasoning_content"]) == (
        "7",
        "maybe 8",
        "maybe 8",
    )
    pieces = [c["choices"][0] for c in _chunks(reply, choices) if c["choices"]]
    assert [(p["text"], p.get("reasoning"), p.get("reasoning_content")) for p in pieces] == [
        ("", "maybe 8", "maybe 8"),
        ("7", None, None),
        ("", None, None),
    ]
