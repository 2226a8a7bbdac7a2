"""``minibroker``: one command, many subcommands.

Each package contributes its subcommands through a ``register(sub, perf)``
function in the modules listed in ``COMMAND_MODULES``: ``sub`` is the top-level
subparser collection and ``perf`` the one under ``minibroker perf``. A
subcommand sets ``func(args) -> int`` (the exit status). Errors a user can fix
(``CliError``, config errors, unreachable peers) print one readable line. Exit
status: 0 done, 1 the operation failed (a wire error, an unreachable peer, a
record not acknowledged), 2 unusable input (flags, config, files).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "storage.cli",
    "broker.cli",
    "controller.cli",
    "cli.cluster",
    "cli.topics",
    "cli.clients",
    "cli.perf",
    "cli.chaos",
    "cli.demo",
    "audit.cli",
)


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 2 unless given."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser that refuses arguments it does not know itself, so the error comes with its own
    usage line (argparse hands them up to the top parser, whose usage names no option of the command)."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minibroker",
        description="A small replicated commit log on Kafka's replication design.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    perf_parser = sub.add_parser("perf", help="benchmarks: storage, broker, controller, produce, consume, e2e, audit",
                                 description="Benchmarks that print figures.")
    perf = perf_parser.add_subparsers(dest="perf_command", metavar="BENCHMARK")
    perf_parser.set_defaults(func=lambda _args: _usage(perf_parser))
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(sub, perf)
    return parser


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        return _usage(parser)
    from common.config import ConfigError
    from common.http import RpcError

    try:
        status = func(args)
    except CliError as exc:
        print(f"minibroker: error: {exc}", file=sys.stderr)
        return exc.status
    except ConfigError as exc:
        print(f"minibroker: error: {exc}", file=sys.stderr)
        return 2
    except RpcError as exc:  # a peer that does not answer: an operating condition, 1 as for wire errors
        print(f"minibroker: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(status or 0)


if __name__ == "__main__":
    # Run through the importable module, not this __main__ copy, so that the
    # CliError subcommands raise is the class main() catches.
    from cli.main import main as _main

    sys.exit(_main())
