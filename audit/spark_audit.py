"""The Spark consistency audit over an export (see ``audit.schema``).

Every check is a DataFrame query whose rows are violations; only a count and
the first ``evidence_rows`` rows of each reach the driver, so the audit scales
with the cluster, not the driver.

Definitions (DESIGN.md "Safety invariants"; the read checks follow Jepsen's
Kafka workload):

- *committed records* of a replica: its records below its own HW (the HW from
  its ``replication-offset-checkpoint``; an unknown HW commits nothing). The
  checkpoint lags the live HW, so this is a safe under-approximation.
- *final log* of a partition: the whole log of its authoritative replica, the
  one a clean election would have made leader last: undamaged first, then the
  highest latest leader epoch, then the longest log, then the lowest broker
  id. After a chaos run heals and every ISR is full, it equals every replica.
  (Kafka has no offline notion of "the" log; this is the replica that holds
  the last leader's writes.)
- *reference log*: the final log, plus, at offsets below the final replica's
  log start (from its replica row) that it no longer holds (retention), other replicas' records there.
- an event *matches* a record at the same (topic, partition, offset) with the
  same value and, when the history has a key, the same key.

Checks, one result each:

``lost_writes``          an acked send (outcome ok) that matches no record of the reference log
``inconsistent_offsets`` a (topic, partition, offset) with two values or two keys across committed replica
                         records, the final log and polls (a poll without a key: its key is not compared)
``replica_divergence``   committed copies of one offset that differ in batch crc, leader epoch or batch base
``epoch_forks``          copies of one offset in one leader epoch that differ in batch crc or base, over every
                         record of every replica (committed or not): two leaders in one epoch (invariant 5)
``missing_replicas``     a replica the controller assigned that the export has no replica row for (skipped
                         without controller metadata; ``metadata_note`` in the manifest says why)
``duplicates``           one idempotent producer's record -- the same (topic, partition, producer id, producer
                         epoch, sequence) -- at two offsets of the final log: a retry appended twice
                         (invariant 6); with a history, also a value with more idempotent copies in the
                         committed final log than sends (``resent_duplicates``). One value at two offsets with
                         other sequences (two sends of an equal value), or without idempotence, is only counted
``offset_gaps``          a replica's log skips offsets (in file order, or its first offset is above log start)
``offset_repeats``       a replica's log repeats an offset or goes backwards
``epoch_regressions``    leader epochs decrease along a replica's log
``hw_above_leo``         a replica whose HW checkpoint is above its log end offset
``epoch_cache_mismatch`` a replica's leader-epoch cache entry whose start offset is not the first offset of that
                         epoch in its log (only entries at or above its log start, for epochs with records
                         there, on undamaged replicas)
``non_monotonic_polls``  one consumer process reads an offset at or below its previous one on a partition
``skipped_polls``        one consumer process jumps over offsets on a partition
``dirty_reads``          a poll that matches no record of the reference log
``unseen_writes``        an acked send that matches the final log at or above its log start but that no poll
                         returned (run only when the history has polls)
``failed_writes_present`` a send recorded as ``fail`` whose value (and key) is in the final log of its topic,
                         unless an ok/info send carried that value too
``damaged_files``        log regions (or controller metadata) the export could not read (torn tails are
                         counted, not violations)

Checks that need the workload history are ``skipped`` without one. Lost writes
and unseen writes are disjoint by construction (an acked value missing from
the final log is lost, not unseen), so each anomaly is reported once.

Counted, not violations (stats, and a note on the check they weaken):
``replicas_without_hw`` (no HW entry: commits nothing, so ``replica_divergence``
and ``inconsistent_offsets`` do not compare it; ``epoch_forks`` does), and
``acked_below_log_start`` / ``polls_below_log_start`` (an offset no replica
holds, below every replica's log start: retention deleted it, nothing can be
checked).
"""

from __future__ import annotations

import enum
import json
import operator
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from audit import schema

if TYPE_CHECKING:  # pyspark is imported lazily: the CLI starts without a JVM
    from pyspark.sql import Column, DataFrame, SparkSession

EVIDENCE_ROWS = 5
EVIDENCE_POSITIONS = 10  # positions listed in one evidence row (its count says how many there are)
EVIDENCE_VALUE_CHARS = 200  # characters of a value shown in duplicates evidence
KEYS = ["export", "topic", "partition"]
REPLICA = ["export", "broker", "topic", "partition"]


class Status(enum.Enum):
    OK = "ok"
    VIOLATION = "violation"
    COUNTED = "counted"  # found, but not a violation (e.g. duplicates without idempotence)
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    status: Status
    count: int
    evidence: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "count": self.count,
                "evidence": self.evidence, "note": self.note}


@dataclass(frozen=True, slots=True)
class AuditReport:
    export_dir: str
    checks: list[CheckResult]
    stats: dict[str, int]

    @property
    def violations(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.VIOLATION]

    @property
    def ok(self) -> bool:
        return not self.violations

    def check(self, name: str) -> CheckResult:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"export_dir": self.export_dir, "ok": self.ok,
                "violations": [c.name for c in self.violations], "stats": self.stats,
                "checks": [c.to_json() for c in self.checks]}


# ---------------------------------------------------------------- session

