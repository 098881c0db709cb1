"""Wave programmes built off the event loop, and a pool's idle clients forgotten."""

import asyncio
import threading
from collections.abc import Callable

import pytest
from blendserve.answers import extract
from blendserve.core import programme
from blendserve.core.programme import ReadyPrior, VotePrior
from blendserve.core.stopping import StoppingRule
from blendserve.engines.replay import ReplayEngine
from blendserve.scheduler import Question
from blendserve.scheduler.pool import Pool, PoolSpec
from blendserve.scheduler.priors import Builds, ready_rule

from tests.support.priors import fitted_prior, no_built_programmes
from tests.support.running import run_coroutine

_PRICE = -5.0


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    no_built_programmes(monkeypatch)


def test_a_build_asked_for_twice_runs_once_in_a_worker_thread() -> None:
    threads: list[int] = []

    def build() -> int:
        threads.append(threading.get_ident())
        return len(threads)

    async def ask() -> tuple[int, int, int]:
        builds = Builds.here()
        first, second = await asyncio.gather(builds.run("k", build), builds.run("k", build))
        return first, second, builds.num_built

    assert run_coroutine(ask()) == (1, 1, 1)
    assert threads != [threading.get_ident()]


def test_awaited_builds_go_before_background_ones() -> None:
    order: list[str] = []
    gate = threading.Event()

    def build(name: str, wait: bool = False) -> Callable[[], None]:
        def run() -> None:
            if wait:
                gate.wait(30)
            order.append(name)

        return run

    async def ask() -> None:
        builds = Builds.here()
        background = [
            builds.ask("a", build("a", wait=True), now=False),
            builds.ask("b", build("b"), now=False),
            builds.ask("c", build("c"), now=False),
        ]
        await builds.run("now", build("now"))
        again = builds.ask("c", build("again"))  # queued: the same build
        gate.set()
        await again
        await asyncio.gather(*background)  # a build left queued is cancelled with its loop

    run_coroutine(ask())
    assert order[0] == "now" and order.index("c") < order.index("b")
    assert "again" not in order and sorted(order) == ["a", "b", "c", "now"]


def test_a_decision_never_waits_for_a_programme_and_has_it_built_meanwhile() -> None:
    prior = fitted_prior([0.62] * 100)
    rule = StoppingRule("asc", 64, max_rounds=4, prior=prior)

    state = (5, 3, 2, 8)
    need = prior.need(_PRICE, 3)
    release = threading.Event()
    build = programme.Need.build

    def held(self: programme.Need) -> None:
        if self == need:  # the client's own programme waits until it has been looked for
            release.wait(30)
        build(self)

    async def decide() -> tuple[int, bool, StoppingRule]:
        early = await ready_rule(rule, _PRICE, 1)
        assert isinstance(early.prior, ReadyPrior)
        wave, built = early.wave_size(*state, _PRICE, 1), prior.programme_built
        release.set()
        # The background build of its programme, awaited here as the same build.
        await Builds.here().run(need, need.build)
        return wave, built, await ready_rule(rule, _PRICE, 1)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(programme.Need, "build", held)
        early, built_then, later = run_coroutine(decide())
    assert not built_then and prior.programme_built
    # Meanwhile a new stream's programme decided; then the client's own, as the rule does.
    fresh = StoppingRule("asc", 64, max_rounds=4, prior=VotePrior())
    assert early == fresh.wave_size(*state, _PRICE, 1)
    assert isinstance(later.prior, ReadyPrior)
    assert later.wave_size(*state, _PRICE, 1) == rule.wave_size(*state, _PRICE, 1) != early


def test_a_new_pools_start_price_is_computed_off_the_loop() -> None:
    engine = ReplayEngine([{"id": "q", "answers": ["4"]}], seed=0)
    pool = Pool(PoolSpec(budget_per_question=6.5), engine, _number)
    assert not programme.start_log_price_known(6.5, pool.spec.max_rounds)

    async def ask() -> int:
        event = await pool.submit(Question("q", prompt="q"))
        return event.samples

    loop_thread = threading.get_ident()
    built_on: list[int] = []
    original = programme._Programme._extend

    def extend(self: programme._Programme, *args: object) -> None:
        built_on.append(threading.get_ident())
        original(self, *args)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(programme._Programme, "_extend", extend)
        assert run_coroutine(ask()) >= 1
    assert programme.start_log_price_known(6.5, pool.spec.max_rounds)
    assert built_on and loop_thread not in built_on
    assert pool.num_open == 0 and pool.client().price.num_questions == 1


async def _number(text: str) -> tuple[str | None, str | None]:
    answer = extract(text, "number")
    return answer, answer


def test_clients_idle_for_the_pools_idle_time_are_forgotten() -> None:
    engine = ReplayEngine([{"id": "q", "answers": ["4"]}], seed=0)
    spec = PoolSpec(budget_per_question=4)
    idle = Pool(spec, engine, _number, idle_client_s=0.0)
    first = idle.client("a")
    idle.client("b")
    idle.client("c")  # a and b have no open question and are past their idle time
    assert list(idle.clients) == ["c"] and idle.client("a") is not first
    kept = Pool(spec, engine, _number)  # ten minutes
    first = kept.client("a")
    kept.client("b")
    assert kept.client("a") is first and list(kept.clients) == ["b", "a"]
    assert kept.idle(kept.seen + 601) and not kept.idle(kept.seen + 1)
