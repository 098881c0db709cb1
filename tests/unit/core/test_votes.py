import numpy as np
import pytest
from blendserve.core import VoteState


def test_counts_and_derived_arrays() -> None:
    votes = VoteState(2)
    for key in ["a", "b", "a", None, "c", "b", "b"]:
        votes.add(0, key)
    assert votes.counts[0] == {"a": 2, "b": 3, "c": 1}
    assert votes.state(0) == (3, 2, 3)
    assert votes.answer(0) == "b"
    arrays = votes.arrays()
    np.testing.assert_array_equal(arrays["num_samples"], [7, 0])
    np.testing.assert_array_equal(arrays["n1"], [3, 0])
    assert votes.answer(1) is None


def test_a_tie_keeps_the_answer_that_reached_the_count_first() -> None:
    votes = VoteState(1)
    for key in ["x", "y", "y", "x"]:
        votes.add(0, key)
    assert votes.state(0) == (2, 2, 2)
    assert votes.answer(0) == "y"


def test_runner_up_tracks_second_largest_count() -> None:
    votes = VoteState(1)
    for key in ["a", "a", "a", "b", "c", "c", "b", "b"]:
        votes.add(0, key)
    assert votes.state(0) == (3, 3, 3)
    votes.add(0, "b")
    assert votes.state(0) == (4, 3, 3)
    assert votes.answer(0) == "b"


def test_needs_a_question() -> None:
    with pytest.raises(ValueError):
        VoteState(0)
