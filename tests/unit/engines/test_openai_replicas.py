"""Replica choice: least outstanding, rendezvous affinity with slack, circuit breakers."""

from __future__ import annotations

import pytest
from blendserve.engines.openai._replicas import BreakerState, Replica, ReplicaSet
from blendserve.testing.stats import RecordingStats

URLS = ["http://a/v1", "http://b/v1", "http://c/v1"]


def _home(replicas: ReplicaSet, key: str) -> Replica:
    """The key's replica when every load is equal."""
    chosen = replicas.pick(key)
    assert chosen is not None
    return chosen


def test_least_outstanding_wins() -> None:
    replicas = ReplicaSet(URLS)
    for replica, load in zip(replicas.replicas, [3, 1, 2], strict=True):
        replica.outstanding = load
    assert replicas.pick() is replicas.replicas[1]


def test_ties_rotate_and_acquire_charges_weight() -> None:
    replicas = ReplicaSet(URLS)
    chosen = [replicas.acquire() for _ in range(6)]
    assert [r.outstanding for r in replicas.replicas] == [2, 2, 2]
    assert {id(r) for r in chosen[:3]} == {id(r) for r in replicas.replicas}
    heavy = replicas.acquire(weight=8)
    assert heavy is not None and heavy.outstanding == 10
    replicas.release(heavy, 8)
    assert heavy.outstanding == 2


def test_a_look_does_not_advance_the_turn() -> None:
    replicas = ReplicaSet(URLS)
    first = replicas.pick(rotate=False)
    assert all(replicas.pick(rotate=False) is first for _ in range(5))


def test_same_key_same_replica_while_within_slack() -> None:
    replicas = ReplicaSet(URLS, affinity_slack=4)
    home = _home(replicas, "q1")
    for _ in range(5):  # the home replica takes loads 0..4 while the others stay at 0
        assert replicas.acquire("q1") is home
    assert home.outstanding == 5
    moved = replicas.pick("q1")
    assert moved is not home and moved is not None and moved.outstanding == 0


def test_overloaded_home_falls_back_to_the_next_rendezvous_choice() -> None:
    replicas = ReplicaSet(URLS, affinity_slack=0)
    home = _home(replicas, "q9")
    home.outstanding = 1
    second = replicas.pick("q9")
    assert second is not None and second is not home
    # The fallback is itself sticky: the same second choice every time.
    assert all(replicas.pick("q9") is second for _ in range(5))


def test_slack_grows_with_load() -> None:
    replicas = ReplicaSet(URLS, affinity_slack=4)
    home = _home(replicas, "q2")
    for replica in replicas.replicas:
        replica.outstanding = 40
    home.outstanding = 50  # least + max(4, 40 // 4)
    assert replicas.pick("q2") is home
    home.outstanding = 51
    assert replicas.pick("q2") is not home


def test_removing_a_replica_moves_only_its_keys() -> None:
    replicas = ReplicaSet(URLS)
    keys = [f"q{i}" for i in range(300)]
    before = {k: _home(replicas, k).url for k in keys}
    assert len(set(before.values())) == 3
    replicas.replicas[2].state = BreakerState.OPEN
    after = {k: _home(replicas, k).url for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != URLS[2])
    assert URLS[2] not in after.values()


def test_avoid_prefers_untried_replicas_then_falls_back() -> None:
    replicas = ReplicaSet(URLS[:2])
    a, b = replicas.replicas
    assert replicas.pick("k", avoid=[a]) is b
    assert replicas.pick("k", avoid=[b]) is a
    assert replicas.pick("k", avoid=[a, b]) in (a, b)
    assert replicas.has_untried([a])
    assert not replicas.has_untried([a, b])


def test_failure_streak_takes_out_and_success_brings_back() -> None:
    replicas = ReplicaSet(URLS[:2], failure_threshold=2)
    a, b = replicas.replicas
    assert not replicas.record_failure(a)
    replicas.record_success(a)
    assert not replicas.record_failure(a)
    assert replicas.record_failure(a)
    assert not replicas.record_failure(a)  # already out: reported once
    assert a.state is BreakerState.OPEN and not a.healthy
    assert all(replicas.pick() is b for _ in range(4))
    assert replicas.snapshot() == {URLS[0]: False, URLS[1]: True}
    replicas.record_failure(b)
    replicas.record_failure(b)
    assert replicas.pick() is None
    replicas.record_success(a)
    assert replicas.pick() is a and a.failures == 0


def test_breaker_opens_half_opens_on_a_probe_and_closes_on_a_trial() -> None:
    url = "http://breaker-a/v1"
    sink = RecordingStats()
    replicas = ReplicaSet([url], failure_threshold=3, sink=sink)
    (a,) = replicas.replicas
    assert a.state is BreakerState.CLOSED and sink.health(url) == 1.0
    assert [replicas.record_failure(a) for _ in range(3)] == [False, False, True]
    assert a.state is BreakerState.OPEN and sink.health(url) == 0.0
    assert replicas.pick() is None and replicas.acquire() is None  # refused, no waiting
    assert replicas.snapshot() == {url: False}
    assert replicas.to_probe() == [a] and replicas.recovering()
    assert replicas.record_probe(a)
    assert a.state is BreakerState.HALF_OPEN and sink.health(url) == 0.5
    assert replicas.snapshot() == {url: True}
    assert replicas.to_probe() == []  # its trial is still to come
    trial = replicas.acquire(weight=2)
    assert trial is a
    assert replicas.pick() is None  # one trial at a time
    assert replicas.to_probe() == [a]
    # A trial that hangs does not hold the replica: each good probe admits one more.
    assert not replicas.record_probe(a)
    assert replicas.acquire() is a and replicas.pick() is None
    replicas.release(a)
    replicas.release(a, 2)
    replicas.record_success(a)
    assert a.state is BreakerState.CLOSED and sink.health(url) == 1.0 and a.failures == 0
    assert not replicas.recovering()


def test_a_failed_trial_reopens_at_once() -> None:
    url = "http://breaker-b/v1"
    sink = RecordingStats()
    replicas = ReplicaSet([url, "http://breaker-c/v1"], failure_threshold=3, sink=sink)
    a, b = replicas.replicas
    for _ in range(3):
        replicas.record_failure(a)
    replicas.record_probe(a)
    assert replicas.record_failure(a)  # one failure, not three
    assert a.state is BreakerState.OPEN and sink.health(url) == 0.0
    assert all(replicas.pick() is b for _ in range(3))
    assert not replicas.record_probe(b)  # a closed breaker stays closed
    assert b.state is BreakerState.CLOSED


def test_a_half_open_replica_is_tried_only_when_untried_replicas_are_not_left() -> None:
    replicas = ReplicaSet(["http://breaker-d/v1", "http://breaker-e/v1"], failure_threshold=1)
    a, b = replicas.replicas
    replicas.record_failure(a)
    replicas.record_probe(a)
    assert replicas.has_untried([b]) and not replicas.has_untried([a, b])
    assert replicas.acquire(avoid=[b]) is a  # its trial is in flight
    assert not replicas.has_untried([b])
    assert replicas.pick(avoid=[b]) is b


@pytest.mark.parametrize(
    ("urls", "kwargs"),
    [
        ([], {}),
        (["http://a/v1", "http://a/v1"], {}),
        (URLS, {"failure_threshold": 0}),
        (URLS, {"affinity_slack": -1}),
    ],
)
def test_bad_configuration_is_rejected(urls: list[str], kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ReplicaSet(urls, **kwargs)
