"""Record batch build/parse/validate/stamp/decode, and each kind of bad batch."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import pytest

from common.errors import ErrorCode
from storage import record_batch as rb
from storage.record_batch import (
    HEADER_SIZE,
    BatchLengthError,
    BatchTooLargeError,
    BatchTooShortError,
    CrcMismatchError,
    Record,
    RecordCountMismatchError,
    UnsupportedMagicError,
)

TS = 1_700_000_000_000


def _batch(n: int = 3, **kw: int) -> bytes:
    return rb.build_batch([(b"k%d" % i, b"v%d" % i) for i in range(n)], timestamp_ms=TS, **kw)


def test_build_and_parse_header() -> None:
    data = rb.build_batch([(b"a", b"1", TS + 5), (None, b"2", TS + 1), (b"c", None, TS + 9)],
                          base_offset=7, timestamp_ms=0, producer_id=3, producer_epoch=1, base_sequence=4,
                          partition_leader_epoch=2)
    h = rb.parse_header(data)
    assert (h.base_offset, h.partition_leader_epoch, h.magic, h.record_count) == (7, 2, 2, 3)
    assert (h.first_timestamp, h.max_timestamp) == (TS + 5, TS + 9)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (3, 1, 4)
    assert (h.last_offset, h.next_offset, h.size) == (9, 10, len(data))
    assert h.batch_length == len(data) - 12
    assert rb.validate_batch(data) == h


def test_decode_records_roundtrip_with_headers() -> None:
    data = rb.build_batch([(b"k", b"v", TS, [("h", b"x")]), (None, None, TS - 3)], timestamp_ms=0)
    assert rb.decode_records(data) == [Record(0, 0, b"k", b"v", [("h", b"x")]), Record(1, -3, None, None, [])]


def test_records_without_headers_encode_as_with_empty_headers() -> None:
    """(key, value, ts) records take a column-wise fast path; the bytes are the general path's."""
    plain = [(b"k", b"v" * 100, TS + 2), (None, b"", TS), (b"", None, TS + 70_000), (None, None, TS - 5)] * 70
    assert rb.build_batch(plain, timestamp_ms=0) == rb.build_batch([(*r, []) for r in plain], timestamp_ms=0)
    assert [(r.key, r.value, r.timestamp_delta) for r in rb.decode_records(rb.build_batch(plain, timestamp_ms=0))][:4] \
        == [(b"k", b"v" * 100, 0), (None, b"", -2), (b"", None, 69_998), (None, None, -7)]


def test_empty_batch_refused() -> None:
    with pytest.raises(ValueError):
        rb.build_batch([], timestamp_ms=TS)


def test_stamp_keeps_crc_valid() -> None:
    buf = bytearray(_batch())
    rb.stamp(buf, 0, base_offset=1234, partition_leader_epoch=9)
    h = rb.validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch) == (1234, 9)


def test_iter_batches_stops_at_partial_tail() -> None:
    a, b = _batch(2), _batch(5, base_offset=2)
    buf = a + b + b[:30]
    got = [(pos, h.base_offset) for pos, h in rb.iter_batches(buf)]
    assert got == [(0, 0), (len(a), 2)]
    assert list(rb.iter_batches(a + b[: len(b) - 1])) == [(0, rb.parse_header(a))]


def test_validate_batches_whole_buffer() -> None:
    a, b = _batch(2), _batch(5)
    assert [h.record_count for h in rb.validate_batches(a + b, max_batch_size=10_000)] == [2, 5]
    assert rb.validate_batches(b"", max_batch_size=10) == []
    with pytest.raises(BatchTooShortError):
        rb.validate_batches(a + b[:-1], max_batch_size=10_000)


def _corrupt(data: bytes, pos: int, value: bytes) -> bytes:
    return data[:pos] + value + data[pos + len(value):]


def _recrc(data: bytes) -> bytes:
    buf = bytearray(data)
    struct.pack_into(">I", buf, 17, rb.compute_crc(buf, 0, len(buf)))
    return bytes(buf)


