"""``blendserve serve``: run the service on one engine."""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from blendserve.service.settings import Settings

__all__ = ["add_parser", "run"]

# flags that override the Settings field of the same name
_FLAGS = (
    "engine", "upstreams", "model", "data", "vllm_model", "embedded_model", "host", "port",
    "log_level", "group_wait_ms", "group_max", "sc_budget_per_question", "sc_policy",
    "sc_greedy_temperature",
    "api_key_file", "metrics_auth", "replay_latency_s", "shutdown_grace_s",
)  # fmt: skip


#: The collector's thresholds while serving (CPython's default: 700, 10, 10). A large
#: job's requests and samples live for milliseconds, long enough to outlive two young
#: collections at 700 allocations each; so many reached the oldest generation that it
#: was collected about once a second, 100-400 ms each time with ten 10,000-question
#: jobs running, holding the event loop. At 10,000 few do: one full collection or none
#: in 25 s, for young ones of 30-200 ms now and then (README, "Abuse").
_GC_THRESHOLDS = (10_000, 10, 10)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers the ``serve`` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="run the HTTP service",
        description="Serves blendserve on one engine: --upstream URL (OpenAI-compatible, "
        "repeatable), --engine replay --data FILE, --vllm-model NAME, or, with none of "
        "these, the embedded llama.cpp default. Flags override BLENDSERVE_* variables.",
    )
    parser.add_argument("--engine", choices=["auto", "openai", "replay", "vllm", "embedded"])
    parser.add_argument("--upstream", action="append", dest="upstreams", metavar="URL")
    parser.add_argument("--model", help="model name sent upstream")
    parser.add_argument("--data", type=Path, help="recorded answers for the replay engine")
    parser.add_argument("--vllm-model", help="run this model with vLLM in-process")
    parser.add_argument("--embedded-model", help="model of the embedded default")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--log-level")
    parser.add_argument(
        "--group-wait-ms", type=float, help="/v1 requests gathered into one job (default 50)"
    )
    parser.add_argument("--group-max", type=int, help="questions that start a group (256)")
    parser.add_argument(
        "--sc-budget-per-question", type=float, help="/v1 samples per question (default 8)"
    )
    parser.add_argument("--sc-policy", help="/v1 allocation policy (default blend)")
    parser.add_argument(
        "--sc-greedy-temperature",
        type=float,
        help="/v1 requests with temperature 0 are sampled at this with their whole budget "
        "(default: unset, such a request gets one greedy sample)",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        help="accepted bearer keys, one a line (with BLENDSERVE_API_KEYS)",
    )
    parser.add_argument(
        "--metrics-auth",
        action="store_true",
        default=None,
        help="ask for an API key on /metrics too (open by default)",
    )
    parser.add_argument(
        "--replay-latency-s", type=float, help="replay engine: seconds each request takes"
    )
    parser.add_argument(
        "--shutdown-grace-s",
        type=float,
        help="on SIGTERM, running jobs get this long before they are cancelled (default 30)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Starts uvicorn; bad settings are one line on stderr and exit code 2."""
    overrides: dict[str, Any] = {
        name: value for name in _FLAGS if (value := getattr(args, name)) is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"blendserve serve: error: {first['loc'][0]}: {first['msg']}", file=sys.stderr)
        return 2
    import uvicorn

    from blendserve.service.app import create_app
    from blendserve.service.connections import timed_protocol
    from blendserve.service.shutdown import DrainingServer

    try:
        app = create_app(settings)
    except OSError as exc:
        print(f"blendserve serve: error: api key file: {exc}", file=sys.stderr)
        return 2
    # On SIGTERM the server stops accepting, lets running jobs finish for
    # shutdown_grace_s, then cancels the rest, which cancels their upstream requests.
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_keep_alive=settings.keep_alive_s,
        http=timed_protocol(settings.connection_timeouts()),
    )
    _raise_descriptor_limit()
    # What the imports built lives as long as the process: out of the collector's
    # sight, a full collection (while a large job is built) scans only request state.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)
    # After its graceful shutdown uvicorn raises the signal again under the handler
    # found at startup; with the default one SIGTERM would kill the process now,
    # and a clean drain would look like a crash (exit 143). It is handled: exit 0.
    server = DrainingServer(config, app.state.running, settings.shutdown_grace_s)
    previous = signal.signal(signal.SIGTERM, _drained)
    try:
        server.run()
    except KeyboardInterrupt:  # the same: uvicorn raises SIGINT again after its shutdown
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    # uvicorn's own exit code when the app or the socket could not start
    return 0 if server.started else 3


def _raise_descriptor_limit() -> None:
    """Lifts the soft limit on open descriptors to the hard one.

    Every client connection holds a descriptor until a deadline closes it; with
    the usual soft limit of 1,024 a burst of slow clients would make ``accept``
    fail for everyone, ``/health`` included.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # not on this platform, or not allowed
        pass


def _drained(signum: int, frame: FrameType | None) -> None:
    """SIGTERM once uvicorn has shut down: nothing left to do."""
