"""Replica set of an OpenAI-compatible engine: balancing, affinity and a circuit breaker each.

Plain bookkeeping mutated from one event loop, with no I/O: the engine
probes unhealthy replicas and reports the results back. Load counts sequences
(an ``n=8`` request weighs 8), as that is what loads a vLLM replica. The rules
are :meth:`ReplicaSet.pick`'s and the ``record_*`` methods'; docs/engines.md
and docs/operations.md ("Upstream faults") say them for operators.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum

from blendserve.engines.engine_cost import Busy
from blendserve.stats import NO_STATS, Stats

__all__ = ["BreakerState", "Replica", "ReplicaSet"]


class BreakerState(Enum):
    """Circuit breaker state of one replica; the value is its health gauge."""

    CLOSED = 1.0
    HALF_OPEN = 0.5
    OPEN = 0.0


@dataclass(eq=False)
class Replica:
    """One upstream base URL (normalised, ending in ``/v1``) and what is known about it.

    ``outstanding`` counts its sequences in flight, ``trials`` the requests its
    half-open breaker takes at once, ``failures`` those since its last success,
    and ``n_honoured`` whether it returned ``n`` choices when asked (None: unknown).
    """

    url: str
    outstanding: int = 0
    busy: Busy = field(default_factory=Busy)
    trials: int = 1
    failures: int = 0
    state: BreakerState = BreakerState.CLOSED
    n_honoured: bool | None = None

    @property
    def healthy(self) -> bool:
        """Whether it takes requests at all (its breaker is not open)."""
        return self.state is not BreakerState.OPEN

    @property
    def available(self) -> bool:
        """Whether it takes a request now: closed, or half-open with a trial to spare."""
        state = self.state
        return state is BreakerState.CLOSED or (
            state is BreakerState.HALF_OPEN and self.busy.requests < self.trials
        )


def _rendezvous_score(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{url}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class ReplicaSet:
    """Data-parallel replicas with least-outstanding balancing and key affinity.

    ``urls`` are normalised and distinct; ``failure_threshold`` and
    ``affinity_slack`` are as in :class:`~blendserve.engines.config.Health`, and
    breaker states go to ``sink`` (see :meth:`report_to`).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        failure_threshold: int = 3,
        affinity_slack: int = 4,
        sink: Stats = NO_STATS,
    ) -> None:
        if not urls:
            raise ValueError("at least one upstream URL is needed")
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate upstream URLs: {list(urls)}")
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        if affinity_slack < 0:
            raise ValueError(f"affinity_slack must be >= 0, got {affinity_slack}")
        self.replicas: tuple[Replica, ...] = tuple(Replica(url) for url in urls)
        self._threshold = failure_threshold
        self._slack = affinity_slack
        self._turn = 0
        self.report_to(sink)

    def report_to(self, sink: Stats) -> None:
        """Reports breaker states to ``sink`` from now on, starting with each one's now."""
        self._sink = sink
        for replica in self.replicas:
            sink.upstream_health(replica.url, replica.state.value)

    def _set(self, replica: Replica, state: BreakerState) -> None:
        replica.state = state
        self._sink.upstream_health(replica.url, state.value)

    def pick(
        self, key: str | None = None, avoid: Collection[Replica] = (), *, rotate: bool = True
    ) -> Replica | None:
        """The replica the next request should go to, without taking it.

        Without a key, the least-loaded one, ties rotating; with a key, the first in
        the key's rendezvous order whose load is within ``max(affinity_slack, least // 4)``
        of the least-loaded's (the key's home replica unless it is clearly busier).

        Args:
            key: affinity key (the question id), or None.
            avoid: replicas already tried by this call; used only when some
                available replica is not in it.
            rotate: advance the tie-breaking turn (False for a mere look).

        Returns:
            The chosen replica, or None when none is available (every breaker
            open, or half-open with its trial in flight).
        """
        available = [r for r in self.replicas if r.available]
        candidates = [r for r in available if r not in avoid] if avoid else available
        if not candidates:
            candidates = available
            if not candidates:
                return None
        if len(candidates) == 1:
            return candidates[0]
        least = min(r.outstanding for r in candidates)
        if key is None:
            ties = [r for r in candidates if r.outstanding == least]
            if rotate:
                self._turn += 1
            return ties[self._turn % len(ties)]
        limit = least + max(self._slack, least // 4)
        ranked = sorted(candidates, key=lambda r: _rendezvous_score(key, r.url), reverse=True)
        # The least-loaded replica is always within the limit, so this returns.
        return next(r for r in ranked if r.outstanding <= limit)

    def acquire(
        self, key: str | None = None, weight: int = 1, avoid: Collection[Replica] = ()
    ) -> Replica | None:
        """Picks a replica and charges ``weight`` outstanding sequences to it.

        Every successful acquire must be matched by one :meth:`release` with
        the same weight (in a ``finally`` block).
        """
        replica = self.pick(key, avoid)
        if replica is not None:
            replica.outstanding += weight
            replica.busy.enter()
        return replica

    def release(self, replica: Replica, weight: int = 1) -> None:
        """Returns ``weight`` outstanding sequences charged by :meth:`acquire`."""
        replica.outstanding -= weight
        replica.busy.leave()

    def record_success(self, replica: Replica) -> None:
        """The replica answered: its failure streak ends and its breaker closes."""
        replica.failures = 0
        if replica.state is not BreakerState.CLOSED:
            self._set(replica, BreakerState.CLOSED)

    def record_failure(self, replica: Replica) -> bool:
        """Counts a failure; returns True when this one opened the breaker."""
        replica.failures += 1
        state = replica.state
        if state is BreakerState.HALF_OPEN or (
            state is BreakerState.CLOSED and replica.failures >= self._threshold
        ):
            self._set(replica, BreakerState.OPEN)
            return True
        return False

    def record_probe(self, replica: Replica) -> bool:
        """A probe succeeded: half-opens an open replica (True) or admits one more trial."""
        if replica.state is BreakerState.OPEN:
            replica.trials = 1
            self._set(replica, BreakerState.HALF_OPEN)
            return True
        if replica.state is BreakerState.HALF_OPEN:
            replica.trials += 1
        return False

    def on_trial(self) -> bool:
        """Whether no replica takes a request now but a half-open one's trial is in flight."""
        return not any(r.available for r in self.replicas) and any(
            r.state is BreakerState.HALF_OPEN for r in self.replicas
        )

    def recovering(self) -> bool:
        """Whether some breaker is not closed (the engine keeps probing)."""
        return any(r.state is not BreakerState.CLOSED for r in self.replicas)

    def to_probe(self) -> list[Replica]:
        """Replicas to probe now: open, or half-open with every trial in flight."""
        return [r for r in self.replicas if r.state is not BreakerState.CLOSED and not r.available]

    def has_untried(self, tried: Collection[Replica]) -> bool:
        """Whether some available replica is not in ``tried``."""
        return any(r.available and r not in tried for r in self.replicas)

    def snapshot(self) -> dict[str, bool]:
        """URL -> takes requests (breaker not open), in configuration order."""
        return {r.url: r.healthy for r in self.replicas}
