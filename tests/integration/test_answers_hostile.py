"""Hostile inputs: extraction and keys return quickly, the pool survives, nothing blocks."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest
from blendserve import answers
from blendserve.answers import acanonical_key, canonical_key, extract
from blendserve.answers._sympy_pool import SympyPool, WorkerError, WorkerTimeout
from blendserve.core.answers import sympy_key

pytestmark = pytest.mark.slow

#: Passes every pre-filter, then takes sympy close to a minute (expanding 1,891 terms).
SLOW_BUT_SAFE = "(x+y+z+1)^{60}"

HOSTILE = {
    "power_tower": "\\boxed{9^{9^{9^9}}}",
    "power_tower_plain": "10^{10^{10}}",
    "huge_factorial": "1000000000!",
    "boxed_factorial": "so \\boxed{1000000000!}",
    "digits": "7" * 100_000,
    "nested_braces": "\\boxed{" + "{" * 5_000 + "1" + "}" * 5_000 + "}",
    "open_braces": "{" * 5_000,
    "repeated_open_boxes": "\\boxed{" * 14_000,
    "repeated_closed_boxes": "\\boxed{1}" * 14_000,
    "spaces_after_answer": "The answer is" + " " * 100_000 + "!",
    "choice_spaces": "answer" + " " * 50_000 + "*" * 50_000,
    "hashes": "####" * 25_000,
    "slow_but_safe": "\\boxed{" + SLOW_BUT_SAFE + "}",
    "huge_exponent": "2^{99999999999}",
    "many_text": "\\text{" * 20_000,
}


@pytest.fixture(scope="module", autouse=True)
def _warm_pool() -> Iterator[None]:
    # Worker start-up (importing sympy) does not count against the deadline;
    # start it here so that the timings below measure the calls themselves.
    answers.configure(deadline_s=answers.DEFAULT_DEADLINE_S)
    answers.warm_up()
    yield
    answers.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["auto", "number", "math", "choice", "exact"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_extract_is_fast_on_hostile_text(name: str, kind: str) -> None:
    text = HOSTILE[name]
    started = time.monotonic()
    extract(text, kind)
    assert time.monotonic() - started < 3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_math_key_is_fast_on_hostile_answers(name: str) -> None:
    answers.clear_cache()
    text = HOSTILE[name]
    for answer in (text, extract(text, "auto")):
        if answer is None:
            continue
        started = time.monotonic()
        key = canonical_key(answer, "math")
        assert time.monotonic() - started < 3
        assert isinstance(key, str)
    # The pool (restarted if a worker was killed) still answers a normal query.
    assert canonical_key("\\frac{6}{8}", "math") == "3/4"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["digits", "nested_braces", "huge_exponent"])
def test_number_and_choice_keys_are_fast_on_hostile_answers(name: str) -> None:
    for kind in ("number", "choice", "exact", "regex"):
        started = time.monotonic()
        canonical_key(HOSTILE[name], kind)
        assert time.monotonic() - started < 3


@pytest.mark.timeout(60)
def test_truncated_hostile_boxes_abstain() -> None:
    for name in ("repeated_open_boxes", "open_braces", "many_text"):
        assert extract(HOSTILE[name], "math") is None
    assert extract(HOSTILE["repeated_open_boxes"], "number") is None
    assert extract(HOSTILE["repeated_closed_boxes"], "math") == "1"


@pytest.mark.timeout(60)
def test_slow_answer_times_out_to_a_string_key_and_the_pool_recovers() -> None:
    answers.clear_cache()
    started = time.monotonic()
    key = canonical_key(SLOW_BUT_SAFE, "math")
    assert time.monotonic() - started < 3
    assert key == "(x+y+z+1)^{60}"
    assert answers.cache_info().timeouts == 1
    # Cached: the second request does not wait for the deadline again.
    started = time.monotonic()
    assert canonical_key(SLOW_BUT_SAFE, "math") == key
    assert time.monotonic() - started < 0.5
    assert canonical_key("2\\sqrt{2}", "math") == canonical_key("\\sqrt{8}", "math")


@pytest.mark.timeout(60)
def test_catastrophic_regex_abstains_within_its_timeout() -> None:
    started = time.monotonic()
    assert extract("a" * 5_000 + "!", "regex", r"(a|aa)+$") is None
    assert extract("x" * 5_000, "regex", r"(x+x+)+y") is None
    assert time.monotonic() - started < 3


@pytest.mark.timeout(60)
def test_async_key_does_not_block_the_event_loop() -> None:
    answers.clear_cache()

    async def main() -> tuple[bool, bool, str]:
        ticked = asyncio.Event()

        async def ticker() -> None:
            ticked.set()

        slow = asyncio.create_task(acanonical_key(SLOW_BUT_SAFE, "math"))
        tick = asyncio.create_task(ticker())
        done, _ = await asyncio.wait({slow, tick}, return_when=asyncio.FIRST_COMPLETED)
        # Had the slow key run on the loop, both would be done by now.
        progressed = tick in done and ticked.is_set()
        still_running = not slow.done()
        return progressed, still_running, await slow

    progressed, still_running, key = asyncio.run(main())
    assert progressed
    assert still_running
    assert key == "(x+y+z+1)^{60}"


@pytest.mark.timeout(60)
def test_pool_kills_a_late_worker_and_leaves_no_process_behind() -> None:
    pool = SympyPool(size=1)
    try:
        assert pool.call(sympy_key, "\\frac{2}{4}", deadline=30) == "1/2"
        (first,) = pool.pids()
        with pytest.raises(WorkerTimeout):
            pool.call(sympy_key, SLOW_BUT_SAFE, deadline=0.5)
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # killed and reaped
        assert pool.call(sympy_key, "0.25", deadline=30) == "1/4"
        stats = pool.stats()
        assert (stats.timeouts, stats.started, stats.alive) == (1, 2, 1)
        (second,) = pool.pids()
    finally:
        pool.close()
    assert pool.stats().alive == 0
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)


@pytest.mark.timeout(60)
def test_shutdown_stops_the_workers_and_they_restart_lazily() -> None:
    assert canonical_key("\\frac{10}{4}", "math") == "5/2"
    answers.shutdown()
    answers.clear_cache()
    assert canonical_key("\\frac{10}{6}", "math") == "5/3"


@pytest.mark.timeout(60)
def test_a_forked_child_does_not_stop_the_parents_workers() -> None:
    pool = SympyPool(size=1)
    try:
        pool.warm()
        (pid,) = pool.pids()
        owner = pool._owner_pid
        pool._owner_pid = -1  # as seen from a forked child
        pool.close()
        os.kill(pid, 0)  # still alive: raises if it was stopped
        pool._owner_pid = owner
        pool._closed = False
        assert pool.call(sympy_key, "0.125", deadline=30) == "1/8"
    finally:
        pool.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.timeout(60)
def test_a_runaway_allocation_fails_in_the_worker_not_the_host() -> None:
    pool = SympyPool(size=1, memory_limit=1 << 30)
    try:
        with pytest.raises(WorkerError, match="MemoryError"):
            pool.call(bytes, 3 << 30, deadline=30)
        assert pool.call(sympy_key, "0.2", deadline=30) == "1/5"
    finally:
        pool.close()
