"""Proving the audit can fail: one injected anomaly per export, reported alone.

Every scenario below is its own export directory; the module audits them all
in one Spark pass (``run_audits``) so the suite stays fast on two cores, and
each test reads its export's report (``run_audit``, the one-export path, is
covered by the CLI test).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from audit.export import export
from audit.spark_audit import (
    CHECK_NAMES,
    EVIDENCE_POSITIONS,
    AuditReport,
    Status,
    format_summary,
    run_audit,
    run_audits,
    write_report,
)
from common.wire import TopicPartition
from controller.journal import encode_frame
from storage.checkpoint import read_offsets, write_epochs, write_offsets
from storage.epoch_cache import EpochEntry
from tests.audit.datadirs import Batch, batch_positions, cluster, corrupt_byte, history, write_replica
from tests.audit.exports import BROKERS, TOPIC, Export, _crc, _row, clean_export


def flagged(report: AuditReport) -> set[str]:
    return {c.name for c in report.checks if c.status in (Status.VIOLATION, Status.COUNTED)}


def _lost_missing(e: Export) -> None:
    e.send("lost", "ok", 10, seq=20)  # acked at offset 10, but every log ends at 10


def _lost_other_value(e: Export) -> None:
    e.sends[3]["offset"] = 4  # v3 acked at offset 4, where the final log holds v4


def _with_partition(e: Export, topic: str, partition: int) -> None:
    """One more healthy partition: a copy of t-0 whose values are w0..w9 (no send or poll of its own)."""
    other = clean_export()
    for r in other.records:
        r.update(topic=topic, partition=partition, value=b"w" + r["value"][1:])
    e.records += other.records
    e.replicas += [{**r, "topic": topic, "partition": partition} for r in other.replicas]
    assert e.assignments is not None and other.assignments is not None
    e.assignments += [{**a, "topic": topic, "partition": partition} for a in other.assignments]


def _acked_to_a_sibling_partition(e: Export) -> None:
    # v3 acked at t-1 offset 3, which holds w3: the match must compare the partition (t-0 offset 3 holds v3)
    _with_partition(e, TOPIC, 1)
    e.send("v3", "ok", 3, seq=20)
    e.sends[-1]["partition"] = 1


def _acked_to_another_topic(e: Export) -> None:
    # v3 acked at u-0 offset 3, which holds w3: the match must compare the topic (t-0 offset 3 holds v3)
    _with_partition(e, "u", 0)
    e.send("v3", "ok", 3, seq=20)
    e.sends[-1]["topic"] = "u"


def _lost_at_the_start_of_an_emptied_log(e: Export) -> None:
    """Every replica's log was emptied by retention, leaving log start = LEO = 10. An ack at offset 10 sits
    exactly at the log start, not under it: a lost write, not one excused as deleted (the acks at 0-9 are)."""
    e.records = []
    for r in e.replicas:
        r.update(log_start_offset=10, records=0, batches=0)
    e.send("lost", "ok", 10, seq=20)


def _inconsistent_read(e: Export) -> None:
    e.poll("c1", 0, 2, "v5")  # offset 2 read as v5 (a value the log holds, at offset 5): a dirty read too


def _inconsistent_replica(e: Export) -> None:
    e.record(2, 2)["value"] = b"v5"  # broker 2's committed copy of offset 2 holds v5 (same batch crc: synthetic)


def _divergence(e: Export) -> None:
    for o in (6, 7):  # broker 2's copy of batch 6-7 has another crc, same values (and epoch: a fork too)
        e.record(2, o)["batch_crc"] = 12345


def _divergence_other_epoch(e: Export) -> None:
    for o in (8, 9):  # broker 2's committed copy of batch 8-9 was written by another leader, in epoch 2
        e.record(2, o)["batch_crc"], e.record(2, o)["leader_epoch"] = 12345, 2


def _divergence_in_epoch_only(e: Export) -> None:
    # The batch CRC covers neither leader epoch nor base offset: broker 2's committed batch 8-9 has the
    # others' CRC but epoch 2 (appended by another leader). Only the compared epoch tells the copies apart.
    for o in (8, 9):
        e.record(2, o)["leader_epoch"] = 2


def _divergence_in_base_only(e: Export) -> None:
    # Broker 2 holds offset 9 in a batch of its own (base 9), same CRC and epoch as the others' batch 8-9:
    # only the compared base offset tells it, both among committed copies and within epoch 1.
    e.record(2, 9)["batch_base_offset"] = 9


def _duplicate(e: Export) -> None:
    for b in BROKERS:  # v8 written at offsets 8 and 9; v9's send was indeterminate
        e.record(b, 9)["value"] = b"v8"
    e.sends[9]["outcome"], e.sends[9]["offset"], e.sends[9]["partition"] = "info", None, None
    for p in e.polls:
        if p["offset"] == 9:
            p["value"] = b"v8"


def _gap(e: Export) -> None:
    e.records.remove(e.record(2, 5))


def _log_begins_above_log_start(e: Export) -> None:
    # Offsets 0-1 vanished from broker 2 while its log start still says 0 (cache entries moved along, so
    # only the hole shows): a gap ahead of the first record, between no two neighbouring records.
    e.records = [r for r in e.records if not (r["broker"] == 2 and r["offset"] < 2)]
    e.replica(2)["epoch_cache"] = [{"epoch": 0, "start_offset": 2}, {"epoch": 1, "start_offset": 4}]


def _repeat(e: Export) -> None:
    e.records.append(dict(e.record(2, 5)))


def _batches_out_of_file_order(e: Export) -> None:
    # Swapped file positions on broker 2: 6-7 sits after 8-9. Sorted by offset the log looks whole; read in
    # file order it jumps 5 -> 8, then falls 9 -> 6 (backwards, though no offset occurs twice).
    for o in (6, 7):
        e.record(2, o)["position"] = 900
    for o in (8, 9):
        e.record(2, o)["position"] = 600


def _epoch_regression(e: Export) -> None:
    for b in BROKERS:
        for o in (8, 9):
            e.record(b, o)["leader_epoch"] = 0


def _hw_above_leo(e: Export) -> None:
    e.replica(1)["high_watermark"] = 12


def _hw_at_leo_plus_one(e: Export) -> None:
    e.replica(1)["high_watermark"] = 11  # the smallest excess: HW = LEO + 1


def _non_monotonic(e: Export) -> None:
    e.poll("c0", 10, 6, "v6")  # c0 read 0..9 and then 6 again


def _same_offset_polled_twice(e: Export) -> None:
    e.poll("c0", 10, 9, "v9")  # c0's last poll repeats offset 9: equal to the one before, not lower


def _skipped(e: Export) -> None:
    e.polls = [p for p in e.polls if not (p["process"] == "c0" and p["offset"] == 4)]


def _dirty(e: Export) -> None:
    e.poll("c0", 10, 10, "phantom")  # read at offset 10, a value no log holds


def _unseen(e: Export) -> None:
    e.add_log_record(10, b"v10")
    e.send("v10", "ok", 10, seq=20)  # acked and in the log, but nobody read offset 10


def _damaged(e: Export) -> None:
    e.damaged.append({"broker": 2, "topic": "t", "partition": 0, "file": "t-0/00000000000000000000.log",
                      "position": 400, "kind": "corrupt_batch", "error": "crc mismatch"})


def _bad_records(e: Export) -> None:
    # a batch whose CRC holds but whose records do not decode: damage like a corrupt batch, not a torn tail
    _damaged(e)
    e.damaged[-1].update(kind="bad_records", error="record timestamp beyond int64")


def _no_history(e: Export) -> None:
    e.sends, e.polls, e.has_history = [], [], False


def _idempotent(e: Export, producer_id: int = 7) -> None:
    """Every record written by one idempotent producer: producer epoch 0, sequence = offset."""
    for r in e.records:
        r["producer_id"], r["producer_epoch"], r["sequence"] = producer_id, 0, r["offset"]


def _v8_appended_again(e: Export, producer_id: int, producer_epoch: int, sequence: int, *, writer: int = 7) -> None:
    """v8 (sent once, by idempotent producer ``writer``, sequence 8) appended again at offset 10 with this stamp."""
    _idempotent(e, writer)
    e.add_log_record(10, b"v8")
    for b in BROKERS:
        e.record(b, 10).update(producer_id=producer_id, producer_epoch=producer_epoch, sequence=sequence)
    e.poll("final", 10, 10, "v8")


def _idempotent_duplicate(e: Export) -> None:
    """A retry of the batch of v8 (producer 7, epoch 0, sequence 8) appended again, at offset 10."""
    _v8_appended_again(e, 7, 0, 8)


def _producer_id_0_duplicate(e: Export) -> None:
    # that retry again, from producer 0: ids are handed out from 0, so 0 is idempotent (only -1 is not)
    _v8_appended_again(e, 0, 0, 8, writer=0)


def _idempotent_tombstone_duplicate(e: Export) -> None:
    """A retry of a null-value record (a tombstone: producer 7, sequence 8) appended again, at offset 10."""
    _no_history(e)
    _idempotent(e)
    e.add_log_record(10, b"")
    for b in BROKERS:
        e.record(b, 8)["value"] = None
        e.record(b, 10).update(value=None, producer_id=7, producer_epoch=0, sequence=8)


def _idempotent_equal_values(e: Export) -> None:
    """One idempotent producer sent the same (empty) value ten times, each its own send and sequence: the
    three empty lines typed into ``minibroker produce``, or ``perf produce``'s identical payloads."""
    _idempotent(e)
    for row in [*e.records, *e.polls, *(s for s in e.sends if s["outcome"] == "ok")]:
        row["value"] = b""


