"""vLLM in-process: ``AsyncLLM`` in the service's own process (extra ``blendserve[vllm]``).

Kept thin on purpose: it follows vLLM's documented v1 API (``AsyncLLM``,
``SamplingParams(n=k, output_kind=FINAL_ONLY)``, or ``DELTA`` to hand each sample over as
it ends; ``abort`` on cancel), on a GPU or vLLM's CPU build (docs/engines.md).

A request with a :class:`~blendserve.core.signals.ConfidenceSpec` asks vLLM for its top
``logprobs`` and reads each sample's tokens into a meter as they come: a completion
output's ``logprobs`` hold one ``{token_id: Logprob}`` a token (its new tokens' in
``DELTA``, all of them in ``FINAL_ONLY``), the sampled token's beside the top k.

A request with a ``cut_below`` bar is read step by step (``DELTA``) and sent as single
requests (a request of ``n`` as ``n``, seeded ``seed + i``, as vLLM seeds its children):
once a sample's window confidence falls below the bar, it is handed over with finish
reason :data:`~blendserve.core.traces.LOW_CONFIDENCE`, the text and tokens it had, and its
request is aborted in the engine, which frees its slot (vLLM aborts a request by the id
it was given; the children of one request of ``n`` have ids of vLLM's own).

A caller's ``seed`` is dropped on vLLM's CPU build while it splits prefills into chunks
(its default): there, a seeded request whose prompt is prefilled over more than one step
kills the engine core (vLLM 0.32 rewinds the request's generator with ``set_offset``,
which a CPU ``torch.Generator`` does not have), and with it every request in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Any

from blendserve.core.signals import ConfidenceMeter
from blendserve.core.traces import LOW_CONFIDENCE
from blendserve.engines.base import Engine, EngineHealth, GenerateRequest, Sample
from blendserve.engines.engine_cost import Busy, EngineCost, cost_counters
from blendserve.errors import EngineDown, EngineError, EngineUnavailable
from blendserve.stats import NO_STATS, Stats
from blendserve.util.cancel import cancel_all

__all__ = ["COST_INTERVAL_S", "VLLMEngine"]

#: Seconds between readings of vLLM's step-cost series (see ``engine_cost``).
COST_INTERVAL_S = 1.0

_log = logging.getLogger(__name__)


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
    """Samples from a vLLM ``AsyncLLM`` running in this process, made of ``engine_args``
    (``AsyncEngineArgs`` fields, at least ``model``) and served as ``name`` (None:
    ``model``); ``sink`` is for jobs and pools built on it (vLLM keeps its own stats).

    Raises:
        EngineUnavailable: vLLM is not installed.
    """

    name = "vllm"
    delivers_each = True  # stream() takes vLLM's DELTA outputs, each sample as it finishes

    def __init__(
        self, engine_args: Mapping[str, Any], *, name: str | None = None, sink: Stats = NO_STATS
    ) -> None:
        self.sink = sink
        vllm, engine_args_cls, output_kind, async_llm = _vllm()
        self._vllm = vllm
        self._final_only = output_kind.FINAL_ONLY
        self._delta = output_kind.DELTA
        self.model = name or str(engine_args["model"])
        self._engine = async_llm.from_engine_args(engine_args_cls(**engine_args))
        self._tokenizer: Any = None
        self._seeds = _seeds_are_safe(self._engine)
        self._seed_dropped = False
        # vLLM's --max-num-seqs: what jobs may fill (the service's own load is all of it).
        scheduler = getattr(getattr(self._engine, "vllm_config", None), "scheduler_config", None)
        self.capacity = getattr(scheduler, "max_num_seqs", None)
        self._cost_task: asyncio.Task[None] | None = None
        self._busy = Busy()

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
        samples = [s async for s in self._run(request, self._final_only)]
        if not samples:
            raise EngineUnavailable("vLLM returned no output")
        return samples

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[Sample, None]:
        """The request's samples as each ends (vLLM's ``DELTA`` outputs of its ``n``
        child requests); closing the iterator aborts the samples still running."""
        async for sample in self._run(request, self._delta):
            yield sample

    def _watch_cost(self) -> None:
        """Starts reading vLLM's own step-cost series, unless it runs or nothing takes them."""
        if self.cost is None or (self._cost_task is not None and not self._cost_task.done()):
            return
        self._cost_task = asyncio.get_running_loop().create_task(
            self._cost_loop(self.cost), name="blendserve-vllm-cost"
        )

    async def _cost_loop(self, cost: EngineCost) -> None:
        """Hands vLLM's series (in this process's Prometheus registry) to ``cost`` each second."""
        from prometheus_client import REGISTRY

        while True:
            samples = [
                (s.name, s.value)
                for family in REGISTRY.collect()
                if family.name.startswith("vllm:")
                for s in family.samples
            ]
            cost.observe(self.name, cost_counters(samples), time.monotonic(), self._busy.since)
            await asyncio.sleep(COST_INTERVAL_S)

    async def _run(self, request: GenerateRequest, kind: Any) -> AsyncGenerator[Sample, None]:
        """Each sample once its output is finished, or cut (see the module); ``kind`` is
        vLLM's output kind where nothing is cut."""
        if request.cut_below is None or request.confidence is None:
            async for sample in self._run_one(request, kind):
                yield sample
            return
        if request.n == 1:
            async for sample in self._run_one(request, self._delta):
                yield sample
            return

        async def single(i: int) -> list[Sample]:
            one = dataclasses.replace(request, n=1, params=request.params.from_sample(i))
            return [sample async for sample in self._run_one(one, self._delta)]

        tasks = [asyncio.ensure_future(single(i)) for i in range(request.n)]
        try:
            for ended in asyncio.as_completed(tasks):
                for sample in await ended:
                    yield sample
        finally:
            await cancel_all(tasks)  # closed early: the singles still running are aborted

    async def _run_one(self, request: GenerateRequest, kind: Any) -> AsyncGenerator[Sample, None]:
        """One vLLM request's samples (see :meth:`_run`)."""
        self._watch_cost()
        p = request.params
        extra = {k: v for k, v in p.extra.items() if k != "chat_template_kwargs"}
        options = {
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
            "min_p": p.min_p, "max_tokens": p.max_tokens, "seed": self._seed(p.seed),
            "stop": list(p.stop) if p.stop else None,
        }  # fmt: skip
        spec = request.confidence
        if spec is not None and "logprobs" not in extra:  # a caller's own ask wins
            options["logprobs"] = spec.top_logprobs
        params = self._vllm.SamplingParams(
            n=request.n,
            output_kind=kind,
            **{k: v for k, v in options.items() if v is not None},
            **extra,
        )
        request_id = f"blendserve-{uuid.uuid4().hex}"
        texts: dict[int, list[str]] = {}
        tokens: dict[int, int] = {}
        meters: dict[int, ConfidenceMeter] = {}  # sample index -> its confidence so far
        prompt_tokens = 0
        finished = False
        self._busy.enter()
        try:
            async for output in self._engine.generate(
                await self._prompt(request), params, request_id
            ):
                prompt_tokens = prompt_tokens or len(output.prompt_token_ids or [])
                for o in output.outputs:
                    texts.setdefault(o.index, []).append(o.text)
                    tokens[o.index] = tokens.get(o.index, 0) + len(o.token_ids)
                    if spec is not None:
                        if o.index not in meters:
                            meters[o.index] = ConfidenceMeter(spec)
                        read = _read_logprobs(meters[o.index], o, request.cut_below)
                        if read is not None and o.finish_reason is None:
                            # Cut (a single request): the finally below aborts it.
                            yield Sample(
                                "".join(texts.pop(o.index)),
                                LOW_CONFIDENCE,
                                prompt_tokens,
                                tokens.pop(o.index) - len(o.token_ids) + read,
                                self.name,
                                confidence=meters.pop(o.index).summary(),
                            )
                            return
                    if o.finish_reason is not None:
                        meter = meters.pop(o.index, None)
                        yield Sample(
                            "".join(texts.pop(o.index)),
                            o.finish_reason,
                            prompt_tokens,
                            tokens.pop(o.index),
                            self.name,
                            stop_reason=None if o.stop_reason is None else str(o.stop_reason),
                            confidence=None if meter is None else meter.summary(),
                        )
            finished = True
        except BaseException as exc:
            if (down := self.down()) is not None:
                raise down from exc
            if isinstance(exc, Exception) and not isinstance(exc, EngineError):
                raise EngineUnavailable(f"vLLM failed: {exc}") from exc
            raise
        finally:
            self._busy.leave()
            # Cancelled, failed or closed early: its samples stop (a dead engine runs none).
            if not finished and self.down() is None:
                await self._engine.abort(request_id)

    def _seed(self, seed: int | None) -> int | None:
        """``seed``, or None where a seeded request can kill the engine (see the module)."""
        if seed is None or self._seeds:
            return seed
        if not self._seed_dropped:
            self._seed_dropped = True
            _log.warning(
                "vLLM's CPU build with chunked prefill dies on a seeded request whose "
                "prefill is split: callers' seeds are not passed to it (samples are not "
                "reproducible by seed)"
            )
        return None

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
        if self._cost_task is not None:
            await cancel_all([self._cost_task])
        self._engine.shutdown()


def _read_logprobs(meter: ConfidenceMeter, output: Any, bar: float | None = None) -> int | None:
    """Reads a completion output's tokens into ``meter``: its ``logprobs`` are one
    ``{token_id: Logprob}`` a token (a list, or vLLM's ``FlatLogprobs``, which iterates as
    one), the sampled token's beside the top k, of which the meter takes the k largest.

    With ``bar``, stops at the first token after which the window confidence is below it
    and returns the output's tokens read by then (None: it never fell below)."""
    positions: Iterable[Any] = output.logprobs or ()
    for i, position in enumerate(positions):
        if position:
            meter.add(entry.logprob for entry in position.values())
            if bar is not None:
                group = meter.group()
                if group is not None and group < bar:
                    return i + 1
    return None


def _seeds_are_safe(engine: Any) -> bool:
    """Whether requests may carry seeds: not on vLLM's CPU build with chunked prefill."""
    from vllm.platforms import current_platform

    scheduler = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
    chunked = getattr(scheduler, "enable_chunked_prefill", True)
    return not (current_platform.is_cpu() and chunked)
