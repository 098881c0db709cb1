"""An always-open pool of questions that each stop once confident (online self-consistency).

A question joins at once (no grouping wait), is sampled in waves of
:meth:`~blendserve.core.stopping.StoppingRule.wave_size` (a first request
with ``n = k``, then smaller top-ups), each sample counted as it ends, and
is answered as soon as its uncertainty is at most its client's ``tau`` (the
samples of its wave still running are then cancelled), it reaches its cap,
its samples keep being cut at ``max_tokens`` (``TRUNCATED_LIMIT`` since its
last vote: ``stopped="truncated"``, not counted in the pacing) or its caller leaves
(:meth:`Pool.cancel` ends them all at once with the answers they have: a
shutdown past its grace).

A question comes from a client (:data:`SHARED_CLIENT` unless named), and
each client of a pool has its own :class:`ClientPacing`: a ``tau`` paced so
that the mean samples per question of that client's questions meet the
pool's budget (or fixed, for a quality target), whatever other clients ask;
the flatness of its finished questions, which sets the share of the budget
its next first wave gets (:class:`~blendserve.core.flatness.Flatness`: about
half on flat answers, only what a unanimous question needs on peaked ones);
and its own keyer, so its answers take turns at the sympy workers with other
clients' answers instead of queueing behind them. Waves of every open
question share ``concurrency`` samples in flight: first waves go first, then
the least sure questions. A client with no open question that the pool has
not seen for :data:`IDLE_CLIENT_S` is forgotten.

What the waves are planned with (each client's prior's programme, and a new
pool's start price) is built off the event loop (see
:mod:`~blendserve.scheduler.priors`). A question the prior stops where a wave
past the programme's horizon would still have been worth its price says so
(``stopped="horizon"``): its budget asks more than the programme can plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from blendserve.core.flatness import PROBE, Flatness
from blendserve.core.online_rule import OnlineRule
from blendserve.core.stopping import DEFAULT_CAP, PacedThreshold, Score, StoppingRule
from blendserve.core.vote_prior import VotePrior
from blendserve.core.votes import VoteState
from blendserve.core.waves import DEFAULT_MAX_ROUNDS
from blendserve.engines.base import Engine, Sample, SamplingParams
from blendserve.errors import EngineError, UpstreamRejected
from blendserve.scheduler.ballots import Ballots
from blendserve.scheduler.events import AnswerEvent
from blendserve.scheduler.failures import FailureStreak
from blendserve.scheduler.priors import Builds, ready_rule
from blendserve.scheduler.spec import Keyer, Question
from blendserve.scheduler.streams import merged
from blendserve.stats import Stats

__all__ = ["IDLE_CLIENT_S", "SHARED_CLIENT", "ClientPacing", "Pool", "PoolSpec"]

#: The client of questions that name none.
SHARED_CLIENT = ""
#: Seconds after which a client with no open question, not seen since, is forgotten
#: (its pacing restarts if it comes back); the service drops a pool idle as long.
IDLE_CLIENT_S = 600.0


@dataclass(frozen=True)
class PoolSpec:
    """What the questions of one pool share.

    Attributes:
        budget_per_question: mean samples per question ``tau`` is paced to
            (also the unit of the cap); None with ``target``.
        target: a fixed ``tau`` (quality target: stop at ``P[p1 < p2] <= target``).
        sampling: sampling parameters of every request.
        model: upstream model name.
        score: the uncertainty thresholded (``asc`` or ``ppr``).
        cap: a question's cap, a multiple of the budget (and at most 48 beyond it).
        max_cap: with a quality target, the cap in samples.
        concurrency: samples in flight for the whole pool.
        max_samples_per_request: largest ``n`` of one engine request.
        max_rounds: waves per question at most (0: no bound): its last wave
            takes all it is expected to need to reach ``tau``.
        request_timeout: seconds per engine request (None: the engine's default).
        max_consecutive_failures: engine failures in a row that end a question.
        failure_timeout: as a job's (:class:`~blendserve.scheduler.failures.FailureStreak`).
    """

    budget_per_question: float | None = 8.0
    target: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None
    score: Score = "asc"
    cap: float = DEFAULT_CAP
    max_cap: int = 64
    concurrency: int = 64
    max_samples_per_request: int = 16
    max_rounds: int = DEFAULT_MAX_ROUNDS
    request_timeout: float | None = None
    max_consecutive_failures: int = 8
    failure_timeout: float = 5.0

    @property
    def online(self) -> OnlineRule:
        """The online rule the pool's questions stop and are paced by."""
        return OnlineRule(
            score=self.score, cap=self.cap, target=self.target, rounds=self.max_rounds
        )

    def rule(
        self, flatness: Flatness | None = None, prior: VotePrior | None = None
    ) -> StoppingRule:
        """The stopping rule of a question; its first wave and cap follow ``flatness``,
        its waves ``prior``."""
        if self.budget_per_question is None:
            return StoppingRule(self.score, self.max_cap, max_rounds=self.max_rounds)
        return self.online.stopping(self.budget_per_question, flatness, prior)

    def threshold(self) -> PacedThreshold:
        """A fresh pacing controller (or fixed threshold) for the pool."""
        return self.online.threshold(self.budget_per_question)


@dataclass(eq=False)
class ClientPacing:
    """One client's side of a pool: what its own questions learn and key with.

    Attributes:
        threshold: paces the client's mean samples per question to the pool's budget.
        flatness: how flat the client's finished questions were: the share of the
            budget its next first wave gets, and its cap.
        keyer: keys the client's answers (its own turns at the sympy workers).
        num_open: the client's questions open now.
        prior: how contested the client's finished questions were: the waves
            of its next questions.
        seen: when the client last asked, or one of its questions ended
            (:func:`time.monotonic`).
    """

    threshold: PacedThreshold
    flatness: Flatness
    keyer: Keyer
    num_open: int = 0
    prior: VotePrior = field(default_factory=VotePrior)
    seen: float = field(default_factory=time.monotonic)

    @property
    def tau(self) -> float:
        """The client's threshold now."""
        return self.threshold.tau

    def closed(self, _: object = None) -> None:
        """One of the client's questions ended (answered, or its caller left)."""
        self.num_open -= 1
        self.seen = time.monotonic()


@dataclass(eq=False)
class _Open:
    """One open question of the pool."""

    question: Question
    pacing: ClientPacing
    votes: VoteState = field(default_factory=lambda: VoteState(1))
    ballots: Ballots = field(default_factory=Ballots)
    rounds: int = 0
    paced: int = 0  # samples reported to the pacing controller
    first_keys: list[str | None] = field(default_factory=list)  # its first PROBE keys
    cut: bool = False  # Pool.cancel ended it
    wave: asyncio.Task[None] | None = None  # its requests in flight


class Pool:
    """Runs questions of one :class:`PoolSpec` as they arrive.

    Args:
        spec: what the questions share.
        engine: where samples come from.
        keyer: turns a completion into ``(answer, key)``.
        name: the pool's name in its reports.
        sink: where the pool reports (None: where ``engine`` reports).
        client_keyer: makes each client's keyer, so that clients take turns at
            the sympy workers (None: every client keys with ``keyer``).
        max_clients: clients with no open question beyond this many are
            forgotten, oldest first (their pacing restarts if they come back).
        idle_client_s: a client with no open question not seen for this long is
            forgotten (None: :data:`IDLE_CLIENT_S`).
    """

    def __init__(
        self,
        spec: PoolSpec,
        engine: Engine,
        keyer: Keyer,
        name: str = "default",
        sink: Stats | None = None,
        *,
        client_keyer: Callable[[], Keyer] | None = None,
        max_clients: int = 1024,
        idle_client_s: float | None = None,
    ) -> None:
        if min(spec.concurrency, spec.max_samples_per_request, max_clients) < 1:
            raise ValueError(
                "concurrency, max_samples_per_request and max_clients must be at least 1"
            )
        # A fresh client's threshold, copied for each (a spec with neither a budget nor a
        # target fails here); a start price not computed yet is, off the loop, on first use.
        self._fresh: PacedThreshold | None = None
        if spec.online.threshold_ready(spec.budget_per_question):
            self._fresh = spec.threshold()
        self.spec = spec
        self.engine = engine
        self.keyer = keyer
        self.name = name
        self.sink = sink if sink is not None else engine.sink
        self.max_clients = max_clients
        self.idle_client_s = IDLE_CLIENT_S if idle_client_s is None else idle_client_s
        self.seen = time.monotonic()
        self._client_keyer = client_keyer
        self._clients: OrderedDict[str, ClientPacing] = OrderedDict()
        self.num_questions = 0  # paced questions answered, every client's
        self.num_samples = 0
        self._free = spec.concurrency
        self._waiting: list[tuple[float, int, int, asyncio.Future[None]]] = []
        self._order: itertools.count[int] = itertools.count()
        self._tasks: set[asyncio.Task[AnswerEvent]] = set()
        self._open: set[_Open] = set()
        self._cancels = 0  # cancel() calls so far
        self.num_open = 0
        self.num_rounds = 0

    def submit(self, question: Question, client: str = SHARED_CLIENT) -> asyncio.Task[AnswerEvent]:
        """Adds a question of ``client`` at once; the task ends with its answer.

        Cancelling the task (the caller left) stops the question's samples;
        it then does not count towards the pacing.
        """
        loop = asyncio.get_running_loop()
        if self._fresh is None:
            task = loop.create_task(self._run_started(question, client, self._cancels))
        else:
            pacing = self.pacing(client)
            task = loop.create_task(self._run(question, pacing))
            # Counted from now (not once it runs), so that the client is not forgotten meanwhile.
            pacing.num_open += 1
            task.add_done_callback(pacing.closed)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.num_open += 1
        task.add_done_callback(self._closed)
        return task

    def _closed(self, _: object) -> None:
        self.num_open -= 1
        self.seen = time.monotonic()

    def idle(self, now: float) -> bool:
        """Whether the pool has no open question and was not used for ``idle_client_s``
        before ``now`` (:func:`time.monotonic`)."""
        return self.num_open == 0 and now - self.seen >= self.idle_client_s

    async def _run_started(self, question: Question, client: str, cancels: int) -> AnswerEvent:
        """Runs the question once the pool's start price is computed (off the loop)."""
        if self._fresh is None:
            self._fresh = await Builds.here().run(
                ("start", self.spec.online, self.spec.budget_per_question), self._start
            )
        pacing = self.pacing(client)
        pacing.num_open += 1
        try:
            return await self._run(question, pacing, cut=cancels != self._cancels)
        finally:
            pacing.closed()

    def _start(self) -> PacedThreshold:
        """A fresh threshold, and the tables its price starts every client's waves with."""
        threshold = self.spec.threshold()
        if self.spec.online.planned:
            VotePrior().need(threshold.log_tau, self.spec.max_rounds).build()
        return threshold

    def pacing(self, client: str = SHARED_CLIENT) -> ClientPacing:
        """``client``'s threshold, flatness and keyer (made when first asked for)."""
        now = time.monotonic()
        self.seen = now
        self._forget_idle(now)
        pacing = self._clients.get(client)
        if pacing is not None:
            self._clients.move_to_end(client)
            pacing.seen = now
            return pacing
        for name, old in list(self._clients.items()):
            if len(self._clients) < self.max_clients:
                break
            if old.num_open == 0:
                del self._clients[name]
        keyer = self._client_keyer() if self._client_keyer is not None else self.keyer
        if self._fresh is None:  # a caller outside the pools' loop: computed here
            self._fresh = self.spec.threshold()
        fresh = copy.copy(self._fresh)
        pacing = self._clients[client] = ClientPacing(fresh, Flatness(), keyer, seen=now)
        return pacing

    def _forget_idle(self, now: float) -> None:
        """Forgets the clients with no open question not seen for ``idle_client_s``."""
        idle = []
        for name, pacing in self._clients.items():  # least recently asked for first
            if now - pacing.seen < self.idle_client_s:
                break
            if pacing.num_open == 0:
                idle.append(name)
        for name in idle:
            del self._clients[name]

    def rule(self, client: str = SHARED_CLIENT) -> StoppingRule:
        """The stopping rule of ``client``'s next question: first wave and cap as it learned."""
        return self._rule(self.pacing(client))

    def _rule(self, pacing: ClientPacing) -> StoppingRule:
        if not pacing.threshold.paced:
            return self.spec.rule()
        return self.spec.rule(pacing.flatness, pacing.prior)

    @property
    def mean_samples(self) -> float:
        """Mean samples per paced question answered, over every client (0 before the first)."""
        return self.num_samples / self.num_questions if self.num_questions else 0.0

    @property
    def pacing_error(self) -> float:
        """``mean_samples / budget - 1`` over every client (0: a fixed threshold, or none yet)."""
        budget = self.spec.budget_per_question
        if budget is None or self.spec.target is not None or not self.num_questions:
            return 0.0
        return self.mean_samples / budget - 1.0

    def cancel(self, reason: str) -> None:
        """Ends every open question now with the samples it has, as a cancelled job's.

        Their requests in flight are cancelled; each question's task ends with
        its answer, marked partial (not counted towards the pacing). Questions
        submitted later run as usual. ``reason`` is for the log of a caller.
        """
        self._cancels += 1  # questions still waiting for the pool's start price too
        for state in self._open:
            state.cut = True
            if state.wave is not None:
                state.wave.cancel()

    async def aclose(self) -> None:
        """Cancels every open question."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(
        self, question: Question, pacing: ClientPacing, cut: bool = False
    ) -> AnswerEvent:
        state = _Open(question, pacing, cut=cut)
        base = self._rule(pacing)
        threshold = pacing.threshold
        self._open.add(state)
        self.sink.queued(1)
        failures = FailureStreak(self.spec.max_consecutive_failures, self.spec.failure_timeout)
        clock = asyncio.get_running_loop().time
        try:
            while True:
                log_tau = threshold.log_tau
                rule = await ready_rule(base, log_tau, state.rounds)  # builds off the loop
                if state.cut:
                    return self._answer(state, partial=True, capped=False)
                n = state.votes.num_samples[0]
                wave = rule.wave_size(*state.votes.state(0), n, log_tau, state.rounds)
                if wave == 0:
                    break
                wave = min(wave, self.spec.concurrency)  # a smaller wave never overshoots
                samples_task = state.wave = asyncio.ensure_future(
                    self._wave(state, wave, rule, log_tau)
                )
                deadline = failures.deadline()
                wait_s = None if deadline is None else max(0.0, deadline - clock())
                try:
                    # wait(), not await: cancel() cuts the wave, not this question's task.
                    done, _ = await asyncio.wait((samples_task,), timeout=wait_s)
                finally:
                    state.wave = None
                    if not samples_task.done():  # cancelled, or past the streak's deadline
                        samples_task.cancel()
                        await asyncio.gather(samples_task, return_exceptions=True)
                # The wave's samples were counted as they came, whatever ended it.
                if state.votes.num_samples[0] > n:
                    state.rounds += 1
                    threshold.spend(n, state.votes.num_samples[0])
                    state.paced = state.votes.num_samples[0]
                if not done and failures.expired(clock()) and failures.cause is not None:
                    return self._give_up(state, n, failures, failures.cause)
                if samples_task.cancelled():
                    continue  # cut by cancel()
                exc = samples_task.exception()
                if isinstance(exc, EngineError):
                    if failures.failed(exc, clock()):
                        return self._give_up(state, n, failures, exc)
                    await asyncio.sleep(failures.backoff(clock()))
                    continue
                if exc is not None:
                    raise exc
                failures.succeeded()
                if state.ballots.stop_if_cut():  # not paced: its spend says nothing of tau
                    return self._answer(state, partial=False, capped=False)
            # Stopped below tau, else at the cap (the same tau decided both).
            confident = self._confident(state, rule, base.prior, log_tau)
            event = self._answer(state, partial=False, capped=not confident)
            threshold.observe(event.samples)
            pacing.flatness.observe(tuple(state.first_keys))
            pacing.prior.observe(*state.votes.state(0)[:2], state.votes.num_samples[0])
            self.num_rounds += state.rounds
            self.num_questions += 1
            self.num_samples += event.samples
            self.sink.pool_answered(
                self.name, state.rounds, threshold.tau, self.mean_samples, self.pacing_error
            )
            return event
        finally:
            threshold.close(state.paced)
            self._open.discard(state)
            self.sink.queued(-1)

    def _confident(self, state: _Open, rule: StoppingRule, prior: object, log_tau: float) -> bool:
        """Whether the question stopped below tau (else at its cap); one the prior stopped
        at its programme's horizon is marked ``stopped="horizon"``."""
        votes = state.votes.state(0)
        confident = rule.is_done(*votes, 0, log_tau)
        if confident and isinstance(prior, VotePrior):
            left = rule.max_num_samples - state.votes.num_samples[0]
            if prior.past_horizon(votes[0], votes[1], log_tau, left):
                state.ballots.stopped = "horizon"
        return confident

    def _give_up(
        self, state: _Open, n: int, failures: FailureStreak, exc: BaseException
    ) -> AnswerEvent:
        """A question whose engine failures ended it: answered with what it has, else raised."""
        if isinstance(exc, UpstreamRejected):
            raise exc  # the upstream's refusal of the request, as it is
        if n == 0:  # as a failed job, of the same kind of error
            raise type(exc)(failures.error) from exc
        return self._answer(state, partial=True, capped=False)

    async def _wave(self, state: _Open, wave: int, rule: StoppingRule, log_tau: float) -> None:
        """Requests ``wave`` samples once the pool has room, counting each vote as it ends.

        Once the question stops at ``log_tau`` whatever the samples still
        running bring (:meth:`StoppingRule.is_done_whatever_comes`), those samples are
        cancelled: its answer and its stop are the wave's, and their slots go
        to other questions at once.
        """
        # Every question's first wave goes first, then the least sure questions.
        first = state.votes.num_samples[0] == 0
        priority = -math.inf if first else -rule.log_uncertainty(*state.votes.state(0))
        await self._acquire(wave, priority)
        left = wave
        try:
            sizes = [self.spec.max_samples_per_request] * (
                wave // self.spec.max_samples_per_request
            )
            if wave % self.spec.max_samples_per_request:
                sizes.append(wave % self.spec.max_samples_per_request)
            # The sample index each request starts at (seeded requests shift their seed).
            starts = itertools.accumulate(sizes[:-1], initial=state.votes.num_samples[0])
            requests = [
                state.question.request(k, i, self.spec) for k, i in zip(sizes, starts, strict=True)
            ]
            samples = merged(self.engine, requests, self.sink)
            async with contextlib.aclosing(samples):
                async for ended in samples:
                    left -= len(ended)
                    self._release(len(ended))
                    for sample in ended:
                        await self._record(state, sample)
                    votes = state.votes.state(0)
                    if left and rule.is_done_whatever_comes(*votes, left, log_tau):
                        break
        finally:
            self._release(left)

    async def _acquire(self, wave: int, priority: float) -> None:
        need = wave
        if not self._waiting and self._free >= need:
            self._free -= need
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), need, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(wave)  # granted as we were cancelled: give it back
            raise

    def _release(self, wave: int) -> None:
        self._free += wave
        waiting = self._waiting
        while waiting:
            _, _, need, future = waiting[0]
            if future.cancelled():
                heapq.heappop(waiting)
                continue
            if self._free < need:
                break
            heapq.heappop(waiting)
            self._free -= need
            future.set_result(None)

    async def _record(self, state: _Open, sample: Sample) -> None:
        key = await state.ballots.add(sample, state.pacing.keyer)
        state.votes.add(0, key)
        if len(state.first_keys) < PROBE:
            state.first_keys.append(key)

    def _answer(self, state: _Open, *, partial: bool, capped: bool) -> AnswerEvent:
        event = state.ballots.answer_event(
            state.votes,
            0,
            index=0,
            id=state.question.id,
            settled_early=not capped and not partial and state.ballots.stopped is None,
            partial=partial,
        )
        confidence = event.confidence
        self.sink.answered(event.samples, confidence.share, confidence.ppr, event.settled_early)
        return event