def _equal_values_at(e: Export, n: int, *, retried: bool) -> None:
    """One idempotent producer's value ``x`` at offsets 0..n-1 of every replica (no history): each its own
    sequence, or (``retried``) all of them sequence 0."""
    _no_history(e)
    e.records = [{**_row(b, o, o, o, 1, b"x", pid=7), **({"sequence": 0} if retried else {})}
                 for b in BROKERS for o in range(n)]
    for r in e.replicas:
        r.update(high_watermark=n, log_end_offset=n, recovery_point=n, records=n, batches=n,
                 epoch_cache=[{"epoch": 1, "start_offset": 0}])


def _failed_value_many_times(e: Export) -> None:
    for o in range(10, 40):  # the value of the failed send "refused" at 30 offsets
        e.add_log_record(o, b"refused")
        e.poll("final", o, o, "refused")


def _torn_tail(e: Export) -> None:
    e.damaged.append({"broker": 1, "topic": "t", "partition": 0, "file": "t-0/00000000000000000000.log",
                      "position": 500, "kind": "torn_tail", "error": "partial batch"})


def _deposed_leader_tail(e: Export) -> None:
    # Broker 2 led epoch 1 and wrote offset 10 that was never committed; brokers 0 and 1 moved to
    # epoch 2 and committed v10 at offset 10. Broker 2 was not restarted yet, so it still holds the orphan.
    e.add_log_record(10, b"v10", epoch=2)
    e.records = [r for r in e.records if not (r["broker"] == 2 and r["offset"] == 10)]
    e.records.append({**e.record(2, 9), "offset": 10, "batch_base_offset": 10, "batch_last_offset": 10,
                      "value": b"orphan", "position": 1000})
    e.replica(2)["high_watermark"] = 10
    for b in (0, 1):
        e.replica(b)["latest_epoch"] = 2
    e.send("v10", "ok", 10, seq=20)
    e.send("orphan", "info", None, seq=21)
    e.poll("final", 10, 10, "v10")


def _same_epoch_fork(e: Export) -> None:
    # broker 2 holds other batches at 8-9 in epoch 1, above its own HW 8: a second writer in epoch 1
    for o in (8, 9):
        r = e.record(2, o)
        r["value"] = f"z{o}".encode()
        r["batch_crc"] = _crc(b"z8", b"z9")
    e.replica(2)["high_watermark"] = 8


def _poll_of_a_vanished_offset(e: Export) -> None:
    e.poll("c0", 10, 10, "v5")  # read at offset 10, which no log holds; v5 is at offset 5


def _acked_key_differs(e: Export) -> None:
    e.sends[3]["key"] = b"sent-key"  # the log holds v3 at offset 3 with a null key


