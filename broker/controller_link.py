"""The broker's side of the controller link: registration, heartbeats, AlterPartition, controlled shutdown.

Small on purpose. One incarnation id (uuid4) per process; every registration
gets a new broker epoch from the controller, which the replica manager uses in
follower fetches and AlterPartition. If the controller is unreachable the
broker keeps serving (it has no leadership until a LeaderAndIsr arrives) and
keeps retrying, bounded per attempt by ``replica.socket.timeout.ms``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from broker.producer_ids import ProducerIdBlock
from broker.replica_manager import AlterResult, ReplicaManager
from common.clock import Clock
from common.config import Config
from common.errors import ErrorCode
from common.http import RpcClient, RpcError
from common.logging import get_logger
from common.wire import TopicPartition, is_cluster_id

log = get_logger("broker")

RETRY_BACKOFF_S = 0.2
MAX_RETRY_BACKOFF_S = 2.0  # the loop's backoff after unexpected errors, and controlled shutdown's, doubles to this
SHUTDOWN_CALL_TIMEOUT_MS = 5_000  # one unanswered controlled-shutdown call: give up and stop anyway


class ControllerLink:
    def __init__(self, rm: ReplicaManager, controller: str, host: str, port: int, config: Config,
                 clock: Clock, *, cluster_id: str | None = None) -> None:
        self._rm = rm
        self._controller = controller
        self._host = host
        self._port = port
        self._config = config
        self._clock = clock
        self.incarnation_id = str(uuid.uuid4())
        timeout_s = config.get_int("replica.socket.timeout.ms") / 1000
        self._rpc = RpcClient(limit_per_host=4, timeout_s=timeout_s)
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # Set once controlled shutdown begins; every heartbeat then says so (Kafka's wantShutDown), so a
        # controller that restarted meanwhile, and forgot the shutdown, does not unfence this broker again.
        self._want_shutdown = False
        self.registered = asyncio.Event()
        self.on_registered: Callable[[], None] | None = None  # e.g. fetch a first producer-id block
        # the cluster the data dir belongs to (None: not yet recorded), sent with each registration; the first
        # registration's answer names it, and on_cluster_id records it
        self.cluster_id = cluster_id
        self.on_cluster_id: Callable[[str], None] | None = None
        self._told_inconsistent = False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # _run guards itself; whatever still got out must not fail the stop
                log.exception("controller_link_failed", broker_id=self._rm.broker_id, error=str(exc))
        await self._rpc.close()

    async def _run(self) -> None:
        """Register, then heartbeat, until closed. An error no call expected (a bug, an answer of the wrong
        shape) is logged and the loop goes on after a backoff: without this task the broker would never
        register again, nor tell the controller it is alive."""
        interval_s = self._config.get_int("broker.heartbeat.interval.ms") / 1000
        failures = unanswered = 0
        while not self._closed:
            try:
                if self._rm.broker_epoch < 0:
                    await self._register()
                    delay_s = interval_s if self._rm.broker_epoch >= 0 else RETRY_BACKOFF_S * 5
                    unanswered = 0
                elif await self._heartbeat(self._want_shutdown) is None:
                    # unanswered: ask again soon, not a whole interval later, or one lost answer plus the
                    # interval outlasts the session; then less often while the controller stays away (Kafka's
                    # BrokerLifecycleManager: a doubling backoff, at most the interval here)
                    unanswered += 1
                    delay_s = min(interval_s, _backoff_s(unanswered))
                else:
                    delay_s = interval_s
                    unanswered = 0
                failures = 0
            except Exception as exc:
                failures += 1
                log.exception("controller_link_error", broker_id=self._rm.broker_id, controller=self._controller,
                              error=str(exc), failures=failures)
                await asyncio.sleep(_backoff_s(failures))
                continue
            await asyncio.sleep(delay_s)

    def _liveness_timeout_s(self) -> float:
        """Half the session timeout at most (Kafka's heartbeat channel, KAFKA-14392): an answer lost on one
        connection leaves time for another heartbeat, on a new connection, before the session ends."""
        return min(self._config.get_int("broker.session.timeout.ms") / 2,
                   self._config.get_int("replica.socket.timeout.ms")) / 1000

    async def _register(self) -> None:
        body = {"node_id": self._rm.broker_id, "host": self._host, "port": self._port,
                "incarnation_id": self.incarnation_id, "cluster_id": self.cluster_id}
        try:
            resp = await self._rpc.call(self._controller, "broker_registration", body,
                                        timeout_s=self._liveness_timeout_s())
        except RpcError as exc:
            log.warning("registration_failed", broker_id=self._rm.broker_id, controller=self._controller,
                        error=str(exc))
            return
        error = ErrorCode.of(_int(resp, "error"))
        epoch = _int(resp, "broker_epoch")
        if error is ErrorCode.DUPLICATE_BROKER_REGISTRATION:
            # a restart before the previous incarnation's session ended, or another process with this node id
            log.warning("registration_refused", broker_id=self._rm.broker_id, error=error.name,
                        hint="another incarnation of this node id holds a session; retrying until it ends")
            return
        if error is ErrorCode.INCONSISTENT_CLUSTER_ID:
            # Kafka's broker keeps asking (BrokerLifecycleManager); it never registers, so it gets no partition
            event = dict(broker_id=self._rm.broker_id, error=error.name, cluster_id=self.cluster_id,
                         controller_cluster_id=resp.get("cluster_id"), controller=self._controller,
                         hint="this broker's data dir belongs to another cluster: point --controller at that "
                              "cluster's controller, or start this broker with an empty --data-dir")
            (log.warning if self._told_inconsistent else log.error)("registration_refused", **event)
            self._told_inconsistent = True
            return
        if error is not ErrorCode.NONE or epoch < 0:
            log.warning("registration_refused", broker_id=self._rm.broker_id, error=error.name)
            return
        named = resp.get("cluster_id")
        if self.cluster_id is None and is_cluster_id(named):
            self.cluster_id = named
            if self.on_cluster_id is not None:
                self.on_cluster_id(named)
        self._rm.broker_epoch = epoch
        self.registered.set()
        if self.on_registered is not None:
            self.on_registered()
        log.info("broker_registered", broker_id=self._rm.broker_id, broker_epoch=epoch,
                 incarnation_id=self.incarnation_id)

    async def _heartbeat(self, want_shutdown: bool = False) -> dict[str, Any] | None:
        body = {"node_id": self._rm.broker_id, "broker_epoch": self._rm.broker_epoch, "want_shutdown": want_shutdown}
        try:
            resp = await self._rpc.call(self._controller, "broker_heartbeat", body,
                                        timeout_s=self._liveness_timeout_s())
        except RpcError as exc:
            log.warning("heartbeat_failed", broker_id=self._rm.broker_id, error=str(exc))
            return None
        error = ErrorCode.of(_int(resp, "error"))
        if error in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
            log.warning("heartbeat_stale_epoch", broker_id=self._rm.broker_id, broker_epoch=self._rm.broker_epoch)
            self._rm.broker_epoch = -1
            self.registered.clear()
        return resp

    async def alter_partition(self, tp: TopicPartition, leader_epoch: int, partition_epoch: int,
                              new_isr: tuple[int, ...], broker_epochs: dict[int, int]) -> AlterResult:
        """Send one AlterPartition; retry connection failures (bounded by request.timeout.ms)."""
        body = {
            "broker_id": self._rm.broker_id, "broker_epoch": self._rm.broker_epoch,
            "topics": [{"topic": tp.topic, "partitions": [{
                "partition": tp.partition, "leader_epoch": leader_epoch, "partition_epoch": partition_epoch,
                "new_isr": list(new_isr),
                "new_isr_broker_epochs": [{"broker_id": b, "broker_epoch": e} for b, e in broker_epochs.items()],
            }]}],
        }
        deadline = self._clock.monotonic_ms() + self._config.get_int("request.timeout.ms")
        while not self._closed:
            try:
                resp = await self._rpc.call(self._controller, "alter_partition", body)
                return _alter_result(resp, tp)
            except RpcError as exc:
                if self._clock.monotonic_ms() >= deadline:
                    log.warning("alter_partition_gave_up", topic=tp.topic, partition=tp.partition, error=str(exc))
                    break
                await asyncio.sleep(RETRY_BACKOFF_S)
        return AlterResult(ErrorCode.REQUEST_TIMED_OUT)

    async def allocate_producer_ids(self) -> ProducerIdBlock | None:
        """One ``allocate_producer_ids`` call (Kafka's AllocateProducerIds); None on any failure (the
        producer-id manager retries after a backoff). Needs a registration: the controller checks the epoch."""
        if self._rm.broker_epoch < 0 or self._closed:
            return None
        body = {"broker_id": self._rm.broker_id, "broker_epoch": self._rm.broker_epoch}
        try:
            resp = await self._rpc.call(self._controller, "allocate_producer_ids", body)
        except RpcError as exc:
            log.warning("allocate_producer_ids_failed", broker_id=self._rm.broker_id, error=str(exc))
            return None
        error = ErrorCode.of(_int(resp, "error"))
        start, length = _int(resp, "producer_id_start"), _int(resp, "producer_id_len")
        if error is not ErrorCode.NONE or start < 0 or length <= 0:
            log.warning("allocate_producer_ids_refused", broker_id=self._rm.broker_id, error=error.name,
                        broker_epoch=self._rm.broker_epoch)
            return None
        return ProducerIdBlock(start, length)

    async def controlled_shutdown(self) -> bool:
        """Ask the controller to move leadership away; bounded by controlled.shutdown.max.wait.ms.

        A failed call (no answer, an error status, an undecodable answer) is retried with a doubling
        backoff until the deadline, as Kafka's controlled.shutdown.max.retries with its backoff (and KRaft's
        broker, which keeps heartbeating with wantShutDown): one lost answer must not cost the cluster
        an unclean leader move."""
        if self._rm.broker_epoch < 0 or not self._config.get_bool("controlled.shutdown.enable"):
            return False
        self._want_shutdown = True
        deadline = self._clock.monotonic_ms() + self._config.get_int("controlled.shutdown.max.wait.ms")
        body = {"node_id": self._rm.broker_id, "broker_epoch": self._rm.broker_epoch}
        failures = 0
        while self._clock.monotonic_ms() < deadline:
            remaining_ms = deadline - self._clock.monotonic_ms()
            try:
                resp = await self._rpc.call(self._controller, "controlled_shutdown", body,
                                            timeout_s=max(0.1, min(remaining_ms, SHUTDOWN_CALL_TIMEOUT_MS) / 1000))
            except RpcError as exc:
                failures += 1
                log.warning("controlled_shutdown_failed", broker_id=self._rm.broker_id, error=str(exc),
                            attempt=failures)
                await self._sleep_until(deadline, _backoff_s(failures))
                continue
            failures = 0
            remaining = resp.get("remaining_partitions") or []
            if _int(resp, "error") == 0 and not remaining:
                log.info("controlled_shutdown_done", broker_id=self._rm.broker_id)
                return True
            await self._sleep_until(deadline, RETRY_BACKOFF_S)
        log.warning("controlled_shutdown_timed_out", broker_id=self._rm.broker_id)
        return False

    async def _sleep_until(self, deadline_ms: int, delay_s: float) -> None:
        """Sleep ``delay_s``, but not past ``deadline_ms``."""
        left_s = (deadline_ms - self._clock.monotonic_ms()) / 1000
        if left_s > 0:
            await asyncio.sleep(min(delay_s, left_s))


def _backoff_s(failures: int) -> float:
    """RETRY_BACKOFF_S after the first failure in a row, doubling up to MAX_RETRY_BACKOFF_S."""
    return float(min(MAX_RETRY_BACKOFF_S, RETRY_BACKOFF_S * 2 ** min(failures - 1, 10)))


def _int(obj: dict[str, Any], name: str, default: int = -1) -> int:
    value = obj.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _alter_result(resp: dict[str, Any], tp: TopicPartition) -> AlterResult:
    top = ErrorCode.of(_int(resp, "error", 0))
    if top is not ErrorCode.NONE:
        return AlterResult(top)
    for t in resp.get("topics") or []:
        if not isinstance(t, dict) or t.get("topic") != tp.topic:
            continue
        for p in t.get("partitions") or []:
            if isinstance(p, dict) and p.get("partition") == tp.partition:
                isr = p.get("isr") or []
                if not all(isinstance(b, int) for b in isr):
                    return AlterResult(ErrorCode.UNKNOWN_SERVER_ERROR)
                return AlterResult(ErrorCode.of(_int(p, "error", 0)), _int(p, "leader_epoch"), tuple(isr),
                                   _int(p, "partition_epoch"))
    return AlterResult(ErrorCode.UNKNOWN_SERVER_ERROR)
