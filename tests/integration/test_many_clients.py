"""Many ``/v1`` clients of an online pool do not stall the event loop, nor hold memory for good.

A real uvicorn server on loopback over the replay engine, its clients named
by a header anyone sets. Every client's prior is fitted on its own questions,
so each has a dynamic programme of its own (hundreds of milliseconds to
build): those builds, and the tables a new budget's pool starts from, happen
in a worker thread, never on the thread that runs the event loop. A client
(or a pool) not seen for a while is dropped, and a budget past what the
programme can plan is said to be what stopped a question.
"""

import random
import threading
from collections.abc import Callable
from typing import Any

import blendserve.scheduler.pool as pool_module
import httpx
import pytest
from blendserve.core import programme
from blendserve.engines.replay import ReplayEngine
from blendserve.testing.live import LiveServer, serve_engine
from blendserve.testing.waiting import wait_until

from tests.support.priors import no_built_programmes

HEADER = "x-client-id"
CLIENTS = 40
# One refit (every 50 finished questions), then questions waved by the fitted prior.
FITTED, AFTER = 50, 8


def _client_records(client: int) -> list[dict[str, Any]]:
    """Client ``client``'s questions: contested to a degree of its own, so its prior is too."""
    rng = random.Random(client)
    records = []
    for q in range(FITTED + AFTER):
        leader = rng.randint(10 + client % 8, 20)  # of 20 recorded answers
        answers = ["1"] * leader + ["2"] * (20 - leader)
        rng.shuffle(answers)
        records.append({"prompt": f"client {client} question {q}", "answers": answers})
    return records


def _ask(
    url: str, client: str | None, prompts: list[str], budget: float = 8
) -> list[dict[str, Any]]:
    """One voted ``/v1/completions`` request of ``client``; its votes, one per prompt."""
    body = {
        "model": "replay",
        "prompt": prompts,
        "max_tokens": 16,
        "seed": 7,
        "blendserve": {"answer": "number", "budget_per_question": budget},
    }
    headers = {HEADER: client} if client is not None else {}
    reply = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=300)
    assert reply.status_code == 200, reply.text
    votes: list[dict[str, Any]] = reply.json()["blendserve"]
    return votes


class _BuildThreads:
    """The threads that built vote-prior programmes and their price tables."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.programmes: list[int] = []
        self.tables: list[int] = []
        built = programme._Programme
        init, extend = built.__init__, built._extend

        def counted_init(this: Any, *args: Any, **kwargs: Any) -> None:
            self.programmes.append(threading.get_ident())
            init(this, *args, **kwargs)

        def counted_extend(this: Any, *args: Any, **kwargs: Any) -> None:
            self.tables.append(threading.get_ident())
            extend(this, *args, **kwargs)

        monkeypatch.setattr(built, "__init__", counted_init)
        monkeypatch.setattr(built, "_extend", counted_extend)

    def on(self, thread: threading.Thread) -> tuple[int, int]:
        """Programmes and table extensions built on ``thread``."""
        return self.programmes.count(thread.ident or -1), self.tables.count(thread.ident or -1)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> _BuildThreads:
    """Counts builds by thread, from no programme, table or start price built."""
    no_built_programmes(monkeypatch)
    return _BuildThreads(monkeypatch)


def _in_threads(calls: list[Callable[[], object]]) -> None:
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not errors, errors[0]


def _pool_clients(live: LiveServer) -> list[Any]:
    return [
        client
        for pool in live.service.dropin.pools.pools.values()
        for client in pool.clients.values()
    ]


def test_fitted_priors_of_many_clients_are_never_built_on_the_loop(
    builds: _BuildThreads,
) -> None:
    records = [r for c in range(CLIENTS) for r in _client_records(c)]
    engine = ReplayEngine(records, seed=1)
    with serve_engine(engine, client_header=HEADER, default_concurrency=64) as live:
        loop_thread = live._thread

        def client(c: int) -> Callable[[], None]:
            prompts = [r["prompt"] for r in _client_records(c)]

            def ask() -> None:
                _ask(live.url, f"client-{c}", prompts[:FITTED])  # its prior refits once
                for vote in _ask(live.url, f"client-{c}", prompts[FITTED:]):
                    assert vote["answer"] in ("1", "2"), vote

            return ask

        _in_threads([client(c) for c in range(CLIENTS)])
        clients = _pool_clients(live)
        # Meanwhile their fitted priors' programmes were asked for, and are built in turn.
        wait_until(
            lambda: all(client.learning.prior.programme_built for client in clients),
            300,
            "every client's programme built",
        )
        priors = {client.learning.prior.weights.tobytes() for client in clients}
        on_loop = builds.on(loop_thread)
    # Every client's prior was fitted, each to its own questions: more programmes than
    # were ever kept before, and every one of them built off the loop.
    assert len(clients) == len(priors) == CLIENTS
    assert len(builds.programmes) > CLIENTS
    assert on_loop == (0, 0), (on_loop, len(builds.programmes), len(builds.tables))


def test_new_budgets_build_their_pools_off_the_loop(builds: _BuildThreads) -> None:
    records = [{"prompt": "easy", "answers": ["3"]}]
    with serve_engine(ReplayEngine(records, seed=1), default_concurrency=16) as live:
        budgets = [5.37 + 1.13 * i for i in range(12)]
        _in_threads(
            [lambda b=b: _ask(live.url, None, ["easy"], budget=b) for b in budgets]  # type: ignore[misc]
        )
        on_loop = builds.on(live._thread)
        pools = len(live.service.dropin.pools.pools)
    assert pools == len(budgets)
    assert builds.tables and on_loop == (0, 0), (on_loop, len(builds.tables))


def test_a_budget_past_the_programmes_horizon_says_so() -> None:
    records = [{"prompt": "even", "answers": ["1", "2"]}]
    with serve_engine(ReplayEngine(records, seed=1), default_concurrency=64) as live:
        (vote,) = _ask(live.url, None, ["even"], budget=10_000)
    # A 50/50 question: the programme had no room for the votes its price would buy.
    assert vote["confidence"]["asc"] > 0.05, vote
    assert vote["samples"] < 200 and vote["stopped"] == "horizon", vote
    assert vote["settled_early"] is False


def test_idle_clients_and_pools_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"prompt": "easy", "answers": ["3"]}]
    with serve_engine(ReplayEngine(records, seed=1), client_header=HEADER) as live:
        _in_threads(
            [lambda c=c: _ask(live.url, f"idle-{c}", ["easy"]) for c in range(CLIENTS)]  # type: ignore[misc]
        )
        assert len(_pool_clients(live)) == CLIENTS  # none idle for ten minutes yet
        # From now on a client or a pool is idle as soon as it has no open question.
        monkeypatch.setattr(pool_module, "IDLE_CLIENT_S", 0.0)
        for pool in live.service.dropin.pools.pools.values():
            pool.clients.idle_s = 0.0
        _ask(live.url, None, ["easy"], budget=9)  # another pool: every idle pool goes
        _ask(live.url, "late", ["easy"], budget=9)  # its idle clients go
        pools = live.service.dropin.pools.pools
        clients = _pool_clients(live)
    assert len(pools) == 1 and len(clients) == 1, (len(pools), len(clients))
