"""Answer extraction and canonical voting keys: right, fast, and never hanging.

Self-consistency is only as good as its vote: samples that give the same answer
in different forms (``\\frac12``, ``0.5``, ``\\dfrac{1}{2}``) must share a key, and
a truncated sample must not vote at all (:func:`extract` returns None).

``number``, ``choice``, ``exact`` and ``regex`` keys are cheap and computed
inline. ``math`` (and ``auto``) keys come from sympy, which can run away on
inputs such as ``10^{10^{10}}``, so:

* answers over a few hundred characters, power towers, huge exponents and
  factorials never reach sympy (they key as a normalised string);
* the rest run in a small pool of persistent worker processes, each answer
  under a hard deadline (default 2 s); a worker past it is killed and replaced
  and the answer keys as a normalised string;
* keys are cached per distinct (cleaned) answer, so 40 samples with 4 distinct
  answers parse 4 times, and concurrent requests for one answer parse it once;
* the workers are shared fairly between owners (:class:`KeyOwner`, one per
  job): the owner that has used them least goes next, so a job whose answers
  are slow never queues another job's quick answers behind its own.

:func:`acanonical_key` and :func:`aextract_key` never block an event loop: any
work that may wait on the pool runs on a small thread executor. Workers stop at
interpreter exit, or at :func:`shutdown`.

The ``regex`` kind runs the caller's pattern with the ``regex`` module's timeout
(0.25 s; past it the sample abstains). Without that module installed, the
standard ``re`` search runs in the worker pool under a 1 s deadline instead.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import NamedTuple

from blendserve._sympy_pool import SympyPool, WorkerError, WorkerTimeout
from blendserve.core.answers import (
    KINDS,
    RegexUnavailable,
    check_kind,
    choice_key,
    clean_math,
    exact_key,
    is_safe_for_sympy,
    is_text_answer,
    math_fallback_key,
    number_key,
    search_re,
    sympy_key,
)
from blendserve.core.answers import extract as _core_extract

__all__ = [
    "DEFAULT_DEADLINE_S",
    "KINDS",
    "CacheInfo",
    "KeyOwner",
    "acanonical_key",
    "aextract",
    "aextract_key",
    "cache_info",
    "canonical_key",
    "clear_cache",
    "configure",
    "extract",
    "shutdown",
    "warm_up",
]

#: Seconds one math answer may spend in sympy before it keys as a string.
DEFAULT_DEADLINE_S = 2.0
#: Deadline of a ``regex`` kind search run in the pool (no ``regex`` module).
_RE_POOL_DEADLINE_S = 1.0
_DEFAULT_CACHE_SIZE = 65_536
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
    """

    hits: int
    misses: int
    size: int
    timeouts: int
    errors: int


class KeyOwner:
    """Whose math keys are asked for (one job): the sympy workers are shared between owners."""

    __slots__ = ("__weakref__",)