def _replica_key_differs(e: Export) -> None:
    e.record(2, 3)["key"] = b"other"  # same batch crc (synthetic): only the key tells


def _failed_write_present(e: Export) -> None:
    e.add_log_record(10, b"refused")  # the client was told "refused" definitely failed
    e.poll("final", 10, 10, "refused")


def _failed_keyed_write_present(e: Export) -> None:
    # the refused send carried key kf; offset 10 holds that value under that very key: a keyed match
    e.sends[10]["key"] = b"kf"
    _failed_write_present(e)
    for b in BROKERS:
        e.record(b, 10)["key"] = b"kf"


def _failed_write_on_the_leaders_longer_log(e: Export) -> None:
    # Only the leader, broker 2, has offset 10 (the refused value) yet; brokers 0-1 lag one record behind.
    # Same latest epoch everywhere, so the longer log wins the tie and is the one checked for the value.
    e.records.append(_row(2, 10, 10, 10, 1, b"refused", pid=-1))
    e.replica(2).update(log_end_offset=11, recovery_point=11, records=11, batches=6)


def _missing_replica(e: Export) -> None:
    e.records = [r for r in e.records if r["broker"] != 2]
    e.replicas = [r for r in e.replicas if r["broker"] != 2]


def _missing_replica_outside_isr(e: Export) -> None:
    # the ISR shrank to [0, 1], yet broker 2 stays in the assignment, so its absent replica still counts
    _missing_replica(e)
    assert e.assignments is not None
    e.assignments[0]["isr"] = [0, 1]


def _retention(e: Export) -> None:
    """Retention deleted offsets 0-3 on every replica: those sends and polls cannot be verified."""
    e.records = [r for r in e.records if r["offset"] >= 4]
    for r in e.replicas:
        r["log_start_offset"], r["records"], r["batches"] = 4, 6, 3


def _retention_behind_one_replica(e: Export) -> None:
    """The final replica (0) deleted offsets 0-3, replicas 1 and 2 still hold them."""
    e.records = [r for r in e.records if r["broker"] != 0 or r["offset"] >= 4]
    e.replica(0)["log_start_offset"] = 4


def _retention_lost(e: Export) -> None:
    _retention_behind_one_replica(e)
    e.sends[1]["value"] = b"ghost"  # acked at offset 1, which replicas 1 and 2 still hold as v1


def _no_metadata(e: Export) -> None:
    e.assignments = None


def _resent_under_a_new_producer_id(e: Export) -> None:
    """v8, sent once (by idempotent producer 7, sequence 8), appended again at offset 10 by producer 8: a
    resend under a new producer id, which no (producer id, epoch, sequence) pair shows (invariant 6)."""
    _v8_appended_again(e, 8, 0, 0)


def _resent_under_a_new_epoch_uncommitted(e: Export) -> None:
    """The same resend (producer 7, epoch 1), but above every replica's HW: not committed, not checked."""
    _resent_under_a_new_producer_id(e)
    for b in BROKERS:
        e.record(b, 10).update(producer_id=7, producer_epoch=1)
        e.replica(b)["high_watermark"] = 10
    e.polls = [p for p in e.polls if p["offset"] != 10]


def _copy_of_an_earlier_run(e: Export) -> None:
    """v8 of an earlier run into the same topic (another producer, stamped before this history's first send
    of v8): not this history's copy."""
    _resent_under_a_new_producer_id(e)
    for b in BROKERS:
        e.record(b, 10)["timestamp"] = 1_000 + 8 - 1_001  # before v8's send started (1_008), beyond the slack


def _epoch_cache_wrong(e: Export) -> None:
    """Broker 2's cache says epoch 1 starts at 8; its log (like every replica's) has epoch 1 from offset 4."""
    e.replica(2)["epoch_cache"] = [{"epoch": 0, "start_offset": 0}, {"epoch": 1, "start_offset": 8}]


def _epoch_cache_entry_too_early(e: Export) -> None:
    # broker 2's cache starts epoch 1 at 2, before the log's first epoch-1 offset 4 (early, not late)
    e.replica(2)["epoch_cache"] = [{"epoch": 0, "start_offset": 0}, {"epoch": 1, "start_offset": 2}]


def _epoch_cache_wrong_at_log_start(e: Export) -> None:
    # Broker 2 kept offsets 2-9 only (log start 2). Its single cache entry sits right on that log start,
    # claiming epoch 1 from 2, but 2-3 are epoch-0 records: entries equal to the log start are checked too.
    e.records = [r for r in e.records if not (r["broker"] == 2 and r["offset"] < 2)]
    e.replica(2).update(log_start_offset=2, epoch_cache=[{"epoch": 1, "start_offset": 2}])


def _epoch_cache_edges(e: Export) -> None:
    """What the cache legitimately says that the log cannot show: retention deleted offsets 0-1 (the entry of
    epoch 0 below log start 2), a leader's assignment of epoch 2 at its LEO with no batch yet, and an
    epoch-0 entry the broker clamped to its log start."""
    e.records = [r for r in e.records if r["offset"] >= 2]
    for r in e.replicas:
        r.update(log_start_offset=2, records=8, batches=4)
        r["epoch_cache"] = [{"epoch": 0, "start_offset": 0}, {"epoch": 1, "start_offset": 4},
                            {"epoch": 2, "start_offset": 10}]
    e.replica(1)["epoch_cache"][0]["start_offset"] = 2  # truncate_from_start's clamped entry


def _plain_resend(e: Export) -> None:
    """A non-idempotent producer's v8 sent once and appended twice (a retry): counted, not a violation."""
    e.add_log_record(10, b"v8")
    e.poll("final", 10, 10, "v8")


