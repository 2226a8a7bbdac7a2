"""``minibroker perf audit``: export and Spark-audit throughput on synthetic data dirs.

Writes ``--brokers`` replicas of ``--partitions`` partitions holding
``--records`` records each (batches of ``--batch`` records, written with
storage's encoders), a matching history (one acked send and one poll per
record), then times the export and the audit. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from common.cli_args import positive
from common.wire import TopicPartition
from storage.checkpoint import write_epochs, write_offsets
from storage.epoch_cache import EpochEntry
from storage.record_batch import build_batch


def write_data(root: Path, brokers: int, partitions: int, records: int, batch: int) -> Path:
    history = root / "history.jsonl"
    with history.open("w") as h:
        for p in range(partitions):
            for o in range(records):
                v = f"p{p}-{o}"
                h.write(json.dumps({"type": "send", "process": "p0", "seq": p * records + o, "topic": "bench",
                                    "key": None, "value": v, "time_ms": o, "outcome": "ok", "partition": p,
                                    "offset": o}) + "\n")
                h.write(json.dumps({"type": "poll", "process": f"c{p}", "seq": o, "topic": "bench",
                                    "partition": p, "offset": o, "key": None, "value": v, "time_ms": o}) + "\n")
    for b in range(brokers):
        bdir = root / "cluster" / f"broker-{b}"
        bdir.mkdir(parents=True)
        (bdir / "meta.properties").write_text(f"version=1\nnode.id={b}\ncluster.id=bench\n")
        hws: dict[TopicPartition, int] = {}
        for p in range(partitions):
            pdir = bdir / f"bench-{p}"
            pdir.mkdir()
            chunks = [build_batch([(None, f"p{p}-{o}".encode()) for o in range(base, min(base + batch, records))],
                      base_offset=base, timestamp_ms=base, partition_leader_epoch=0)
                      for base in range(0, records, batch)]
            (pdir / f"{0:020d}.log").write_bytes(b"".join(chunks))
            write_epochs(pdir / "leader-epoch-checkpoint", [EpochEntry(0, 0)])
            hws[TopicPartition("bench", p)] = records
        write_offsets(bdir / "replication-offset-checkpoint", hws)
    return history


def run(args: argparse.Namespace) -> int:
    import tempfile

    from audit.export import export
    from audit.spark_audit import build_session, run_audit

    with tempfile.TemporaryDirectory(prefix="mb-perf-audit-") as tmp:
        root = Path(tmp)
        history = write_data(root, args.brokers, args.partitions, args.records, args.batch)
        rows = args.brokers * args.partitions * args.records
        t0 = time.perf_counter()
        summary = export([root / "cluster"], root / "export", history=history)
        export_s = time.perf_counter() - t0
        print(f"export: {summary.records} record rows + {summary.sends} sends + {summary.polls} polls "
              f"in {export_s:.2f} s ({rows / export_s:,.0f} record rows/s)")
        t0 = time.perf_counter()
        spark = build_session(args.master)
        start_s = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            report = run_audit(spark, root / "export")
            audit_s = time.perf_counter() - t0
        finally:
            spark.stop()
        print(f"spark session start: {start_s:.1f} s")
        print(f"audit ({args.master}): {audit_s:.1f} s ({rows / audit_s:,.0f} record rows/s), "
              f"violations: {len(report.violations)}")
    return 0


def register_perf(perf: argparse._SubParsersAction[Any]) -> None:
    p = perf.add_parser("audit", help="export + Spark audit throughput on synthetic data dirs",
                        description="Writes synthetic broker data dirs (every broker a replica of every "
                                    "partition) and a matching workload history, then times `export` and the "
                                    "Spark audit. Figures only; nothing is asserted.")
    p.add_argument("--brokers", type=positive("--brokers"), default=3, help="replicas written (default 3)")
    p.add_argument("--partitions", type=positive("--partitions"), default=4, help="partitions (default 4)")
    p.add_argument("--records", type=positive("--records"), default=50_000,
                   help="records per partition (default 50000)")
    p.add_argument("--batch", type=positive("--batch"), default=100, help="records per batch (default 100)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.set_defaults(func=run)