class _Turns:
    """Gives the sympy workers to waiting calls, least-served owner first.

    An owner's service is the wall time its calls held a worker; of two owners
    with equal service the one with fewer calls running goes first, then the
    earlier arrival. An owner is forgotten when it is garbage collected.
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

    @contextmanager
    def turn(self, owner: KeyOwner, capacity: int) -> Iterator[None]:
        """Holds one of ``capacity`` workers for ``owner`` while the block runs."""
        with self._cond:
            entry = (owner, next(self._arrivals))
            self._waiting.append(entry)
            self._cond.wait_for(
                lambda: self._running < capacity and min(self._waiting, key=self._rank) is entry
            )
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


class _State:
    """Module state: settings, the pool, the cache and the executor (guarded by ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deadline = DEFAULT_DEADLINE_S
        self.workers = _DEFAULT_WORKERS
        self.cache_size = _DEFAULT_CACHE_SIZE
        self.pool: SympyPool | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.cache: OrderedDict[str, str] = OrderedDict()  # cleaned answer -> key
        self.aliases: OrderedDict[str, str] = OrderedDict()  # raw answer -> key
        self.inflight: dict[str, Future[str]] = {}
        self.turns = _Turns()
        self.hits = self.misses = self.timeouts = self.errors = 0

    def after_fork(self) -> None:
        """In a forked child: the parent's workers, threads and lock are not ours."""
        self.lock = threading.Lock()
        self.pool = None
        self.executor = None
        self.inflight = {}
        self.turns = _Turns()

    def get_pool(self) -> SympyPool:
        with self.lock:
            if self.pool is None:
                self.pool = SympyPool(size=self.workers)
            return self.pool

    def get_executor(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(
                    max_workers=max(_KEY_THREADS, 2 * self.workers),
                    thread_name_prefix="blendserve-keys",
                )
            return self.executor


_state = _State()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_state.after_fork)


def configure(
    *,
    deadline_s: float | None = None,
    workers: int | None = None,
    cache_size: int | None = None,
) -> None:
    """Changes the math key settings; a new worker count restarts the pool.

    Args:
        deadline_s: seconds one answer may spend in sympy (default 2).
        workers: worker processes (default 1).
        cache_size: distinct answers whose keys are kept (default 65,536).
    """
    if deadline_s is not None and deadline_s <= 0:
        raise ValueError("deadline_s must be positive")
    if workers is not None and workers < 1:
        raise ValueError("workers must be at least 1")
    if cache_size is not None and cache_size < 0:
        raise ValueError("cache_size must be >= 0")
    old_pool = None
    with _state.lock:
        if deadline_s is not None:
            _state.deadline = deadline_s
        if cache_size is not None:
            _state.cache_size = cache_size
            for cache in (_state.cache, _state.aliases):
                while len(cache) > cache_size:
                    cache.popitem(last=False)
        if workers is not None and workers != _state.workers:
            _state.workers = workers
            old_pool, _state.pool = _state.pool, None
    if old_pool is not None:
        old_pool.close()


def warm_up() -> None:
    """Starts the worker processes now (e.g. at service start) instead of on first use."""
    _state.get_pool().warm()


def shutdown() -> None:
    """Stops the worker processes and the executor; both restart lazily if used again."""
    with _state.lock:
        pool, _state.pool = _state.pool, None
        executor, _state.executor = _state.executor, None
    if pool is not None:
        pool.close()
    if executor is not None:
        executor.shutdown(wait=True)


def clear_cache() -> None:
    """Forgets every cached math key and zeroes the counters."""
    with _state.lock:
        _state.cache.clear()
        _state.aliases.clear()
        _state.hits = _state.misses = _state.timeouts = _state.errors = 0


def cache_info() -> CacheInfo:
    """Counters of the math key cache."""
    with _state.lock:
        return CacheInfo(
            _state.hits, _state.misses, len(_state.cache), _state.timeouts, _state.errors
        )


def extract(text: str, kind: str, pattern: str | None = None) -> str | None:
    """The final answer of one sample, or None when it abstains (no answer, truncated).

    Args:
        text: the sample's completion text.
        kind: ``auto``, ``number``, ``math``, ``choice``, ``regex`` or ``exact``.
        pattern: the ``regex`` kind's pattern (first group, else the whole match).

    Raises:
        ValueError: unknown kind, or a ``regex`` kind without a valid pattern.
    """
    try:
        return _core_extract(text, kind, pattern)
    except RegexUnavailable:
        assert pattern is not None
        try:
            result: str | None = _state.get_pool().call(
                search_re, text, pattern, deadline=_RE_POOL_DEADLINE_S
            )
        except WorkerTimeout:
            return None
        except WorkerError as exc:
            if "invalid answer pattern" in str(exc):
                raise ValueError(str(exc).split(": ", 1)[-1]) from None
            return None
        return result


def _bounded_put(cache: OrderedDict[str, str], key: str, value: str, size: int) -> None:
    """Inserts into an LRU dict, evicting the oldest entries (caller holds the lock)."""
    if size <= 0:
        return
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


def _quick_math_key(answer: str) -> tuple[str | None, str]:
    """``(key, cleaned answer)``; the key is None when a worker must parse the answer.

    Text answers and answers unsafe for sympy key without a worker; parsed keys
    come from the cache, first by the raw answer (no clean-up), then by the
    cleaned one.
    """
    with _state.lock:
        key = _state.aliases.get(answer)
        if key is not None:
            _state.aliases.move_to_end(answer)
            _state.hits += 1
            return key, ""
    cleaned = clean_math(answer)
    words = is_text_answer(cleaned)
    if words is not None:
        return words, cleaned
    if not is_safe_for_sympy(cleaned):
        return math_fallback_key(cleaned), cleaned
    with _state.lock:
        key = _state.cache.get(cleaned)
        if key is not None:
            _state.cache.move_to_end(cleaned)
            _state.hits += 1
            _bounded_put(_state.aliases, answer, key, _state.cache_size)
    return key, cleaned


def _math_key(answer: str, owner: KeyOwner = _SHARED_OWNER) -> str:
    quick, cleaned = _quick_math_key(answer)
    if quick is not None:
        return quick
    with _state.lock:
        future = _state.inflight.get(cleaned)
        first = future is None
        if future is None:
            future = _state.inflight[cleaned] = Future()
            _state.misses += 1
        else:
            _state.hits += 1
    if not first:
        return future.result()
    key = math_fallback_key(cleaned)
    cacheable = True
    try:
        with _state.turns.turn(owner, _state.workers):
            key = _state.get_pool().call(sympy_key, cleaned, deadline=_state.deadline)
    except WorkerTimeout:
        with _state.lock:
            _state.timeouts += 1
    except WorkerError:
        cacheable = False
        with _state.lock:
            _state.errors += 1
    finally:
        with _state.lock:
            if cacheable:
                _bounded_put(_state.cache, cleaned, key, _state.cache_size)
                _bounded_put(_state.aliases, answer, key, _state.cache_size)
            del _state.inflight[cleaned]
        future.set_result(key)
    return key


def canonical_key(answer: str, kind: str) -> str:
    """The voting key of an extracted answer: equivalent answers share it.

    ``number``: Decimal form (``1,000``, ``$1000.00`` -> ``1000``; ``50%`` -> ``50``).
    ``math``/``auto``: a canonical sympy form (``\\frac12``, ``0.5`` -> ``1/2``; sets
    order-free; ``x = 5`` -> ``5``), plain words lower-cased, and a normalised
    string when sympy is unsafe, fails or misses the deadline. ``choice``: the
    upper-case letter. ``exact``/``regex``: the trimmed, whitespace-folded text.
    May block up to the deadline for an uncached ``math`` key.

    Raises:
        ValueError: unknown kind.
    """
    check_kind(kind)
    if kind in ("math", "auto"):
        return _math_key(answer)
    if kind == "number":
        return number_key(answer) or exact_key(answer)
    if kind == "choice":
        return choice_key(answer)
    return exact_key(answer)


async def acanonical_key(answer: str, kind: str, owner: KeyOwner | None = None) -> str:
    """:func:`canonical_key` for an event loop: sympy work runs off the loop's thread.

    Args:
        answer: an extracted answer.
        kind: its answer kind.
        owner: whose key it is (one per job), for a fair share of the workers.

    Raises:
        ValueError: unknown kind.
    """
    check_kind(kind)
    if kind not in ("math", "auto"):
        return canonical_key(answer, kind)
    quick, _ = _quick_math_key(answer)
    if quick is not None:
        return quick
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _state.get_executor(), _math_key, answer, owner or _SHARED_OWNER
    )


async def aextract(
    text: str, kind: str, pattern: str | None = None, owner: KeyOwner | None = None
) -> tuple[str | None, str | None]:
    """Extracts the answer of a sample and returns it with its key (both None: it abstains).

    The ``regex`` kind's search runs on the executor too (it may take up to its timeout).

    Args:
        text: the sample's completion text.
        kind: the answer kind.
        pattern: the ``regex`` kind's pattern.
        owner: whose key it is (one per job), for a fair share of the workers.

    Raises:
        ValueError: unknown kind, or a ``regex`` kind without a valid pattern.
    """
    check_kind(kind)
    if kind == "regex":
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(_state.get_executor(), extract, text, kind, pattern)
    else:
        answer = extract(text, kind, pattern)
    if answer is None:
        return None, None
    return answer, await acanonical_key(answer, kind, owner)


async def aextract_key(text: str, kind: str, pattern: str | None = None) -> str | None:
    """Extracts the answer of a sample and returns its key (None when it abstains).

    The ``regex`` kind's search runs on the executor too (it may take up to its timeout).

    Raises:
        ValueError: unknown kind, or a ``regex`` kind without a valid pattern.
    """
    return (await aextract(text, kind, pattern))[1]
