"""The model names a ``/v1`` request may give: listed ones, kept a while; aliases when allowed."""

from typing import TypeVar

import pytest
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample
from blendserve.errors import EngineUnavailable, ModelNotFound
from blendserve.service.openai.served import LIST_TTL_S, MISS_TTL_S, ServedModels

from tests.support.running import run_coroutine

T = TypeVar("T")


class _Listing(Engine):
    """Lists ``names`` (or fails when None), counting how often it is asked."""

    name = "listing"

    def __init__(self, names: list[str] | None) -> None:
        self.names = names
        self.asked = 0

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        raise AssertionError("not used")

    async def health(self) -> EngineHealth:
        return EngineHealth(True, {})

    async def models(self) -> list[str]:
        self.asked += 1
        if self.names is None:
            raise EngineUnavailable("no upstream listed its models")
        return list(self.names)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_listed_name_or_none_goes_on_and_the_list_is_kept() -> None:
    engine, clock = _Listing(["a", "b"]), _Clock()
    served = ServedModels(engine, clock=clock)
    assert [run_coroutine(served.resolve(name)) for name in ("a", "b", None, "a")] == [
        "a",
        "b",
        None,
        "a",
    ]
    assert engine.asked == 1
    clock.now += LIST_TTL_S
    assert run_coroutine(served.resolve("b")) == "b" and engine.asked == 2


def test_an_unknown_name_is_refused_after_asking_again_at_most_once_a_second() -> None:
    engine, clock = _Listing(["a"]), _Clock()
    served = ServedModels(engine, clock=clock)
    assert run_coroutine(served.resolve("a")) == "a"
    with pytest.raises(ModelNotFound) as refused:
        run_coroutine(served.resolve("new"))
    assert refused.value.param == "model" and "'new'" in str(refused.value)
    assert engine.asked == 1  # the list is not a second old yet
    clock.now += MISS_TTL_S
    engine.names = ["a", "new"]  # loaded since (an adapter)
    assert run_coroutine(served.resolve("new")) == "new" and engine.asked == 2


@pytest.mark.parametrize("names", [[], None], ids=["lists-none", "list-fails"])
def test_an_engine_without_a_list_takes_any_name(names: list[str] | None) -> None:
    assert run_coroutine(ServedModels(_Listing(names)).resolve("anything")) == "anything"


def test_an_alias_stands_for_the_default_or_the_first_model() -> None:
    engine = _Listing(["a", "b"])
    assert run_coroutine(ServedModels(engine, allow_aliases=True).resolve("x")) == "a"
    assert run_coroutine(ServedModels(engine, allow_aliases=True, default="b").resolve("x")) == "b"
    assert run_coroutine(ServedModels(engine, allow_aliases=True).resolve("b")) == "b"


def test_a_long_list_is_cut_in_the_message() -> None:
    message = str(ModelNotFound("x", [f"m{i}" for i in range(20)]))
    assert "'m7'" in message and "'m8'" not in message and "12 more" in message
