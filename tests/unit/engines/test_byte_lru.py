"""Caches bounded by bytes: the helper, the embedded engine's detokenized prompts, prompt counts."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import httpx2 as httpx
from blendserve.engines.base import GenerateRequest, Sample
from blendserve.engines.embedded import EmbeddedEngine, EmbeddedLlamaServer
from blendserve.engines.openai import OpenAIEngine
from blendserve.engines.openai.wire import CHAT
from blendserve.util.byte_lru import ENTRY_OVERHEAD, ByteLRU

MB = 1 << 20


def _retained(fill: Callable[[], object]) -> int:
    """Bytes still allocated after ``fill()`` ran and its garbage was collected."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


async def _retained_by(fill: Callable[[], Awaitable[object]]) -> int:
    """:func:`_retained` of a coroutine function."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await fill()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


# --- the helper ---------------------------------------------------------------------


def test_the_least_recently_used_entries_go_once_the_bytes_pass_the_bound() -> None:
    cache: ByteLRU[str, bytes] = ByteLRU(1000, size=lambda key, value: len(value))
    for key in "abc":
        cache.put(key, b"x" * 300)
    assert cache.get("a") == b"x" * 300  # now the most recently used
    cache.put("d", b"x" * 300)
    assert "b" not in cache and all(key in cache for key in "acd")
    assert (len(cache), cache.nbytes) == (3, 900)
    cache.put("c", b"x" * 50)  # replaced: its old size no longer counts
    assert cache.nbytes == 650


def test_an_entry_larger_than_the_bound_is_not_kept() -> None:
    cache: ByteLRU[str, bytes] = ByteLRU(1000, size=lambda key, value: len(value))
    cache.put("small", b"x" * 10)
    cache.put("huge", b"x" * 1001)
    assert "huge" not in cache and cache.get("small") == b"x" * 10


def test_large_entries_are_held_within_the_byte_bound() -> None:
    bound = 4 * MB
    cache: ByteLRU[int, str] = ByteLRU(bound)

    def fill() -> None:
        for i in range(100):  # 100 MB offered
            cache.put(i, f"{i:08d}" + "x" * (MB - 8))

    assert _retained(fill) <= bound
    assert cache.nbytes <= bound and len(cache) == 3
    assert cache.nbytes >= 3 * MB + 3 * ENTRY_OVERHEAD


# --- the embedded engine's detokenized prompts --------------------------------------------


class _Detokenizer(EmbeddedLlamaServer):
    """Turns each token id into 8 characters, counting the calls; runs no server."""

    def __init__(self) -> None:
        super().__init__(Path("model.gguf"))
        self.calls = 0

    async def detokenize(self, tokens: Sequence[int]) -> str:
        self.calls += 1
        return "x" * (8 * len(tokens))


def test_detokenized_prompts_are_kept_within_a_byte_bound() -> None:
    bound = 4 * MB
    tokens = 50_000  # a 400 KB text and 50k token ids a prompt

    async def scenario() -> tuple[int, int, int]:
        server = _Detokenizer()
        inner = OpenAIEngine(["http://127.0.0.1:9/v1"])
        asked: list[GenerateRequest] = []

        async def generate(request: GenerateRequest) -> list[Sample]:
            asked.append(request)
            return []

        inner.generate = generate  # type: ignore[method-assign]
        engine = EmbeddedEngine(server, inner, max_text_bytes=bound)
        try:
            first = range(tokens)
            await engine.generate(GenerateRequest(prompt=first))
            await engine.generate(GenerateRequest(prompt=first))  # kept: not asked again
            calls = server.calls

            async def fill() -> None:
                for i in range(1, 40):  # 16 MB of texts, 2 M token ids offered
                    await engine.generate(GenerateRequest(prompt=range(i, i + tokens)))
                asked.clear()

            retained = await _retained_by(fill)
            return calls, retained, engine.texts.nbytes
        finally:
            await inner.aclose()

    calls, retained, held = asyncio.run(scenario())
    assert calls == 1
    assert held <= bound
    # the texts within the bound, and nothing of the token ids (once 36 bytes a token)
    assert retained <= bound + MB, f"{retained / MB:.1f} MB retained"


# --- prompt token counts (upstreams whose streams carry no usage) ---------------------------


def test_prompt_token_counts_of_large_prompts_are_kept_within_a_byte_bound() -> None:
    async def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        count = len(body["messages"][0]["content"])
        message = {"role": "assistant", "content": "x"}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        usage = {"prompt_tokens": count, "completion_tokens": 1}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    bound = 64 * 1024

    async def scenario() -> tuple[list[int | None], int, int, int]:
        transport = httpx.MockTransport(answer)
        async with OpenAIEngine(["http://up.test/v1"], transport=transport) as engine:
            upstreams = engine._upstreams
            upstreams._prompt_counts.max_bytes = bound

            def body(i: int) -> dict[str, object]:
                text = f"{i:06d}" + "x" * 100_000  # 100 KB prompts
                return {"messages": [{"role": "user", "content": text}]}

            async def fill() -> None:
                for i in range(1, 600):  # 60 MB of prompts offered
                    await upstreams.prompt_tokens(CHAT, body(i), None)

            counts = [await upstreams.prompt_tokens(CHAT, body(0), None)]
            retained = await _retained_by(fill)
            counts.append(await upstreams.prompt_tokens(CHAT, body(599), None))
            cache = upstreams._prompt_counts
            return counts, retained, cache.nbytes, len(cache)

    counts, retained, held, entries = asyncio.run(scenario())
    assert counts == [100_006, 100_006]
    assert held <= bound and entries >= 100
    assert retained <= 4 * bound, f"{retained} bytes retained"