ANOMALIES: dict[str, tuple[Callable[[Export], None], str]] = {
    "lost_missing": (_lost_missing, "lost_writes"),
    "lost_other_value": (_lost_other_value, "lost_writes"),
    "inconsistent_offsets": (_inconsistent_replica, "inconsistent_offsets"),
    "replica_divergence": (_divergence_other_epoch, "replica_divergence"),
    "idempotent_duplicates": (_idempotent_duplicate, "duplicates"),
    "idempotent_tombstone_duplicates": (_idempotent_tombstone_duplicate, "duplicates"),
    "offset_gaps": (_gap, "offset_gaps"),
    "offset_repeats": (_repeat, "offset_repeats"),
    "epoch_regressions": (_epoch_regression, "epoch_regressions"),
    "hw_above_leo": (_hw_above_leo, "hw_above_leo"),
    "non_monotonic_polls": (_non_monotonic, "non_monotonic_polls"),
    "skipped_polls": (_skipped, "skipped_polls"),
    "dirty_reads": (_dirty, "dirty_reads"),
    "unseen_writes": (_unseen, "unseen_writes"),
    "damaged_files": (_damaged, "damaged_files"),
    "epoch_forks": (_same_epoch_fork, "epoch_forks"),
    "dirty_read_of_a_vanished_offset": (_poll_of_a_vanished_offset, "dirty_reads"),
    "lost_write_key": (_acked_key_differs, "lost_writes"),
    "inconsistent_key": (_replica_key_differs, "inconsistent_offsets"),
    "failed_writes_present": (_failed_write_present, "failed_writes_present"),
    "missing_replicas": (_missing_replica, "missing_replicas"),
    "lost_below_final_log_start": (_retention_lost, "lost_writes"),
    "resent_under_a_new_producer_id": (_resent_under_a_new_producer_id, "duplicates"),
    "epoch_cache_mismatch": (_epoch_cache_wrong, "epoch_cache_mismatch"),
    "lost_in_partition_1": (_acked_to_a_sibling_partition, "lost_writes"),
    "lost_in_topic_u": (_acked_to_another_topic, "lost_writes"),
    "lost_at_the_start_of_an_emptied_log": (_lost_at_the_start_of_an_emptied_log, "lost_writes"),
    "divergence_in_epoch_only": (_divergence_in_epoch_only, "replica_divergence"),
    "producer_id_0_duplicates": (_producer_id_0_duplicate, "duplicates"),
    "log_begins_above_log_start": (_log_begins_above_log_start, "offset_gaps"),
    "hw_at_leo_plus_one": (_hw_at_leo_plus_one, "hw_above_leo"),
    "epoch_cache_entry_too_early": (_epoch_cache_entry_too_early, "epoch_cache_mismatch"),
    "epoch_cache_wrong_at_log_start": (_epoch_cache_wrong_at_log_start, "epoch_cache_mismatch"),
    "same_offset_polled_twice": (_same_offset_polled_twice, "non_monotonic_polls"),
    "missing_replica_outside_isr": (_missing_replica_outside_isr, "missing_replicas"),
    "failed_keyed_write_present": (_failed_keyed_write_present, "failed_writes_present"),
    "failed_write_only_on_the_leader": (_failed_write_on_the_leaders_longer_log, "failed_writes_present"),
    "damaged_bad_records": (_bad_records, "damaged_files"),
}
CLEAN: dict[str, Callable[[Export], None]] = {
    "clean": lambda e: None,
    "no_history": _no_history,
    "plain_duplicates": _duplicate,
    "idempotent_equal_values": _idempotent_equal_values,
    "many_equal_values": lambda e: _equal_values_at(e, 3000, retried=False),
    "torn_tail": _torn_tail,
    "deposed_leader_tail": _deposed_leader_tail,
    "retention": _retention,
    "retention_behind_one_replica": _retention_behind_one_replica,
    "no_metadata": _no_metadata,
    "resent_uncommitted": _resent_under_a_new_epoch_uncommitted,
    "resent_by_an_earlier_run": _copy_of_an_earlier_run,
    "plain_resend": _plain_resend,
    "epoch_cache_edges": _epoch_cache_edges,
}
OTHER: dict[str, Callable[[Export], None]] = {
    "inconsistent_read": _inconsistent_read,
    "divergence_same_epoch": _divergence,
    "many_retries": lambda e: _equal_values_at(e, 3000, retried=True),
    "failed_value_many_times": _failed_value_many_times,
    "divergence_in_base_only": _divergence_in_base_only,
    "batches_out_of_file_order": _batches_out_of_file_order,
}
GLOB_DIR = "run[1]{a,b}*?\\x"  # Hadoop glob characters in an export's path


