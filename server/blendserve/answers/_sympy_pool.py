"""A small pool of persistent worker processes that run slow pure functions under a deadline.

sympy cannot be interrupted from another thread, so its work runs in worker
processes, and one that misses a call's deadline is killed and replaced (the
replacement warms up in the background). On POSIX a worker is a fresh
interpreter, so the caller's ``__main__`` is never re-imported; elsewhere the
``multiprocessing`` ``spawn`` context is used (which needs a main guard).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["PoolStats", "SympyPool", "WorkerError", "WorkerTimeout"]

#: Run by ``python -c`` in a worker: the parent's ``sys.path``, then the loop.
_BOOTSTRAP = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
    "from blendserve.answers._sympy_pool import _worker_entry; "
    "_worker_entry(int(sys.argv[2]), int(sys.argv[3]))"
)

#: Address-space cap of a POSIX worker: a runaway allocation raises MemoryError
#: in the worker (its answer keys as a string) instead of exhausting the host.
DEFAULT_MEMORY_LIMIT = 4 << 30


class WorkerTimeout(TimeoutError):
    """The call ran past its deadline; its worker was killed."""


class WorkerError(RuntimeError):
    """The call raised in the worker, or the worker died or could not start."""


@dataclass(frozen=True)
class PoolStats:
    """Counters of one pool: ``calls`` sent to a worker, ``timeouts`` (the worker killed),
    workers ``started`` (replacements included) and ``alive`` now.
    """

    calls: int
    timeouts: int
    started: int
    alive: int


def _worker_loop(conn: Connection) -> None:
    """Loop of one worker: ``(fn, args)`` in, ``("ok", result)`` or ``("err", text)`` out."""
    # The parent owns Ctrl-C: it closes the pipes, and EOF ends the loop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.simplefilter("ignore")  # sympy/antlr chatter must not reach the service's logs
    try:
        from blendserve.core.answers.math_keys import warm_up

        warm_up()
    except Exception as exc:  # a broken install: report it instead of hanging the parent
        conn.send(("err", f"worker warm-up failed: {exc!r}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        fn, args = message
        try:
            reply: tuple[str, Any] = ("ok", fn(*args))
        except Exception as exc:
            reply = ("err", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


def _limit_memory(limit: int) -> None:
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):  # not enforceable here: the deadline remains
        pass


def _worker_entry(fd: int, memory_limit: int) -> None:
    """Entry point of a worker interpreter started by :class:`_Worker` (POSIX)."""
    if memory_limit > 0:
        _limit_memory(memory_limit)
    _worker_loop(Connection(fd))


class _Worker:
    """One worker process and the parent's end of its connection; launching does not wait."""

    def __init__(self, memory_limit: int) -> None:
        self.ready = False
        self.process: Any
        if os.name == "posix":
            parent_sock, child_sock = socket.socketpair()
            try:
                path = json.dumps([p for p in sys.path if isinstance(p, str)])
                self.process = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _BOOTSTRAP,
                        path,
                        str(child_sock.fileno()),
                        str(memory_limit),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    pass_fds=(child_sock.fileno(),),
                )
            except OSError as exc:
                parent_sock.close()
                raise WorkerError(f"cannot start a sympy worker: {exc}") from exc
            finally:
                child_sock.close()
            self.conn: Connection = Connection(parent_sock.detach())
        else:  # pragma: no cover - no pass_fds: the multiprocessing way
            ctx = multiprocessing.get_context("spawn")
            self.conn, child = ctx.Pipe(duplex=True)
            self.process = ctx.Process(target=_worker_loop, args=(child,), daemon=True)
            self.process.start()
            child.close()

    def wait_ready(self, timeout: float) -> None:
        """Waits until the worker has imported sympy and parsed once."""
        if self.ready:
            return
        try:
            if not self.conn.poll(timeout):
                raise WorkerError(f"sympy worker did not start within {timeout:g} s")
            status, detail = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.kill()
            raise WorkerError("sympy worker died while starting") from exc
        except WorkerError:
            self.kill()
            raise
        if status != "ready":
            self.kill()
            raise WorkerError(str(detail))
        self.ready = True

    def alive(self) -> bool:
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll() is None
        return bool(self.process.is_alive())  # pragma: no cover

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            if isinstance(self.process, subprocess.Popen):
                self.process.wait(5)
            else:  # pragma: no cover
                self.process.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(None)
        with contextlib.suppress(Exception):
            if isinstance(self.process, subprocess.Popen):
                self.process.wait(1)
            else:  # pragma: no cover
                self.process.join(1)
        self.kill()


