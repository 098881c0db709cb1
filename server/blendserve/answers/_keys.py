"""The state behind :mod:`blendserve.answers`: settings, the sympy pool, the cache, the executor.

An :class:`AnswerKeys` is one such state; the module functions of
:mod:`blendserve.answers` use a default one, and a service may hold its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import NamedTuple

from blendserve.answers._sympy_pool import SympyPool, WorkerError, WorkerTimeout
from blendserve.core.answers import (
    DEFAULT_REASONING_TAGS,
    REGEX_TIMEOUT_S,
    AnswerKind,
    ReasoningTags,
    RegexTimeout,
    RegexUnavailable,
    bounded_key,
    check_kind,
    choice_key,
    clean_math,
    exact_key,
    is_safe_for_sympy,
    is_text_answer,
    math_fallback_key,
    number_key,
    plain_number_key,
    read_thought,
    search_re,
    sympy_key,
)
from blendserve.core.answers import extract as _core_extract
from blendserve.stats import NO_STATS, Stats
from blendserve.util.byte_lru import ByteLRU

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_DEADLINE_S",
    "AnswerKeys",
    "CacheInfo",
    "KeyOwner",
    "SampleKeyer",
]

#: Seconds one math answer may spend in sympy before it keys as a string.
DEFAULT_DEADLINE_S = 2.0
#: Deadline of a ``regex`` kind search run in the pool (no ``regex`` module).
_RE_POOL_DEADLINE_S = 1.0
#: After this many of an owner's searches ran out of time, its pattern is
#: taken to backtrack on its samples: later ones get :data:`STRUCK_REGEX_TIMEOUT_S`.
REGEX_STRIKES = 3
#: Time limit of an owner's later searches once its pattern has struck out.
STRUCK_REGEX_TIMEOUT_S = 0.01
#: Bytes each of the two key caches (cleaned answers, raw answers) may hold.
DEFAULT_CACHE_BYTES = 16 << 20
_DEFAULT_WORKERS = 1
#: Threads that wait for a worker; each waiting owner needs one to take its turn.
_KEY_THREADS = 64


class CacheInfo(NamedTuple):
    """Math key cache and pool counters.

    Attributes:
        hits: keys served from the cache (or from a parse already in flight).
        misses: keys that went to a worker (one parse each).
        size: distinct answers cached now.
        timeouts: parses that ran past the deadline and keyed as strings.
        errors: parses that failed in the pool (keyed as strings, not cached).
        regex_timeouts: ``regex`` kind searches that ran past their limit (abstained).
    """

    hits: int
    misses: int
    size: int
    timeouts: int
    errors: int
    regex_timeouts: int


class KeyOwner:
    """Whose answers are keyed (one job, or one client of a pool).

    The sympy workers are shared between owners, and an owner whose ``regex``
    searches keep running out of time gets shorter ones: a pattern that
    backtracks costs its own job at most :data:`REGEX_STRIKES` full limits.
    """

    __slots__ = ("__weakref__", "regex_timeouts")

    def __init__(self) -> None:
        self.regex_timeouts = 0

    def regex_timeout(self) -> float:
        """The time limit of this owner's next ``regex`` search."""
        return REGEX_TIMEOUT_S if self.regex_timeouts < REGEX_STRIKES else STRUCK_REGEX_TIMEOUT_S


