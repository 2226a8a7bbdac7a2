"""``minibroker controller --listen HOST:PORT --data-dir DIR [--set key=value ...]``.

Replays the journal and bumps the controller epoch (app startup), then listens;
once bound it writes ``<data-dir>/endpoint`` (temp file + rename) and
``<data-dir>/pid``. SIGTERM or SIGINT stops it gracefully with status 0, at
any point from the start of ``run``: one during the replay lets the replay
finish, then stops without listening (``docker stop`` on a starting container).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from common.cli_args import positive
from common.hostport import split_host_port


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("controller", help="run the controller",
                       description="Run the controller: broker registry, topics, elections, ISR, metadata.")
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to bind (port 0 = any free)")
    p.add_argument("--data-dir", required=True, metavar="DIR", help="journal and snapshot directory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                   help="controller config (see common.config.CONTROLLER_CONFIGS)")
    p.set_defaults(func=run)
    b = perf.add_parser("controller", help="controller: create_topics rate, failover fan-out, replay",
                        description="Figures for the controller against stub brokers (controller/bench.py).")
    b.add_argument("--brokers", type=positive("--brokers"), default=3, help="stub brokers (default 3)")
    b.add_argument("--topics", type=positive("--topics"), default=200,
                   help="topics created one request at a time (default 200)")
    b.add_argument("--partitions", type=positive("--partitions"), default=5, help="partitions per topic (default 5)")
    b.add_argument("--replication-factor", type=positive("--replication-factor"), default=3,
                   help="replicas per partition, at most --brokers (default 3)")
    b.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from cli.main import CliError
    from controller.bench import main

    if args.replication_factor > args.brokers:
        raise CliError(f"--replication-factor {args.replication_factor} needs at least as many --brokers "
                       f"(got {args.brokers})")

    return main(args)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run(args: argparse.Namespace) -> int:
    # first: a stop signal before serve() has the event loop's handlers is remembered, not fatal (as PID 1 in
    # a container, SIGTERM without a handler would be ignored until docker stop's SIGKILL)
    early: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: early.append(signum)) for sig in STOP_SIGNALS}
    try:
        return _run(args, early)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace, early: list[int]) -> int:
    from common.config import controller_config, parse_assignments
    from common.logging import configure

    try:
        host, port = split_host_port(args.listen, allow_port_zero=True)
    except ValueError as exc:
        print(f"minibroker: error: --listen: {exc}", file=sys.stderr)
        return 2
    config = controller_config(parse_assignments(args.settings))
    data_dir = Path(args.data_dir)
    configure("controller", "controller")
    from controller.journal import DataDirLockedError, JournalBrokenError, JournalCorruptError

    if os.path.lexists(data_dir) and not data_dir.is_dir():  # else mkdir's "[Errno 17] File exists"
        print(f"minibroker: error: controller: --data-dir {data_dir} exists and is not a directory", file=sys.stderr)
        return 2
    try:
        data_dir.mkdir(parents=True, exist_ok=True)  # a file in the way of a parent is an OSError, reported below
        return asyncio.run(serve(host, port, data_dir, config, early))
    except (JournalCorruptError, DataDirLockedError, OSError) as exc:
        # printed here rather than raised as cli.main.CliError: under ``python -m cli.main`` that
        # module is ``__main__`` and would not catch the class imported as ``cli.main``
        print(f"minibroker: error: controller: {exc}", file=sys.stderr)
        return 2
    except JournalBrokenError as exc:  # the start's own commit (the controller epoch), e.g. on a full disk
        print(f"minibroker: error: controller: cannot write the metadata journal in {data_dir}: {exc}",
              file=sys.stderr)
        return 2


async def serve(host: str, port: int, data_dir: Path, config: Any, early: list[int] | None = None) -> int:
    """Replay, listen, and run until SIGTERM/SIGINT (or a fatal journal error). ``early``: stop signals
    received before this was called (``run``'s handlers): the controller then stops without listening."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:  # before the replay: a signal during it is handled, not lost
        loop.add_signal_handler(sig, stop.set)
    if early:
        stop.set()

    from aiohttp import web

    from common.clock import SystemClock
    from common.logging import get_logger
    from controller.controller import Controller
    from controller.server import make_app
    from storage.checkpoint import write_atomic

    log = get_logger("controller.cli")
    controller = Controller(data_dir, config, SystemClock())
    runner = web.AppRunner(make_app(controller), access_log=None, handle_signals=False,
                           keepalive_timeout=config.get_int("connections.max.idle.ms") / 1000)
    await runner.setup()  # the replay and the controller epoch bump
    if stop.is_set():  # stopped while starting: no endpoint for anyone to find
        log.info("controller_stopping", exit_status=0, while_starting=True)
        await runner.cleanup()
        return 0
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    address = f"{host}:{bound[1]}"
    # pid first: the endpoint file is what waiters poll for, so everything else is in place when it appears
    for name, text in (("pid", str(os.getpid())), ("endpoint", address)):
        try:
            write_atomic(data_dir / name, text)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write {data_dir / name}: {exc.strerror or exc}") from None
    log.info("controller_listening", address=address, controller_epoch=controller.image.controller_epoch)
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(controller.fatal.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for w in waiters:
        w.cancel()
    status = 1 if controller.fatal.is_set() else 0
    log.info("controller_stopping", exit_status=status)
    await runner.cleanup()
    return status