class SympyPool:
    """Persistent worker processes, started lazily, each call under a hard deadline.

    Thread-safe: up to ``size`` calls run at once (1-2 workers are plenty: keys are
    cached), more wait for a free worker. ``start_timeout`` bounds a new worker's
    warm-up, ``memory_limit`` caps each worker's address space (POSIX; 0: none).
    """

    def __init__(
        self,
        size: int = 1,
        start_timeout: float = 60.0,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
    ) -> None:
        if size < 1:
            raise ValueError("a pool needs at least one worker")
        self.size = size
        self.start_timeout = start_timeout
        self.memory_limit = memory_limit
        self._slots: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(size):
            self._slots.put(None)
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self._closed = False
        self._calls = self._timeouts = self._started = 0
        self._owner_pid = os.getpid()
        atexit.register(self.close)

    def _launch(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise WorkerError("the sympy pool is closed")
            worker = _Worker(self.memory_limit)
            self._started += 1
            self._all.add(worker)
        return worker

    def _drop(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def call(self, fn: Callable[..., Any], *args: Any, deadline: float) -> Any:
        """Runs ``fn(*args)`` in a worker; ``fn`` and args must be picklable.

        Raises:
            WorkerTimeout: it ran past ``deadline`` seconds (the worker is killed).
            WorkerError: it raised, or the worker died or could not start.
        """
        worker = self._slots.get()
        try:
            if worker is None or not worker.alive():
                if worker is not None:
                    self._drop(worker)
                worker = None
                worker = self._launch()
            worker.wait_ready(self.start_timeout)
            with self._lock:
                self._calls += 1
            try:
                worker.conn.send((fn, args))
                ready = worker.conn.poll(deadline)
                reply = worker.conn.recv() if ready else None
            except (EOFError, OSError, ValueError) as exc:
                self._drop(worker)
                worker = None
                raise WorkerError("sympy worker died during a call") from exc
            if reply is None:
                self._drop(worker)
                worker = None
                with self._lock:
                    self._timeouts += 1
                # The replacement warms up while the caller moves on.
                with contextlib.suppress(WorkerError):
                    worker = self._launch()
                raise WorkerTimeout(f"sympy call ran past its {deadline:g} s deadline")
            status, value = reply
            if status != "ok":
                raise WorkerError(str(value))
            return value
        except WorkerError:
            if worker is not None and not worker.ready:
                self._drop(worker)
                worker = None
            raise
        finally:
            self._slots.put(worker)

    def warm(self) -> None:
        """Starts every idle worker now instead of on first use."""
        taken = [self._slots.get() for _ in range(self.size)]
        try:
            for i, worker in enumerate(taken):
                if worker is None or not worker.alive():
                    taken[i] = self._launch()
            for worker in taken:
                if worker is not None:
                    worker.wait_ready(self.start_timeout)
        finally:
            for worker in taken:
                self._slots.put(worker)

    def stats(self) -> PoolStats:
        """The pool's counters."""
        with self._lock:
            alive = sum(w.alive() for w in self._all)
            return PoolStats(self._calls, self._timeouts, self._started, alive)

    def pids(self) -> list[int]:
        """Process ids of the workers alive now."""
        with self._lock:
            return sorted(w.process.pid for w in self._all if w.alive())

    def close(self) -> None:
        """Stops every worker (idempotent); later calls raise :class:`WorkerError`.

        In a forked child the workers belong to the parent: they are left alone.
        """
        if os.getpid() != self._owner_pid:  # the lock may have been held at fork time
            self._closed = True
            return
        with self._lock:
            self._closed = True
            workers = list(self._all)
        for worker in workers:
            worker.stop()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
