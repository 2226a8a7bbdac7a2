"""Small exports written straight through ``audit.schema`` (the exporter's own tables).

``clean_export()`` is a healthy 3-replica partition: ten records in batches of
two (leader epoch 0 for offsets 0-3, epoch 1 from offset 4), HW = LEO = 10
everywhere, ten acked sends plus one failed and one indeterminate send, and
two consumers (``c0`` and ``final``) that read every offset in order, and the
controller's assignment of the partition to the three brokers. Tests
mutate the row lists to inject exactly one anomaly.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit import schema

TOPIC = "t"
BROKERS = (0, 1, 2)
SEGMENT = "00000000000000000000.log"


def _crc(*values: bytes) -> int:
    return zlib.crc32(b"|".join(values))


@dataclass
class Export:
    records: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[dict[str, Any]] = field(default_factory=list)
    damaged: list[dict[str, Any]] = field(default_factory=list)
    sends: list[dict[str, Any]] = field(default_factory=list)
    polls: list[dict[str, Any]] = field(default_factory=list)
    assignments: list[dict[str, Any]] | None = None  # None: no controller metadata (no assignments.parquet)
    has_history: bool = True

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        counts = {name: schema.write_table(out, name, getattr(self, name)) for name in schema.TABLES
                  if getattr(self, name) is not None}
        schema.write_manifest(out, {"has_history": self.has_history, "brokers": list(BROKERS),
                                    "has_metadata": self.assignments is not None,
                                    "metadata_note": "" if self.assignments is not None else "no metadata (test)",
                                    "counts": counts, "sources": ["test"]})
        return out

    def record(self, broker: int, offset: int) -> dict[str, Any]:
        return next(r for r in self.records if r["broker"] == broker and r["offset"] == offset)

    def replica(self, broker: int) -> dict[str, Any]:
        return next(r for r in self.replicas if r["broker"] == broker)

    def add_log_record(self, offset: int, value: bytes, *, epoch: int = 1) -> None:
        """Append one single-record batch at ``offset`` to every replica (HW and LEO follow)."""
        for b in BROKERS:
            self.records.append(_row(b, offset, offset, offset, epoch, value, pid=-1))
            rep = self.replica(b)
            rep["high_watermark"] = rep["log_end_offset"] = offset + 1
            rep["records"] += 1
            rep["batches"] += 1

    def send(self, value: str, outcome: str, offset: int | None, *, seq: int, process: str = "p0") -> None:
        self.sends.append({"process": process, "seq": seq, "topic": TOPIC, "partition": 0 if offset is not None
                           else None, "offset": offset, "key": None, "value": value.encode(),
                           "outcome": outcome, "error": None if outcome == "ok" else "x",
                           "start_ms": 1_000 + seq, "time_ms": 1_001 + seq})

    def poll(self, process: str, seq: int, offset: int, value: str) -> None:
        self.polls.append({"process": process, "seq": seq, "topic": TOPIC, "partition": 0, "offset": offset,
                           "key": None, "value": value.encode(), "time_ms": 2_000 + seq})


def _row(broker: int, offset: int, base: int, last: int, epoch: int, value: bytes, *, pid: int,
         crc: int | None = None) -> dict[str, Any]:
    return {"broker": broker, "topic": TOPIC, "partition": 0, "offset": offset, "leader_epoch": epoch,
            "batch_base_offset": base, "batch_last_offset": last,
            "batch_crc": crc if crc is not None else _crc(value), "key": None, "value": value,
            "timestamp": 1_000 + offset, "producer_id": pid, "producer_epoch": 0 if pid >= 0 else -1,
            "sequence": offset if pid >= 0 else -1, "segment": SEGMENT, "position": base * 100}


def value(offset: int) -> str:
    return f"v{offset}"


def clean_export(*, producer_id: int = -1) -> Export:
    e = Export()
    for b in BROKERS:
        for base in range(0, 10, 2):
            epoch = 0 if base < 4 else 1
            vals = [value(base).encode(), value(base + 1).encode()]
            crc = _crc(*vals)
            for i, v in enumerate(vals):
                e.records.append(_row(b, base + i, base, base + 1, epoch, v, pid=producer_id, crc=crc))
        e.replicas.append({"broker": b, "topic": TOPIC, "partition": 0, "data_dir": f"/d/broker-{b}",
                           "high_watermark": 10, "log_end_offset": 10, "log_start_offset": 0,
                           "recovery_point": 10, "latest_epoch": 1,
                           "epoch_cache": [{"epoch": 0, "start_offset": 0}, {"epoch": 1, "start_offset": 4}],
                           "segments": 1, "batches": 5, "records": 10, "damaged": False})
    for o in range(10):
        e.send(value(o), "ok", o, seq=o)
    e.send("refused", "fail", None, seq=10)
    e.send("maybe", "info", None, seq=11)
    for process in ("c0", "final"):
        for o in range(10):
            e.poll(process, o, o, value(o))
    e.assignments = [{"topic": TOPIC, "partition": 0, "replicas": list(BROKERS), "isr": list(BROKERS),
                      "leader": 0, "leader_epoch": 1}]
    return e
