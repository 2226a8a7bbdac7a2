"""State-change log events say what changed, with the values after it: ``isr_updated`` only when the ISR
changed, carrying the old ISR and the HW it moved to (it was logged before the HW moved, without the old ISR
when the controller changed it, and not at all on a follower), ``became_follower`` with the ISR and
replicas as ``became_leader`` has them."""

from __future__ import annotations

import logging

import pytest

from common.http import RpcClient
from tests.broker.conftest import TP, StartBroker, batch, part, produce_body
from tests.fake_controller import FakeController


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(name + " ")]


async def test_isr_shrunk_by_the_controller_is_logged_with_the_old_isr_and_the_hw_it_moved_to(
        start_broker: StartBroker, controller: FakeController, rpc: RpcClient,
        caplog: pytest.LogCaptureFixture) -> None:
    b = await start_broker()
    part_state = await controller.elect(TP, leader=1, replicas=[1, 2])
    assert part(await rpc.call(b.address, "produce", produce_body(batch(3))))["error"] == 0  # HW 0: 2 lags
    caplog.clear()
    same_isr = {**part_state.state(TP), "partition_epoch": part_state.partition_epoch + 1}
    assert (await controller.send_leader_and_isr(b.address, [same_isr]))["partitions"][0]["error"] == 0
    assert events(caplog, "isr_updated") == []  # a newer partition epoch, the same ISR
    shrunk = {**same_isr, "isr": [1], "partition_epoch": part_state.partition_epoch + 2}
    assert (await controller.send_leader_and_isr(b.address, [shrunk]))["partitions"][0]["error"] == 0
    [line] = events(caplog, "isr_updated")
    assert "isr=[1]" in line and "old_isr=[1, 2]" in line and "high_watermark=3" in line, line


async def test_follower_logs_its_isr_updates_and_becomes_follower_with_isr_and_replicas(
        start_broker: StartBroker, controller: FakeController, caplog: pytest.LogCaptureFixture) -> None:
    b = await start_broker()
    caplog.clear()
    part_state = await controller.elect(TP, leader=2, replicas=[2, 1])
    [became] = events(caplog, "became_follower")
    assert "isr=[2, 1]" in became and "replicas=[2, 1]" in became, became
    shrunk = {**part_state.state(TP), "isr": [2], "partition_epoch": part_state.partition_epoch + 1}
    assert (await controller.send_leader_and_isr(b.address, [shrunk]))["partitions"][0]["error"] == 0
    [line] = events(caplog, "isr_updated")
    assert "isr=[2]" in line and "old_isr=[2, 1]" in line and "source='controller'" in line, line