def _real_file_exports(root: Path) -> dict[str, Path]:
    """Exports of broker data dirs written with storage's encoders (and a controller journal written by
    ``controller.journal``): clean, and with one fault each."""
    out = {}
    for name in ("files_clean", "files_crc", "files_retention", "files_no_hw_divergent", "files_missing_replica",
                 "files_bad_metadata", "files_two_histories", "files_final_emptied_by_retention",
                 "files_hw_checkpoint_deleted", "files_empty_history"):
        c = cluster(root / f"{name}-cluster", metadata=name != "files_crc")
        hist = history(root / f"{name}-history.jsonl")
        if name == "files_crc":
            seg0 = c / "broker-1" / "t-0" / "00000000000000000000.log"
            corrupt_byte(seg0, batch_positions(seg0)[1] + 70)
        elif name == "files_retention":  # segment 0 (offsets 0-2) deleted everywhere; checkpoints still say 0
            for b in range(3):
                (c / f"broker-{b}" / "t-0" / "00000000000000000000.log").unlink()
        elif name == "files_no_hw_divergent":  # broker 2: another log in the same epochs, no HW entry
            shutil.rmtree(c / "broker-2")
            other = [[Batch(0, ["X0", "X1"]), Batch(0, ["X2"])], [Batch(1, ["X3", "X4"]), Batch(1, ["X5"])]]
            write_replica(c / "broker-2", 2, other, hw=6)
            cp = c / "broker-2" / "replication-offset-checkpoint"
            write_offsets(cp, {tp: o for tp, o in read_offsets(cp).items() if tp != TopicPartition("t", 0)})
        elif name == "files_missing_replica":
            shutil.rmtree(c / "broker-2" / "t-0")
        elif name == "files_bad_metadata":
            journal = c / "controller" / "metadata.journal"  # a flipped byte in frame 1, a whole frame after
            corrupt_byte(journal, 12)
            journal.write_bytes(journal.read_bytes() + encode_frame({"offset": 2, "records": []}))
        elif name == "files_final_emptied_by_retention":
            # retention on broker 0 only (the final replica: lowest id) deleted every segment, the active one
            # too, as Log.delete_old_segments does: one empty segment at the LEO, log start = LEO = 6
            pdir = c / "broker-0" / "t-0"
            for seg in pdir.glob("*.log"):
                seg.unlink()
            (pdir / f"{6:020d}.log").write_bytes(b"")
            write_epochs(pdir / "leader-epoch-checkpoint", [EpochEntry(1, 6)])
            cp = c / "broker-0" / "log-start-offset-checkpoint"
            write_offsets(cp, {**read_offsets(cp), TopicPartition("t", 0): 6})
        elif name == "files_hw_checkpoint_deleted":
            (c / "broker-2" / "replication-offset-checkpoint").unlink()
        elif name == "files_empty_history":  # the writer died before its first line was whole
            hist.write_text('{"type": "send", "process": "p0"')
        elif name == "files_two_histories":  # a second run's history names its clients p0 and c0 again
            hist = root / f"{name}-histories"
            hist.mkdir()
            history(hist / "history.jsonl")
            history(hist / "history-rerun.jsonl")
        out[name] = root / name
        export([c], out[name], history=hist)
    # one idempotent producer (id 7) writing x at sequences 0-5 of partitions t-0 and t-1
    same = [[Batch(0, ["x", "x"]), Batch(0, ["x"])], [Batch(1, ["x", "x"]), Batch(1, ["x"])]]
    # a retry of the batch of v3-v4 (sequences 3-4) appended again at offsets 5-6
    retried = [[Batch(0, ["v0", "v1"]), Batch(0, ["v2"])], [Batch(1, ["v3", "v4"]), Batch(1, ["v3", "v4"], sequence=3)]]
    for name, partitions, segments in (("files_idempotent_equal_values", (0, 1), same),
                                       ("files_idempotent_retry", (0,), retried)):
        c = root / f"{name}-cluster"
        records = sum(len(batch.values) for seg in segments for batch in seg)
        for b in BROKERS:
            for p in partitions:
                write_replica(c / f"broker-{b}", b, segments, hw=records, partition=p, producer_id=7)
        out[name] = root / name
        export([c], out[name])
    return out


@pytest.fixture(scope="module")
def reports(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, AuditReport]:
    root = tmp_path_factory.mktemp("exports")
    dirs: dict[str, Path] = {}
    for name, inject in {**{k: v[0] for k, v in ANOMALIES.items()}, **CLEAN, **OTHER}.items():
        e = clean_export()
        inject(e)
        dirs[name] = e.write(root / name)
    glob_case = clean_export()
    _lost_missing(glob_case)
    dirs["glob_path"] = glob_case.write(root / GLOB_DIR / "export")
    dirs.update(_real_file_exports(root))
    return dict(zip(dirs, run_audits(spark, list(dirs.values())), strict=True))


def test_clean_export_reports_nothing(reports: dict[str, AuditReport]) -> None:
    report = reports["clean"]
    assert report.ok
    assert [c.name for c in report.checks] == list(CHECK_NAMES)
    assert all(c.status is Status.OK for c in report.checks), format_summary(report)
    assert report.stats["acked"] == 10
    assert report.stats["failed"] == 1
    assert report.stats["indeterminate"] == 1
    assert report.stats["final_log_records"] == 10
    assert report.stats["record_rows"] == 30
    assert report.stats["partitions"] == 1
    assert "RESULT: ok" in format_summary(report)


def test_clean_export_without_history_skips_history_checks(reports: dict[str, AuditReport]) -> None:
    report = reports["no_history"]
    assert report.ok
    skipped = {c.name for c in report.checks if c.status is Status.SKIPPED}
    assert skipped == {"lost_writes", "non_monotonic_polls", "skipped_polls", "dirty_reads", "unseen_writes",
                       "failed_writes_present"}
    assert flagged(report) == set()


@pytest.mark.parametrize("case", sorted(ANOMALIES))
def test_one_anomaly_is_reported_alone(reports: dict[str, AuditReport], case: str) -> None:
    check = ANOMALIES[case][1]
    report = reports[case]
    assert flagged(report) == {check}, format_summary(report)
    result = report.check(check)
    assert result.status is Status.VIOLATION
    assert result.count >= 1
    assert result.evidence
    assert not report.ok
    assert f"VIOLATED: {check}" in format_summary(report)


def test_lost_write_evidence_names_the_value_found(reports: dict[str, AuditReport]) -> None:
    result = reports["lost_other_value"].check("lost_writes")
    assert result.count == 1
    assert result.evidence[0]["value"] == "v3"
    assert result.evidence[0]["offset"] == 4
    assert result.evidence[0]["found_value"] == "v4"
    missing = reports["lost_missing"].check("lost_writes")
    assert missing.evidence[0]["value"] == "lost"
    assert missing.evidence[0].get("found_value") is None


def test_divergence_evidence_shows_both_copies(reports: dict[str, AuditReport]) -> None:
    result = reports["replica_divergence"].check("replica_divergence")
    assert result.count == 2  # offsets 8 and 9
    assert [row["offset"] for row in result.evidence] == [8, 9]
    assert {(c["leader_epoch"], c["batch_crc"]) for c in result.evidence[0]["copies"]} >= {(2, 12345)}
    same_epoch = reports["divergence_same_epoch"]  # committed and in one epoch: two writers in epoch 1 too
    assert flagged(same_epoch) == {"replica_divergence", "epoch_forks"}, format_summary(same_epoch)
    result = same_epoch.check("replica_divergence")
    assert [row["offset"] for row in result.evidence] == [6, 7]
    crcs = {copy["batch_crc"] for copy in result.evidence[0]["copies"]}
    assert 12345 in crcs and len(crcs) == 2


