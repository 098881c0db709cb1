"""An always-open pool of questions that each stop once confident (online self-consistency).

A question joins at once (no grouping wait) and is sampled in waves of its stopping rule
(:meth:`~blendserve.core.stopping.StoppingRule.wave_size`), each sample counted as it
ends (docs/decisions.md, "The stages of a question"). It is answered once its next votes
are worth less than its client's price (its wave's samples still running are cancelled),
at its cap, once its samples keep being cut at ``max_tokens`` (``TRUNCATED_LIMIT`` since
its last vote: ``stopped="truncated"``, not paced), or when its caller leaves
(:meth:`Pool.cancel` ends them all at once: a shutdown past its grace). One the prior
stops where a wave past the programme's horizon would still have been worth its price
says so (``stopped="horizon"``).

Each client (:mod:`~blendserve.scheduler.clients`) learns from its own finished questions
and keys with its own keyer. Waves of every open question share ``concurrency`` samples
in flight (:class:`~blendserve.scheduler.slots.Slots`), first waves first, then the least
sure; what they are planned with is built off the event loop
(:mod:`~blendserve.scheduler.priors`).

The pool's trace rule (:mod:`blendserve.core.traces`) reads each client's learner: each
vote counts what it weighs it, each wave's requests carry its cut bar, and with
``first_m`` a wave of more than ``m`` samples has the rest cancelled once ``m`` of them
ended (the question goes on to its next wave). Each answered question of a rule that
learns teaches its client's learner.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from blendserve.core.flatness import PROBE
from blendserve.core.online_rule import OnlineRule, StreamLearning
from blendserve.core.price import PacedPrice
from blendserve.core.programme import ReadyPrior, VotePrior
from blendserve.core.signals import ConfidenceSpec
from blendserve.core.stopping import DEFAULT_CAP, Score, StoppingRule
from blendserve.core.traces import TraceLearner, TraceRule
from blendserve.core.votes import VoteState
from blendserve.core.waves import DEFAULT_MAX_ROUNDS
from blendserve.engines.base import Engine, GenerateRequest, Sample, SamplingParams
from blendserve.errors import EngineError, UpstreamRejected
from blendserve.scheduler.ballots import Ballots, SampleLog
from blendserve.scheduler.clients import IDLE_CLIENT_S, SHARED_CLIENT, Client, Clients
from blendserve.scheduler.events import AnswerEvent
from blendserve.scheduler.failures import FailureStreak
from blendserve.scheduler.priors import Builds, ready_rule
from blendserve.scheduler.slots import Slots
from blendserve.scheduler.spec import Keyer, Question
from blendserve.scheduler.streams import merged
from blendserve.stats import Stats

__all__ = ["IDLE_CLIENT_S", "SHARED_CLIENT", "Pool", "PoolSpec"]


@dataclass(frozen=True)
class PoolSpec:
    """What the questions of one pool share.

    ``budget_per_question`` is the mean the price is paced to and the unit of ``cap`` (a
    question's cap, at most 48 samples beyond the budget); None with ``target``, a fixed
    price (stop at ``P[p1 < p2] <= target``), where ``max_cap`` is the cap in samples.
    ``concurrency`` bounds the whole pool's samples in flight; ``max_rounds`` a question's
    waves (0: no bound), its last taking all it is expected to need.
    ``max_consecutive_failures`` in a row end a question, with ``failure_timeout`` as a
    job's (:class:`~blendserve.scheduler.failures.FailureStreak`); ``request_timeout`` is
    in seconds (None: the engine's default); ``confidence`` and ``traces`` as a job's
    (:class:`~blendserve.scheduler.spec.JobSpec`).
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
    confidence: ConfidenceSpec | None = None
    traces: TraceRule = field(default_factory=TraceRule)

    @property
    def online(self) -> OnlineRule:
        """The online rule the pool's questions stop and are paced by."""
        return OnlineRule(
            score=self.score, cap=self.cap, target=self.target, rounds=self.max_rounds
        )

    def price(self) -> PacedPrice:
        """A fresh price, paced to the budget (or fixed by the target)."""
        return self.online.price(self.budget_per_question)


@dataclass(eq=False)
class _Open:
    """One open question of the pool."""

    question: Question
    client: Client
    votes: VoteState = field(default_factory=lambda: VoteState(1))
    ballots: Ballots = field(default_factory=Ballots)
    rounds: int = 0
    paced: int = 0  # samples reported to the price's pacing
    first_keys: list[str | None] = field(default_factory=list)  # its first PROBE keys
    cut: bool = False  # Pool.cancel ended it
    wave: asyncio.Task[None] | None = None  # its requests in flight


class Pool:
    """Runs questions of one :class:`PoolSpec` as they arrive.

    ``sink`` defaults to where ``engine`` reports. ``client_keyer`` makes each client's
    keyer, so that clients take turns at the sympy workers (None: all key with ``keyer``).
    Clients with no open question are forgotten beyond ``max_clients`` (oldest first), or
    once not seen for ``idle_client_s`` (None: :data:`IDLE_CLIENT_S`); their learning
    restarts if they come back. ``log`` takes each question's samples once it ends,
    answered or not. ``learner_of`` gives a client's trace learner by its name (None: each
    client keeps one of its own, forgotten with it).
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
        log: SampleLog | None = None,
        learner_of: Callable[[str], TraceLearner] | None = None,
    ) -> None:
        if spec.traces.cut is not None and spec.confidence is None:
            raise ValueError("a trace rule that cuts needs the pool's confidence spec")
        if min(spec.concurrency, spec.max_samples_per_request, max_clients) < 1:
            raise ValueError(
                "concurrency, max_samples_per_request and max_clients must be at least 1"
            )
        # A fresh client's price, copied for each (a spec with neither a budget nor a
        # target fails here); a start price not computed yet is, off the loop, on first use.
        self._fresh: PacedPrice | None = None
        if spec.online.price_ready(spec.budget_per_question):
            self._fresh = spec.price()
        self.spec = spec
        self.engine = engine
        self.keyer = keyer
        self.name = name
        self.sink = sink if sink is not None else engine.sink
        self.log = log
        self.seen = time.monotonic()
        self._client_keyer = client_keyer
        self._learner_of = learner_of
        idle_s = IDLE_CLIENT_S if idle_client_s is None else idle_client_s
        self.clients = Clients(self._new_client, max_clients, idle_s)
        self.num_questions = 0  # paced questions answered, every client's
        self.num_samples = 0
        self.slots = Slots(spec.concurrency)
        self._tasks: set[asyncio.Task[AnswerEvent]] = set()
        self._open: set[_Open] = set()
        self._cancels = 0  # cancel() calls so far
        self.num_open = 0
        self.num_rounds = 0

    def submit(self, question: Question, client: str = SHARED_CLIENT) -> asyncio.Task[AnswerEvent]:
        """Adds a question of ``client`` at once; the task ends with its answer. Cancelling it
        (the caller left) stops its samples, and it then does not count towards the pacing."""
        loop = asyncio.get_running_loop()
        if self._fresh is None:
            task = loop.create_task(self._run_started(question, client, self._cancels))
        else:
            known = self.client(client)
            task = loop.create_task(self._run(question, known))
            # Counted from now (not once it runs), so that the client is not forgotten meanwhile.
            known.num_open += 1
            task.add_done_callback(known.closed)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.num_open += 1
        task.add_done_callback(self._closed)
        return task

    def _closed(self, _: object) -> None:
        self.num_open -= 1
        self.seen = time.monotonic()

    def idle(self, now: float) -> bool:
        """Whether the pool has no open question and was not used for as long as a client
        is kept idle before ``now`` (:func:`time.monotonic`)."""
        return self.num_open == 0 and now - self.seen >= self.clients.idle_s

    async def _run_started(self, question: Question, client: str, cancels: int) -> AnswerEvent:
        """Runs the question once the pool's start price is computed (off the loop)."""
        if self._fresh is None:
            self._fresh = await Builds.here().run(
                ("start", self.spec.online, self.spec.budget_per_question), self._start
            )
        known = self.client(client)
        known.num_open += 1
        try:
            return await self._run(question, known, cut=cancels != self._cancels)
        finally:
            known.closed()

    def _start(self) -> PacedPrice:
        """A fresh price, and the tables it starts every client's waves with."""
        price = self.spec.price()
        if self.spec.online.planned:
            VotePrior().need(price.log_price, self.spec.max_rounds).build()
        return price

    def client(self, name: str = SHARED_CLIENT) -> Client:
        """The client ``name`` (made when first asked for)."""
        self.seen = time.monotonic()
        return self.clients.get(name, self.seen)

    def _new_client(self, name: str) -> Client:
        keyer = self._client_keyer() if self._client_keyer is not None else self.keyer
        if self._fresh is None:  # a caller outside the pools' loop: computed here
            self._fresh = self.spec.price()
        spec = self.spec
        learning = StreamLearning(
            spec.online, spec.budget_per_question, copy.copy(self._fresh), spec.max_cap
        )
        if self._learner_of is not None:
            return Client(learning, keyer, self._learner_of(name))
        return Client(learning, keyer)

    def rule(self, client: str = SHARED_CLIENT) -> StoppingRule:
        """The stopping rule of ``client``'s next question: first wave and cap as it learned."""
        return self.client(client).learning.stopping()

    @property
    def mean_samples(self) -> float:
        """Mean samples per paced question answered, over every client (0 before the first)."""
        return self.num_samples / self.num_questions if self.num_questions else 0.0

    @property
    def pacing_error(self) -> float:
        """``mean_samples / budget - 1`` over every client (0: a fixed price, or none yet)."""
        budget = self.spec.budget_per_question
        if budget is None or self.spec.target is not None or not self.num_questions:
            return 0.0
        return self.mean_samples / budget - 1.0

    def cancel(self, reason: str) -> None:
        """Ends every open question now with the samples it has, as a cancelled job's: its
        requests cancelled, its task ending with its answer marked partial (not paced).
        Questions submitted later run as usual; ``reason`` is for the log of a caller."""
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

    async def _run(self, question: Question, client: Client, cut: bool = False) -> AnswerEvent:
        ballots = Ballots.kept_for(self.log, self.spec.traces.learns)
        state = _Open(question, client, ballots=ballots, cut=cut)
        learning = client.learning
        base = learning.stopping()
        price = learning.price
        self._open.add(state)
        self.sink.queued(1)
        failures = FailureStreak(self.spec.max_consecutive_failures, self.spec.failure_timeout)
        clock = asyncio.get_running_loop().time
        try:
            while True:
                log_price = price.log_price
                rule = await ready_rule(base, log_price, state.rounds)  # builds off the loop
                if state.cut:
                    return self._answer(state, partial=True, capped=False)
                n = state.votes.num_samples[0]
                wave = rule.wave_size(*state.votes.state(0), n, log_price, state.rounds)
                if wave == 0:
                    break
                wave = min(wave, self.spec.concurrency)  # a smaller wave never overshoots
                samples_task = state.wave = asyncio.ensure_future(
                    self._wave(state, wave, rule, log_price)
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
                    price.spend(n, state.votes.num_samples[0])
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
                if state.ballots.stop_if_cut():  # not paced: its spend says nothing of the price
                    return self._answer(state, partial=False, capped=False)
            # Stopped at the price, else at the cap (the same price decided both).
            confident = self._confident(state, rule, base.prior, log_price)
            event = self._answer(state, partial=False, capped=not confident)
            learning.finished(*state.votes.state(0)[:2], event.samples, state.first_keys)
            self.num_rounds += state.rounds
            self.num_questions += 1
            self.num_samples += event.samples
            self.sink.pool_answered(
                self.name, state.rounds, price.price, self.mean_samples, self.pacing_error
            )
            return event
        finally:
            price.close(state.paced)
            self._open.discard(state)
            self.sink.queued(-1)
            state.ballots.hand_over(question, self.log)

    def _confident(
        self,
        state: _Open,
        rule: StoppingRule,
        prior: VotePrior | ReadyPrior | None,
        log_price: float,
    ) -> bool:
        """Whether the question stopped at its price (else at its cap); one the prior stopped
        at its programme's horizon is marked ``stopped="horizon"``."""
        votes = state.votes.state(0)
        confident = rule.is_done(*votes, 0, log_price)
        if confident and isinstance(prior, VotePrior):
            left = rule.max_num_samples - state.votes.num_samples[0]
            if prior.past_horizon(votes[0], votes[1], log_price, left):
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

    async def _wave(self, state: _Open, wave: int, rule: StoppingRule, log_price: float) -> None:
        """Requests ``wave`` samples once the pool has room, counting each vote as it ends; once
        the question stops at ``log_price`` whatever those still running bring
        (:meth:`StoppingRule.is_done_whatever_comes`), they are cancelled and their slots go
        to other questions at once; so are they once ``first_m`` of a larger wave ended.
        Those cancelled are counted in the question's ``stops``."""
        # Every question's first wave goes first, then the least sure questions.
        first = state.votes.num_samples[0] == 0
        priority = -math.inf if first else -rule.log_uncertainty(*state.votes.state(0))
        await self.slots.acquire(wave, priority)
        left = wave
        first_m = state.client.traces.first_m(self.spec.traces)
        reason = "budget"  # why those left stop, unless the wave ends otherwise
        try:
            sizes = [self.spec.max_samples_per_request] * (
                wave // self.spec.max_samples_per_request
            )
            if wave % self.spec.max_samples_per_request:
                sizes.append(wave % self.spec.max_samples_per_request)
            # The sample index each request starts at (seeded requests shift their seed).
            starts = itertools.accumulate(sizes[:-1], initial=state.votes.num_samples[0])
            requests = [self._request(state, k, i) for k, i in zip(sizes, starts, strict=True)]
            samples = merged(self.engine, requests, self.sink)
            async with contextlib.aclosing(samples):
                async for ended in samples:
                    left -= len(ended)
                    self.slots.release(len(ended))
                    for sample in ended:
                        await self._record(state, sample)
                    votes = state.votes.state(0)
                    if left and rule.is_done_whatever_comes(*votes, left, log_price):
                        reason = "settled"
                        break
                    if left and first_m is not None and wave > first_m and wave - left >= first_m:
                        reason = "first_m"
                        break
            if left:
                state.ballots.stopped_in_flight(reason, left)
        except asyncio.CancelledError:
            if left:
                state.ballots.stopped_in_flight("budget", left)
            raise
        finally:
            self.slots.release(left)

    def _request(self, state: _Open, n: int, first: int) -> GenerateRequest:
        """The request of ``n`` samples of ``state``'s question, from its ``first``-th, with
        its client's cut bar as it stands now."""
        request = state.question.request(n, first, self.spec)
        rule = self.spec.traces
        if rule.cut is not None:
            bar = state.client.traces.bar(rule)
            if bar is not None:
                request = replace(request, cut_below=bar)
        return request

    async def _record(self, state: _Open, sample: Sample) -> None:
        key = await state.ballots.add(sample, state.client.keyer)
        rule = self.spec.traces
        if key is not None and rule.vote != "count":
            weight = state.client.traces.weight(rule, sample.completion_tokens, sample.confidence)
            state.votes.add(0, key, weight)
        else:
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
            learner=state.client.traces,
            rule=self.spec.traces,
        )
        confidence = event.confidence
        self.sink.answered(event.samples, confidence.share, confidence.ppr, event.settled_early)
        self.sink.samples_stopped(event.stops, event.cut_tokens)
        if self.spec.traces.learns:
            state.client.traces.learn(state.ballots.facts())
        return event
