"""Replica choice: least outstanding, rendezvous affinity with slack, health streaks."""

from __future__ import annotations

import pytest
from blendserve.engines._replicas import Replica, ReplicaSet

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
    replicas.replicas[2].healthy = False
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
    assert replicas.unhealthy() == [a]
    assert all(replicas.pick() is b for _ in range(4))
    assert replicas.snapshot() == {URLS[0]: False, URLS[1]: True}
    replicas.record_failure(b)
    replicas.record_failure(b)
    assert replicas.pick() is None
    replicas.record_success(a)
    assert replicas.pick() is a and a.failures == 0


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
