"""``perf produce`` / ``perf e2e``: a record size the producer cannot send is one usage line, refused before
any payload is built or any broker contacted (a huge one once spun at 100 % CPU, building it byte by byte)."""

from __future__ import annotations

import argparse
import socket
import time
from collections.abc import Iterator

import pytest

from cli.main import CliError
from cli.perf import check_e2e, check_record_size, make_payload
from client.accumulator import RECORD_OVERHEAD_BYTES
from tests.cli.helpers import run

HUGE = str(2**63 - 1)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket on 127.0.0.1 as --bootstrap: afterwards, nothing must have connected to it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.setblocking(False)
        yield s


def assert_nobody_connected(s: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        s.accept()[0].close()


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("minibroker: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("command", ["produce", "e2e"])
@pytest.mark.parametrize(("extra", "message"), [
    (["--record-size", HUGE], f"--record-size {HUGE} does not fit --max-request-size 1048576"),
    (["--record-size", "100000000"], "--record-size 100000000 does not fit --max-request-size 1048576"),
    (["--record-size", "1000", "--max-request-size", "1011"], "at most --record-size 999"),
])
async def test_a_record_larger_than_max_request_size_is_refused_at_once(
        listener: socket.socket, command: str, extra: list[str], message: str) -> None:
    started = time.monotonic()
    status, out, err = await run("perf", command, "--topic", "t", "--num-records", "1", *extra,
                                 "--bootstrap", f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=30)
    assert status == 2
    assert message in one_error_line(err)
    assert out == ""
    assert time.monotonic() - started < 20  # not minutes of building a payload first
    assert_nobody_connected(listener)


async def test_e2e_max_request_size_too_small_for_its_header(listener: socket.socket) -> None:
    status, _, err = await run("perf", "e2e", "--topic", "t", "--num-records", "1", "--record-size", "16",
                               "--max-request-size", "20", "--bootstrap",
                               f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=30)
    assert status == 2
    assert "--max-request-size 20 leaves no room for a 16-byte record" in one_error_line(err)
    assert_nobody_connected(listener)


def _args(record_size: int, max_request_size: int, throughput: float = 100) -> argparse.Namespace:
    return argparse.Namespace(record_size=record_size, max_request_size=max_request_size, throughput=throughput)


def test_the_limit_is_the_producers_own() -> None:
    """Exactly the records Producer.send_nowait accepts (value + RECORD_OVERHEAD_BYTES <= max.request.size)."""
    limit = 4096
    check_record_size(_args(limit - RECORD_OVERHEAD_BYTES, limit))
    check_e2e(_args(limit - RECORD_OVERHEAD_BYTES, limit))
    with pytest.raises(CliError, match=f"at most --record-size {limit - RECORD_OVERHEAD_BYTES}"):
        check_record_size(_args(limit - RECORD_OVERHEAD_BYTES + 1, limit))
    with pytest.raises(CliError, match="at most --record-size"):
        check_e2e(_args(limit - RECORD_OVERHEAD_BYTES + 1, limit))
    with pytest.raises(CliError, match="leaves no room"):
        check_record_size(_args(1, RECORD_OVERHEAD_BYTES))
    with pytest.raises(CliError, match="--record-size >= 16"):
        check_e2e(_args(15, limit))
    with pytest.raises(CliError, match="--throughput > 0"):
        check_e2e(_args(100, limit, throughput=-1))


@pytest.mark.parametrize("size", [0, 1, 25, 26, 27, 52, 1000, 12_345])
def test_payload_is_the_same_fixed_printable_filler(size: int) -> None:
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    assert make_payload(size) == bytes(alphabet[(i * 7 + 3) % 26] for i in range(size))


def test_large_payload_is_built_without_a_per_byte_loop() -> None:
    started = time.perf_counter()
    payload = make_payload(50_000_000)  # once ~8 s, byte by byte
    assert time.perf_counter() - started < 2
    assert len(payload) == 50_000_000
    for i in (0, 25, 26, 12_345_677, 49_999_999):
        assert payload[i] == b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"[(i * 7 + 3) % 26]


@pytest.mark.parametrize("command", ["produce", "e2e"])
@pytest.mark.parametrize(("extra", "message"), [
    (["--acks", "1", "--producer-property", "enable.idempotence=true"], "enable.idempotence=true needs acks=all"),
    (["--producer-property", "buffer.memory=1"], "--producer-property buffer.memory: use --buffer-memory"),
    (["--producer-property", "linger.ms=1"], "--producer-property linger.ms: use --linger-ms"),
    (["--producer-property", "nope=1"], "unknown producer setting 'nope'"),
])
async def test_producer_properties_are_checked_before_any_broker_is_contacted(
        listener: socket.socket, command: str, extra: list[str], message: str) -> None:
    status, out, err = await run("perf", command, "--topic", "t", "--num-records", "1", "--record-size", "100",
                                 *extra, "--bootstrap", f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=30)
    assert status == 2
    assert message in one_error_line(err)
    assert out == ""
    assert_nobody_connected(listener)