@pytest.mark.parametrize(
    ("make", "error", "code"),
    [
        (lambda d: d[:HEADER_SIZE - 1], BatchTooShortError, ErrorCode.CORRUPT_MESSAGE),
        (lambda d: d[:-1], BatchTooShortError, ErrorCode.CORRUPT_MESSAGE),
        (lambda d: _corrupt(d, 8, struct.pack(">i", 10)), BatchLengthError, ErrorCode.CORRUPT_MESSAGE),
        (lambda d: _corrupt(d, 8, struct.pack(">i", -5)), BatchLengthError, ErrorCode.CORRUPT_MESSAGE),
        (lambda d: _corrupt(d, 16, b"\x01"), UnsupportedMagicError, ErrorCode.CORRUPT_MESSAGE),
        (lambda d: _corrupt(d, len(d) - 1, bytes([d[-1] ^ 0xFF])), CrcMismatchError, ErrorCode.CORRUPT_MESSAGE),
        (lambda d: _corrupt(d, 30, bytes([d[30] ^ 1])), CrcMismatchError, ErrorCode.CORRUPT_MESSAGE),
        (lambda d: _recrc(_corrupt(d, 57, struct.pack(">i", 4))), RecordCountMismatchError,
         ErrorCode.INVALID_RECORD),
        (lambda d: _recrc(_corrupt(d, 23, struct.pack(">i", 1))), RecordCountMismatchError,
         ErrorCode.INVALID_RECORD),
    ],
)
def test_each_bad_batch_has_its_error(make, error, code) -> None:  # type: ignore[no-untyped-def]
    bad = make(_batch(3))
    with pytest.raises(error) as info:
        rb.validate_batch(bad)
    assert info.value.code == code
    assert isinstance(info.value, rb.InvalidBatchError)


def test_too_large() -> None:
    data = _batch(3)
    with pytest.raises(BatchTooLargeError) as info:
        rb.validate_batch(data, max_size=len(data) - 1)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert rb.validate_batch(data, max_size=len(data)).record_count == 3


def _with_body(body: bytes, count: int) -> bytes:
    tail = struct.pack(">hiqqqhii", 0, count - 1, TS, TS, -1, -1, -1, count) + body
    head = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, 0)
    return _recrc(head + tail)


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never-used msgpack byte
        msgpack.packb({"a": 1}),
        msgpack.packb([[0, 0, b"k", b"v"]]),  # 4 fields
        msgpack.packb([[1, 0, b"k", b"v", []]]),  # wrong offset delta
        msgpack.packb([[0, 0, "k", b"v", []]]),  # key not bytes
        msgpack.packb([[0, 0, b"k", b"v", [["h", "not-bytes"]]]]),
        msgpack.packb([[0, 0.5, b"k", b"v", []]]),
    ],
)
def test_undecodable_records_are_invalid_record(body: bytes) -> None:
    with pytest.raises(RecordCountMismatchError) as info:
        rb.validate_batch(_with_body(body, 1))
    assert info.value.code == ErrorCode.INVALID_RECORD


def test_record_count_vs_records() -> None:
    body = msgpack.packb([[0, 0, b"k", b"v", []], [1, 0, b"k", b"v", []]])
    assert rb.validate_batch(_with_body(body, 2)).record_count == 2
    with pytest.raises(RecordCountMismatchError):
        rb.validate_batch(_with_body(body, 3))


@pytest.mark.parametrize(
    ("body", "count", "why"),
    [
        (msgpack.packb("hello"), 1, "not a msgpack array"),
        (b"garbage bytes", 1, "not a msgpack array"),
        (b"", 1, "not a msgpack array"),
        (msgpack.packb([[0, 0, b"k", b"v", []]]), 2**31 - 1, "an array of 1"),  # offsets would jump by 2**31
        (msgpack.packb([[i, 0, None, b"v", []] for i in range(20)]), 19, "an array of 20"),  # array 16
        (b"\xdd\x00\x01\x00\x00", 3, "an array of 65536"),  # array 32
    ],
)
def test_check_frame_reads_the_record_count_off_the_array_header(body: bytes, count: int, why: str) -> None:
    """The produce path's checks (no record decoded) refuse records that are no array or an array of
    another length than record_count: such batches once broke every consumer of the partition."""
    with pytest.raises(RecordCountMismatchError, match=why) as info:
        rb.check_frame(_with_body(body, count))
    assert info.value.code == ErrorCode.INVALID_RECORD
    good = msgpack.packb([[i, 0, None, b"v", []] for i in range(70000)])  # array 32 in the normal case
    assert rb.check_frame(_with_body(good, 70000)).record_count == 70000