def test_copies_that_differ_outside_the_crc_diverge(reports: dict[str, AuditReport]) -> None:
    """The batch CRC covers neither the leader epoch nor the base offset: copies equal but there differ."""
    epoch_only = reports["divergence_in_epoch_only"].check("replica_divergence")
    assert [row["offset"] for row in epoch_only.evidence] == [8, 9]
    assert {copy["leader_epoch"] for copy in epoch_only.evidence[0]["copies"]} == {1, 2}
    report = reports["divergence_in_base_only"]  # one epoch too: a fork as well
    assert flagged(report) == {"replica_divergence", "epoch_forks"}, format_summary(report)
    assert {c.status for c in report.violations} == {Status.VIOLATION} and len(report.violations) == 2
    assert [row["offset"] for row in report.check("replica_divergence").evidence] == [9]
    fork = report.check("epoch_forks").evidence[0]
    assert (fork["offset"], fork["leader_epoch"], fork["variants"]) == (9, 1, 2)


def test_batches_out_of_file_order_skip_and_go_back(reports: dict[str, AuditReport]) -> None:
    """A log is checked in file order (segment, position), not in offset order."""
    report = reports["batches_out_of_file_order"]
    assert flagged(report) == {"offset_gaps", "offset_repeats"}, format_summary(report)
    assert {c.name for c in report.violations} == {"offset_gaps", "offset_repeats"}
    gap = report.check("offset_gaps").evidence[0]
    assert (gap["broker"], gap["prev_offset"], gap["offset"]) == (2, 5, 8)
    back = report.check("offset_repeats").evidence[0]
    assert (back["broker"], back["prev_offset"], back["offset"]) == (2, 9, 6)


def test_structure_evidence(reports: dict[str, AuditReport]) -> None:
    gap = reports["offset_gaps"].check("offset_gaps")
    assert (gap.count, gap.evidence[0]["broker"], gap.evidence[0]["prev_offset"], gap.evidence[0]["offset"]) \
        == (1, 2, 4, 6)
    assert reports["offset_repeats"].check("offset_repeats").evidence[0]["offset"] == 5
    assert reports["epoch_regressions"].check("epoch_regressions").count == 3  # once per replica
    assert reports["hw_above_leo"].check("hw_above_leo").evidence[0]["high_watermark"] == 12
    assert reports["hw_at_leo_plus_one"].check("hw_above_leo").evidence[0]["high_watermark"] == 11
    first = reports["log_begins_above_log_start"].check("offset_gaps").evidence[0]  # against the log start
    assert (first["broker"], first["prev_offset"], first["offset"], first["segment"]) == (2, -1, 2, "(log start)")


def test_read_evidence(reports: dict[str, AuditReport]) -> None:
    nm = reports["non_monotonic_polls"].check("non_monotonic_polls").evidence[0]
    assert (nm["process"], nm["prev_offset"], nm["offset"]) == ("c0", 9, 6)
    sk = reports["skipped_polls"].check("skipped_polls").evidence[0]
    assert (sk["process"], sk["prev_offset"], sk["offset"]) == ("c0", 3, 5)
    assert reports["dirty_reads"].check("dirty_reads").evidence[0]["value"] == "phantom"
    assert reports["unseen_writes"].check("unseen_writes").evidence[0]["value"] == "v10"
    inc = reports["inconsistent_offsets"].check("inconsistent_offsets").evidence[0]
    assert inc["offset"] == 2 and inc["distinct_values"] == ["v2", "v5"]


def test_duplicates_are_a_violation_with_an_idempotent_producer(reports: dict[str, AuditReport]) -> None:
    """One record of an idempotent producer, (producer id, epoch, sequence), at two offsets: a retry
    appended twice (invariant 6)."""
    result = reports["idempotent_duplicates"].check("duplicates")
    assert (result.status, result.count) == (Status.VIOLATION, 1)
    row = result.evidence[0]
    assert (row["value"], row["producer_id"], row["producer_epoch"], row["sequence"], row["copies"]) \
        == ("v8", 7, 0, 8, 2)
    assert [p["offset"] for p in row["positions"]] == [8, 10]
    tombstone = reports["idempotent_tombstone_duplicates"].check("duplicates")  # a null value is a record too
    assert (tombstone.status, tombstone.count, tombstone.evidence[0]["sequence"]) == (Status.VIOLATION, 1, 8)
    assert [p["offset"] for p in tombstone.evidence[0]["positions"]] == [8, 10]


def test_a_retried_batch_in_real_files_is_a_violation(reports: dict[str, AuditReport]) -> None:
    """Sequences as the export derives them (base sequence + offset delta) from batches storage wrote."""
    report = reports["files_idempotent_retry"]
    assert flagged(report) == {"duplicates"}, format_summary(report)
    result = report.check("duplicates")
    assert (result.status, result.count) == (Status.VIOLATION, 2)  # sequences 3 and 4
    assert [(r["partition"], r["sequence"], r["value"], [p["offset"] for p in r["positions"]])
            for r in result.evidence] == [(0, 3, "v3", [3, 5]), (0, 4, "v4", [4, 6])]


def test_equal_values_of_one_idempotent_producer_are_only_counted(reports: dict[str, AuditReport]) -> None:
    """Equal values at other sequences are other sends (``minibroker produce`` given three empty lines,
    ``perf produce``'s identical payloads): counted, never a violation; nor the same sequences in two
    partitions (sequences count per partition)."""
    for name, copies in (("idempotent_equal_values", 10), ("files_idempotent_equal_values", 12)):
        report = reports[name]
        assert report.ok and flagged(report) == {"duplicates"}, format_summary(report)
        result = report.check("duplicates")
        assert (result.status, result.count, result.evidence[0]["copies"]) == (Status.COUNTED, 1, copies)
        assert "RESULT: ok" in format_summary(report)
    positions = reports["files_idempotent_equal_values"].check("duplicates").evidence[0]["positions"]
    assert {(p["partition"], p["sequence"]) for p in positions} >= {(0, 0), (1, 0)}


@pytest.mark.parametrize(("case", "status"), [("many_equal_values", Status.COUNTED),
                                              ("many_retries", Status.VIOLATION)])
def test_evidence_of_thousands_of_copies_is_bounded(reports: dict[str, AuditReport], tmp_path: Path,
                                                    case: str, status: Status) -> None:
    report = reports[case]
    result = report.check("duplicates")
    assert (result.status, result.count) == (status, 1)
    assert result.evidence[0]["copies"] == 3000
    assert len(result.evidence[0]["positions"]) == EVIDENCE_POSITIONS
    assert [p["offset"] for p in result.evidence[0]["positions"]] == list(range(EVIDENCE_POSITIONS))
    assert len(format_summary(report)) < 4_000
    write_report(report, tmp_path / "report.json")
    assert (tmp_path / "report.json").stat().st_size < 8_000


