"""Model-based: random leadership histories between two replicas; the follower always ends identical.

A history is a list of epochs, each led by replica A or B; the leader appends some
batches in its epoch and the other replica either stays away or catches up fully
(copies the leader's log). At the end B leads a new epoch and A follows it through
``FetcherTask.do_work()`` (real storage logs, fake leader endpoint). Whatever the
history (clean or unclean elections), A must end byte-identical to B, never
truncating below the longest prefix the two logs share.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from fetcher.api import InitialFetchState
from fetcher.task import FetcherConfig, FetcherTask
from storage.log import Log
from tests.fetcher.fakes import TP, FakeLeader, LocalFollower, log_bytes, open_log, write

EPOCH = st.tuples(st.sampled_from("AB"), st.integers(0, 3), st.booleans())  # leader, batches, other catches up


def copy_log(src: Log, dst: Log) -> None:
    dst.truncate_fully_and_start_at(0)
    data = log_bytes(src)
    if data:
        dst.append_as_follower(data)


def common_prefix_offset(a: Log, b: Log) -> int:
    """The first offset where the two logs' batches differ."""
    from storage.record_batch import iter_batches

    da, db = log_bytes(a), log_bytes(b)
    offset = 0
    for (pa, ha), (pb, hb) in zip(iter_batches(da), iter_batches(db), strict=False):
        if da[pa:pa + ha.size] != db[pb:pb + hb.size]:
            break
        offset = ha.last_offset + 1
    return offset


async def replay(root: Path, history: list[tuple[str, int, bool]], final_batches: int, on_fetch: bool) -> None:
    clock = ManualClock()
    logs = {"A": open_log(root, "a", clock), "B": open_log(root, "b", clock)}
    try:
        for epoch, (who, batches, catch_up) in enumerate(history):
            # a new leader records (epoch, LEO) before accepting writes, as the broker does
            logs[who].maybe_assign_epoch_start_offset(epoch, logs[who].log_end_offset)
            write(logs[who], epoch, batches, clock, records=2)
            if catch_up:
                copy_log(logs[who], logs["B" if who == "A" else "A"])
        final_epoch = len(history)
        logs["B"].maybe_assign_epoch_start_offset(final_epoch, logs["B"].log_end_offset)
        write(logs["B"], final_epoch, final_batches, clock, records=2)
        shared = common_prefix_offset(logs["A"], logs["B"])

        leader, follower = FakeLeader(), LocalFollower()
        leader.lead(TP, logs["B"], final_epoch)
        follower.follow(TP, logs["A"], final_epoch)
        task = FetcherTask(0, leader, follower, FetcherConfig(wait_max_ms=0, truncate_on_fetch=on_fetch), clock)
        task.add_partitions({TP: InitialFetchState(leader.broker, final_epoch, logs["A"].log_end_offset)})
        for _ in range(4 * len(history) + 10):
            await task.do_work()
            state = task.fetch_state(TP)
            if state is not None and state.fetch_offset == logs["B"].log_end_offset and \
                    log_bytes(logs["A"]) == log_bytes(logs["B"]):
                break
        assert log_bytes(logs["A"]) == log_bytes(logs["B"])
        assert all(offset >= shared for _, offset, _ in follower.truncations), (shared, follower.truncations)
    finally:
        for log in logs.values():
            log.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(EPOCH, min_size=1, max_size=6), final_batches=st.integers(0, 2), on_fetch=st.booleans())
def test_follower_always_converges_to_the_leader(history: list[tuple[str, int, bool]], final_batches: int,
                                                 on_fetch: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(replay(Path(tmp), history, final_batches, on_fetch))
