"""Tiny broker data directories written with storage's own encoders.

``write_replica`` lays out one partition the way DESIGN.md "Storage" says a
broker does: ``<base>.log`` segments of record batches built by
``storage.record_batch.build_batch``, a ``leader-epoch-checkpoint`` and the
broker's offset checkpoints (``storage.checkpoint``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgpack
from crc32c import crc32c

from audit.history import HistoryWriter, Outcome, PollEvent, SendEvent
from common.wire import TopicPartition
from storage.checkpoint import write_epochs, write_offsets
from storage.epoch_cache import EpochEntry
from storage.record_batch import ATTRIBUTES_OFFSET, HEADER_SIZE, build_batch, parse_header


@dataclass(frozen=True)
class Batch:
    epoch: int
    values: Sequence[str]
    sequence: int | None = None  # its base sequence with a producer id (default: its base offset)


def write_meta(broker_dir: Path, broker_id: int) -> None:
    broker_dir.mkdir(parents=True, exist_ok=True)
    (broker_dir / "meta.properties").write_text(f"version=1\nnode.id={broker_id}\ncluster.id=test\n")


def write_replica(broker_dir: Path, broker_id: int, segments: Sequence[Sequence[Batch]], *, hw: int,
                  topic: str = "t", partition: int = 0, producer_id: int = -1) -> list[Path]:
    """Segments of batches (offsets assigned from 0); returns the segment paths."""
    write_meta(broker_dir, broker_id)
    pdir = broker_dir / f"{topic}-{partition}"
    pdir.mkdir(exist_ok=True)
    offset = 0
    paths = []
    epochs: list[EpochEntry] = []
    for seg in segments:
        path = pdir / f"{offset:020d}.log"
        chunks = []
        for b in seg:
            if not epochs or epochs[-1].epoch != b.epoch:
                epochs.append(EpochEntry(b.epoch, offset))
            chunks.append(build_batch([(f"k{offset + i}".encode(), v.encode()) for i, v in enumerate(b.values)],
                                      base_offset=offset, timestamp_ms=1_700_000_000_000 + offset,
                                      partition_leader_epoch=b.epoch, producer_id=producer_id,
                                      producer_epoch=0 if producer_id >= 0 else -1,
                                      base_sequence=(offset if b.sequence is None else b.sequence)
                                      if producer_id >= 0 else -1))
            offset += len(b.values)
        path.write_bytes(b"".join(chunks))
        paths.append(path)
    write_epochs(pdir / "leader-epoch-checkpoint", epochs)
    tp = TopicPartition(topic, partition)
    _merge_offsets(broker_dir / "replication-offset-checkpoint", tp, hw)
    _merge_offsets(broker_dir / "recovery-point-offset-checkpoint", tp, offset)
    _merge_offsets(broker_dir / "log-start-offset-checkpoint", tp, 0)
    return paths


def _merge_offsets(path: Path, tp: TopicPartition, value: int) -> None:
    from storage.checkpoint import read_offsets

    offsets = read_offsets(path)
    offsets[tp] = value
    write_offsets(path, offsets)


def batch_positions(path: Path) -> list[int]:
    from storage.record_batch import iter_batches

    return [pos for pos, _ in iter_batches(path.read_bytes())]


def corrupt_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def undecodable_batch(base_offset: int, epoch: int) -> bytes:
    """A batch with a valid frame and CRC whose records are not a msgpack array."""
    good = build_batch([(None, b"x")], base_offset=base_offset, timestamp_ms=1, partition_leader_epoch=epoch)
    header = parse_header(good)
    body = msgpack.packb({"not": "records"})
    tail = good[ATTRIBUTES_OFFSET:HEADER_SIZE] + body
    return struct.pack(">qiibI", header.base_offset, len(tail) + 9, epoch, 2, crc32c(tail)) + tail


SEGMENTS = [[Batch(0, ["v0", "v1"]), Batch(0, ["v2"])], [Batch(1, ["v3", "v4"]), Batch(1, ["v5"])]]


def cluster(root: Path, *, hw: int = 6, metadata: bool = False) -> Path:
    """A cluster dir as ``cluster up`` makes it: broker-0..2, one partition t-0 of six records; with
    ``metadata``, the controller's journal assigns t-0 to brokers 0, 1, 2 (else its data dir is empty)."""
    for b in range(3):
        write_replica(root / f"broker-{b}", b, SEGMENTS, hw=hw)
    (root / "controller").mkdir()
    if metadata:
        controller_metadata(root / "controller", {TopicPartition("t", 0): (0, 1, 2)})
    return root


def controller_metadata(data_dir: Path, assignments: dict[TopicPartition, tuple[int, ...]]) -> Path:
    """A controller data dir whose journal (written by ``controller.journal.Journal``) creates the topics
    with these replica assignments, leader the first replica, in leader epoch 1; returns the journal."""
    from controller.journal import JOURNAL_NAME, Journal
    from controller.state import PartitionRecord, TopicRecord

    journal, _image = Journal.open(data_dir)
    try:
        for topic in sorted({tp.topic for tp in assignments}):
            journal.append([TopicRecord(topic, {}),
                            *(PartitionRecord(topic, tp.partition, reps, reps, reps[0], 1, 0)
                              for tp, reps in sorted(assignments.items()) if tp.topic == topic)])
    finally:
        journal.close()
    return data_dir / JOURNAL_NAME


def history(path: Path, n: int = 6) -> Path:
    with HistoryWriter(path) as w:
        for o in range(n):
            w.write(SendEvent("p0", o, "t", f"k{o}", f"v{o}", 1, 2, Outcome.OK, 0, o))
        for o in range(n):
            w.write(PollEvent("c0", o, "t", 0, o, f"k{o}", f"v{o}", 3))
    return path
