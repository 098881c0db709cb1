"""Client connection deadlines: slow or silent clients cannot hold a connection for ever.

uvicorn closes an idle keep-alive connection, but not one that never finishes
its headers, trickles its body or never reads its response: each would hold a
descriptor, and a stream that cannot be written its job and admission slots.
A connection past a deadline is aborted, which cancels its job
(docs/operations.md, "Slow or silent clients").
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from blendserve.service.errors import error_body

__all__ = ["ConnectionTimeouts", "TimedH11Protocol", "timed_protocol"]


@dataclass(frozen=True)
class ConnectionTimeouts:
    """Deadlines of one client connection, in seconds.

    Attributes:
        header: for a request's headers, from the connection's opening or a later
            request's first byte.
        body: for its body, from its headers.
        write: for a response whose client reads nothing (the send buffer stays full).
    """

    header: float = 10.0
    body: float = 60.0
    write: float = 30.0


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header, body and write deadlines (:attr:`timeouts`).

    A chunk with more than :attr:`max_body_bytes` still due (None: no limit) is a 413.
    """

    timeouts = ConnectionTimeouts()
    max_body_bytes: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._reading_body = False
        self._write_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read(self.timeouts.header)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read()
        self._disarm_write()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm_read(self.timeouts.header)  # the first byte of a later request
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        limit = self.max_body_bytes
        if limit is not None and not self.transport.is_closing() and self._declared_chunk() > limit:
            self._refuse_chunk()
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if not self._reading_body:
                self._reading_body = True
                self._arm_read(self.timeouts.body)
        elif state is not h11.IDLE:  # the request is in, or the connection ends
            self._reading_body = False
            self._disarm_read()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.timeouts.write, self._abort)

    def resume_writing(self) -> None:
        self._disarm_write()
        super().resume_writing()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._reading_body = False

    def _arm_read(self, seconds: float) -> None:
        self._disarm_read()
        self._read_deadline = self.loop.call_later(seconds, self._abort)

    def _disarm_read(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _declared_chunk(self) -> int:
        """Bytes still due of the body chunk being read (0: none, or not chunked).

        h11 keeps the size a chunk-size line declared to its reader.
        """
        if self.conn.their_state is not h11.SEND_BODY:
            return 0
        reader = getattr(self.conn, "_reader", None)
        return int(getattr(reader, "_bytes_in_chunk", 0))

    def _refuse_chunk(self) -> None:
        """Answers 413 (the error contract) and closes: the body is never read."""
        if self.conn.our_state is not h11.SEND_RESPONSE:  # a response has started
            self._abort()
            return
        message = f"request body over {self.max_body_bytes} bytes (a chunk declares more)"
        body = json.dumps(error_body(message, 413)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        response = h11.Response(status_code=413, headers=headers, reason=b"Content Too Large")
        for event in (response, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self._disarm_read()
        self.transport.close()  # the application's receive() sees the client leave

    def _abort(self) -> None:
        # abort(), not close(): close() would wait for a full send buffer to drain.
        self._read_deadline = self._write_deadline = None
        self.transport.abort()


def timed_protocol(
    timeouts: ConnectionTimeouts, max_body_bytes: int | None = None
) -> type[TimedH11Protocol]:
    """A :class:`TimedH11Protocol` class for ``uvicorn.Config(http=...)``.

    Args:
        timeouts: the connection deadlines.
        max_body_bytes: the largest body any route takes (None: no limit on a chunk).
    """
    attributes = {"timeouts": timeouts, "max_body_bytes": max_body_bytes}
    return type("TimedH11Protocol", (TimedH11Protocol,), attributes)