class _Turns:
    """Gives the sympy workers to waiting calls, least-served owner first.

    An owner's service is the wall time its calls held a worker (ties: fewer calls
    running, then the earlier arrival). The last free worker goes only to an owner
    that holds none, so one owner's slow calls never hold every worker. An owner
    is forgotten when it is garbage collected.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._waiting: list[tuple[KeyOwner, int]] = []  # (owner, arrival)
        self._arrivals = itertools.count()
        self._served: weakref.WeakKeyDictionary[KeyOwner, float] = weakref.WeakKeyDictionary()
        self._calls: weakref.WeakKeyDictionary[KeyOwner, int] = weakref.WeakKeyDictionary()

    def _rank(self, entry: tuple[KeyOwner, int]) -> tuple[float, int, int]:
        owner, arrival = entry
        return self._served.get(owner, 0.0), self._calls.get(owner, 0), arrival

    def _next(self, capacity: int) -> tuple[KeyOwner, int] | None:
        """The waiting call that takes a free worker now, if any (the caller holds the lock)."""
        free = capacity - self._running
        if free <= 0:
            return None
        may = [e for e in self._waiting if free > 1 or not self._calls.get(e[0], 0)]
        return min(may, key=self._rank, default=None)

    @contextmanager
    def turn(self, owner: KeyOwner, capacity: int) -> Iterator[None]:
        """Holds one of ``capacity`` workers for ``owner`` while the block runs."""
        with self._cond:
            entry = (owner, next(self._arrivals))
            self._waiting.append(entry)
            self._cond.wait_for(lambda: self._next(capacity) is entry)
            self._waiting.remove(entry)
            self._running += 1
            self._calls[owner] = self._calls.get(owner, 0) + 1
            self._cond.notify_all()
        start = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._calls[owner] -= 1
                self._served[owner] = self._served.get(owner, 0.0) + time.monotonic() - start
                self._cond.notify_all()


_SHARED_OWNER = KeyOwner()  # callers that name no owner
#: Every live state: a forked child resets each.
_LIVE: weakref.WeakSet[AnswerKeys] = weakref.WeakSet()


class AnswerKeys:
    """Answer extraction and math keys with their own workers, cache and counters.

    See :mod:`blendserve.answers` (whose functions use a default one) for what
    each method does. The workers start on first use and stop at interpreter
    exit or at :meth:`shutdown`; a forked child starts its own.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deadline = DEFAULT_DEADLINE_S
        self.workers = _DEFAULT_WORKERS
        self.pool: SympyPool | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.cache: ByteLRU[str, str] = ByteLRU(DEFAULT_CACHE_BYTES)  # cleaned answer -> key
        self.aliases: ByteLRU[str, str] = ByteLRU(DEFAULT_CACHE_BYTES)  # raw answer -> key
        self.inflight: dict[str, Future[str]] = {}
        self.turns = _Turns()
        self.hits = self.misses = self.timeouts = self.errors = self.regex_timeouts = 0
        self.stats: Stats = NO_STATS
        _LIVE.add(self)

    def report_to(self, stats: Stats) -> None:
        """Reports answers that run out of time to ``stats`` from now on."""
        self.stats = stats

    def after_fork(self) -> None:
        """In a forked child: the parent's workers, threads and lock are not ours."""
        self.lock = threading.Lock()
        self.pool = None
        self.executor = None
        self.inflight = {}
        self.turns = _Turns()

    def _get_pool(self) -> SympyPool:
        with self.lock:
            if self.pool is None:
                self.pool = SympyPool(size=self.workers)
            return self.pool

    def _get_executor(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(
                    max_workers=max(_KEY_THREADS, 2 * self.workers),
                    thread_name_prefix="blendserve-keys",
                )
            return self.executor

    def configure(
        self,
        *,
        deadline_s: float | None = None,
        workers: int | None = None,
        cache_bytes: int | None = None,
    ) -> None:
        """Changes the math key settings; a new worker count restarts the pool."""
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        if workers is not None and workers < 1:
            raise ValueError("workers must be at least 1")
        if cache_bytes is not None and cache_bytes < 0:
            raise ValueError("cache_bytes must be >= 0")
        old_pool = None
        with self.lock:
            if deadline_s is not None:
                self.deadline = deadline_s
            if cache_bytes is not None:
                self.cache.resize(cache_bytes)
                self.aliases.resize(cache_bytes)
            if workers is not None and workers != self.workers:
                self.workers = workers
                old_pool, self.pool = self.pool, None
        if old_pool is not None:
            old_pool.close()

    def warm_up(self) -> None:
        """Starts the worker processes now instead of on first use."""
        self._get_pool().warm()

    def shutdown(self) -> None:
        """Stops the worker processes and the executor; both restart lazily if used again."""
        with self.lock:
            pool, self.pool = self.pool, None
            executor, self.executor = self.executor, None
        if pool is not None:
            pool.close()
        if executor is not None:
            executor.shutdown(wait=True)

    def clear_cache(self) -> None:
        """Forgets every cached math key and zeroes the counters."""
        with self.lock:
            self.cache.clear()
            self.aliases.clear()
            self.hits = self.misses = self.timeouts = self.errors = self.regex_timeouts = 0

    def cache_info(self) -> CacheInfo:
        """Counters of the math key cache."""
        with self.lock:
            return CacheInfo(
                self.hits,
                self.misses,
                len(self.cache),
                self.timeouts,
                self.errors,
                self.regex_timeouts,
            )

    def extract(
        self,
        text: str,
        kind: AnswerKind,
        pattern: str | None = None,
        owner: KeyOwner | None = None,
        reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
    ) -> str | None:
        """The final answer of one sample (never a thought), or None when it abstains."""
        timeout = owner.regex_timeout() if owner is not None else REGEX_TIMEOUT_S
        try:
            return _core_extract(text, kind, pattern, timeout, reasoning_tags=reasoning_tags)
        except RegexTimeout:
            if owner is not None:
                owner.regex_timeouts += 1  # a race here only moves the strike by one
            self._regex_timed_out()
            return None
        except RegexUnavailable:
            assert pattern is not None
            thought = read_thought(text, reasoning_tags)
            if thought.cut:
                return None
            try:
                result: str | None = self._get_pool().call(
                    search_re, thought.content, pattern, deadline=_RE_POOL_DEADLINE_S
                )
            except WorkerTimeout:
                self._regex_timed_out()
                return None
            except WorkerError as exc:
                if "invalid answer pattern" in str(exc):
                    raise ValueError(str(exc).split(": ", 1)[-1]) from None
                return None
            return result

    def _regex_timed_out(self) -> None:
        with self.lock:
            self.regex_timeouts += 1
        self.stats.answer_timeout("regex")

    def _quick_math_key(self, answer: str) -> tuple[str | None, str]:
        """``(key, cleaned answer)``; the key is None when a worker must parse the answer.

        Text answers, plain numbers and answers unsafe for sympy key without a
        worker; parsed keys come from the cache, first by the raw answer (no
        clean-up), then by the cleaned one.
        """
        with self.lock:
            key = self.aliases.get(answer)
            if key is not None:
                self.hits += 1
                return key, ""
        cleaned = clean_math(answer)
        words = is_text_answer(cleaned)
        if words is not None:
            return words, cleaned
        if not is_safe_for_sympy(cleaned):
            return math_fallback_key(cleaned), cleaned
        number = plain_number_key(cleaned)
        with self.lock:
            if number is not None:
                self.aliases.put(answer, number)
                return number, cleaned
            key = self.cache.get(cleaned)
            if key is not None:
                self.hits += 1
                self.aliases.put(answer, key)
        return key, cleaned

    def _math_key(self, answer: str, owner: KeyOwner = _SHARED_OWNER) -> str:
        quick, cleaned = self._quick_math_key(answer)
        if quick is not None:
            return quick
        with self.lock:
            future = self.inflight.get(cleaned)
            first = future is None
            if future is None:
                future = self.inflight[cleaned] = Future()
                self.misses += 1
            else:
                self.hits += 1
        if not first:
            return future.result()
        key = math_fallback_key(cleaned)
        cacheable = True
        try:
            with self.turns.turn(owner, self.workers):
                key = self._get_pool().call(sympy_key, cleaned, deadline=self.deadline)
        except WorkerTimeout:
            with self.lock:
                self.timeouts += 1
            self.stats.answer_timeout("sympy")
        except WorkerError:
            cacheable = False
            with self.lock:
                self.errors += 1
        finally:
            with self.lock:
                if cacheable:
                    self.cache.put(cleaned, key)
                    self.aliases.put(answer, key)
                del self.inflight[cleaned]
            future.set_result(key)
        return key

    def canonical_key(self, answer: str, kind: AnswerKind) -> str:
        """The voting key of an extracted answer (may block up to the deadline), at most
        :data:`~blendserve.core.answers.normalize.MAX_KEY_CHARS` long."""
        check_kind(kind)
        if kind in ("math", "auto"):
            return bounded_key(self._math_key(answer))
        if kind == "number":
            return bounded_key(number_key(answer) or exact_key(answer))
        if kind == "choice":
            return bounded_key(choice_key(answer))
        return bounded_key(exact_key(answer))

    async def acanonical_key(
        self, answer: str, kind: AnswerKind, owner: KeyOwner | None = None
    ) -> str:
        """:meth:`canonical_key` for an event loop: sympy work runs off the loop's thread."""
        check_kind(kind)
        if kind not in ("math", "auto"):
            return self.canonical_key(answer, kind)
        quick, _ = self._quick_math_key(answer)
        if quick is not None:
            return bounded_key(quick)
        loop = asyncio.get_running_loop()
        key = await loop.run_in_executor(
            self._get_executor(), self._math_key, answer, owner or _SHARED_OWNER
        )
        return bounded_key(key)

    async def aextract(
        self,
        text: str,
        kind: AnswerKind,
        pattern: str | None = None,
        owner: KeyOwner | None = None,
        reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
    ) -> str | None:
        """:meth:`extract` for an event loop: a ``regex`` search runs off the loop's thread."""
        check_kind(kind)
        if kind != "regex":
            return self.extract(text, kind, pattern, reasoning_tags=reasoning_tags)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._get_executor(), self.extract, text, kind, pattern, owner, reasoning_tags
        )

    def keyer(
        self,
        kind: AnswerKind,
        pattern: str | None = None,
        reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
    ) -> SampleKeyer:
        """How one job (or one client of a pool) keys its samples: an owner of its own.

        Raises:
            ValueError: unknown kind, or a ``regex`` kind without a valid pattern.
        """
        check_kind(kind)
        if kind == "regex":
            self.extract("", kind, pattern)  # a pattern that does not compile fails here
        return SampleKeyer(self, kind, pattern, reasoning_tags)


