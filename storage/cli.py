"""Subcommands contributed by this package (see ``cli.main``): ``dump-log`` and ``perf storage``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common.cli_args import non_negative, positive

MIN_BATCH, MAX_BATCH = 200, 64 * 1024 * 1024  # perf storage --batch-sizes: a header and a record; 64 MiB


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    dump = sub.add_parser("dump-log", help="print the batches of a .log file or partition directory as JSON lines",
                          description="One JSON line per record batch; invalid batches are reported, "
                                      "not raised. Offsets must follow on (each batch's base_offset is the "
                                      "previous batch's last_offset + 1, across a directory's segment files "
                                      "too): a batch that does not carries \"non_consecutive\", and the "
                                      "pairs are listed on stderr. Exit status 1 if any batch is invalid "
                                      "or offsets do not follow on.")
    dump.add_argument("path", type=Path, help="a segment file (<20-digit base offset>.log) or a "
                                              "<topic>-<partition> directory")
    dump.add_argument("--records", action="store_true", help="add the decoded records to each line")
    dump.set_defaults(func=_dump)

    bench = perf.add_parser("storage", help="Log append/read throughput next to raw os.write/os.pread",
                            description="Storage benchmark: prints MB/s, batches/s and log/raw ratios.")
    bench.add_argument("--dir", type=Path, default=None, help="where to write (default: the system temp dir)")
    bench.add_argument("--total-mib", type=positive("--total-mib"), default=128,
                       help="MiB written per batch size (default 128)")
    bench.add_argument("--batch-sizes", default="16384,1048576",
                       help=f"comma-separated batch sizes in bytes, {MIN_BATCH}-{MAX_BATCH} (default 16384,1048576)")
    bench.add_argument("--record-bytes", type=non_negative("--record-bytes"), default=100,
                       help="value size of each record (default 100)")
    bench.add_argument("--repeat", type=positive("--repeat"), default=5,
                       help="measured runs after the warm-up (default 5)")
    bench.set_defaults(func=_perf)


def _dump(args: argparse.Namespace) -> int:
    from cli.main import CliError
    from storage.dump import DumpError, dump

    try:
        result = dump(args.path, sys.stdout, records=args.records)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except DumpError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"{args.path}: {exc}") from None
    for file, after, base in result.non_consecutive:
        print(f"non-consecutive offsets in {file}: {after} is followed by {base}", file=sys.stderr)
    return 0 if result.clean else 1


def _perf(args: argparse.Namespace) -> int:
    from cli.main import CliError
    from common.logging import configure
    from storage.perf import run

    configure("perf", level="WARNING")

    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--batch-sizes: expected integers, got {args.batch_sizes!r}") from None
    if not sizes or not all(MIN_BATCH <= size <= MAX_BATCH for size in sizes):
        raise CliError(f"--batch-sizes: each must be {MIN_BATCH}-{MAX_BATCH} bytes, got {args.batch_sizes!r}")
    if args.dir is not None and not args.dir.is_dir():
        raise CliError(f"--dir {args.dir}: not a directory")
    run(args.dir, args.total_mib, sizes, args.record_bytes, args.repeat)
    return 0
