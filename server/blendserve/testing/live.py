"""Serve an ASGI app with a real uvicorn server on 127.0.0.1 from a background thread."""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn
from fastapi import FastAPI

from blendserve.answers import AnswerKeys
from blendserve.engines.base import Engine
from blendserve.service.connections import ConnectionTimeouts, timed_protocol
from blendserve.service.state import ServiceState

#: One answer-keys state for the apps of :func:`serve_engine`: an app's own
#: would start a sympy worker process for each test.
KEYS = AnswerKeys()


class LiveServer:
    """A real uvicorn server on an ephemeral loopback port, lifespan included.

    Args:
        app: the application.
        timeout: seconds to wait for startup and shutdown.
        connections: client connection deadlines (the service's protocol, as
            ``blendserve serve`` runs it); None: uvicorn's plain h11.
        max_body_bytes: with ``connections``, the largest body any route takes.
    """

    def __init__(
        self,
        app: FastAPI,
        timeout: float = 20.0,
        connections: ConnectionTimeouts | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        http = timed_protocol(connections, max_body_bytes) if connections is not None else "h11"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, loop="asyncio", http=http, log_level="warning",
            access_log=False, timeout_graceful_shutdown=2,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.app = app
        self.timeout = timeout
        self._thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()))
        self.url = ""

    @property
    def service(self) -> ServiceState:
        """What the app's routes read (its engine, admission, pools), once it has started."""
        state: ServiceState = self.app.state.service
        return state

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + self.timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.005)
        (sock,) = self.server.servers[0].sockets
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self._thread.join(self.timeout)
        if self._thread.is_alive():
            raise RuntimeError("the server did not stop")


def serve_engine(engine: Engine, **settings: Any) -> LiveServer:
    """The blendserve app over ``engine`` (not started: use it as a context manager).

    ``settings`` override :class:`Settings`; by default 4 samples in flight per
    job and no ``/v1`` grouping wait.
    """
    from blendserve.service import Settings, create_app

    async def factory() -> Engine:
        return engine

    options = {"default_concurrency": 4, "group_wait_ms": 0, **settings}
    config = Settings(**options)
    return LiveServer(
        create_app(config, engine_factory=factory, answer_keys=KEYS),
        connections=config.connection_timeouts(),
        max_body_bytes=max(config.max_body_bytes, config.max_tokenizer_body_bytes),
    )
