"""The trace model: rules parse and print, a learner trusts only a measure that shows a
signal, weights and bars follow from what it trusts."""

from __future__ import annotations

import random

import pytest
from blendserve.core.signals import Confidence
from blendserve.core.traces import (
    FLOOR,
    MIN_EACH,
    TraceFacts,
    TraceLearner,
    TraceRule,
    parse_trace_rule,
)
from blendserve.core.votes import VoteState


def _learner(separation: float, questions: int = 120, seed: int = 0) -> TraceLearner:
    """A learner fed questions of 8 samples whose agreeing ones have a confidence
    ``separation`` standard deviations higher (0: the confidence is noise)."""
    rng = random.Random(seed)
    learner = TraceLearner()
    for _ in range(questions):
        level = rng.gauss(11.0, 1.0)  # questions differ: only the within-question shift tells
        facts = []
        for _ in range(8):
            agreed = rng.random() < 0.6
            value = level + rng.gauss(separation if agreed else 0.0, 1.0)
            tokens = rng.randint(100, 500)
            facts.append(TraceFacts(tokens, Confidence(value, value - 1.0, value), agreed))
        learner.learn(facts)
    return learner


def test_rules_parse_and_print_round_trip() -> None:
    rule = parse_trace_rule("weighted:measure=tail,cut=10,first_m=2")
    assert rule == TraceRule("weighted", "tail", cut=10.0, first_m=2)
    assert parse_trace_rule(str(rule)) == rule
    assert parse_trace_rule("count").is_count
    assert parse_trace_rule("filter:keep=0.5").keep == 0.5


@pytest.mark.parametrize(
    "text", ["vote", "weighted:measure=loud", "filter:keep=0", "count:cut=100", "count:first_m=0"]
)
def test_a_bad_rule_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_trace_rule(text)


def test_what_a_rule_reads() -> None:
    assert not TraceRule().reads_confidence and not TraceRule().learns
    assert not TraceRule("weighted", "length").reads_confidence
    assert TraceRule(cut=10).reads_confidence and TraceRule(cut=10).learns
    assert TraceRule(first_m=2).learns and not TraceRule(first_m=2).reads_confidence


def test_first_m_waits_for_length_to_tell() -> None:
    rule = TraceRule(first_m=2)
    assert _learner(separation=1.0).first_m(rule) is None  # lengths were drawn independently
    learner = TraceLearner()
    for _ in range(20):  # the short samples agreed, the long ones did not
        learner.learn([TraceFacts(100 + i, None, True) for i in range(4)])
        learner.learn(
            [TraceFacts(100 + i, None, True) for i in range(4)]
            + [TraceFacts(400 + i, None, False) for i in range(4)]
        )
    assert learner.strength("length") > 0.5
    assert learner.first_m(rule) == 2
    assert learner.first_m(TraceRule()) is None


def test_noise_is_never_trusted_and_changes_nothing() -> None:
    learner = _learner(separation=0.0)
    for measure in ("tail", "mean", "lowest_group", "length"):
        assert learner.strength(measure) == 0.0
    low = Confidence(5.0, 4.0, 5.0)
    for rule in (TraceRule("weighted"), TraceRule("filter", keep=0.5), TraceRule(cut=50)):
        assert learner.weight(rule, 300, low) == 1.0
    assert learner.bar(TraceRule(cut=50)) is None


def test_an_informative_measure_weighs_and_cuts() -> None:
    learner = _learner(separation=1.0)
    assert learner.strength("tail") > 0.5
    assert learner.strength("length") == 0.0  # lengths were drawn independently
    assert learner.chosen(TraceRule("weighted")) in ("tail", "mean", "lowest_group")
    rule = TraceRule("weighted", "tail")
    high, low = Confidence(14.0, 13.0, 14.0), Confidence(8.0, 7.0, 8.0)
    assert learner.weight(rule, 300, high) == 1.0
    assert FLOOR <= learner.weight(rule, 300, low) < 0.6
    filtered = TraceRule("filter", "tail", keep=0.9)
    assert learner.weight(filtered, 300, low) == FLOOR
    assert learner.weight(filtered, 300, high) == 1.0
    bar = learner.bar(TraceRule(cut=10))
    assert bar is not None
    # The 10th percentile of the lowest groups seen: about 1.3 standard deviations down.
    assert 8.0 < bar < 10.5


