"""The ``blendserve`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from blendserve_client import cli as solve_command

from blendserve import __version__
from blendserve.engines.calibration import command as calibrate_command
from blendserve.recordings import command as record_command
from blendserve.service import command as serve_command
from blendserve.sim import command as simulate_command

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per job."""
    parser = argparse.ArgumentParser(prog="blendserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"blendserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    serve_command.add_parser(subparsers)
    solve_command.add_parser(subparsers)
    simulate_command.add_parser(subparsers)
    calibrate_command.add_parser(subparsers)
    record_command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
