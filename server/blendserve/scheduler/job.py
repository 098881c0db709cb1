"""One budgeted job: questions and a budget in, one voted answer per question out.

The job drives the same policy object the simulator uses (docs/decisions.md)
and emits each question's answer as soon as it is final. On an engine it has
mostly to itself it sends the policy's waves; once others hold half the
engine, or where waves cannot go, it decides sample by sample, keeping the
policy's choices close to its sequential ones (virtual votes, at most
``in_flight_per_question`` samples per open question in flight: the rules
are in docs/solve.md). A question's next wave is planned once its own last
one is all back. Fewer, larger waves (:meth:`WavePlan.widened
<blendserve.core.waves.WavePlan.widened>`) go where the engine has room for
half the budget and hands each sample over as it ends
(:attr:`Engine.delivers_each <blendserve.engines.base.Engine.delivers_each>`).

Samples vote as each ends. A question that settles, or whose samples keep
being cut at ``max_tokens`` (``stopped="truncated"``), has its samples in
flight cancelled and refunded (``DoneEvent.cut``). With no known engine
capacity, a sample out far longer than the job's others
(:mod:`blendserve.core.stragglers`) is held by the policy and left running.

The job's trace rule (:mod:`blendserve.core.traces`) reads its ``learner``: each vote
counts what the learner weighs it, each request carries the learner's cut bar as it
is sent, and with ``first_m`` a question's wave of more than ``m`` samples has the rest
cancelled and refunded once ``m`` of them ended (the question may be sent more). Each
answered question of a rule that learns teaches the learner its voting samples. An
answer counts its samples by why they stopped (``AnswerEvent.stops``).

Engine failures are refunded and retried after a backoff (doubling from
50 ms to 1 s; requests in flight go on meanwhile). A job fails, with the
answers it has marked partial, after ``max_consecutive_failures`` failures
with no success in between, once that streak also spans ``failure_timeout``
seconds when the failures are transient (``EngineUnavailable``,
``EngineTimeout``), and then at once, with requests still in flight. An
upstream's refusal of the request itself ends it at once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import (
    AsyncGenerator,
    Callable,
    Iterable,
    Iterator,
)
from dataclasses import dataclass, replace

from blendserve.core.policies import AllocationPolicy
from blendserve.core.stragglers import Stragglers
from blendserve.core.traces import TraceLearner
from blendserve.core.waves import WavePlan
from blendserve.engines.base import Engine, GenerateRequest, Sample
from blendserve.scheduler.ballots import Ballots, SampleLog
from blendserve.scheduler.events import (
    AnswerEvent,
    DoneEvent,
    Event,
    JobStatus,
    ProgressEvent,
    Usage,
)
from blendserve.scheduler.failures import FailureStreak
from blendserve.scheduler.spec import DEFAULT_CONCURRENCY, JobSpec, Keyer
from blendserve.scheduler.streams import deliver, drain
from blendserve.stats import JobReport, Stats
from blendserve.util.cancel import cancel_all

__all__ = ["Job"]


@dataclass(eq=False)
class _Wave:
    """The samples of one question dispatched together: how many, and how many ended."""

    size: int
    ended: int = 0


@dataclass(eq=False)
class _Request:
    """An engine request in flight: its question, and the samples it has yet to deliver
    (``left``, the policy's pending samples; ``late``, stragglers the policy holds)."""

    question: int
    left: int
    sent: float  # the event loop's time when it was sent
    late: int = 0
    cut: bool = False  # its stragglers were cancelled (counted in DoneEvent.cut)
    wave: _Wave | None = None
    reason: str | None = None  # why it was cancelled (one of core.traces.STOPS)


class _AnswerSweeper:
    """Which questions may have a final answer once a request completes."""

    def __init__(self, num_questions: int) -> None:
        self.num_questions = num_questions
        self.swept = False  # every question checked once the budget ran out

    def candidates(self, q: int, policy: AllocationPolicy) -> Iterable[int]:
        """Only ``q`` changed, unless the budget just ran out: then all may be final."""
        return self.everyone(policy) or (q,)

    def everyone(self, policy: AllocationPolicy) -> range:
        """Every question, once, as soon as the budget has run out (else none)."""
        if policy.num_remaining == 0 and not self.swept:
            self.swept = True
            return range(self.num_questions)
        return range(0)


class Job:
    """Runs one job; iterate :meth:`events` to drive it. Closing the event iterator early (a
    client that went away) cancels every in-flight engine request of the job.

    ``sink`` defaults to where ``engine`` reports; ``stragglers`` says when a sample in
    flight on an engine of unknown capacity stops holding a slot (None:
    :class:`~blendserve.core.stragglers.Stragglers`'s defaults). ``log`` takes each
    question's samples once it is answered, or, for a question the job ends without
    answering (its events closed early), when the job winds down. ``learner`` is what
    the job's trace rule reads and teaches (None: one of the job's own).
    """

    def __init__(
        self,
        spec: JobSpec,
        engine: Engine,
        keyer: Keyer,
        sink: Stats | None = None,
        *,
        stragglers: Stragglers | None = None,
        log: SampleLog | None = None,
        learner: TraceLearner | None = None,
    ) -> None:
        if not spec.questions:
            raise ValueError("a job needs at least one question")
        if (spec.concurrency is not None and spec.concurrency < 1) or (
            spec.max_samples_per_request < 1
        ):
            raise ValueError("concurrency and max_samples_per_request must be at least 1")
        if not spec.in_flight_per_question > 0:
            raise ValueError(
                f"in_flight_per_question must be positive, got {spec.in_flight_per_question}"
            )
        if not spec.failure_timeout >= 0:
            raise ValueError(f"failure_timeout must be >= 0, got {spec.failure_timeout}")
        if spec.traces.cut is not None and spec.confidence is None:
            raise ValueError("a trace rule that cuts needs the job's confidence spec")
        self.spec = spec
        self.rule = spec.traces
        self.learner = learner if learner is not None else TraceLearner()
        self.engine = engine
        self.keyer = keyer
        self.sink = sink if sink is not None else engine.sink
        self.log = log
        self.status = JobStatus.PENDING
        # Any question may take several samples at once if the ranking, virtual
        # votes included, still puts it first; _in_flight_limit bounds the job.
        self.policy: AllocationPolicy = spec.policy.build(
            len(spec.questions),
            spec.budget,
            seed=spec.seed,
            settle_delta=spec.settle_delta,
            max_in_flight=spec.budget,
        )
        self._num_questions = len(spec.questions)
        # Only questions with samples and no answer yet have a state: a large job
        # does not keep objects per question for the collector to walk.
        self._states: dict[int, Ballots] = {}
        self._answered = bytearray(self._num_questions)
        self._usage = Usage()
        self._num_answered = 0
        self._cancelled: str | None = None  # why cancel() ended the job
        self._in_flight: dict[asyncio.Task[None], _Request] = {}
        # Samples as they end, and a request's end (None), in the order they came.
        self._arrivals: asyncio.Queue[tuple[asyncio.Task[None], Sample | None]] = asyncio.Queue()
        self._replan = False  # a question's wave is all back: the plan may send it another
        waves = spec.max_rounds > 0 and self.policy.plans_waves
        self._plan = WavePlan(max_rounds=spec.max_rounds) if waves else None
        self._concurrency = spec.concurrency or DEFAULT_CONCURRENCY  # sample by sample
        self._rounds = [0] * self._num_questions  # waves each question was sent
        self._num_cut = 0  # samples in flight cancelled because their question settled
        # How long this job's samples take; with no known capacity, one out far longer
        # than its peers is held by the policy and left running (see _write_off_stragglers).
        self._stragglers = stragglers if stragglers is not None else Stragglers()
        self._straggler_at: float | None = None  # when the next one would, if it is still out
        self._late_of: dict[int, int] = {}  # stragglers held, by question
        self._skipped: dict[int, int] = {}  # sample indices of stragglers that never came

    def abandon(self, q: int) -> None:
        """Stops sampling question ``q`` (its caller went away) and cancels its requests; the
        rest of the job goes on, and ``q`` still gets an answer event from its samples."""
        self._stop(q, "budget")

    def _stop(self, q: int, reason: str) -> None:
        """No more samples for ``q``; its requests in flight are cancelled (and refunded),
        their samples stopped for ``reason``."""
        self.policy.stop(q)
        for task, request in self._in_flight.items():
            if request.question == q:
                _cancel(task, request, reason)

    def cancel(self, reason: str) -> None:
        """Ends the job now: no more samples, in-flight requests cancelled and refunded; every
        question still gets its answer (partial), and the job ends ``CANCELLED`` with
        ``reason`` as its error."""
        if self.status.finished or self._cancelled is not None:
            return
        self._cancelled = reason
        for q in range(self._num_questions):
            self.policy.stop(q)
        for task, request in self._in_flight.items():
            _cancel(task, request, "budget")

    async def events(self) -> AsyncGenerator[Event, None]:
        """Runs the job, yielding answers as they settle, progress, and a final summary."""
        self.status = JobStatus.RUNNING
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._report = JobReport(self.sink, self._num_questions, self.spec.budget, started)
        last_progress = -math.inf
        in_flight = self._in_flight
        failures = FailureStreak(self.spec.max_consecutive_failures, self.spec.failure_timeout)
        sweeper = _AnswerSweeper(self._num_questions)
        try:
            while True:
                backoff = failures.backoff(loop.time())
                if failures.error is None and backoff <= 0:
                    self._dispatch(in_flight)
                    # The last of the budget went out: questions with nothing in flight are final.
                    for event in self._final_answers(sweeper.everyone(self.policy)):
                        yield event
                if not in_flight:
                    if backoff > 0:
                        await asyncio.sleep(backoff)
                        continue
                    break
                for task, sample in await self._arrived(failures, backoff):
                    if sample is None:
                        q = self._complete(task, failures, loop.time)
                    else:
                        q = await self._take(task, sample)
                    if q is not None and failures.error is None:
                        candidates = sweeper.candidates(q, self.policy)
                        cut = self._cancelled is not None
                        for event in self._final_answers(candidates, partial=cut):
                            yield event
                now = loop.time()
                if now - last_progress >= self.spec.progress_interval:
                    last_progress = now
                    yield self._progress()
            everyone = range(self._num_questions)
            cut = failures.error is not None or self._cancelled is not None
            for event in self._final_answers(everyone, everything=True, partial=cut):
                yield event
            yield self._done(started, failures.error, failures.cause)
        finally:
            await self._wind_down()

    def _complete(
        self, task: asyncio.Task[None], failures: FailureStreak, clock: Callable[[], float]
    ) -> int | None:
        """Accounts one ended request and returns its question (None: accounted already): the
        samples it did not deliver are refunded, whether it was cancelled (not a failure),
        returned too few, or failed (an ``EngineError`` or an engine's bug: retried after a
        backoff; the failure that ends the job cancels the rest)."""
        request = self._in_flight.pop(task, None)
        if request is None:
            return None
        left = request.left
        q = request.question
        if request.late:  # never came: refunded, their sample indices still taken
            self._end_late(q, request.late)
            self.policy.release(q, request.late)
            self._skipped[q] = self._skipped.get(q, 0) + request.late
        self._refund(q, left)
        if task.cancelled() and not self._answered[q]:
            stopped = left + (0 if request.cut else request.late)
            if stopped:
                self._ballots(q).stopped_in_flight(request.reason or "budget", stopped)
        # Cut samples are counted by request, as they were before samples came one by one:
        # a request's votes that end after its cut samples still count.
        state = self._states.get(q)
        if state is not None and state.stop_if_cut():
            self._stop(q, "settled")  # answered once its cancelled requests are refunded
        elif not self.policy.num_pending_of[q]:
            self._replan = True  # its wave is all back: the plan may send it another
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            if not task.cancelled():
                failures.succeeded()
        elif failures.failed(exc, clock()):
            for other, in_flight in self._in_flight.items():  # refunded when they end
                _cancel(other, in_flight, "budget")
        return q

    async def _take(self, task: asyncio.Task[None], sample: Sample) -> int | None:
        """Records one sample as it ends and returns its question (None: not awaited)."""
        request = self._in_flight.get(task)
        if request is None or not (request.left or request.late):
            return None  # the job wound down, or the engine sent more than asked
        q = request.question
        self._stragglers.observe(asyncio.get_running_loop().time() - request.sent)
        if request.left:
            request.left -= 1
        else:
            # A straggler that came after all: it votes if its question may still take a
            # sample (an answered one is stopped and takes none), else it was spent for
            # nothing.
            request.late -= 1
            self._end_late(q, 1)
            if not self.policy.take_held(q):
                return None
        await self._record(q, sample)
        self._first_m(request)
        return q

    def _first_m(self, request: _Request) -> None:
        """With ``first_m``, once the learner trusts length: once ``m`` samples of a wave of
        more ended, the rest of it still in flight is cancelled (refunded as each request
        ends; the question goes on)."""
        wave = request.wave
        if wave is None:
            return
        wave.ended += 1
        m = self.learner.first_m(self.rule)
        if m is None or wave.size <= m or wave.ended != m:
            return
        for task, other in self._in_flight.items():
            if other.wave is wave and (other.left or other.late):
                _cancel(task, other, "first_m")

    async def _arrived(
        self, failures: FailureStreak, backoff: float
    ) -> list[tuple[asyncio.Task[None], Sample | None]]:
        """Samples and request ends that came, in the order they came, waited for until the
        backoff ends, a sample in flight becomes a straggler, or the failure streak's
        deadline passes (the job then gives up: its requests are cancelled, and refunded
        as they end)."""
        now = asyncio.get_running_loop().time
        waits = [backoff] if backoff > 0 else []
        deadline = failures.deadline()
        if deadline is not None:
            waits.append(max(0.0, deadline - now()))
        if self._straggler_at is not None:  # it may have passed while answers were yielded
            waits.append(max(0.0, self._straggler_at - now()))
        try:
            async with asyncio.timeout(min(waits) if waits else None):
                return await drain(self._arrivals)
        except TimeoutError:
            if failures.expired(now()):
                for task, request in self._in_flight.items():
                    _cancel(task, request, "budget")
            return []

    def _refund(self, q: int, n: int) -> None:
        for _ in range(n):
            self.policy.cancel(q)

    def _spent(self) -> int:
        """Samples spent: the policy's, stragglers still out and those that came too late."""
        return self.policy.num_dispatched

    def _done(self, started: float, error: str | None, cause: BaseException | None) -> DoneEvent:
        """Sets the final status and returns the summary."""
        now = asyncio.get_running_loop().time
        if self._cancelled is not None:
            self.status, error = JobStatus.CANCELLED, error or self._cancelled
        else:
            self.status = JobStatus.FAILED if error is not None else JobStatus.COMPLETED
        self._report.end(self.status.name.lower(), self.spec.budget, self._spent(), now())
        return DoneEvent(
            status=self.status,
            budget=self.spec.budget,
            spent=self._spent(),
            usage=self._usage,
            duration_s=now() - started,
            error=error,
            cause=cause,
            answered=self._num_answered,
            settled=sum(map(self.policy.is_settled, range(self._num_questions))),
            cut=self._num_cut,
        )

    async def _wind_down(self) -> None:
        """Ends the job however it stopped: every request in flight cancelled and awaited."""
        if not self.status.finished:
            self.status = JobStatus.CANCELLED
        in_flight = self._in_flight
        self._report.end(
            self.status.name.lower(),
            self.spec.budget,
            self._spent(),
            asyncio.get_running_loop().time(),
        )
        tasks = list(in_flight)
        in_flight.clear()
        await cancel_all(tasks)
        for q, state in self._states.items():  # questions it never answered
            state.hand_over(self.spec.questions[q], self.log)
        self._states.clear()

    def _in_flight_limit(self) -> int:
        """Samples the job may have in flight now (docs/solve.md, "Samples in flight")."""
        policy = self.policy
        if policy.num_open == 1:  # nothing left to rank: only where it could stop
            return max(1, min(self._concurrency, policy.num_pending + policy.lone_runway()))
        informed = math.ceil(self.spec.in_flight_per_question * policy.num_open)
        # Two at least, so that one slow sample does not hold up a small job.
        return min(self._concurrency, max(2, informed))

    def _dispatch(self, in_flight: dict[asyncio.Task[None], _Request]) -> None:
        """Sends the plan's waves while the engine has room for more than the sample-by-sample
        limit (:meth:`_dispatch_waves`) and others hold less than half of it; else fills the
        free slots one decision at a time, a question chosen k times getting ``n=k``."""
        policy = self.policy
        load = self.engine.load()
        if load.capacity is None:
            self._write_off_stragglers()
        limit = self._in_flight_limit()
        if policy.num_held:  # stragglers are out of the policy's pending, not the engine's
            limit = min(limit, self._concurrency - policy.num_held)
        if self._plan is not None:
            free = load.free
            if self.spec.concurrency is not None:
                free = min(free, self.spec.concurrency - policy.num_pending)
            others = load.running + load.waiting - policy.num_pending
            if load.capacity and 2 * others >= load.capacity:
                # Others keep the engine busy: a round costs it no idle steps, a sample
                # costs a slot, so decide sample by sample and keep the free slots filled.
                limit = max(limit, min(self._concurrency, policy.num_pending + free))
            elif free > limit - policy.num_pending:
                if self._widens(free):
                    self._plan = self._plan.widened()
                # A question's next wave is planned once its last one is all back:
                # a plan made on the part that came back first (on a real engine,
                # the shortest samples) would stop it on too few votes.
                if policy.num_pending and not self._replan:
                    return
                waves = self._dispatch_waves(self._plan, free)
                if waves is not None:
                    self._replan = False
                    self._send(waves, in_flight)
                    return
                # A wave over the job's concurrency: from here on the job decides sample by
                # sample, so that every question still gets its first sample before any its
                # second.
                self._plan = None
        sizes: dict[int, int] = {}
        for _ in range(limit - policy.num_pending):
            chosen = policy.select(1)
            if not chosen:
                break
            sizes[chosen[0]] = sizes.get(chosen[0], 0) + 1
        self._send(sizes, in_flight)

    def _widens(self, free: int) -> bool:
        """Whether the job, about to send its first wave, plans fewer, larger ones: the engine
        has room for half its budget at once and hands each sample over as it ends."""
        return not any(self._rounds) and 2 * free >= self.spec.budget and self.engine.delivers_each

    def _write_off_stragglers(self) -> None:
        """Has the policy hold the samples in flight that are stragglers, and leaves them running.

        With no known capacity the engine may have room the job cannot see: a sample out far
        longer than its peers (:mod:`blendserve.core.stragglers`) then holds none of the
        job's few slots and is no virtual vote; it still votes if it comes while its question
        is open (:meth:`_take`), and is cancelled once its question settles. Notes when the
        next would become a straggler, so that a job held at its limit wakes then.
        """
        self._straggler_at = None
        after = self._stragglers.after()
        if after is None:
            return
        now = asyncio.get_running_loop().time()
        next_at = math.inf
        for request in self._in_flight.values():
            if not request.left:
                continue
            # The moment as the wait for it is timed, so that once the clock reaches it
            # the sample is a straggler (a difference of times could round below ``after``).
            due = request.sent + after
            if due > now:
                next_at = min(next_at, due)
                continue
            q, n = request.question, request.left
            # Held by the policy, still its question's: it may come and vote.
            self.policy.hold(q, n)
            request.left, request.late = 0, request.late + n
            self._late_of[q] = self._late_of.get(q, 0) + n
        if next_at < math.inf:
            self._straggler_at = next_at

    def _end_late(self, q: int, n: int) -> None:
        """Counts ``n`` stragglers of ``q`` as no longer running."""
        if n:
            left = self._late_of[q] - n
            if left:
                self._late_of[q] = left
            else:
                del self._late_of[q]

    def _cancel_late(self, q: int) -> None:
        """Cancels the stragglers of question ``q``, settled: they could change nothing."""
        for task, request in self._in_flight.items():
            if request.late and not request.cut and request.question == q:
                request.cut = True
                self._num_cut += request.late
                self._ballots(q).stopped_in_flight("settled", request.late)
                _cancel(task, request, "settled")

    def _dispatch_waves(self, plan: WavePlan, free: int) -> dict[int, int] | None:
        """The plan's next waves that fit in ``free`` sequences (the engine's, within the
        job's ``concurrency``); the rest waits for room. None: the first wave is over the
        job's concurrency with nothing in flight, so no wave can go. A question planned none
        has passed a round too: it catches up with the one furthest on, so that its later
        waves still end within ``max_rounds`` (however many times it was planned)."""
        policy = self.policy
        rounds = self._rounds
        sizes: dict[int, int] = {}
        passed = []
        for q, k in policy.plan_waves(plan, rounds).items():
            if k > free:
                if sizes or policy.num_pending:
                    break  # the rest waits for room (the engine would queue it)
                if self.spec.concurrency is not None:
                    return None
            sent = policy.assign(q, k)
            if sent:
                sizes[q] = sent
                rounds[q] += 1
                free -= sent
            else:
                passed.append(q)
        furthest = max(rounds)
        for q in passed:
            rounds[q] = max(rounds[q], furthest)
        return sizes

    def _send(self, sizes: dict[int, int], in_flight: dict[asyncio.Task[None], _Request]) -> None:
        """One engine request of ``n = size`` per question (split at the request limit)."""
        policy = self.policy
        limit = self.spec.max_samples_per_request
        now = asyncio.get_running_loop().time()
        # Read as each dispatch is built: the bar moves as the learner learns.
        cut_below = self.learner.bar(self.rule) if self.rule.cut is not None else None
        for q, size in sizes.items():
            # The index of this dispatch's first sample (stragglers' indices stay taken).
            first = policy.num_assigned[q] - size + self._skipped.get(q, 0)
            wave = _Wave(size) if self.rule.first_m is not None else None
            while size > 0:
                n = min(size, limit)
                size -= n
                request = self.spec.questions[q].request(n, first, self.spec)
                if cut_below is not None:
                    request = replace(request, cut_below=cut_below)
                first += n
                task = asyncio.ensure_future(self._stream(request))
                task.add_done_callback(self._ended)
                in_flight[task] = _Request(q, n, now, wave=wave)

    async def _stream(self, request: GenerateRequest) -> None:
        """Hands the job each sample of ``request`` as it ends."""
        task = asyncio.current_task()
        assert task is not None
        await deliver(
            self.engine,
            request,
            lambda sample: self._arrivals.put_nowait((task, sample)),
            self.sink,
        )

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Tells the job a request ended, after the samples it delivered."""
        self._arrivals.put_nowait((task, None))

    def _ballots(self, q: int) -> Ballots:
        """Question ``q``'s ballots, made at its first sample (or first sample stopped)."""
        state = self._states.get(q)
        if state is None:
            state = self._states[q] = Ballots.kept_for(self.log, self.rule.learns)
        return state

    async def _record(self, q: int, sample: Sample) -> None:
        key = await self._ballots(q).add(sample, self.keyer)
        self._usage.add(
            Usage(1, sample.prompt_tokens, sample.completion_tokens, sample.reasoning_tokens)
        )
        if key is not None and self.rule.vote != "count":
            weight = self.learner.weight(self.rule, sample.completion_tokens, sample.confidence)
            self.policy.observe(q, key, weight)
        else:
            self.policy.observe(q, key)
        pending = self.policy.num_pending_of[q]
        if self.policy.is_settled(q) and pending:
            # Its samples still out cannot unsettle it: they stop, and their budget
            # goes back to the questions still open.
            self._num_cut += pending
            self._stop(q, "settled")

    def _final_answers(
        self, candidates: Iterable[int], everything: bool = False, partial: bool = False
    ) -> Iterator[AnswerEvent]:
        """The answers of ``candidates`` that are final, each built as it is asked for: of the
        thousands that may be final at once (the budget out, the job ended), a consumer that
        yields to the event loop between them never holds it for the whole burst."""
        policy = self.policy
        for q in candidates:
            if self._answered[q] or policy.num_pending_of[q]:
                continue
            if q in self._late_of and not (everything or policy.is_settled(q)):
                continue  # its stragglers hold budget, and may still come and vote
            if everything or policy.is_finished(q):
                self._answered[q] = 1
                # Its answer is out: a failed sample refunded after the budget ran
                # out must go to a question still waiting, not change a sent answer.
                policy.stop(q)
                if q in self._late_of:
                    self._cancel_late(q)
                self._num_answered += 1
                cut = partial or self._cancelled is not None  # cancelled mid-burst
                event = self._answer(q, cut and not policy.is_settled(q))
                state = self._states.pop(q, None)
                if state is not None:
                    state.hand_over(self.spec.questions[q], self.log)
                    if self.rule.learns:
                        self.learner.learn(state.facts())
                self.sink.samples_stopped(event.stops, event.cut_tokens)
                self._report.answer(
                    event.samples,
                    event.confidence.share,
                    event.confidence.ppr,
                    event.settled_early,
                    asyncio.get_running_loop().time(),
                )
                yield event

    def _answer(self, q: int, partial: bool) -> AnswerEvent:
        return self._ballots(q).answer_event(
            self.policy.votes,
            q,
            index=q,
            id=self.spec.questions[q].id,
            settled_early=self.policy.is_settled(q),
            partial=partial,
            learner=self.learner,
            rule=self.rule,
        )

    def _progress(self) -> ProgressEvent:
        policy = self.policy
        return ProgressEvent(
            spent=self._spent(),
            completed=self._spent() - policy.num_pending - policy.num_held,
            budget=self.spec.budget,
            answered=self._num_answered,
            settled=sum(map(policy.is_settled, range(self._num_questions))),
            questions=self._num_questions,
        )


def _cancel(task: asyncio.Task[None], request: _Request, reason: str) -> None:
    """Cancels ``request``; its samples still out stop for ``reason`` (the first one given)."""
    if request.reason is None:
        request.reason = reason
    task.cancel()