class SampleKeyer:
    """``completion text -> (answer, key)``, both None when the sample abstains: how a
    job or pool keys its samples (the scheduler's ``Keyer``).

    Made by :meth:`AnswerKeys.keyer`; each is its own owner of the sympy workers' time.
    The scheduler reads samples' thoughts with its ``reasoning_tags``.
    """

    __slots__ = ("_keys", "_owner", "kind", "pattern", "reasoning_tags")

    def __init__(
        self,
        keys: AnswerKeys,
        kind: AnswerKind,
        pattern: str | None = None,
        reasoning_tags: ReasoningTags = DEFAULT_REASONING_TAGS,
    ) -> None:
        self._keys = keys
        self._owner = KeyOwner()
        self.kind = kind
        self.pattern = pattern
        self.reasoning_tags = reasoning_tags

    async def __call__(self, text: str) -> tuple[str | None, str | None]:
        keys, owner = self._keys, self._owner
        answer = await keys.aextract(text, self.kind, self.pattern, owner, self.reasoning_tags)
        if answer is None:
            return None, None
        key = await keys.acanonical_key(answer, self.kind, owner)
        if not key:  # nothing left of it once normalised ("$$$"): no vote
            return None, None
        return answer, key


def _after_fork() -> None:
    for keys in list(_LIVE):
        keys.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
