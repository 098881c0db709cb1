"""``blendserve serve``: run the service on one engine."""

from __future__ import annotations

import argparse
import gc
import signal
import sys
from types import FrameType

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from blendserve.service.settings import Settings

__all__ = ["add_parser", "read_settings", "run", "settings_source"]

#: The collector's thresholds while serving (CPython's default: 700, 10, 10): at 700 a
#: large job's short-lived requests and samples reach the oldest generation, whose long
#: collections hold the event loop (docs/operations.md, "The event loop under load").
_GC_THRESHOLDS = (10_000, 10, 10)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers the ``serve`` subcommand: one flag per :class:`Settings` field."""
    parser = subparsers.add_parser(
        "serve",
        help="run the HTTP service",
        description="Serves blendserve on one engine: --upstreams URL (OpenAI-compatible, "
        "repeatable), --engine replay --data FILE, --vllm-model NAME, or, with none of "
        "these, the embedded llama.cpp default. Every flag --foo-bar also reads "
        "BLENDSERVE_FOO_BAR from the environment; a flag overrides its variable.",
    )
    source = settings_source(parser)
    parser.add_argument(
        "--upstream", action="append", dest="upstreams", metavar="URL", help="as --upstreams"
    )
    parser.set_defaults(handler=run, settings_source=source)


def settings_source(parser: argparse.ArgumentParser) -> CliSettingsSource[Settings]:
    """Adds a flag for every :class:`Settings` field to ``parser``; reads them back."""
    return CliSettingsSource(
        Settings,
        root_parser=parser,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_hide_none_type=True,
        cli_avoid_json=True,
    )


def read_settings(args: argparse.Namespace) -> Settings:
    """The settings of a parsed ``serve`` command line, over the environment.

    Raises:
        ValidationError: a flag or variable has a value the setting does not take.
    """
    source: CliSettingsSource[Settings] = args.settings_source
    return Settings(_cli_settings_source=source(parsed_args=args))


def _check_data(settings: Settings) -> None:
    """Reads the engine's profile, and the replay engine's data and profile, and opens the
    recording, once before serving: a bad file is one line, not a traceback from the
    engine's start.

    Raises:
        ValueError: a file or a line of it is bad (the message starts with the flag's
            subject: ``engine profile``, ``replay`` or ``record``).
    """
    from blendserve.engines.step_cost import load_step_cost

    if settings.record is not None:
        try:
            settings.record.open("a", encoding="utf-8").close()
        except OSError as exc:
            raise ValueError(f"record: {exc}") from None
    config = settings.engine_config()
    if config.engine_profile is not None:
        try:
            load_step_cost(config.engine_profile)
        except ValueError as exc:
            raise ValueError(f"engine profile: {exc}") from None
    if config.resolved_kind() == "replay" and config.data is not None:
        from blendserve.engines.replay import ReplayEngine

        try:
            ReplayEngine(config.data)
            if config.replay_profile is not None:
                load_step_cost(config.replay_profile)
        except ValueError as exc:
            raise ValueError(f"replay: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Starts uvicorn; bad settings are one line on stderr and exit code 2."""
    try:
        settings = read_settings(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"blendserve serve: error: {first['loc'][0]}: {first['msg']}", file=sys.stderr)
        return 2
    import uvicorn

    from blendserve.service.app import create_app
    from blendserve.service.connections import timed_protocol
    from blendserve.service.shutdown import DrainingServer, RunningJobs

    running = RunningJobs()
    try:
        app = create_app(settings, running=running)
    except OSError as exc:
        print(f"blendserve serve: error: api key file: {exc}", file=sys.stderr)
        return 2
    try:
        _check_data(settings)
    except ValueError as exc:
        print(f"blendserve serve: error: {exc}", file=sys.stderr)
        return 2
    # On SIGTERM the server stops accepting, lets running jobs finish for
    # shutdown_grace_s, then cancels the rest, which cancels their upstream requests.
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_keep_alive=settings.keep_alive_s,
        http=timed_protocol(
            settings.connection_timeouts(),
            max(settings.max_body_bytes, settings.max_tokenizer_body_bytes),
        ),
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
    server = DrainingServer(config, running, settings.shutdown_grace_s)
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