@pytest.mark.parametrize(
    ("attributes", "error", "code"),
    [
        (1, rb.UnsupportedCompressionError, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
        (7, rb.UnsupportedCompressionError, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
        (0x10, rb.UnsupportedAttributesError, ErrorCode.INVALID_RECORD),  # transactional
        (0x20, rb.UnsupportedAttributesError, ErrorCode.INVALID_RECORD),  # control
    ],
)
def test_check_frame_refuses_attributes_this_log_cannot_honour(attributes: int, error: type, code: ErrorCode) -> None:
    data = _recrc(_corrupt(_batch(3), 21, struct.pack(">h", attributes)))
    with pytest.raises(error) as info:
        rb.check_frame(data)
    assert info.value.code == code
    assert rb.check_frame(_recrc(_corrupt(_batch(3), 21, struct.pack(">h", 0x08)))).record_count == 3


def test_parse_header_short() -> None:
    with pytest.raises(BatchTooShortError):
        rb.parse_header(b"\x00" * 10)


def test_log_append_time_is_set_on_every_batch_with_a_valid_crc() -> None:
    # Kafka's setMaxTimestamp(LOG_APPEND_TIME, now): the attributes bit, the max timestamp, the CRC again
    a = rb.build_batch([(None, b"a"), (None, b"b")], timestamp_ms=1_000)
    b = rb.build_batch([(b"k", b"c")], base_offset=2, timestamp_ms=4_102_444_800_000)  # year 2100
    out = rb.set_timestamp_type(a + b, [rb.parse_header(a), rb.parse_header(b)], 5_000)
    headers = rb.validate_batches(out, max_batch_size=1 << 20)  # CRCs hold
    assert [(h.attributes, h.max_timestamp, h.first_timestamp) for h in headers] == [
        (rb.TIMESTAMP_TYPE_BIT, 5_000, 1_000), (rb.TIMESTAMP_TYPE_BIT, 5_000, 4_102_444_800_000)]
    records = rb.decode_records(out, 0) + rb.decode_records(out, headers[0].size)
    assert [r.value for r in records] == [b"a", b"b", b"c"]
    assert [rb.record_timestamp(headers[0], r) for r in records[:2]] == [5_000, 5_000]
    assert rb.record_timestamp(rb.parse_header(a), records[1]) == 1_000  # CreateTime: the record's own
    # CreateTime clears a client's bit (and keeps the max timestamp); nothing to change: the same object back
    back = rb.set_timestamp_type(out, headers, None)
    assert [(h.attributes, h.max_timestamp) for h in rb.validate_batches(back, max_batch_size=1 << 20)] == [
        (0, 5_000), (0, 5_000)]
    assert rb.set_timestamp_type(a, [rb.parse_header(a)], None) is a
    assert rb.set_timestamp_type(out, headers, 5_000) is out


def test_dump_log_and_export_read_the_append_time_of_a_log_append_time_batch(tmp_path: Path) -> None:
    from audit.export import _record_rows
    from common.wire import TopicPartition
    from storage.dump import dump_file

    raw = rb.build_batch([(None, b"a"), (None, b"b")], timestamp_ms=1_000)
    stamped = bytes(rb.set_timestamp_type(raw, [rb.parse_header(raw)], 5_000))
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(stamped)
    (line,) = dump_file(segment, records=True)
    assert [r["timestamp"] for r in line["records"]] == [5_000, 5_000]
    rows = _record_rows(1, TopicPartition("t", 0), segment.name, 0, rb.parse_header(stamped), stamped)
    assert [r["timestamp"] for r in rows] == [5_000, 5_000]
    assert [r["timestamp"] for r in _record_rows(1, TopicPartition("t", 0), segment.name, 0,
                                                 rb.parse_header(raw), raw)] == [1_000, 1_000]