def test_a_learner_waits_for_enough_samples_of_each_side() -> None:
    learner = TraceLearner()
    facts = [TraceFacts(100, Confidence(10.0 + i, 9.0, 10.0 + i), True) for i in range(200)]
    learner.learn(facts)  # all agree: nothing to tell apart
    assert learner.strength("tail") == 0.0
    assert MIN_EACH > 1


def test_a_trace_with_no_confidence_counts_whole() -> None:
    learner = _learner(separation=1.0)
    assert learner.weight(TraceRule("weighted", "tail"), 300, None) == 1.0
    assert learner.chosen(TraceRule("weighted"), reads_confidence=False) == "length"


def test_weighted_votes_lead_and_round() -> None:
    votes = VoteState(1)
    votes.add(0, "a", 0.4)
    votes.add(0, "a", 0.4)
    votes.add(0, "b", 1.0)
    assert votes.answer(0) == "b"  # 1.0 against 0.8
    assert votes.state(0) == (1, 1, 2)
    votes.add(0, "a", 0.4)
    assert votes.answer(0) == "a"  # 1.2 now
    assert votes.counts[0] == pytest.approx({"a": 1.2, "b": 1.0})
    assert votes.num_samples[0] == 4


def test_a_weight_never_lifts_a_count_past_its_samples() -> None:
    votes = VoteState(1)
    with pytest.raises(ValueError):
        votes.add(0, "a", 1.5)
    for _ in range(5):
        votes.add(0, "a", 0.99)
    assert votes.n1[0] <= votes.num_samples[0]


def test_unweighted_votes_stay_whole_numbers() -> None:
    votes = VoteState(1)
    votes.add(0, "x")
    votes.add(0, "x")
    assert votes.counts[0] == {"x": 2} and isinstance(votes.counts[0]["x"], int)


def test_a_filter_answers_with_its_most_confident_share_once_trusted() -> None:
    voters = [
        ("a", 300, Confidence(9.0, 8.0, 9.0)),
        ("a", 300, Confidence(9.5, 8.5, 9.5)),
        ("a", 300, Confidence(9.2, 8.2, 9.2)),
        ("b", 300, Confidence(13.0, 12.0, 13.0)),
        ("b", 300, Confidence(12.5, 11.5, 12.5)),
    ]
    rule = TraceRule("filter", "tail", keep=0.4)
    assert _learner(separation=1.0).kept_answer(rule, voters) == "b"  # the surest two
    assert _learner(separation=0.0).kept_answer(rule, voters) is None  # noise: the vote stands
    assert _learner(separation=1.0).kept_answer(TraceRule("weighted", "tail"), voters) is None
    # A tie among those kept goes to the answer of the surest.
    tie = [("a", 300, Confidence(12.0, 11.0, 12.0)), ("b", 300, Confidence(13.0, 12.0, 13.0))]
    assert _learner(separation=1.0).kept_answer(TraceRule("filter", "tail", keep=1.0), tie) == "b"


def test_a_weaker_signal_filters_fewer_votes() -> None:
    rule = TraceRule("filter", keep=0.1)
    assert TraceLearner.kept_share(rule, 1.0) == pytest.approx(0.1)
    assert TraceLearner.kept_share(rule, 0.5) == pytest.approx(0.55)
    assert TraceLearner.kept_share(rule, 0.0) == pytest.approx(1.0)


def test_a_whole_weight_keeps_counts_whole() -> None:
    votes = VoteState(1)
    votes.add(0, "x", 1.0)
    votes.add(0, "x", 1.0)
    assert votes.counts[0] == {"x": 2} and isinstance(votes.counts[0]["x"], int)
