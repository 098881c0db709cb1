"""Reasoning models: answers are read from the final answer, never from a thought.

The shapes are those reasoning models write with no reasoning parser upstream:
``<think>...</think>``, R1's thought with no opening tag, gpt-oss's harmony
channels (with and without their special tokens), and thoughts cut at
``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from blendserve.core.answers import (
    DEFAULT_REASONING_TAGS,
    KINDS,
    ReasoningTags,
    Thought,
    extract,
    read_thought,
)
from hypothesis import given, settings
from hypothesis import strategies as st

#: The issue's example: a box inside the thought, the answer after it.
R1_THOUGHT = "Let me see, 3+4 is 7? no wait maybe \\boxed{8}. Hmm."
R1_EXAMPLE = f"<think>{R1_THOUGHT}</think>\n\nThe answer is 7."
CUT_EXAMPLE = "<think>Squares: 11*11 = 121, 12*12 = 144. But let me double check 12*12=144"
HARMONY = (
    "<|channel|>analysis<|message|>maybe \\boxed{8}? 12*12 = 144<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The final answer is \\boxed{7}.<|return|>"
)
PATTERN = r"answer is (\d+)"

#: Each shape as a function of (thought, final answer); None: the thought was cut.
Shape = Callable[[str, str | None], str]
SHAPES: dict[str, Shape] = {
    "tags": lambda t, f: f"<think>{t}" + ("" if f is None else f"</think>\n\n{f}"),
    "r1": lambda t, f: t + ("" if f is None else f"</think>\n\n{f}"),
    "harmony": lambda t, f: (
        f"<|channel|>analysis<|message|>{t}"
        + (
            ""
            if f is None
            else f"<|end|><|start|>assistant<|channel|>final<|message|>{f}<|return|>"
        )
    ),
    "harmony-skipped": lambda t, f: f"analysis{t}" + ("" if f is None else f"assistantfinal{f}"),
}


def _extract(text: str, kind: str) -> str | None:
    return extract(text, kind, PATTERN if kind == "regex" else None)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("auto", "7"), ("number", "7"), ("math", None), ("exact", "The answer is 7.")],
)
def test_a_box_in_the_thought_never_wins_over_the_final_answer(
    kind: str, expected: str | None
) -> None:
    # math reads a box or "final answer is": without the thought, this sample has neither.
    assert extract(R1_EXAMPLE, kind) == expected == extract("The answer is 7.", kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_thought_cut_at_max_tokens_has_no_answer_in_any_kind(kind: str) -> None:
    assert _extract(CUT_EXAMPLE, kind) is None
    assert read_thought(CUT_EXAMPLE) == Thought(
        "", "Squares: 11*11 = 121, 12*12 = 144. But let me double check 12*12=144", cut=True
    )


@pytest.mark.parametrize(
    ("text", "thought"),
    [
        (R1_EXAMPLE, Thought("The answer is 7.", R1_THOUGHT)),
        ("3+4 is 7</think>\n\nSo: \\boxed{7}", Thought("So: \\boxed{7}", "3+4 is 7")),
        (HARMONY, Thought("The final answer is \\boxed{7}.", "maybe \\boxed{8}? 12*12 = 144")),
        ("analysisWe need 12*12.assistantfinal144", Thought("144", "We need 12*12.")),
        ("<think>\n\n</think>\n\n42", Thought("42")),  # Qwen3's empty thought
        ("The answer is 7.", Thought("The answer is 7.")),
        ("<think>a</think>b<think>c", Thought("b", "a\n\nc", cut=True)),  # a second thought, cut
        ("<|channel|>analysis<|message|>12*12 = 144", Thought("", "12*12 = 144", cut=True)),
        ("<|channel|>anal", Thought("", None, cut=True)),  # cut inside harmony's header
    ],
    ids=lambda value: "" if isinstance(value, Thought) else value[:24],
)
def test_each_shape_reads_as_thought_and_answer(text: str, thought: Thought) -> None:
    assert read_thought(text) == thought


def test_harmony_reads_the_last_final_message_past_commentary() -> None:
    text = (
        "<|channel|>analysis<|message|>think 1<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
        '{"x": 5}<|call|>'
        "<|start|>assistant<|channel|>final<|message|>draft 3<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>think 2<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Answer: 4"
    )
    assert read_thought(text) == Thought("Answer: 4", "think 1\n\nthink 2")
    assert extract(text, "number") == "4"


def test_other_tags_are_a_setting() -> None:
    tags = ReasoningTags.parse(" <reasoning> , </reasoning> ")
    assert tags == ReasoningTags("<reasoning>", "</reasoning>")
    text = "<reasoning>maybe \\boxed{8}</reasoning>The answer is \\boxed{7}."
    assert extract(text, "math", reasoning_tags=tags) == "7"
    assert extract(text, "math") == "7"  # <think> tags: the whole text is read, last box wins
    assert extract("<reasoning>maybe \\boxed{8}", "math", reasoning_tags=tags) is None
    assert extract("<reasoning>maybe \\boxed{8}", "math") == "8"
    assert ReasoningTags.parse("<think>,</think>") == DEFAULT_REASONING_TAGS


@pytest.mark.parametrize("text", ["<think>", "<think>,", ",</think>", "<t>,</t>,<u>", "<t>,<t>"])
def test_reasoning_tags_are_two_different_tags(text: str) -> None:
    with pytest.raises(ValueError):
        ReasoningTags.parse(text)


def test_a_long_hostile_thought_reads_in_linear_time() -> None:
    text = "<|channel|>analysis<|message|>" * 20_000 + "<think>" * 20_000 + "</think>x"
    assert read_thought(text).cut  # harmony, and no final message
    assert read_thought("</think>" * 50_000 + "7").content == "7"


# Thoughts full of would-be answers: numbers, boxes (closed or not), "####", choices, phrases.
_DECOYS = st.one_of(
    st.integers(-10_000, 10_000).map(str),
    st.sampled_from(
        [
            "\\boxed{8}", "\\boxed{", "}", "#### 144", "Answer: (B)", "the answer is 9",
            "final answer is 3", "So the correct answer is D", "$", "\n", " ", "(C)", "\\fbox{2}",
        ]
    ),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ0123456789.,:=+*()\n", max_size=24),
)  # fmt: skip
THOUGHTS = st.lists(_DECOYS, max_size=12).map(" ".join)
FINALS = st.one_of(
    st.integers(0, 999).map(lambda n: f"The answer is {n}."),
    st.integers(0, 999).map(lambda n: f"So the final answer is $\\boxed{{{n}}}$."),
    st.integers(0, 999).map(lambda n: f"#### {n}"),
    st.sampled_from("ABCDEFGHIJ").map(lambda c: f"Answer: ({c})"),
    st.sampled_from(["I cannot tell.", "No idea", "unsure"]),  # no answer at all
)


@settings(max_examples=300, deadline=None)
@given(thought=THOUGHTS, final=FINALS, shape=st.sampled_from(sorted(SHAPES)))
def test_a_thought_never_votes_in_any_kind(thought: str, final: str, shape: str) -> None:
    text = SHAPES[shape](thought, final)
    for kind in KINDS:
        assert _extract(text, kind) == _extract(final, kind), kind


@settings(max_examples=200, deadline=None)
@given(thought=THOUGHTS, shape=st.sampled_from(["tags", "harmony"]))
def test_a_cut_thought_never_votes_in_any_kind(thought: str, shape: str) -> None:
    text = SHAPES[shape](thought, None)
    assert read_thought(text).cut
    for kind in KINDS:
        assert _extract(text, kind) is None, kind
