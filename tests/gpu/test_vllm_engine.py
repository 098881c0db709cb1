"""GPU smoke test of vLLM in-process (deselected by default: ``pytest -m gpu``)."""

import asyncio

import pytest
from blendserve.engines import GenerateRequest, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_generate_n_samples_and_cancel() -> None:
    from blendserve.engines.vllm_inprocess import VLLMEngine

    async def scenario() -> None:
        engine = VLLMEngine({"model": "Qwen/Qwen2.5-0.5B-Instruct", "gpu_memory_utilization": 0.5})
        try:
            request = GenerateRequest(
                messages=[
                    {"role": "user", "content": "What is 6 * 7? End with 'The answer is N'."}
                ],
                n=4,
                params=SamplingParams(temperature=0.8, max_tokens=128),
            )
            samples = await engine.generate(request)
            assert len(samples) == 4 and all(s.completion_tokens > 0 for s in samples)
            slow = asyncio.ensure_future(
                engine.generate(
                    GenerateRequest(
                        prompt="Count to ten thousand:", params=SamplingParams(max_tokens=4000)
                    )
                )
            )
            await asyncio.sleep(0.5)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            assert (await engine.health()).healthy
        finally:
            await engine.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 600))
