"""A trace's confidence as DeepConf defines it, read one token at a time."""

from __future__ import annotations

import math

import pytest
from blendserve.core.signals import Confidence, ConfidenceMeter, ConfidenceSpec, token_confidence
from hypothesis import given
from hypothesis import strategies as st


def test_a_tokens_confidence_is_minus_the_mean_of_its_top_k_logprobs() -> None:
    assert token_confidence([-0.1, -2.0, -3.0], k=2) == pytest.approx(1.05)
    # the sampled token's own logprob beside the top k: the k largest count
    assert token_confidence([-5.0, -0.1, -2.0, -3.0], k=3) == pytest.approx(5.1 / 3)
    # a masked entry is not finite; a token with none finite is not read
    assert token_confidence([-math.inf, -1.0], k=2) == pytest.approx(1.0)
    assert token_confidence([-math.inf, math.nan], k=2) is None


def _meter(confidences: list[float], spec: ConfidenceSpec) -> ConfidenceMeter:
    meter = ConfidenceMeter(spec)
    for c in confidences:
        meter.add([-c])  # one logprob of -c: confidence c
    return meter


def test_the_lowest_group_is_the_lowest_sliding_window_mean() -> None:
    values = [3.0, 3.0, 1.0, 1.0, 3.0, 3.0, 2.0]
    summary = _meter(values, ConfidenceSpec(top_logprobs=1, window=2, tail=3, block=3)).summary()
    assert summary is not None
    assert summary.mean == pytest.approx(sum(values) / 7)
    assert summary.lowest_group == pytest.approx(1.0)
    assert summary.tail == pytest.approx((3 + 3 + 2) / 3)
    assert summary.tokens == 7
    assert summary.groups == pytest.approx((7 / 3, 7 / 3, 2.0))


def test_a_trace_shorter_than_the_window_is_one_group() -> None:
    summary = _meter([1.0, 2.0], ConfidenceSpec(top_logprobs=1, window=8)).summary()
    assert summary is not None
    assert summary.lowest_group == pytest.approx(1.5) == summary.mean


def test_a_trace_with_no_token_read_has_no_confidence() -> None:
    assert ConfidenceMeter(ConfidenceSpec()).summary() is None


def test_the_window_so_far_is_known_once_full() -> None:
    meter = _meter([1.0, 2.0], ConfidenceSpec(top_logprobs=1, window=3))
    assert meter.group() is None
    meter.add([-6.0])
    assert meter.group() == pytest.approx(3.0)


def test_a_spec_scales_to_short_chains() -> None:
    spec = ConfidenceSpec().scaled(512)
    assert (spec.window, spec.tail, spec.block) == (64, 64, 16)
    assert ConfidenceSpec().scaled(None) == ConfidenceSpec()
    assert ConfidenceSpec().scaled(40).window == 16  # never below 16 tokens
    assert ConfidenceSpec(block=0).scaled(512).block == 0
    with pytest.raises(ValueError, match="top_logprobs"):
        ConfidenceSpec(top_logprobs=21)


@given(
    st.lists(st.floats(0.0, 20.0), min_size=1, max_size=60),
    st.integers(1, 8),
    st.integers(1, 4),
)
def test_the_trajectory_replays_the_window_at_every_block_end(
    values: list[float], block: int, blocks: int
) -> None:
    """A window of whole blocks, replayed from the trajectory, is the meter's own."""
    spec = ConfidenceSpec(top_logprobs=1, window=block * blocks, tail=1, block=block)
    meter = ConfidenceMeter(spec)
    live = {}
    for i, c in enumerate(values, start=1):
        meter.add([-c])
        if i % block == 0 and meter.group() is not None:
            live[i] = meter.group()
    summary = meter.summary()
    assert summary is not None
    replayed = {read: value for read, value in summary.windows(blocks) if read % block == 0}
    assert replayed.keys() == live.keys()
    for read, value in live.items():
        assert replayed[read] == pytest.approx(value, abs=1e-9)
    if live:
        assert min(live.values()) >= summary.lowest_group - 1e-9


def test_a_summary_round_trips_through_json() -> None:
    summary = _meter([1.0, 2.0, 4.0], ConfidenceSpec(top_logprobs=1, window=2, block=2)).summary()
    assert summary is not None
    again = Confidence.from_json(summary.to_json(), summary.groups_json())
    assert again == Confidence(
        round(summary.mean, 4), 1.5, round(summary.tail, 4), 3, 2, 2, (1.5, 4.0)
    )


@pytest.mark.parametrize(
    ("summary", "groups", "message"),
    [
        ({"mean": 1.0, "lowest_group": 1.0}, (), "tail"),
        ({"mean": "x", "lowest_group": 1.0, "tail": 1.0}, (), "mean"),
        ({"mean": 1.0, "lowest_group": math.inf, "tail": 1.0}, (), "lowest_group"),
        ({"mean": 1.0, "lowest_group": 1.0, "tail": 1.0, "tokens": -1}, (), "tokens"),
        ({"mean": 1.0, "lowest_group": 1.0, "tail": 1.0}, (1.0,), "block"),
        ({"mean": 1.0, "lowest_group": 1.0, "tail": 1.0, "block": 2}, ("a",), "groups"),
    ],
)
def test_a_bad_summary_is_refused(summary: dict, groups: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Confidence.from_json(summary, groups)
