"""The export format: Parquet tables in one directory, plus ``manifest.json``.

This module is the contract between ``audit.export`` (which writes) and
``audit.spark_audit`` (which reads); tests may write these tables directly.

``records.parquet``   one row per record per replica (the brokers' own files)
``replicas.parquet``  one row per replica: HW, LEO, log start, leader-epoch cache
``damaged.parquet``   one row per damaged file region (bad CRC, torn tail, ...)
``sends.parquet``     workload history: one row per produce attempt
``polls.parquet``     workload history: one row per record a consumer read
``assignments.parquet`` the controller's assignment: one row per partition (its replicas, ISR, leader);
                      present when the export read controller metadata (``has_metadata``), optional
                      otherwise: exports made before it existed have none, and the audit skips the
                      checks that need it
``manifest.json``     ``{"format_version", "has_history", "history_torn_lines", "has_metadata", "metadata_note",
                      "brokers", "counts", "sources"}``; ``metadata_note`` says why there is no metadata;
                      ``history_torn_lines``: torn last lines skipped in the history files

Conventions: offsets and times are int64 milliseconds/offsets; ``-1`` means
unknown (an HW with no checkpoint entry); keys and values are the raw bytes
(the history's UTF-8 text is encoded the same way the producer encodes it).
``damaged.kind`` is one of ``DAMAGE_KINDS`` (``bad_metadata``: the controller's journal or snapshot,
with a null broker; ``missing_checkpoint``: a broker whose partitions hold records has no
``replication-offset-checkpoint``); ``torn_tail`` (a partial batch at
the end of a segment, what a SIGKILL mid-write leaves and recovery truncates)
is informational, every other kind is damage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMAT_VERSION = 1

EPOCH_ENTRY = pa.struct([("epoch", pa.int32()), ("start_offset", pa.int64())])

RECORDS_SCHEMA = pa.schema([
    ("broker", pa.int32()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("leader_epoch", pa.int32()),
    ("batch_base_offset", pa.int64()),
    ("batch_last_offset", pa.int64()),
    ("batch_crc", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("timestamp", pa.int64()),
    ("producer_id", pa.int64()),
    ("producer_epoch", pa.int32()),
    ("sequence", pa.int32()),
    ("segment", pa.string()),
    ("position", pa.int64()),
])

REPLICAS_SCHEMA = pa.schema([
    ("broker", pa.int32()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("data_dir", pa.string()),
    ("high_watermark", pa.int64()),
    ("log_end_offset", pa.int64()),
    ("log_start_offset", pa.int64()),
    ("recovery_point", pa.int64()),
    ("latest_epoch", pa.int32()),
    ("epoch_cache", pa.list_(EPOCH_ENTRY)),
    ("segments", pa.int32()),
    ("batches", pa.int64()),
    ("records", pa.int64()),
    ("damaged", pa.bool_()),
])

DAMAGED_SCHEMA = pa.schema([
    ("broker", pa.int32()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("file", pa.string()),
    ("position", pa.int64()),
    ("kind", pa.string()),
    ("error", pa.string()),
])

SENDS_SCHEMA = pa.schema([
    ("process", pa.string()),
    ("seq", pa.int64()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("outcome", pa.string()),
    ("error", pa.string()),
    ("start_ms", pa.int64()),
    ("time_ms", pa.int64()),
])

ASSIGNMENTS_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("replicas", pa.list_(pa.int32())),
    ("isr", pa.list_(pa.int32())),
    ("leader", pa.int32()),
    ("leader_epoch", pa.int32()),
])

POLLS_SCHEMA = pa.schema([
    ("process", pa.string()),
    ("seq", pa.int64()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("time_ms", pa.int64()),
])

TABLES: dict[str, pa.Schema] = {
    "records": RECORDS_SCHEMA,
    "replicas": REPLICAS_SCHEMA,
    "damaged": DAMAGED_SCHEMA,
    "sends": SENDS_SCHEMA,
    "polls": POLLS_SCHEMA,
    "assignments": ASSIGNMENTS_SCHEMA,
}
OPTIONAL_TABLES = frozenset({"assignments"})  # required only when the manifest says ``has_metadata``

DAMAGE_KINDS = ("torn_tail", "corrupt_batch", "bad_records", "unreadable", "bad_checkpoint", "bad_name",
                "bad_metadata", "missing_checkpoint")
INFORMATIONAL_DAMAGE = ("torn_tail",)

MANIFEST = "manifest.json"


def table_path(export_dir: Path, name: str) -> Path:
    return export_dir / f"{name}.parquet"


def write_table(export_dir: Path, name: str, rows: list[dict[str, Any]]) -> int:
    """Write a whole table from row dicts (missing columns are null); returns the row count."""
    schema = TABLES[name]
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, table_path(export_dir, name))
    return int(table.num_rows)


class TableWriter:
    """Streams one table in row groups so an export never holds every record in memory."""

    def __init__(self, export_dir: Path, name: str, *, row_group_rows: int = 65_536) -> None:
        self.name = name
        self.schema = TABLES[name]
        self._writer = pq.ParquetWriter(table_path(export_dir, name), self.schema)
        self._pending: list[dict[str, Any]] = []
        self._row_group_rows = row_group_rows
        self.rows = 0

    def add(self, row: dict[str, Any]) -> None:
        self._pending.append(row)
        if len(self._pending) >= self._row_group_rows:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._writer.write_table(pa.Table.from_pylist(self._pending, schema=self.schema))
            self.rows += len(self._pending)
            self._pending = []

    def close(self) -> None:
        self.flush()
        self._writer.close()


def write_manifest(export_dir: Path, manifest: dict[str, Any]) -> None:
    body = {"format_version": FORMAT_VERSION, **manifest}
    tmp = export_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(export_dir / MANIFEST)


def read_manifest(export_dir: Path) -> dict[str, Any]:
    """The manifest; ``ValueError`` with a readable message if missing or unreadable."""
    path = export_dir / MANIFEST
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{export_dir} is not an export directory (no {MANIFEST})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"cannot read {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(body, dict) or body.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported export format (want format_version {FORMAT_VERSION})")
    for name in TABLES:
        if name in OPTIONAL_TABLES and not body.get("has_metadata"):
            continue
        if not table_path(export_dir, name).is_file():
            raise ValueError(f"{export_dir} is incomplete: {name}.parquet is missing")
    return body
