"""The sympy workers are shared fairly between jobs: slow answers of one job do not
queue another job's answers behind them (real worker processes, real sympy)."""

import asyncio
import threading

import pytest
from blendserve import answers
from blendserve.answers import KeyOwner
from blendserve.answers._keys import _Turns
from blendserve.testing.waiting import wait_until


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    answers.clear_cache()
    answers.warm_up()


def test_a_job_with_many_slow_answers_does_not_hold_back_another_jobs_answer() -> None:
    acanonical_key = answers.default_keys().acanonical_key

    async def scenario() -> tuple[int, str]:
        slow_job, other_job = KeyOwner(), KeyOwner()
        # 16 distinct polynomial expansions, about 0.1-0.3 s of sympy each, one worker
        slow = [
            asyncio.ensure_future(acanonical_key(f"(x+1)^{{{k}}}-(x-1)^{{{k}}}", "math", slow_job))
            for k in range(30, 46)
        ]
        await asyncio.wait(slow, return_when=asyncio.FIRST_COMPLETED)
        key = await acanonical_key(r"\frac{14}{6}", "math", other_job)
        pending = sum(not task.done() for task in slow)
        await asyncio.gather(*slow)
        return pending, key

    pending, key = asyncio.run(scenario())
    assert key == "7/3"
    # First come, first served, the answer would wait for all 15 others.
    assert pending >= 12, pending


def test_with_two_workers_one_owner_never_holds_both() -> None:
    turns = _Turns()
    slow, other = KeyOwner(), KeyOwner()
    entered: list[str] = []
    release = threading.Event()

    def hold(owner: KeyOwner, name: str) -> None:
        with turns.turn(owner, 2):
            entered.append(name)
            release.wait(10)

    threads = [
        threading.Thread(target=hold, args=(owner, name))
        for owner, name in ((slow, "slow 1"), (slow, "slow 2"), (other, "other"))
    ]
    try:
        threads[0].start()
        wait_until(lambda: entered == ["slow 1"], 5, "the first slow call's turn")
        threads[1].start()
        wait_until(lambda: len(turns._waiting) == 1, 5, "the second slow call waiting")
        # The free worker is kept: the other owner's call starts while the slow one waits.
        threads[2].start()
        wait_until(lambda: "other" in entered, 5, "the other owner's turn")
        assert entered == ["slow 1", "other"]
    finally:
        release.set()
        for thread in threads:
            thread.join(10)
    assert entered == ["slow 1", "other", "slow 2"]
