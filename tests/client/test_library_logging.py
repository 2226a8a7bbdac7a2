"""The client library used from plain Python (the README's snippet) writes nothing on stdout: its logs go
through the standard ``logging`` module, which shows warnings and up on stderr when the program set nothing
up. structlog's unconfigured default printed every event, info too, on stdout."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.client.fake_broker import FakeCluster

# the README's "From plain Python" example, plus a partition that does not exist (a warning)
SNIPPET = """
import asyncio
import sys
from client import Consumer, Producer

async def main() -> None:
    async with Producer(sys.argv[1], acks="all") as producer:
        meta = await producer.send_and_wait("events", b"hello", key=b"user-1")
        print("written at", meta.partition, meta.offset)
    async with Consumer(sys.argv[1], auto_offset_reset="earliest") as consumer:
        await consumer.assign_topic("events")
        for record in await consumer.poll(timeout_ms=2000):
            print(record.partition, record.offset, record.key, record.value)
        consumer.assign([("events", 9)])
        await consumer.poll(timeout_ms=300)

asyncio.run(main())
"""


async def run_snippet(fake: FakeCluster, *setup: str) -> tuple[str, str]:
    code = "\n".join(setup) + SNIPPET
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, fake.bootstrap,
                                                cwd=Path(__file__).parents[2], stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


async def test_the_client_library_prints_only_what_the_program_prints(fake: FakeCluster) -> None:
    out, err = await run_snippet(fake)
    partition = next(tp.partition for tp, p in fake.partitions.items() if p.log_end_offset)
    assert out.splitlines() == [f"written at {partition} 0", f"{partition} 0 b'user-1' b'hello'"]
    # warnings and up on stderr, as logging's last resort shows them; info events (producer_id_assigned) not
    assert "consumer_unknown_topic_or_partition topic='events' partition=9" in err
    assert "producer_id_assigned" not in err


async def test_a_program_that_sets_up_logging_gets_the_client_events_there(fake: FakeCluster) -> None:
    out, err = await run_snippet(fake, "import logging",
                                 "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s %(message)s')")
    assert len(out.splitlines()) == 2
    assert "INFO client.producer producer_id_assigned producer_id=" in err
    assert "WARNING client.consumer consumer_unknown_topic_or_partition" in err
