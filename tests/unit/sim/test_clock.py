import asyncio

from blendserve.sim import VirtualClockLoop, run_virtual


def test_modelled_delays_advance_the_clock_in_order() -> None:
    finished: list[str] = []

    async def nap(name: str, seconds: float) -> float:
        await asyncio.sleep(seconds)
        finished.append(name)
        return asyncio.get_running_loop().time()

    async def main() -> list[float]:
        return await asyncio.gather(nap("long", 3600.0), nap("short", 60.0), nap("mid", 600.0))

    times, elapsed = run_virtual(main())
    assert finished == ["short", "mid", "long"]
    assert times == [3600.0, 60.0, 600.0]
    assert elapsed == 3600.0


def test_a_loop_starts_at_zero() -> None:
    loop = VirtualClockLoop()
    try:
        assert loop.time() == 0.0
        assert loop.run_until_complete(asyncio.sleep(5.0, result="done")) == "done"
        assert loop.time() == 5.0
    finally:
        loop.close()
