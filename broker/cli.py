"""Subcommands contributed by this package (see ``cli.main``): ``broker`` and ``perf broker``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from common.cli_args import int_range, non_negative, positive
from common.wire import MAX_INT32

MAX_NODE_ID = MAX_INT32  # Kafka's node.id is an int32; the controller refuses a larger one at registration


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("broker", help="run one broker process",
                       description="Run a broker: aiohttp server, replica manager, fetchers, controller link.")
    p.add_argument("--node-id", type=int_range("--node-id", 0, MAX_NODE_ID), required=True, metavar="N",
                   help=f"0 to {MAX_NODE_ID}")
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="port 0 binds a free port")
    p.add_argument("--controller", required=True, metavar="HOST:PORT", help="the controller (port 1-65535)")
    p.add_argument("--data-dir", required=True, type=Path,
                   help="log.dirs: the broker's data directory (created if missing; refused if it belongs to "
                        "another node.id)")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="address given to the controller (default: listen); port 0 advertises the bound port")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker config override")
    p.set_defaults(func=_run_broker)

    b = perf.add_parser("broker", help="produce to one broker vs a bare aiohttp server",
                        description="One partition, acks=1, batches of N x S-byte records over keep-alive HTTP; "
                                    "the same client against a bare aiohttp server in the same run, in "
                                    "alternating rounds. Prints each round's rate and CPU, then the broker/bare "
                                    "request-rate ratio per round with its median, the ratio over all rounds "
                                    "together, and the CPU ratios. Figures only; nothing is asserted.")
    b.add_argument("--requests", type=positive("--requests"), default=3000,
                   help="produce requests per target and round (default 3000)")
    b.add_argument("--records", type=positive("--records"), default=1000, help="records per batch (default 1000)")
    b.add_argument("--record-size", type=non_negative("--record-size"), default=100,
                   help="bytes of each record's value (default 100)")
    b.add_argument("--concurrency", type=positive("--concurrency"), default=4, help="requests in flight (default 4)")
    b.add_argument("--rounds", type=positive("--rounds"), default=3,
                   help="alternating rounds, bare server then broker (default 3)")
    b.add_argument("--data-dir", type=Path, default=None, help="broker data dir (default: a temp dir)")
    b.add_argument("--bare", choices=("app", "lowlevel"), default="app",
                   help="the bare server: a web.Application with one route (default), or aiohttp's low-level "
                        "web.Server, which the broker itself uses")
    b.add_argument("--retained-mb", type=non_negative("--retained-mb"), default=256,
                   help="log.retention.bytes in MiB for the broker's partition (default 256), checked every "
                        "second, with segments of a quarter of it, at most 64 MiB: the log stays bounded as a "
                        "broker's does at steady state "
                        "(0: unbounded, so every batch lands on fresh page-cache memory; see "
                        "docs/benchmarks/broker.md)")
    b.set_defaults(func=_run_perf)


def _run_broker(args: argparse.Namespace) -> int:
    from broker.process import BrokerOptions, DataDirError, check_meta, parse_host_port, run
    from common.config import broker_config, parse_assignments
    from common.fsutil import DirLockedError, lock_dir
    from common.logging import configure, get_logger
    from common.memory import MMAP_THRESHOLD, TRIM_THRESHOLD, keep_large_buffers
    from storage.log import StorageError

    # Errors are printed here rather than raised as cli.main.CliError: under ``python -m cli.main`` that
    # module runs as __main__, so its CliError class is not the one an import of cli.main would give us.
    config = broker_config(parse_assignments(args.set))
    try:
        host, port = parse_host_port(args.listen, "--listen", allow_port_zero=True)
        parse_host_port(args.controller, "--controller", allow_port_zero=False)
        # port 0 here is "the port --listen bound" (BrokerProcess.start), as with --listen ...:0
        advertise = (parse_host_port(args.advertise, "--advertise", allow_port_zero=True)
                     if args.advertise else None)
        opts = BrokerOptions(args.node_id, host, port, args.controller, args.data_dir, advertise, config)
        check_meta(args.data_dir, args.node_id)  # refuse another node's data dir before anything starts
        os.close(lock_dir(args.data_dir, "broker"))  # and one in use (BrokerProcess.start takes it for good)
        configure("broker", args.node_id)
        tuned = keep_large_buffers()  # before the first large buffer: see common/memory.py
        get_logger("broker").info("allocator_thresholds", node_id=args.node_id, fixed=tuned,
                                  mmap_threshold=MMAP_THRESHOLD, trim_threshold=TRIM_THRESHOLD)
        return int(asyncio.run(run(opts)))
    except (DataDirError, DirLockedError, StorageError) as exc:  # StorageError names its file or partition dir
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"broker: {exc}")


def _fail(message: str) -> int:
    print(f"minibroker: error: {message}", file=sys.stderr)
    return 2


def _run_perf(args: argparse.Namespace) -> int:
    from broker.bench import run_perf

    return int(run_perf(args))
