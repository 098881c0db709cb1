"""The model names a /v1 request may use, while the upstream's list comes and goes."""

import pytest
from blendserve.engines.replay import ReplayEngine
from blendserve.errors import EngineUnavailable, ModelNotFound
from blendserve.service.openai.served import LIST_TTL_S, MISS_TTL_S, ServedModels

from tests.support.running import run_coroutine


class _Listing(ReplayEngine):
    """Lists ``served`` until ``down``, then fails to list; counts the listings asked."""

    def __init__(self) -> None:
        super().__init__([{"id": "q", "answers": ["1"]}])
        self.down = False
        self.asked = 0

    async def models(self) -> list[str]:
        self.asked += 1
        if self.down:
            raise EngineUnavailable("no upstream listed its models")
        return ["served"]


def test_a_list_that_fails_keeps_the_last_and_is_asked_again_after_a_second() -> None:
    now = [0.0]
    engine = _Listing()
    models = ServedModels(engine, clock=lambda: now[0])
    assert run_coroutine(models.resolve("served")) == "served"
    engine.down = True
    now[0] += LIST_TTL_S + 1  # the list is stale, and the upstream cannot list now
    with pytest.raises(ModelNotFound):
        run_coroutine(models.resolve("no-such-model"))
    asked = engine.asked
    with pytest.raises(ModelNotFound):  # not asked again at once, on every request
        run_coroutine(models.resolve("no-such-model"))
    assert engine.asked == asked
    now[0] += MISS_TTL_S
    engine.down = False
    assert run_coroutine(models.resolve("served")) == "served"
    run_coroutine(models.names(MISS_TTL_S))
    assert engine.asked == asked + 1
