"""``minibroker export`` and ``minibroker audit`` (see ``cli.main``).

    minibroker export --data-dir DIR [DIR ...] [--history FILE|DIR] --out DIR
    minibroker audit EXPORT_DIR [--master URL] [--report FILE] [--evidence-rows N]

``audit`` exits 0 when nothing is violated, 1 when anything is, 2 for input it
cannot use or a Spark that cannot start or run the job (``AUDIT_EXIT_STATUS``).
Spark is imported only when ``audit`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

AUDIT_EXIT_STATUS = ("Exit status: 0 no violation, 1 a violation found, 2 a usage or environment error (bad "
                     "flags, not an export, a Spark that cannot start or fails the job): one line on stderr.")
# The --master URLs Spark takes (SparkSubmit's check, then SparkContext.createTaskScheduler's forms), checked
# before a JVM starts only to refuse it with a stack trace. yarn and k8s:// are parsed by their cluster managers.
SPARK_MASTER_RE = re.compile(r"local|local\[(\d+|\*)\]|local\[(\d+|\*)\s*,\s*\d+\]"
                             r"|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]|spark://.+|yarn|k8s://.+")


AUDIT_EXTRA = ("pyarrow", "pyspark", "py4j")  # the optional ``audit`` extra (py4j comes with pyspark)


@contextlib.contextmanager
def audit_extra(command: str) -> Iterator[None]:
    """Imports of the optional ``audit`` extra: without it, one line naming the install command (exit 2, an
    environment error, as for the CLI's other unusable-environment errors) instead of a traceback. An
    ImportError of any other module is a bug and goes on as one."""
    from cli.main import CliError

    try:
        yield
    except ImportError as exc:
        root = (exc.name or "").partition(".")[0]
        if root not in AUDIT_EXTRA:
            raise
        raise CliError(f"minibroker {command} needs the audit extra ({root} is not installed): "
                       "pip install 'minibroker[audit]'") from None


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("export", help="export broker data dirs (offline) and a workload history to Parquet",
                       description="Read broker data directories offline and write the Parquet tables the "
                                   "Spark audit reads. Damaged files are reported in damaged.parquet.")
    p.add_argument("--data-dir", type=Path, nargs="+", action="extend", required=True, metavar="DIR",
                   help="a cluster dir from 'cluster up' or broker data dirs (repeatable)")
    p.add_argument("--history", type=Path, metavar="FILE",
                   help="workload history (JSON lines), or a directory with *history* files")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="export directory to write")
    p.set_defaults(func=run_export)

    a = sub.add_parser("audit", help="Spark consistency audit of an export",
                       description="Check an export for lost writes, inconsistent offsets, replica divergence, "
                                   "duplicates, log structure and read anomalies (docs/audit.md). "
                                   + AUDIT_EXIT_STATUS)
    a.add_argument("export_dir", type=Path, metavar="EXPORT_DIR", help="directory written by `minibroker export`")
    a.add_argument("--master", default="local[*]",
                   help="Spark master URL: local[N], spark://HOST:PORT, yarn, k8s://... (default local[*])")
    a.add_argument("--report", type=Path, metavar="FILE", help="also write the JSON report here")
    a.add_argument("--evidence-rows", type=int, default=5, metavar="N",
                   help="rows of evidence per violation (default 5)")
    a.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark config")
    a.set_defaults(func=run_audit_command)

    from audit.bench import register_perf

    register_perf(perf)


def run_export(args: argparse.Namespace) -> int:
    import os

    from cli.main import CliError
    from common.logging import configure

    with audit_extra("export"):
        from audit.export import ExportError, export

    # stdout's summary is the output; the export's events (export_done, each damaged region, which the
    # summary counts and damaged.parquet lists) are info: on stderr only with MINIBROKER_LOG_LEVEL=INFO
    configure("export", level=os.environ.get("MINIBROKER_LOG_LEVEL", "WARNING"))
    try:
        summary = export(args.data_dir, args.out, history=args.history)
    except ExportError as exc:
        raise CliError(str(exc)) from None
    print("\n".join(summary.lines()))
    return 0


def _conf(items: list[str]) -> dict[str, str]:
    from cli.main import CliError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--conf wants KEY=VALUE, got {item!r}")
        out[key] = value
    return out


MIN_DRIVER_MEMORY = 4 << 30  # bytes; what a 20-minute chaos run's export (10M rows) needed
HEAP_PER_ROW = 512  # bytes of JVM heap per exported row (records + polls + sends); see driver_memory_for
RAM_SHARE = 0.6  # at most this share of the machine's memory


def driver_memory_for(counts: dict[str, Any], ram_bytes: int) -> str:
    """The default ``spark.driver.memory`` for an export: its heap runs every task in local mode, and the
    joins over records, polls and sends need it in proportion to them. 4g audited a 20-minute chaos run's
    10M rows and ran out (a broadcast join's hash map) on a 5-minute run's 20.6M, which 8g audited: about
    400 bytes a row, taken as 512. Never below 4g, never above ``RAM_SHARE`` of ``ram_bytes`` (a larger
    export then needs a bigger machine or ``--conf spark.driver.memory``). A heap is reserved, not used,
    until the data needs it."""
    rows = sum(int(counts.get(k) or 0) for k in ("records", "polls", "sends"))
    want = max(MIN_DRIVER_MEMORY, rows * HEAP_PER_ROW)
    cap = int(ram_bytes * RAM_SHARE) if ram_bytes > 0 else want
    return f"{max(min(want, cap), 1 << 30) >> 20}m"


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def check_report_path(path: Path) -> None:
    """``CliError`` unless a report can be written at ``path`` (checked before the audit, which is slow).
    The report is written as ``<path>.tmp`` and renamed, so its directory must take a new file."""
    from cli.main import CliError

    parent = path.parent
    if path.is_dir():
        raise CliError(f"--report {path} is a directory")
    if not parent.is_dir():
        raise CliError(f"--report {path}: {parent} is not a directory" if parent.exists()
                       else f"--report {path}: directory {parent} does not exist")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise CliError(f"--report {path}: cannot write in {parent}: {exc.strerror or exc}") from None


def check_master(master: str) -> None:
    """``CliError`` for a ``--master`` Spark cannot parse (``SPARK_MASTER_RE``), before a JVM is started
    only to print a stack trace."""
    from cli.main import CliError

    if not SPARK_MASTER_RE.fullmatch(master):
        raise CliError(f"--master {master!r}: not a Spark master URL (local[N], spark://HOST:PORT, yarn, "
                       "k8s://...)")


def _one_line(exc: BaseException) -> str:
    """An exception from Spark as one line: a Java exception's own message, not the JVM's stack."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def run_audit_command(args: argparse.Namespace) -> int:
    from cli.main import CliError

    with audit_extra("audit"):
        from audit import schema

    if args.evidence_rows < 1:
        raise CliError("--evidence-rows must be at least 1")
    check_master(args.master)
    try:
        manifest = schema.read_manifest(args.export_dir)  # fail before starting a JVM
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.report is not None:
        check_report_path(args.report)
    conf = _conf(args.conf)
    with audit_extra("audit"):
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession

        from audit.spark_audit import build_session, format_summary, run_audit, write_report

    # Called in-process next to a running session (tests, notebooks): use it and leave it running.
    existing = SparkSession.getActiveSession()
    try:
        memory = conf.get("spark.driver.memory") or driver_memory_for(manifest.get("counts") or {}, _ram_bytes())
        spark = existing or build_session(args.master, driver_memory=memory, extra_conf=conf)
    except (Py4JError, PySparkException) as exc:  # no JVM (no Java), a master it refuses or cannot reach
        raise CliError(f"cannot start Spark with --master {args.master}: {_one_line(exc)}") from None
    try:
        report = run_audit(spark, args.export_dir, evidence_rows=args.evidence_rows)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except (Py4JError, PySparkException) as exc:  # a failed job or a JVM that died (out of memory)
        raise CliError(f"the Spark audit failed ({type(exc).__name__}); Spark's log above has the cause. An "
                       "export too large for the JVM's heap needs more: --conf spark.driver.memory=8g, say") from None
    finally:
        if existing is None:
            with contextlib.suppress(Py4JError, PySparkException):  # nothing left to stop if the JVM died
                spark.stop()
    print(format_summary(report))
    if args.report is not None:
        try:
            write_report(report, args.report)
        except OSError as exc:
            raise CliError(f"cannot write --report {args.report}: {exc}") from None
        print(f"report written to {args.report}", file=sys.stderr)
    return 0 if report.ok else 1
