"""The service on a real uvicorn server on loopback, in a thread of this process.

Shared by the benchmarks that time it through HTTP (``bench.overhead.scheduler``,
``bench.wall_time.latency``, ``bench.samples.e2e_efficiency``).
"""

from __future__ import annotations

import asyncio
import threading
import time

import uvicorn
from blendserve.engines.replay import ReplayEngine
from blendserve.service import Settings, create_app


def serve(engine: ReplayEngine, settings: Settings) -> tuple[uvicorn.Server, threading.Thread, int]:
    """The service over ``engine`` on a real uvicorn server on loopback; returns it and its port."""

    async def factory() -> ReplayEngine:
        return engine

    app = create_app(settings, engine_factory=factory)
    server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]
