from typing import Any

import pytest
from blendserve.core.stragglers import Stragglers


def test_no_straggler_until_enough_samples_came_back() -> None:
    stragglers = Stragglers(multiple=4, floor=0.0, min_peers=3)
    stragglers.observe(1.0)
    stragglers.observe(1.0)
    assert stragglers.after() is None and not stragglers.is_straggler(1e9)
    stragglers.observe(1.0)
    assert stragglers.after() == 4.0
    assert stragglers.is_straggler(4.5) and not stragglers.is_straggler(4.0)


def test_a_multiple_of_the_median_not_the_mean_and_at_least_the_floor() -> None:
    stragglers = Stragglers(multiple=4, floor=1.0, min_peers=3)
    for seconds in (0.1, 0.1, 0.1, 0.1, 60.0):  # one slow sample does not move the median
        stragglers.observe(seconds)
    assert stragglers.after() == 1.0  # 4 x 0.1 s is under the floor
    for seconds in (2.0, 2.0, 2.0, 2.0, 2.0):
        stragglers.observe(seconds)
    assert stragglers.after() == 8.0


def test_the_median_is_of_the_latest_samples() -> None:
    stragglers = Stragglers(multiple=2, floor=0.0, min_peers=1, window=3)
    for seconds in (1.0, 1.0, 1.0, 5.0, 5.0):
        stragglers.observe(seconds)
    assert stragglers.after() == 10.0


@pytest.mark.parametrize(
    "bad", [{"multiple": 0}, {"floor": -1.0}, {"min_peers": 0}, {"min_peers": 4, "window": 3}]
)
def test_bad_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Stragglers(**bad)