def test_failed_write_evidence_is_bounded(reports: dict[str, AuditReport]) -> None:
    report = reports["failed_value_many_times"]
    assert flagged(report) == {"failed_writes_present", "duplicates"}, format_summary(report)
    row = report.check("failed_writes_present").evidence[0]
    assert (row["value"], row["copies"], len(row["found_at"])) == ("refused", 30, EVIDENCE_POSITIONS)


def test_duplicates_are_only_counted_without_idempotence(reports: dict[str, AuditReport]) -> None:
    report = reports["plain_duplicates"]
    assert flagged(report) == {"duplicates"}
    assert report.check("duplicates").status is Status.COUNTED
    assert report.check("duplicates").count == 1
    assert report.ok


def test_torn_tail_is_counted_not_a_violation(reports: dict[str, AuditReport]) -> None:
    report = reports["torn_tail"]
    assert report.ok
    assert report.stats["torn_tails"] == 1
    assert "1 torn tail" in report.check("damaged_files").note


def test_uncommitted_tail_of_a_deposed_leader_is_not_a_violation(reports: dict[str, AuditReport]) -> None:
    report = reports["deposed_leader_tail"]
    assert report.ok, format_summary(report)
    assert report.stats["final_log_records"] == 11


def test_exports_of_real_files_audit_as_expected(reports: dict[str, AuditReport]) -> None:
    """Clean files audit clean; a corrupted batch is damage (and a gap in that replica's log)."""
    clean = reports["files_clean"]
    assert clean.ok, format_summary(clean)
    assert clean.stats["acked"] == 6 and clean.stats["final_log_records"] == 6 and clean.stats["record_rows"] == 18
    assert flagged(reports["files_crc"]) == {"damaged_files", "offset_gaps"}, format_summary(reports["files_crc"])