def build_session(master: str = "local[*]", *, app_name: str = "minibroker-audit",
                  shuffle_partitions: int = 4, driver_memory: str = "4g",
                  extra_conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession sized for a small machine; pass ``--master`` for a real cluster.

    ``driver_memory``: the JVM's heap, which in local mode runs every task. Spark's default of 1g ran out
    (in a broadcast join) auditing a 20-minute chaos run's export (5.0M record rows, 1.7M sends, 3.3M
    polls); 4g audited it in 138 s. A heap is reserved, not used, until the data needs it."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.default.parallelism", str(shuffle_partitions))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", driver_memory)
               .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith("local"):  # stay on the loopback interface
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ---------------------------------------------------------------- tables

@dataclass(frozen=True, slots=True)
class Tables:
    """The export tables, each with an ``export`` column naming its export directory."""

    records: DataFrame
    replicas: DataFrame
    damaged: DataFrame
    sends: DataFrame
    polls: DataFrame
    assignments: DataFrame


ASSIGNMENTS_DDL = ("topic string, partition int, replicas array<int>, isr array<int>, leader int, "
                   "leader_epoch int, export string")


def glob_escape(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped: ``spark.read.parquet`` expands globs, so an export
    under ``run[1]`` or ``{a,b}`` was not found (or, worse, another directory would have been)."""
    return re.sub(r"([\\*?\[\]{}])", r"\\\1", path)


def _normalise(path_or_uri: str) -> str:
    """A local path or Spark's ``file:`` URI -> the absolute path, as the export key."""
    parsed = urlparse(path_or_uri)
    path = unquote(parsed.path) if parsed.scheme else path_or_uri
    return os.path.abspath(path)


def load_tables(spark: SparkSession, export_dirs: list[Path]) -> Tables:
    """All exports' tables, read together (one scan per table, whatever the number of exports). The
    optional ``assignments`` table is read from the exports that have it (empty if none has)."""
    from pyspark.sql import functions as F

    export_col = F.regexp_extract(F.col("_metadata.file_path"), r"^(.*)/[^/]*$", 1)

    def read(name: str, dirs: list[Path]) -> DataFrame:
        paths = [glob_escape(str(schema.table_path(d, name))) for d in dirs]
        return spark.read.parquet(*paths).withColumn("export", export_col)

    with_assignments = [d for d in export_dirs if schema.table_path(d, "assignments").is_file()]
    assignments = (read("assignments", with_assignments) if with_assignments
                   else spark.createDataFrame([], ASSIGNMENTS_DDL))
    return Tables(records=read("records", export_dirs), replicas=read("replicas", export_dirs),
                  damaged=read("damaged", export_dirs), sends=read("sends", export_dirs),
                  polls=read("polls", export_dirs), assignments=assignments)


def _vkey(col: str = "value") -> Column:
    """A comparable, null-safe fingerprint of a binary value."""
    from pyspark.sql import functions as F

    return F.coalesce(F.sha2(F.col(col), 256), F.lit("<null>"))


def _kkey(col: str = "key") -> Column:
    """A log record's key fingerprint (a null key is a key too)."""
    return _vkey(col)


def _history_kkey() -> Column:
    """A history event's key fingerprint, null when the history has no key: the key is then not compared
    (the chaos workload records no keys)."""
    from pyspark.sql import functions as F

    return F.sha2(F.col("key"), 256)


def _text(col: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(col).cast("string")


def committed_records(t: Tables) -> DataFrame:
    """Every replica's records below its own HW."""
    from pyspark.sql import functions as F

    hws = t.replicas.select(*REPLICA, F.col("high_watermark"))
    return (t.records.join(hws, REPLICA)
            .where(F.col("offset") < F.col("high_watermark"))
            .drop("high_watermark"))


def authoritative_replicas(t: Tables) -> DataFrame:
    """(export, broker, topic, partition, log_start_offset, high_watermark) of the replica whose log is the
    partition's final log."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy(*KEYS).orderBy(F.col("damaged").asc(), F.col("latest_epoch").desc(),
                                          F.col("log_end_offset").desc(), F.col("broker").asc())
    return (t.replicas.withColumn("rank", F.row_number().over(w))
            .where(F.col("rank") == 1).select(*REPLICA, "log_start_offset", "high_watermark"))


def final_log(t: Tables, authoritative: DataFrame) -> DataFrame:
    """The authoritative replica's records, with its ``final_log_start`` and ``final_hw``."""
    return t.records.join(authoritative.withColumnRenamed("log_start_offset", "final_log_start")
                          .withColumnRenamed("high_watermark", "final_hw"), REPLICA)


def reference_log(t: Tables, final: DataFrame, authoritative: DataFrame) -> DataFrame:
    """What acked sends and polls are checked against: the final log, plus, at offsets below the final
    replica's log start that it no longer holds (retention deleted them), every other replica's records
    there. Offsets the final log holds are checked against it alone.

    The final replica's log start comes from its replica row, not from its records: retention may have
    emptied it (``Log.delete_old_segments`` deletes the active segment too and rolls an empty one at the
    LEO, log start = LEO), and then it has no record to carry it, yet every other replica's records below
    it are still the reference."""
    from pyspark.sql import functions as F

    cols = [*KEYS, "offset", "broker", "key", "value"]
    starts = authoritative.select(*KEYS, F.col("log_start_offset").alias("final_log_start"))
    held = final.select(*KEYS, "offset").distinct()
    older = (t.records.join(starts, KEYS).where(F.col("offset") < F.col("final_log_start"))
             .join(held, [*KEYS, "offset"], "left_anti"))
    return final.select(*cols).unionByName(older.select(*cols))


def partition_log_starts(t: Tables) -> DataFrame:
    """(export, topic, partition, min_log_start): below it, no replica can hold a record."""
    from pyspark.sql import functions as F

    return t.replicas.groupBy(*KEYS).agg(F.min("log_start_offset").alias("min_log_start"))


# ---------------------------------------------------------------- checks

@dataclass(frozen=True, slots=True)
class Context:
    t: Tables
    final: DataFrame
    committed: DataFrame
    acked: DataFrame
    reference: DataFrame
    log_starts: DataFrame
    authoritative: DataFrame  # (export, broker, topic, partition, log_start_offset, high_watermark)


def _matching(events: DataFrame, log: DataFrame, how: str) -> DataFrame:
    """History events joined (``left_semi``/``left_anti``) with the log records at their (topic,
    partition, offset) holding the same value and, when the event has a key, the same key."""
    from pyspark.sql import functions as F

    ev = events.withColumn("_vkey", _vkey()).withColumn("_hkey", _history_kkey())
    rec = log.select(*[F.col(k).alias(f"_r_{k}") for k in [*KEYS, "offset"]],
                     _vkey().alias("_r_vkey"), _kkey().alias("_r_kkey"))
    cond = reduce(operator.and_, [F.col(k) == F.col(f"_r_{k}") for k in [*KEYS, "offset"]])
    same_key = F.col("_hkey").isNull() | (F.col("_hkey") == F.col("_r_kkey"))
    cond = cond & (F.col("_vkey") == F.col("_r_vkey")) & same_key
    return ev.join(rec, cond, how).drop("_vkey", "_hkey")


def _unverified(c: Context, events: DataFrame) -> DataFrame:
    """History events that match no reference record, with ``below_log_start``: no replica holds their
    offset and it is below every replica's log start (retention deleted it), so nothing can be checked."""
    from pyspark.sql import functions as F

    held = c.reference.select(*KEYS, "offset").distinct().withColumn("_held", F.lit(True))
    return (_matching(events, c.reference, "left_anti")
            .join(held, [*KEYS, "offset"], "left").join(c.log_starts, KEYS, "left")
            .withColumn("below_log_start", F.col("_held").isNull() & F.col("min_log_start").isNotNull()
                        & (F.col("offset") < F.col("min_log_start")))
            .drop("_held", "min_log_start"))


def _found(c: Context) -> DataFrame:
    """What the reference log holds at each offset (for evidence)."""
    from pyspark.sql import functions as F

    return (c.reference.groupBy(*KEYS, "offset")
            .agg(F.min(_text("value")).alias("found_value"), F.min(_text("key")).alias("found_key"),
                 F.min("broker").alias("found_broker")))


def check_lost_writes(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    lost = _unverified(c, c.acked).where(~F.col("below_log_start"))
    return (lost.join(_found(c), [*KEYS, "offset"], "left")
            .select("export", "process", "seq", "topic", "partition", "offset", _text("key").alias("key"),
                    _text("value").alias("value"), "found_key", "found_value", "found_broker"))


def acked_below_log_start(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return _unverified(c, c.acked).where(F.col("below_log_start"))


def check_inconsistent_offsets(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    def tagged(df: DataFrame, tag: str, col: str, key: Column) -> DataFrame:
        return df.select(*KEYS, "offset", "key", "value", key.alias("kkey"),
                         F.concat(F.lit(tag), F.col(col).cast("string")).alias("source"))

    observed = (tagged(c.committed, "replica:", "broker", _kkey())
                .unionByName(tagged(c.final.drop("final_log_start"), "final:", "broker", _kkey()))
                .unionByName(tagged(c.t.polls, "poll:", "process", _history_kkey())))  # a null poll key: not compared
    return (observed.groupBy(*KEYS, "offset")
            .agg(F.countDistinct(_vkey()).alias("values"), F.countDistinct("kkey").alias("keys"),
                 F.slice(F.array_sort(F.collect_set(_text("value"))), 1, 5).alias("distinct_values"),
                 F.slice(F.array_sort(F.collect_set(_text("key"))), 1, 5).alias("distinct_keys"),
                 F.slice(F.array_sort(F.collect_set("source")), 1, 10).alias("sources"))
            .where((F.col("values") > 1) | (F.col("keys") > 1)))


def check_replica_divergence(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    copy = F.struct("batch_crc", "leader_epoch", "batch_base_offset")
    return (c.committed.groupBy(*KEYS, "offset")
            .agg(F.countDistinct(copy).alias("variants"),
                 F.array_sort(F.collect_list(F.struct("broker", "leader_epoch", "batch_crc",
                                                      "batch_base_offset"))).alias("copies"))
            .where(F.col("variants") > 1))


def check_epoch_forks(c: Context) -> DataFrame:
    """Copies of one offset written in one leader epoch that differ: two writers in that epoch (invariant
    5). Over every record of every replica, committed or not: one leader writes per epoch, and followers
    copy its batches, so this has no false positives (a deposed leader's tail is in an older epoch)."""
    from pyspark.sql import functions as F

    return (c.t.records.groupBy(*KEYS, "offset", "leader_epoch")
            .agg(F.countDistinct(F.struct("batch_crc", "batch_base_offset")).alias("variants"),
                 F.array_sort(F.collect_list(F.struct("broker", "batch_crc", "batch_base_offset")))
                 .alias("copies"))
            .where(F.col("variants") > 1))


def check_missing_replicas(c: Context) -> DataFrame:
    """A replica the controller assigned with no replica in the export (its data dir or partition dir is
    gone). Runs only on exports with controller metadata, which come from a cluster dir: it is expected to
    hold every broker of the cluster."""
    from pyspark.sql import functions as F

    assigned = c.t.assignments.select("export", "topic", "partition", F.explode("replicas").alias("broker"),
                                      "replicas", "leader", "leader_epoch")
    return assigned.join(c.t.replicas.select(*REPLICA), REPLICA, "left_anti")


def _bounded(col: Column) -> Column:
    """The first ``EVIDENCE_POSITIONS`` elements of a sorted array column (an evidence row's ``copies``
    counts them all): one value written thousands of times must not make a row of thousands of positions."""
    from pyspark.sql import functions as F

    return F.slice(F.array_sort(col), 1, EVIDENCE_POSITIONS)


def _short_text(col: str) -> Column:
    """A value as text for evidence, cut to ``EVIDENCE_VALUE_CHARS`` characters (a benchmark's payload
    can be a MiB)."""
    from pyspark.sql import functions as F

    text = _text(col)
    return F.when(F.length(text) > EVIDENCE_VALUE_CHARS,
                  F.concat(F.substring(text, 1, EVIDENCE_VALUE_CHARS), F.lit("..."))).otherwise(text)


def duplicate_groups(c: Context) -> DataFrame:
    """One value at two offsets of a topic's final log (counted, not a violation: equal values sent
    twice are different sends, and without idempotence a retry may write a record twice)."""
    from pyspark.sql import functions as F

    return (c.final.where(F.col("value").isNotNull()).groupBy("export", "topic", _vkey().alias("vkey"))
            .agg(F.count("*").alias("copies"),
                 F.first(_short_text("value")).alias("value"),
                 _bounded(F.collect_list(F.struct("partition", "offset", "producer_id", "producer_epoch",
                                                  "sequence"))).alias("positions"))
            .where(F.col("copies") > 1).drop("vkey"))


def idempotent_duplicates(c: Context) -> DataFrame:
    """One record of an idempotent producer at two offsets of a partition's final log: the same
    (producer id, producer epoch, sequence), which only a retry of the same batch carries, appended twice
    (invariant 6). Sequences count per partition, so copies are grouped per partition. Equal values with
    other sequences are other sends (``duplicate_groups`` counts them)."""
    from pyspark.sql import functions as F

    return (c.final.where((F.col("producer_id") >= 0) & (F.col("sequence") >= 0))
            .groupBy(*KEYS, "producer_id", "producer_epoch", "sequence")
            .agg(F.count("*").alias("copies"), F.countDistinct(_vkey()).alias("values"),
                 F.min(_short_text("value")).alias("value"),
                 _bounded(F.collect_list(F.struct("offset", "leader_epoch", "batch_base_offset")))
                 .alias("positions"))
            .where(F.col("copies") > 1))


RESEND_SLACK_MS = 1_000  # a copy's timestamp may be this much before its value's first send (clock rounding)


def resent_duplicates(c: Context) -> DataFrame:
    """A value of the history whose copies in the committed final log of its topic, written by an
    idempotent producer (producer id >= 0), outnumber the sends that carried it (any outcome): a record sent
    once was appended again under another producer id or epoch (invariant 6), which the same-sequence check
    (``idempotent_duplicates``) cannot see.

    - A copy is one (partition, producer id, producer epoch, sequence): a same-sequence retry appended twice
      counts once here (``idempotent_duplicates`` reports it), so each anomaly is reported once.
    - Copies of a non-idempotent producer (producer id -1) are not counted: its retries legitimately
      duplicate (``duplicate_groups`` counts them).
    - Only values the history sent at least once, and only copies stamped no earlier than the value's first
      send (less ``RESEND_SLACK_MS``): records of an earlier run into the same topic (``chaos run`` against a
      running cluster reuses topic ``chaos`` and its value names ``p0-0``, ...) are not this history's.
    - Committed only (below the final replica's HW): an unknown HW checks nothing.
    Values are compared whole (a null value is a value too); keys are not compared, so copies and sends of
    one value are summed over keys, which can only hide an excess, never make one up."""
    from pyspark.sql import functions as F

    sends = (c.t.sends.groupBy("export", "topic", _vkey().alias("vkey"))
             .agg(F.count("*").alias("sends"), F.min("start_ms").alias("first_send_ms")))
    copies = (c.final.where((F.col("producer_id") >= 0) & (F.col("offset") < F.col("final_hw")))
              .select("export", "topic", _vkey().alias("vkey"), "value", "timestamp", "partition", "offset",
                      "producer_id", "producer_epoch", "sequence"))
    return (copies.join(sends, ["export", "topic", "vkey"])
            .where(F.col("timestamp") >= F.col("first_send_ms") - RESEND_SLACK_MS)
            .groupBy("export", "topic", "vkey")
            .agg(F.countDistinct(F.struct("partition", "producer_id", "producer_epoch", "sequence"))
                 .alias("copies"), F.first("sends").alias("sends"), F.first(_short_text("value")).alias("value"),
                 _bounded(F.collect_list(F.struct("partition", "offset", "producer_id", "producer_epoch",
                                                  "sequence"))).alias("positions"))
            .where(F.col("copies") > F.col("sends")).drop("vkey"))


def _replica_order(t: Tables) -> DataFrame:
    """Each record with the previous record of the same replica in file order."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy(*REPLICA).orderBy("segment", "position", "offset")
    return (t.records.select(*REPLICA, "offset", "leader_epoch", "segment", "position")
            .withColumn("prev_offset", F.lag("offset").over(w))
            .withColumn("prev_epoch", F.lag("leader_epoch").over(w)))


def check_offset_gaps(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    ordered = _replica_order(c.t)
    inner = (ordered.where(F.col("prev_offset").isNotNull() & (F.col("offset") > F.col("prev_offset") + 1))
             .select(*REPLICA, "prev_offset", "offset", "segment"))
    starts = c.t.replicas.select(*REPLICA, "log_start_offset")
    first = (c.t.records.groupBy(*REPLICA).agg(F.min("offset").alias("offset"))
             .join(starts, REPLICA)
             .where((F.col("log_start_offset") >= 0) & (F.col("offset") > F.col("log_start_offset")))
             .select(*REPLICA, (F.col("log_start_offset") - 1).alias("prev_offset"), "offset",
                     F.lit("(log start)").alias("segment")))
    return inner.unionByName(first)


def check_offset_repeats(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return (_replica_order(c.t)
            .where(F.col("prev_offset").isNotNull() & (F.col("offset") <= F.col("prev_offset")))
            .select(*REPLICA, "prev_offset", "offset", "segment", "position"))


def check_epoch_regressions(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return (_replica_order(c.t)
            .where(F.col("prev_epoch").isNotNull() & (F.col("leader_epoch") < F.col("prev_epoch")))
            .select(*REPLICA, "offset", "prev_epoch", "leader_epoch", "segment"))


def check_epoch_cache_mismatch(c: Context) -> DataFrame:
    """A replica's leader-epoch cache entry (epoch, start offset) whose start is not the first offset of that
    epoch in the replica's own log. A leader records (its epoch, its LEO) before it writes, a follower the
    base offset of the first batch of a new epoch it appends, and truncation trims the cache with the log,
    so they agree; a wrong cache misleads epoch truncation (KIP-101), which follows it.

    Compared only where the log can still show the epoch's first batch: entries at or above the replica's
    log start (below it, retention deleted the batches and ``truncate_from_start`` clamped the entry), epochs
    with records at or above the log start (an epoch with no batch: a leader's assignment at its LEO, or an
    epoch whose batches were truncated), and undamaged replicas (their scan stopped at the damage, which
    ``damaged_files`` reports)."""
    from pyspark.sql import functions as F

    reps = c.t.replicas.where(~F.col("damaged")).select(*REPLICA, "log_start_offset", "epoch_cache")
    entries = (reps.select(*REPLICA, "log_start_offset", F.explode("epoch_cache").alias("entry"))
               .select(*REPLICA, "log_start_offset", F.col("entry.epoch").alias("leader_epoch"),
                       F.col("entry.start_offset").alias("cache_start_offset"))
               .where(F.col("cache_start_offset") >= F.col("log_start_offset")))
    firsts = (c.t.records.join(reps.select(*REPLICA, "log_start_offset"), REPLICA)
              .where(F.col("offset") >= F.col("log_start_offset"))
              .groupBy(*REPLICA, "leader_epoch").agg(F.min("offset").alias("first_offset_in_log")))
    return (entries.join(firsts, [*REPLICA, "leader_epoch"])
            .where(F.col("first_offset_in_log") != F.col("cache_start_offset"))
            .select(*REPLICA, "leader_epoch", "cache_start_offset", "first_offset_in_log", "log_start_offset"))


def check_hw_above_leo(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return (c.t.replicas.where(F.col("high_watermark") > F.col("log_end_offset"))
            .select(*REPLICA, "high_watermark", "log_end_offset", "data_dir"))


def _poll_order(c: Context) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("export", "process", "topic", "partition").orderBy("seq", "time_ms")
    return (c.t.polls.withColumn("prev_offset", F.lag("offset").over(w))
            .withColumn("prev_seq", F.lag("seq").over(w))
            .where(F.col("prev_offset").isNotNull()))


def check_non_monotonic_polls(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return (_poll_order(c).where(F.col("offset") <= F.col("prev_offset"))
            .select("export", "process", "topic", "partition", "prev_seq", "seq", "prev_offset", "offset"))


def check_skipped_polls(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return (_poll_order(c).where(F.col("offset") > F.col("prev_offset") + 1)
            .select("export", "process", "topic", "partition", "prev_seq", "seq", "prev_offset", "offset"))


def check_dirty_reads(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    dirty = _unverified(c, c.t.polls).where(~F.col("below_log_start"))
    return (dirty.join(_found(c), [*KEYS, "offset"], "left")
            .select("export", "process", "seq", "topic", "partition", "offset", _text("key").alias("key"),
                    _text("value").alias("value"), "found_key", "found_value"))


def polls_below_log_start(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return _unverified(c, c.t.polls).where(F.col("below_log_start"))


def check_unseen_writes(c: Context) -> DataFrame:
    """Acked, in the final log at or above its log start (what a consumer can read), never polled."""
    from pyspark.sql import functions as F

    readable = c.final.where(F.col("offset") >= F.col("final_log_start"))
    read = c.t.polls.select(*KEYS, _vkey().alias("vkey"))
    return (_matching(c.acked, readable, "left_semi").withColumn("vkey", _vkey())
            .join(read, [*KEYS, "vkey"], "left_anti")
            .select("export", "process", "seq", "topic", "partition", "offset", _text("value").alias("value")))


def check_failed_writes_present(c: Context) -> DataFrame:
    """A send the client reported as a definite failure (``fail``) whose value (and key, when the history
    has one) is in the final log of its topic. A value some other (ok or info) send also carried is not
    counted: that send may have written it."""
    from pyspark.sql import functions as F

    sends = c.t.sends.where(F.col("value").isNotNull())
    others = sends.where(F.col("outcome") != "fail").select("export", "topic", _vkey().alias("vkey"))
    failed = (sends.where(F.col("outcome") == "fail")
              .select("export", "process", "seq", "topic", "value", _vkey().alias("vkey"),
                      _history_kkey().alias("hkey"))
              .join(others, ["export", "topic", "vkey"], "left_anti"))
    log = c.final.select(F.col("export").alias("_r_export"), F.col("topic").alias("_r_topic"),
                         _vkey().alias("_r_vkey"), _kkey().alias("_r_kkey"),
                         F.struct("partition", "offset").alias("at"))
    cond = ((F.col("export") == F.col("_r_export")) & (F.col("topic") == F.col("_r_topic"))
            & (F.col("vkey") == F.col("_r_vkey")) & (F.col("hkey").isNull() | (F.col("hkey") == F.col("_r_kkey"))))
    return (failed.join(log, cond).groupBy("export", "process", "seq", "topic", "value")
            .agg(F.count("*").alias("copies"), _bounded(F.collect_list("at")).alias("found_at"))
            .select("export", "process", "seq", "topic", _short_text("value").alias("value"), "copies",
                    "found_at"))


def check_damaged_files(c: Context) -> DataFrame:
    from pyspark.sql import functions as F

    return c.t.damaged.where(~F.col("kind").isin(*schema.INFORMATIONAL_DAMAGE))


@dataclass(frozen=True, slots=True)
class Query:
    """A DataFrame of findings and the order its evidence rows are shown in."""

    query: Callable[[Context], DataFrame]
    order: tuple[str, ...]


PARTITION_ORDER = ("topic", "partition", "offset")
REPLICA_ORDER = ("broker", "topic", "partition", "offset")
POLL_ORDER = ("process", "topic", "partition", "seq")

QUERIES: dict[str, Query] = {
    "lost_writes": Query(check_lost_writes, PARTITION_ORDER),
    "inconsistent_offsets": Query(check_inconsistent_offsets, PARTITION_ORDER),
    "replica_divergence": Query(check_replica_divergence, PARTITION_ORDER),
    "epoch_forks": Query(check_epoch_forks, ("topic", "partition", "offset", "leader_epoch")),
    "missing_replicas": Query(check_missing_replicas, ("topic", "partition", "broker")),
    "duplicates:idempotent": Query(idempotent_duplicates,
                                   ("topic", "partition", "producer_id", "producer_epoch", "sequence")),
    "duplicates:resent": Query(resent_duplicates, ("topic", "value")),
    "duplicates:all": Query(duplicate_groups, ("topic", "value")),
    "offset_gaps": Query(check_offset_gaps, REPLICA_ORDER),
    "offset_repeats": Query(check_offset_repeats, ("broker", "topic", "partition", "segment", "position")),
    "epoch_regressions": Query(check_epoch_regressions, REPLICA_ORDER),
    "hw_above_leo": Query(check_hw_above_leo, ("broker", "topic", "partition")),
    "epoch_cache_mismatch": Query(check_epoch_cache_mismatch, ("broker", "topic", "partition", "leader_epoch")),
    "non_monotonic_polls": Query(check_non_monotonic_polls, POLL_ORDER),
    "skipped_polls": Query(check_skipped_polls, POLL_ORDER),
    "dirty_reads": Query(check_dirty_reads, POLL_ORDER),
    "unseen_writes": Query(check_unseen_writes, PARTITION_ORDER),
    "failed_writes_present": Query(check_failed_writes_present, ("topic", "process", "seq")),
    "damaged_files": Query(check_damaged_files, ("broker", "file", "position")),
}
HISTORY_CHECKS = frozenset({"lost_writes", "non_monotonic_polls", "skipped_polls", "dirty_reads", "unseen_writes",
                            "failed_writes_present"})
METADATA_CHECKS = frozenset({"missing_replicas"})

CHECK_NAMES = ("lost_writes", "inconsistent_offsets", "replica_divergence", "epoch_forks", "missing_replicas",
               "duplicates", "offset_gaps", "offset_repeats", "epoch_regressions", "hw_above_leo",
               "epoch_cache_mismatch",
               "non_monotonic_polls", "skipped_polls", "dirty_reads", "unseen_writes", "failed_writes_present",
               "damaged_files")


STAT_NAMES = ("record_rows", "replicas", "partitions", "final_log_records", "replicas_without_hw", "sends", "acked",
              "failed", "indeterminate", "polls", "acked_below_log_start", "polls_below_log_start", "torn_tails")


def _stat_queries(c: Context) -> dict[str, DataFrame]:
    from pyspark.sql import functions as F

    sends = c.t.sends
    return {
        "record_rows": c.t.records,
        "replicas": c.t.replicas,
        "partitions": c.t.replicas.select(*KEYS).distinct(),
        "final_log_records": c.final,
        "replicas_without_hw": c.t.replicas.where(F.col("high_watermark") < 0),
        "sends": sends,
        "acked": c.acked,
        "failed": sends.where(F.col("outcome") == "fail"),
        "indeterminate": sends.where(F.col("outcome") == "info"),
        "polls": c.t.polls,
        "acked_below_log_start": acked_below_log_start(c),
        "polls_below_log_start": polls_below_log_start(c),
        "torn_tails": c.t.damaged.where(F.col("kind").isin(*schema.INFORMATIONAL_DAMAGE)),
    }


# ---------------------------------------------------------------- running

Counts = dict[tuple[str, str], int]  # (query name, export) -> rows


def _counts(named: dict[str, DataFrame]) -> Counts:
    """Row counts per export of many DataFrames, in one Spark job."""
    from pyspark.sql import functions as F

    parts = [df.groupBy("export").agg(F.count(F.lit(1)).alias("n")).select(F.lit(name).alias("name"), "export", "n")
             for name, df in named.items()]
    union = reduce(lambda a, b: a.unionByName(b), parts)
    return {(r["name"], _normalise(r["export"])): int(r["n"]) for r in union.collect()}


def _evidence(c: Context, names: list[str], evidence_rows: int) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The first rows of each named query per export, in one Spark job."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not names:
        return {}
    parts = []
    for name in names:
        q = QUERIES[name]
        df = q.query(c)
        row = F.to_json(F.struct(*[col for col in df.columns if col != "export"]))
        w = Window.partitionBy("export").orderBy(*q.order)
        parts.append(df.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") <= evidence_rows)
                     .select(F.lit(name).alias("name"), "export", "_rank", row.alias("row")))
    out: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
    for r in reduce(lambda a, b: a.unionByName(b), parts).collect():
        out.setdefault((r["name"], _normalise(r["export"])), []).append((r["_rank"], json.loads(r["row"])))
    return {key: [row for _, row in sorted(rows, key=lambda x: x[0])] for key, rows in out.items()}


def _with_note(result: CheckResult, note: str) -> CheckResult:
    return replace(result, note="; ".join(filter(None, [result.note, note])))


def _export_results(export: str, manifest: dict[str, Any], counts: Counts,
                    evidence: dict[tuple[str, str], list[dict[str, Any]]]) -> list[CheckResult]:
    def n(name: str) -> int:
        return counts.get((name, export), 0)

    def rows(name: str) -> list[dict[str, Any]]:
        return evidence.get((name, export), [])

    has_history = bool(manifest.get("has_history"))
    results: dict[str, CheckResult] = {}
    for name in CHECK_NAMES:
        if name in HISTORY_CHECKS and not has_history:
            results[name] = CheckResult(name, Status.SKIPPED, 0, note="no workload history in this export")
        elif name in METADATA_CHECKS and not manifest.get("has_metadata"):
            results[name] = CheckResult(name, Status.SKIPPED, 0, note=manifest.get("metadata_note")
                                        or "no controller metadata (an export made before it was exported)")
        elif name in QUERIES:
            results[name] = CheckResult(name, Status.VIOLATION if n(name) else Status.OK, n(name), rows(name))
    if n("stat:replicas_without_hw"):
        results["replica_divergence"] = _with_note(
            results["replica_divergence"], f"{n('stat:replicas_without_hw')} replica(s) without an HW checkpoint "
            "entry commit nothing and are not compared (epoch_forks still compares their logs)")
    if has_history and n("stat:acked_below_log_start"):
        results["lost_writes"] = _with_note(
            results["lost_writes"], f"{n('stat:acked_below_log_start')} acked send(s) below every replica's log "
            "start (deleted by retention) cannot be verified")
    if has_history and n("stat:polls_below_log_start"):
        results["dirty_reads"] = _with_note(
            results["dirty_reads"], f"{n('stat:polls_below_log_start')} poll(s) below every replica's log start "
            "(deleted by retention) cannot be verified")
    if has_history and n("stat:polls") == 0:
        results["unseen_writes"] = CheckResult("unseen_writes", Status.SKIPPED, 0, note="the history has no polls")
    if has_history and n("stat:sends") == 0:  # an empty history file (the writer died before a send): noted
        results["lost_writes"] = _with_note(results["lost_writes"], "the history has no sends: no write was "
                                            "checked")
    torn_lines = int(manifest.get("history_torn_lines") or 0)
    if has_history and torn_lines:
        results["lost_writes"] = _with_note(results["lost_writes"], f"{torn_lines} torn last line(s) of the "
                                            "history skipped (the writer was killed mid-line)")
    resent = n("duplicates:resent") if has_history else 0
    if n("duplicates:idempotent") or resent:
        notes = []
        if n("duplicates:idempotent"):
            notes.append(f"{n('duplicates:idempotent')} record(s) of one idempotent producer (same producer id, "
                         "epoch and sequence) at two offsets: a retry appended twice")
        if resent:
            notes.append(f"{resent} value(s) with more idempotent copies in the committed final log than sends "
                         "in the history: resent under another producer id or epoch")
        results["duplicates"] = CheckResult("duplicates", Status.VIOLATION, n("duplicates:idempotent") + resent,
                                            rows("duplicates:idempotent") + (rows("duplicates:resent") if resent
                                                                            else []), "; ".join(notes))
    elif n("duplicates:all"):
        results["duplicates"] = CheckResult(
            "duplicates", Status.COUNTED, n("duplicates:all"), rows("duplicates:all"),
            "values at two offsets, each a separate send (other sequences, or no idempotence: retries may "
            "duplicate)")
    else:
        results["duplicates"] = CheckResult("duplicates", Status.OK, 0)
    if n("stat:torn_tails"):
        results["damaged_files"] = _with_note(results["damaged_files"], f"{n('stat:torn_tails')} torn tail(s) "
                                              "(partial last batch, truncated by recovery)")
    return [results[name] for name in CHECK_NAMES]


def run_audits(spark: SparkSession, export_dirs: list[Path], *,
               evidence_rows: int = EVIDENCE_ROWS) -> list[AuditReport]:
    """Every check over several exports at once, one report each, in two Spark jobs.

    The first job counts every query per export; the second fetches the first
    ``evidence_rows`` rows of the queries that found something. ``ValueError``
    if a directory is not an export.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if not export_dirs:
        raise ValueError("no export directory given")
    if len({_normalise(str(d)) for d in export_dirs}) != len(export_dirs):
        raise ValueError("an export directory is given twice")
    manifests = {_normalise(str(d)): schema.read_manifest(d) for d in export_dirs}
    loaded = load_tables(spark, list(export_dirs))
    # Every check scans the same tables: cache them (spilling to disk when large)
    # instead of re-reading Parquet once per query.
    t = Tables(*(df.persist(StorageLevel.MEMORY_AND_DISK) for df in
                 (loaded.records, loaded.replicas, loaded.damaged, loaded.sends, loaded.polls, loaded.assignments)))
    try:
        authoritative = authoritative_replicas(t)
        final = final_log(t, authoritative)
        c = Context(t=t, final=final, committed=committed_records(t), acked=t.sends.where(F.col("outcome") == "ok"),
                    reference=reference_log(t, final, authoritative), log_starts=partition_log_starts(t),
                    authoritative=authoritative)
        named = {name: q.query(c) for name, q in QUERIES.items()}
        named.update({f"stat:{name}": df for name, df in _stat_queries(c).items()})
        counts = _counts(named)
        found = sorted({name for (name, _), n in counts.items() if n and name in QUERIES})
        evidence = _evidence(c, found, evidence_rows)
    finally:
        for df in (t.records, t.replicas, t.damaged, t.sends, t.polls, t.assignments):
            df.unpersist()
    reports = []
    for d in export_dirs:
        key = _normalise(str(d))
        stats = {name: counts.get((f"stat:{name}", key), 0) for name in STAT_NAMES}
        reports.append(AuditReport(export_dir=str(d), checks=_export_results(key, manifests[key], counts, evidence),
                                   stats=stats))
    return reports


def run_audit(spark: SparkSession, export_dir: Path, *, evidence_rows: int = EVIDENCE_ROWS) -> AuditReport:
    """Every check over one export; ``ValueError`` if ``export_dir`` is not an export."""
    return run_audits(spark, [export_dir], evidence_rows=evidence_rows)[0]


# ---------------------------------------------------------------- output

def format_summary(report: AuditReport) -> str:
    """A readable table, then the evidence of each violation."""
    stats = textwrap.wrap(", ".join(f"{k}={v}" for k, v in report.stats.items()), width=100,
                          break_long_words=False, break_on_hyphens=False)
    lines = [f"audit of {report.export_dir}", *(f"  {line}" for line in stats), "",
             f"  {'check':<22} {'status':<10} {'count':>8}  note",
             f"  {'-' * 22} {'-' * 10} {'-' * 8}  {'-' * 4}"]
    for c in report.checks:
        lines.append(f"  {c.name:<22} {c.status.value:<10} {c.count:>8}  {c.note}".rstrip())
    for c in report.checks:
        if c.status in (Status.VIOLATION, Status.COUNTED) and c.evidence:
            lines += ["", f"{c.name} ({c.status.value}, {c.count}), first rows:"]
            lines += [f"  {json.dumps(row, sort_keys=True, default=str)}" for row in c.evidence]
    lines += ["", "RESULT: " + ("ok, no violations" if report.ok
                                else "VIOLATED: " + ", ".join(c.name for c in report.violations))]
    return "\n".join(lines)


def write_report(report: AuditReport, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
