"""The FastAPI application: engine built in the lifespan, routes, error handlers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from blendserve import __version__, answers
from blendserve.core.policies.blend import warm_up as policy_warm_up
from blendserve.engines.base import Engine
from blendserve.engines.factory import build_engine
from blendserve.service import metrics
from blendserve.service.errors import install_error_handlers
from blendserve.service.jobs import JobDefaults, JobMaker
from blendserve.service.limits import Admission, BodySizeLimit, JobLimits
from blendserve.service.observability import RequestMetrics
from blendserve.service.observability import router as metrics_router
from blendserve.service.openai.grouping import Grouper
from blendserve.service.openai.online import DropIn, OnlinePools
from blendserve.service.openai.routes import router as openai_router
from blendserve.service.openai.served import ServedModels
from blendserve.service.openai.tokenizer import TOKENIZER_BODY_PATHS
from blendserve.service.openai.tokenizer import router as tokenizer_router
from blendserve.service.prometheus import PrometheusStats
from blendserve.service.recording import RecordingWriter
from blendserve.service.security import ApiKeyAuth, ClientIds
from blendserve.service.settings import Settings
from blendserve.service.shutdown import RunningJobs
from blendserve.service.solve.routes import router as solve_router
from blendserve.service.state import ServiceState
from blendserve.service.system.routes import router as system_router

__all__ = ["create_app"]


def create_app(
    settings: Settings | None = None,
    *,
    engine_factory: Callable[[], Awaitable[Engine]] | None = None,
    answer_keys: answers.AnswerKeys | None = None,
    running: RunningJobs | None = None,
) -> FastAPI:
    """Builds the service.

    Args:
        settings: service settings (default: read from the environment).
        engine_factory: builds the engine at startup (default: from ``settings``);
            tests pass a ready engine this way.
        answer_keys: the answer keys' workers and cache, shared with the caller
            (default: the app's own, ``settings.sympy_workers`` of them, started and
            stopped with it).
        running: where the app keeps its running jobs, for a server that drains
            them at shutdown (default: its own).

    Raises:
        OSError: the API key file cannot be read.
    """
    settings = settings if settings is not None else Settings()
    api_keys = settings.keys()
    sink = PrometheusStats()
    running = running if running is not None else RunningJobs()
    make_engine = engine_factory or (lambda: build_engine(settings.engine_config(), sink))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        recording = None
        if settings.record is not None:  # before the engine: a bad path fails at once
            metrics.recording_started()
            recording = RecordingWriter(settings.record, report=metrics.recording_lines)
        try:
            engine = await make_engine()
        except BaseException:
            if recording is not None:
                await recording.aclose()
            raise
        engine.report_to(sink)  # its jobs and pools report where it does
        served_models = ServedModels(
            engine, allow_aliases=settings.allow_model_aliases, default=settings.model
        )
        keys = answer_keys
        if keys is None:
            keys = answers.AnswerKeys()
            keys.configure(workers=settings.sympy_workers)
        keys.report_to(sink)
        maker = JobMaker(engine, JobDefaults.from_settings(settings), keys, recording)
        grouper = Grouper(
            maker,
            wait=settings.group_wait_ms / 1000,
            max_questions=settings.group_max,
            jobs=running,
        )
        pools = OnlinePools(
            maker, score=settings.sc_score, cap=settings.sc_cap, running=running,
            models=served_models.known,
        )  # fmt: skip
        dropin = DropIn(pools, grouper, online=settings.sc_mode == "online")
        app.state.service = ServiceState(
            settings=settings,
            engine=engine,
            served_models=served_models,
            job_maker=maker,
            limits=JobLimits.from_settings(settings),
            admission=Admission(settings.max_concurrent_jobs, settings.max_queued_questions),
            dropin=dropin,
            running=running,
            clients=ClientIds(bool(api_keys), settings.client_header),
        )
        # Start the sympy workers now, so the first math answer does not wait for them.
        warming = asyncio.ensure_future(asyncio.to_thread(keys.warm_up))
        # Before the first request: the first job would load them on the event loop.
        await asyncio.to_thread(policy_warm_up)
        try:
            yield
        finally:
            await dropin.aclose()
            if recording is not None:  # after the pools, whose questions hand theirs over
                await recording.aclose()
            await engine.aclose()
            await asyncio.gather(warming, return_exceptions=True)
            if answer_keys is None:
                await asyncio.to_thread(keys.shutdown)

    app = FastAPI(title="blendserve", version=__version__, lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(system_router)
    app.include_router(solve_router)
    app.include_router(openai_router)
    app.include_router(tokenizer_router)
    app.include_router(metrics_router)
    # The last added runs first: count every request, then check its key, then its size.
    tokenizer_bytes = settings.max_tokenizer_body_bytes
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        path_bytes=dict.fromkeys(TOKENIZER_BODY_PATHS, tokenizer_bytes),
    )
    app.add_middleware(ApiKeyAuth, keys=api_keys, protect_metrics=settings.metrics_auth)
    app.add_middleware(RequestMetrics)
    return app
