"""A question's ballots over a reasoning model's samples: only final answers vote.

The samples are what the fake upstream writes for each shape of thought (a
reasoning parser's fields, raw ``<think>``, R1's, harmony), parsed as the
OpenAI engine parses them and keyed by the service's keyers.
"""

from __future__ import annotations

import pytest
from blendserve.answers import KINDS, AnswerKeys, AnswerKind, ReasoningTags, make_keyer
from blendserve.core.votes import VoteState
from blendserve.engines.base import Sample
from blendserve.engines.openai.wire import parse_samples
from blendserve.scheduler.ballots import TRUNCATED_LIMIT, Ballots
from blendserve.scheduler.spec import Keyer
from blendserve.testing.fake_openai import (
    CUT_TAIL,
    THOUGHT,
    THOUGHT_SHAPES,
    FakeState,
    completion_body,
)

from tests.support.fake_engine import last_word
from tests.support.running import run_coroutine

#: One state for every keyer here (no worker process is needed for these answers).
KEYS = AnswerKeys()
PATTERN = r"answer is (\w)"


def _add_all(ballots: Ballots, samples: list[Sample], keyer: Keyer) -> list[str | None]:
    async def add() -> list[str | None]:
        return [await ballots.add(sample, keyer) for sample in samples]

    return run_coroutine(add())


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "text"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", THOUGHT_SHAPES)
def test_every_kind_votes_on_the_final_answer_of_every_shape(
    shape: str, kind: AnswerKind, chat: bool
) -> None:
    answer = "C" if kind == "choice" else "7"
    state = FakeState(name="up", thoughts=shape, answers=(answer,), cut_every=3, reasoning_tokens=2)
    samples = parse_samples(completion_body(state, 6, chat), chat, "up")
    keyer = make_keyer(kind, PATTERN if kind == "regex" else None, KEYS)
    ballots = Ballots()
    keys = _add_all(ballots, samples, keyer)
    # Each sample keys as its final answer alone would; the 3rd and 6th thought past max_tokens.
    finals = [f"up:{i} so the final answer is {answer}." for i in range(1, 7)]
    alone = _add_all(Ballots(), [Sample(f, "stop", 0, 0, "up") for f in finals], keyer)
    assert keys == [None if i in (2, 5) else key for i, key in enumerate(alone)]
    assert all(key is not None for key in alone)
    assert ballots.truncated == 1 and ballots.abstained_finish_reason == "length"
    # R1's cut thought has no marker at all: cut by its finish reason, it reads as all text.
    cut = (THOUGHT + CUT_TAIL, None) if shape == "r1" else ("", THOUGHT + CUT_TAIL)
    assert (ballots.last_truncated, ballots.abstained_thought) == cut
    assert {completion for _, completion in ballots.answers.values()} <= set(finals)
    assert set(ballots.thoughts.values()) == {THOUGHT}
    assert ballots.usage.samples == 6 and ballots.usage.reasoning_tokens == 12


def test_a_thought_that_never_closed_is_cut_whatever_the_finish_reason() -> None:
    ballots = Ballots()
    cut = Sample("<think>12*12 = 144. But let me double check", "stop", 5, 9, "up")
    keyer = make_keyer("number", keys=KEYS)
    assert _add_all(ballots, [cut] * TRUNCATED_LIMIT, keyer) == [None] * TRUNCATED_LIMIT
    assert ballots.is_cut and ballots.stop_if_cut()
    votes = VoteState(1)
    event = ballots.answer_event(votes, 0, index=0, id="q", settled_early=False, partial=False)
    assert (event.answer, event.abstained, event.abstained_finish_reason) == (None, "", "length")
    assert event.abstained_thought == "12*12 = 144. But let me double check"
    assert event.stopped == "truncated" and event.usage.reasoning_tokens is None


def test_the_winners_thought_comes_with_its_completion() -> None:
    ballots, votes = Ballots(), VoteState(1)
    keyer = make_keyer("auto", keys=KEYS)
    texts = ["<think>\\boxed{8}</think>The answer is 7.", "7 at once", "<think>hmm</think>6"]
    for key in _add_all(ballots, [Sample(t, "stop", 1, 1, "up") for t in texts], keyer):
        votes.add(0, key)
    event = ballots.answer_event(votes, 0, index=0, id="q", settled_early=False, partial=False)
    assert (event.key, event.completion, event.reasoning) == ("7", "The answer is 7.", "\\boxed{8}")
    assert event.thoughts == {"7": "\\boxed{8}", "6": "hmm"}


def test_the_keyers_tags_read_the_thought_and_a_plain_keyer_reads_the_default_ones() -> None:
    tags = ReasoningTags("<reasoning>", "</reasoning>")
    keyer = make_keyer("number", keys=KEYS, reasoning_tags=tags)
    assert keyer.reasoning_tags == tags
    ballots = Ballots()
    text = "<reasoning>#### 144</reasoning>The answer is 7. <think>not a thought here</think>"
    assert _add_all(ballots, [Sample(text, "stop", 1, 1, "up")], keyer) == ["7"]
    assert ballots.thoughts == {"7": "#### 144"}
    plain = Sample("<think>so it is 8</think>so it is 9", "stop", 1, 1, "up")
    assert _add_all(Ballots(), [plain], last_word) == ["9"]