def test_json_report(reports: dict[str, AuditReport], tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_report(reports["dirty_reads"], path)
    body = json.loads(path.read_text())
    assert body["ok"] is False
    assert body["violations"] == ["dirty_reads"]
    assert body["stats"]["polls"] == 21
    dirty = next(c for c in body["checks"] if c["name"] == "dirty_reads")
    assert dirty["evidence"][0]["value"] == "phantom"
    assert {c["status"] for c in body["checks"]} == {"ok", "violation"}


def test_not_an_export_is_a_clear_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an export directory"):
        run_audit(spark, tmp_path)
    e = clean_export().write(tmp_path / "x")
    (e / "polls.parquet").unlink()
    with pytest.raises(ValueError, match=r"polls\.parquet is missing"):
        run_audit(spark, e)


def test_a_read_of_another_offsets_value_is_inconsistent_and_dirty(reports: dict[str, AuditReport]) -> None:
    report = reports["inconsistent_read"]
    assert flagged(report) == {"inconsistent_offsets", "dirty_reads"}, format_summary(report)
    dirty = report.check("dirty_reads").evidence[0]
    assert (dirty["process"], dirty["offset"], dirty["value"], dirty["found_value"]) == ("c1", 2, "v5", "v2")


def test_same_epoch_fork_above_the_hw(reports: dict[str, AuditReport]) -> None:
    result = reports["epoch_forks"].check("epoch_forks")
    assert result.count == 2  # offsets 8 and 9, both in epoch 1
    row = result.evidence[0]
    assert (row["offset"], row["leader_epoch"], row["variants"]) == (8, 1, 2)
    assert [copy["broker"] for copy in row["copies"]] == [0, 1, 2]


def test_a_replica_without_hw_entry_is_counted_and_its_forked_log_caught(reports: dict[str, AuditReport]) -> None:
    report = reports["files_no_hw_divergent"]
    assert flagged(report) == {"epoch_forks"}, format_summary(report)
    assert report.check("epoch_forks").count == 6
    assert report.stats["replicas_without_hw"] == 1
    assert report.check("replica_divergence").status is Status.OK
    assert "1 replica(s) without an HW checkpoint entry" in report.check("replica_divergence").note
    assert reports["clean"].stats["replicas_without_hw"] == 0
    assert reports["clean"].check("replica_divergence").note == ""


def test_reads_and_writes_are_matched_by_offset_and_key(reports: dict[str, AuditReport]) -> None:
    dirty = reports["dirty_read_of_a_vanished_offset"].check("dirty_reads")
    assert (dirty.count, dirty.evidence[0]["offset"], dirty.evidence[0]["value"]) == (1, 10, "v5")
    lost = reports["lost_write_key"].check("lost_writes")
    assert lost.count == 1
    assert (lost.evidence[0]["key"], lost.evidence[0]["found_value"], lost.evidence[0].get("found_key")) \
        == ("sent-key", "v3", None)
    inc = reports["inconsistent_key"].check("inconsistent_offsets").evidence[0]
    assert (inc["offset"], inc["values"], inc["keys"], inc["distinct_keys"]) == (3, 1, 2, ["other"])


def test_retention_below_every_log_start_is_counted_not_violated(reports: dict[str, AuditReport]) -> None:
    report = reports["retention"]
    assert report.ok and flagged(report) == set(), format_summary(report)
    assert (report.stats["acked_below_log_start"], report.stats["polls_below_log_start"]) == (4, 8)
    assert "4 acked send(s) below every replica's log start" in report.check("lost_writes").note
    assert "8 poll(s) below every replica's log start" in report.check("dirty_reads").note
    behind = reports["retention_behind_one_replica"]  # verified against the replicas that still hold them
    assert behind.ok and flagged(behind) == set(), format_summary(behind)
    assert (behind.stats["acked_below_log_start"], behind.stats["polls_below_log_start"]) == (0, 0)
    lost = reports["lost_below_final_log_start"].check("lost_writes")
    assert (lost.count, lost.evidence[0]["offset"], lost.evidence[0]["value"], lost.evidence[0]["found_value"]) \
        == (1, 1, "ghost", "v1")


def test_retention_in_real_files_with_a_stale_log_start_checkpoint(reports: dict[str, AuditReport]) -> None:
    report = reports["files_retention"]
    assert report.ok and flagged(report) == set(), format_summary(report)
    assert (report.stats["acked_below_log_start"], report.stats["polls_below_log_start"]) == (3, 3)
    assert report.stats["record_rows"] == 9


def test_failed_write_found_in_the_log(reports: dict[str, AuditReport]) -> None:
    result = reports["failed_writes_present"].check("failed_writes_present")
    assert result.count == 1
    assert (result.evidence[0]["value"], result.evidence[0]["found_at"]) == ("refused", [{"partition": 0,
                                                                                          "offset": 10}])


def test_missing_replicas_against_the_controllers_assignment(reports: dict[str, AuditReport]) -> None:
    result = reports["missing_replicas"].check("missing_replicas")
    assert (result.count, result.evidence[0]["broker"], result.evidence[0]["replicas"]) == (1, 2, [0, 1, 2])
    real = reports["files_missing_replica"]
    assert flagged(real) == {"missing_replicas"}, format_summary(real)
    assert real.check("missing_replicas").evidence[0]["broker"] == 2
    assert reports["files_clean"].check("missing_replicas").status is Status.OK
    skipped = reports["no_metadata"].check("missing_replicas")
    assert (skipped.status, skipped.note) == (Status.SKIPPED, "no metadata (test)")
    assert reports["no_metadata"].ok
    no_journal = reports["files_crc"].check("missing_replicas")  # a cluster dir whose controller/ is empty
    assert no_journal.status is Status.SKIPPED
    assert "no controller/metadata.snapshot or metadata.journal" in no_journal.note


def test_damaged_controller_metadata_is_damage_and_skips_the_check(reports: dict[str, AuditReport]) -> None:
    report = reports["files_bad_metadata"]
    assert flagged(report) == {"damaged_files"}, format_summary(report)
    damage = report.check("damaged_files").evidence[0]
    assert (damage["kind"], damage.get("broker")) == ("bad_metadata", None)
    result = report.check("missing_replicas")
    assert result.status is Status.SKIPPED and "controller metadata unreadable" in result.note


def test_merged_histories_keep_their_processes_apart(reports: dict[str, AuditReport]) -> None:
    report = reports["files_two_histories"]
    assert report.ok and flagged(report) == set(), format_summary(report)
    assert (report.stats["acked"], report.stats["polls"]) == (12, 12)


def test_an_export_path_with_glob_characters(reports: dict[str, AuditReport]) -> None:
    report = reports["glob_path"]
    assert GLOB_DIR in report.export_dir
    assert flagged(report) == {"lost_writes"}, format_summary(report)
    assert report.stats["record_rows"] == 30


def test_retention_that_emptied_the_final_replica(reports: dict[str, AuditReport]) -> None:
    """The final replica's log start comes from its replica row: emptied by retention it has no record, and
    the other replicas' records below its log start are the reference (was: every acked send lost, every
    poll dirty)."""
    report = reports["files_final_emptied_by_retention"]
    assert report.ok and flagged(report) == set(), format_summary(report)
    assert (report.stats["final_log_records"], report.stats["acked"]) == (0, 6)
    assert (report.stats["acked_below_log_start"], report.stats["polls_below_log_start"]) == (0, 0)


def test_a_resend_under_a_new_producer_id_is_a_violation(reports: dict[str, AuditReport]) -> None:
    result = reports["resent_under_a_new_producer_id"].check("duplicates")
    assert (result.status, result.count) == (Status.VIOLATION, 1)
    row = result.evidence[0]
    assert (row["value"], row["copies"], row["sends"]) == ("v8", 2, 1)
    assert [(p["offset"], p["producer_id"]) for p in row["positions"]] == [(8, 7), (10, 8)]
    assert "resent under another producer id or epoch" in result.note
    # a same-sequence retry is reported once (by the same-sequence check), not again as a resend
    assert reports["idempotent_duplicates"].check("duplicates").count == 1


@pytest.mark.parametrize("case", ["resent_uncommitted", "resent_by_an_earlier_run", "plain_resend",
                                  "idempotent_equal_values"])
def test_copies_that_are_no_resend_are_only_counted(reports: dict[str, AuditReport], case: str) -> None:
    """Above the HW (not committed), stamped before the history sent the value (an earlier run), written
    without idempotence (retries may duplicate), or one copy per send: counted, never a violation."""
    report = reports[case]
    assert report.ok, format_summary(report)
    assert report.check("duplicates").status is Status.COUNTED
    assert flagged(report) == {"duplicates"}, format_summary(report)


def test_a_missing_hw_checkpoint_file_fails_the_audit(reports: dict[str, AuditReport]) -> None:
    report = reports["files_hw_checkpoint_deleted"]
    assert flagged(report) == {"damaged_files"}, format_summary(report)
    damage = report.check("damaged_files").evidence[0]
    assert (damage["broker"], damage["kind"], damage["file"]) == (2, "missing_checkpoint",
                                                                  "broker-2/replication-offset-checkpoint")
    assert report.stats["replicas_without_hw"] == 1


def test_a_history_without_sends_is_noted(reports: dict[str, AuditReport]) -> None:
    report = reports["files_empty_history"]
    assert report.ok and flagged(report) == set(), format_summary(report)
    assert report.stats["sends"] == 0
    note = report.check("lost_writes").note
    assert "the history has no sends" in note and "1 torn last line(s) of the history skipped" in note
    assert reports["files_clean"].check("lost_writes").note == ""


def test_epoch_cache_entries_are_checked_against_the_log(reports: dict[str, AuditReport]) -> None:
    result = reports["epoch_cache_mismatch"].check("epoch_cache_mismatch")
    assert result.count == 1
    row = result.evidence[0]
    assert (row["broker"], row["leader_epoch"], row["cache_start_offset"], row["first_offset_in_log"]) \
        == (2, 1, 8, 4)
    edges = reports["epoch_cache_edges"]  # below log start, an epoch without batches, a clamped entry
    assert edges.ok and flagged(edges) == set(), format_summary(edges)
    assert edges.check("epoch_cache_mismatch").status is Status.OK
