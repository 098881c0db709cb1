"""Hostile clients against ``blendserve serve``: slowloris, streams nobody reads, and more.

Seventeen phases, chosen with ``--phases`` (default: all). For the first three it
starts the real command (``blendserve serve --engine replay`` on DATA) on
loopback with a soft limit of 1,024 open descriptors (as a default ``ulimit -n``
gives it), then runs them bounded, each ``--duration`` seconds:

1. ``--slowloris`` connections (1,000): half send nothing, half send half a
   request's headers and then one more byte a second;
2. ``--readers`` (10) streamed ``/solve`` requests of ``--questions`` (10,000)
   questions each from clients that never read a byte;
3. both at once.

During each phase ``/health`` is probed four times a second (a new connection
each time) and a fresh one-question ``/solve`` once a second. It prints the
``/health`` latency (p50, p99, max, failures), when the first fresh ``/solve``
was admitted, how many hostile connections the server had closed by the end,
and the queued-questions gauge at the end (a reader whose job has finished
keeps its connection open for keep-alive, its unread reply in the socket
buffers), and the server's descriptors and RSS.

The other fourteen need no DATA and run first, each against a server of its own,
over the replay engine or a fake upstream on loopback: four in this process
(``bench/load/abuse/phases.py``):

4. ``dropped``: 200 streamed ``/solve`` jobs dropped one event in, then 50
   plain ``/v1`` requests: the slowest, and the samples still in flight;
5. ``labels``: 10,000 ``/v1`` requests, each naming its own model and budget:
   the ``/metrics`` series, size and scrape time, ``/health`` meanwhile;
6. ``sympy``: one API key's 30 requests of slow math answers beside another
   key's ordinary ones: the other key's latency alone and beside them;
7. ``tokenizer``: 600 ``/tokenize`` calls at once (how many got 429, ``/v1``
   meanwhile) and an 18.9 MB ``/detokenize`` body (its status and time);

and five upstream faults against ``blendserve serve`` processes
(``bench/load/abuse/faults.py``, the fake upstream in this process):

8. ``breaker``: an upstream that ignores ``n`` down until its breaker opens,
   then back: when the first ``/solve`` and ``/v1`` answer;
9. ``keys``: ``/solve`` of math answers ``\\boxed{(9x+k)^{1000}}``: reply
   bytes, the server's memory, ``/health`` meanwhile;
10. ``hung``: an upstream that never answers: when each request ends;
11. ``nested``: upstream bodies nested 200,000 deep: what each route answers;
12. ``accounting``: faults in turn against one server, then its sample
    accounting (dispatched = completed + failed + cancelled + in flight);

and five more, each against a ``blendserve serve`` of its own
(``bench/load/abuse/clients.py``, ``bench/load/abuse/inputs.py``, ``bench/load/abuse/engines.py``):

13. ``clients``: the same ``/v1`` traffic as one client id, then as 40 (each
    fitting a prior, so a wave programme, of its own): ``/health`` p99 beside each;
14. ``extra``: 2 MiB of ``sampling.extra`` in a 100-question ``/solve``, and of
    an undeclared ``/v1`` field: status, time, upstream requests and bytes;
15. ``auth``: ``/v1`` requests with two ``Authorization`` headers, in both orders;
16. ``metrics``: an upstream ``/metrics`` of 100,000 label sets read every half
    second: ``/solve`` and ``/health`` times meanwhile;
17. ``replay``: ``--replay-capacity 3``, one-wave jobs of budget 1,000 finished
    or left mid-way, each followed by a budget-1 ``/solve``; then the accounting.

Exits 1 if ``/health`` ever took 1 s or more or failed, or if no fresh ``/solve``
was admitted in one of the first three phases; or if one of the other fourteen
missed its target: every plain ``/v1`` within 2 s and no sample in flight
after; every flood request a 200 and ``/metrics`` under 1 MB; the other key
delayed by under 1 s; some ``/tokenize`` refused with 429 and the body with 413;
answers within 3 s of the upstream's return; replies under 1 MB and ``/health``
p99 under 200 ms; every request ended within the two timeouts plus 1 s; every
reply the error contract; the accounting holding (in every fault phase); the
``/health`` p99 beside 40 client ids within 1.5x of that beside one; the large
fields and the doubled headers refused with nothing sent upstream; every
``/solve`` under 1 s and ``/health`` p99 under 0.5 s beside the ``/metrics``
flood; every budget-1 ``/solve`` after the replay jobs completed, the
accounting holding.

Usage: python -m bench.load.abuse [DATA.jsonl] [--duration 40] [--slowloris 1000]
[--readers 10] [--phases slowloris readers both dropped labels sympy tokenizer
breaker keys hung nested accounting clients extra auth metrics replay]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.load.abuse.phases import PHASES
from bench.load.abuse.server import serve, usage

#: Phases against one ``blendserve serve --engine replay`` process on DATA.
_SERVED = ("slowloris", "readers", "both")
_PHASES = (*_SERVED, *PHASES)
_SERVER_FDS = 1024  # the server's soft limit at start, as with a default ulimit -n


@dataclass
class Probes:
    """What the probes saw during one phase."""

    health_ms: list[float] = field(default_factory=list)
    #: (seconds into the phase, ms) of probes that took 500 ms or more
    slow: list[tuple[float, float]] = field(default_factory=list)
    health_failures: int = 0
    #: why probes failed: exception name or status
    failure_kinds: set[str] = field(default_factory=set)
    #: (seconds into the phase, status) of each fresh /solve
    solves: list[tuple[float, int]] = field(default_factory=list)


def _probe(url: str, ids: list[str], stop: threading.Event, probes: Probes) -> None:
    started = time.monotonic()
    next_solve = started
    body = {"questions": [{"id": ids[0], "prompt": "x"}], "budget": 2}
    while not stop.wait(0.25):
        begin = time.monotonic()
        try:
            status = httpx.get(f"{url}/health", timeout=5).status_code
            ok = status == 200
            if not ok:
                probes.failure_kinds.add(str(status))
        except httpx.HTTPError as exc:
            ok = False
            probes.failure_kinds.add(type(exc).__name__)
        if ok:
            probes.health_ms.append(ms := (time.monotonic() - begin) * 1000)
            if ms >= 500:
                probes.slow.append((round(begin - started, 1), round(ms)))
        else:
            probes.health_failures += 1
        if time.monotonic() >= next_solve:
            next_solve += 1.0
            try:
                status = httpx.post(f"{url}/solve", json=body, timeout=10).status_code
            except httpx.HTTPError:
                status = 0
            probes.solves.append((round(time.monotonic() - started, 1), status))


def _slowloris(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sockets.append(sock)
    return sockets


def _trickle(sockets: list[socket.socket], stop: threading.Event) -> None:
    while not stop.wait(1.0):
        for sock in sockets[1::2]:
            with contextlib.suppress(OSError):
                sock.send(b"a")


def _readers(port: int, count: int, questions: int, ids: list[str]) -> list[socket.socket]:
    sockets = []
    for r in range(count):
        batch = [{"id": ids[(r + i) % len(ids)], "prompt": "x"} for i in range(questions)]
        body = json.dumps({"questions": batch, "budget": questions, "stream": True}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST /solve HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        sockets.append(sock)
    return sockets


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while sock.recv(1 << 20):  # a reader's unread stream, then its end
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def _phase(
    name: str, args: argparse.Namespace, url: str, port: int, pid: int, ids: list[str]
) -> bool:
    stop = threading.Event()
    probes = Probes()
    hostile: list[socket.socket] = []
    start = time.monotonic()
    if name in ("slowloris", "both"):
        hostile += _slowloris(port, args.slowloris)
    if name in ("readers", "both"):
        hostile += _readers(port, args.readers, args.questions, ids)
    opened = time.monotonic() - start
    threads = [
        threading.Thread(target=_probe, args=(url, ids, stop, probes)),
        threading.Thread(target=_trickle, args=(hostile, stop)),
    ]
    for thread in threads:
        thread.start()
    stop.wait(args.duration)
    during = usage(pid)
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    queued = next(
        line.split()[1]
        for line in metrics.splitlines()
        if line.startswith("blendserve_queued_questions ")
    )
    stop.set()
    for thread in threads:
        thread.join()
    closed = sum(_closed(sock) for sock in hostile)
    for sock in hostile:
        sock.close()
    ms = sorted(probes.health_ms)
    admitted = [t for t, status in probes.solves if status == 200]
    statuses = sorted({status for _, status in probes.solves})
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else float("nan")
    print(
        f"{name}: {len(hostile)} hostile connections opened in {opened:.1f} s; "
        f"/health over {len(ms) + probes.health_failures} probes: "
        f"p50 {statistics.median(ms) if ms else float('nan'):.1f} ms, p99 {p99:.1f} ms, "
        f"max {ms[-1] if ms else float('nan'):.1f} ms, "
        f"{probes.health_failures} failed {sorted(probes.failure_kinds)}; "
        f"fresh /solve statuses {statuses}, first admitted at "
        f"{admitted[0] if admitted else 'never'} s; "
        f"slow probes (s, ms) {probes.slow}; "
        f"{closed}/{len(hostile)} closed by the server after {args.duration:g} s, "
        f"questions still queued {queued}; server: {during}",
        flush=True,
    )
    return bool(ms) and ms[-1] < 1000 and probes.health_failures == 0 and bool(admitted)


def main() -> int:
    """Runs the chosen phases; the exit code is 1 when a check fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "data",
        type=Path,
        nargs="?",
        help="recorded answers (JSONL with id and answers): the first three phases need it",
    )
    parser.add_argument("--duration", type=float, default=40.0, help="seconds per phase")
    parser.add_argument("--slowloris", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=10)
    parser.add_argument("--questions", type=int, default=10_000, help="per reader")
    parser.add_argument(
        "--phases",
        nargs="+",
        choices=_PHASES,
        default=list(_PHASES),
        help="which phases to run (default: all): those with servers of their own first, "
        "then the others against one server, each group in this order",
    )
    args = parser.parse_args()
    served = [name for name in args.phases if name in _SERVED]
    if served and args.data is None:
        parser.error(f"DATA is needed by {', '.join(served)}")
    # every phase runs, even after one failed
    ok = all([PHASES[name]() for name in args.phases if name in PHASES])
    if served:
        ok = _served_phases(args, served) and ok
    return 0 if ok else 1


def _served_phases(args: argparse.Namespace, phases: list[str]) -> bool:
    """Runs ``phases`` against one ``blendserve serve --engine replay`` on ``args.data``."""
    ids = [
        str(json.loads(line)["id"])
        for line in args.data.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.slowloris)), hard))
    flags = ["--engine", "replay", "--data", str(args.data)]
    with serve(flags, fds=_SERVER_FDS) as served:
        print(f"server: {usage(served.pid)} idle", flush=True)
        ok = all([_phase(name, args, served.url, served.port, served.pid, ids) for name in phases])
        log = served.log_text()
        print(f"server log: {len(log)} bytes; its last lines:", flush=True)
        print("\n".join(log.splitlines()[-5:]), flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(main())
