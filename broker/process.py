"""One broker process: data dir, log manager, replica manager, fetchers, HTTP server, controller link.

Start-up: check/write ``meta.properties`` (refuse another node's data dir),
load the logs, listen, write ``<data-dir>/endpoint`` and ``<data-dir>/pid``,
register with the controller. The broker starts with no leadership.

SIGTERM/SIGINT: controlled shutdown (bounded), stop heartbeats, answer every
waiting request (retriable error), stop accepting and finish in-flight
requests, stop fetchers, write checkpoints, close logs; exit status 0. Each
step runs even if one before it failed (logged once).

Data dir failure (Kafka's LogDirFailureChannel and ``Exit.halt``): the first
I/O error on the data dir (any log operation, a checkpoint file, the epoch
checkpoint of a LeaderAndIsr, the periodic flush) makes the broker log one
``log_dir_failed`` line at level critical, naming the dir and the error, and
halt at once (``os._exit(1)``): no controlled shutdown, no more answers. A
broker has one data dir, so none is left online (Kafka halts then too): the
controller fences it after the session timeout and elects a leader from the
healthy ISR, which a broken leader can no longer shrink to itself. Late in a
shutdown (requests no longer served) the halt waits until the logs are closed
(see ``_dir_failed``). The halt is ``BrokerProcess(on_dir_failure=...)``;
in-process tests pass their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from broker.controller_link import ControllerLink
from broker.metadata_cache import MetadataCache
from broker.metrics import BrokerMetrics
from broker.producer_ids import ProducerIdManager
from broker.replica_manager import ReplicaManager
from broker.server import build_server
from common.clock import Clock, SystemClock
from common.config import Config
from common.digits import parse_digits
from common.fsutil import DirLockedError, lock_dir
from common.hostport import split_host_port
from common.logging import get_logger
from common.wire import HOST_RULE, MAX_INT32, is_cluster_id, is_host
from storage.checkpoint import read_properties, write_atomic

log = get_logger("broker")

META_FILE = "meta.properties"
DEFAULT_CLUSTER_ID = "minibroker"


class DataDirError(Exception):
    """The data dir cannot be used by this node (one readable line)."""


DIR_FAILURE_EXIT_STATUS = 1
DirFailureHandler = Callable[[Path, str], None]


def halt(data_dir: Path, error: str) -> None:
    """The broker process's answer to a failed data dir, once ``log_dir_failed`` is logged: Kafka's
    ``Exit.halt(1)``. No controlled shutdown and no clean-up: nothing more is written to a failing dir,
    and every request in flight is dropped (clients retry elsewhere)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(DIR_FAILURE_EXIT_STATUS)


@dataclass(frozen=True, slots=True)
class BrokerOptions:
    node_id: int
    listen_host: str
    listen_port: int
    controller: str
    data_dir: Path
    advertise: tuple[str, int] | None
    config: Config


def parse_host_port(text: str, what: str, *, allow_port_zero: bool) -> tuple[str, int]:
    """``HOST:PORT`` of flag ``what``; ``DataDirError`` (one line, naming the flag) when it is not one."""
    try:
        host, port = split_host_port(text, allow_port_zero=allow_port_zero)
    except ValueError as exc:
        raise DataDirError(f"{what}: {exc}") from None
    if not is_host(host):  # the controller would refuse the registration, and the broker retry it for ever
        raise DataDirError(f"{what}: the host must be a host name or IP address ({HOST_RULE}), got {host!r}")
    return host, port


def _shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for a one-line message, cut to ``limit`` characters."""
    return repr(text[:limit] + "..." if len(text) > limit else text)


def _unusable_meta(path: Path, data_dir: Path, what: str) -> DataDirError:
    return DataDirError(f"{path} has no usable node.id ({what}); if {data_dir} is not another broker's "
                        f"data dir, remove {path} and start again")


def check_meta(data_dir: Path, node_id: int) -> str | None:
    """Create the data dir and meta.properties, or refuse a dir that belongs to another node. -> the cluster
    id the dir belongs to, None until the first registration recorded one (``record_cluster_id``; a dir
    written before cluster ids says ``minibroker``, which counts as none)."""
    if os.path.lexists(data_dir) and not data_dir.is_dir():  # else mkdir's "[Errno 17] File exists"
        raise DataDirError(f"--data-dir {data_dir} exists and is not a directory")
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / META_FILE
    cluster_id: str | None = None
    existing = None
    if path.exists():
        try:
            props = read_properties(path)
        except UnicodeDecodeError:
            raise _unusable_meta(path, data_dir, "it is not UTF-8 text") from None
        except OSError as exc:
            raise DataDirError(f"cannot read {path}: {exc}") from None
        owner = props.get("node.id")
        if owner is None and "cluster.id" in props:
            raise DataDirError(f"{path} has a cluster.id and no node.id: {data_dir} looks like the controller's "
                               "data dir; give the broker a --data-dir of its own (or, if it is this broker's, "
                               "put its node.id back)")
        if owner is None:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise DataDirError(f"cannot read {path}: {exc}") from None
            raise _unusable_meta(path, data_dir, f"it holds {_shown(text.strip())}" if text.strip()
                                 else "the file is empty")
        owner_id = parse_digits(owner, MAX_INT32)
        if owner_id is None:
            raise _unusable_meta(path, data_dir, f"node.id={_shown(owner)} is not an integer in [0, {MAX_INT32}]")
        if owner_id != node_id:
            raise DataDirError(f"data dir {data_dir} belongs to node.id={owner}, not {node_id}")
        cluster_id = props.get("cluster.id")
        if cluster_id is not None and not is_cluster_id(cluster_id):
            raise DataDirError(f"{path} has an unusable cluster.id ({_shown(cluster_id)}); it names the cluster "
                               f"{data_dir} belongs to: restore it, or remove {path} to let the controller's "
                               "cluster take the dir")
        with contextlib.suppress(OSError, UnicodeDecodeError):
            existing = path.read_text(encoding="utf-8")
    _write_meta(path, node_id, cluster_id, existing)
    return None if cluster_id == DEFAULT_CLUSTER_ID else cluster_id


def record_cluster_id(data_dir: Path, node_id: int, cluster_id: str) -> None:
    """The cluster a data dir now belongs to, in its meta.properties (at the first registration)."""
    _write_meta(data_dir / META_FILE, node_id, cluster_id, None)


def _write_meta(path: Path, node_id: int, cluster_id: str | None, existing: str | None) -> None:
    wanted = f"version=1\nnode.id={node_id}\n" + (f"cluster.id={cluster_id}\n" if cluster_id is not None else "")
    if existing == wanted:  # as Kafka, not written again at every start: a full disk then halts on the logs
        return
    try:
        write_atomic(path, wanted)
    except OSError as exc:  # write_atomic removed its temp file
        raise DataDirError(f"cannot write {path}: {exc.strerror or exc}") from None


class BrokerProcess:
    def __init__(self, opts: BrokerOptions, clock: Clock | None = None,
                 log_manager_factory: Callable[[Path, Config, Clock], Any] | None = None,
                 on_dir_failure: DirFailureHandler | None = None) -> None:
        self.opts = opts
        self._log_manager_factory = log_manager_factory
        self.clock = clock or SystemClock()
        self.rm: ReplicaManager | None = None
        self.link: ControllerLink | None = None
        self._runner: web.ServerRunner | None = None
        self._lock_fd: int | None = None
        self.address = ""
        self._on_dir_failure = on_dir_failure or halt  # called once, with (data dir, error)
        self.dir_failure: tuple[Path, str] | None = None  # the data dir's first I/O failure
        self._stopping = False
        self._halt_after_stop = False

    async def start(self) -> None:
        o = self.opts
        cluster_id = check_meta(o.data_dir, o.node_id)
        try:
            self._lock_fd = lock_dir(o.data_dir, "broker")
        except DirLockedError as exc:
            raise DataDirError(str(exc)) from None
        try:
            await self._start(cluster_id)
        except BaseException:
            self._unlock()
            raise

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _start(self, cluster_id: str | None) -> None:
        from fetcher.manager import ReplicaFetcherManager

        o = self.opts
        factory = self._log_manager_factory
        if factory is None:
            from storage.log_manager import LogManager
            factory = LogManager
        from storage.log import StorageError

        log_manager = factory(o.data_dir, o.config, self.clock)
        log_manager.on_dir_failure = self._dir_failed
        try:
            await log_manager.load()
        except StorageError as exc:  # names the partition dir and the error: one line, as Kafka's fatal
            raise DataDirError(f"cannot load the logs: {exc}") from None
        rm = ReplicaManager(o.node_id, o.config, self.clock, log_manager,
                            MetadataCache(cluster_id or DEFAULT_CLUSTER_ID), BrokerMetrics())
        rm.fetcher = ReplicaFetcherManager(rm, o.config, self.clock, registry=rm.metrics.registry)
        # retention never deletes past the HW; the manager's periodic flush/retention/checkpoints run here
        log_manager.high_watermarks = rm.high_watermarks
        log_manager.start()
        self.rm = rm
        idle_s = o.config.get_int("connections.max.idle.ms") / 1000
        self._runner = web.ServerRunner(build_server(rm, access_log=None, keepalive_timeout=idle_s),
                                        handle_signals=False, shutdown_timeout=5.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, o.listen_host, o.listen_port, backlog=1024)
        await site.start()
        port = self._runner.addresses[0][1]
        host, adv_port = o.advertise if o.advertise else (o.listen_host, port)
        if o.advertise and o.advertise[1] == 0:
            adv_port = port
        self.address = f"{host}:{adv_port}"
        await rm.start()
        self.link = ControllerLink(rm, o.controller, host, adv_port, o.config, self.clock, cluster_id=cluster_id)
        self.link.on_cluster_id = self._record_cluster_id
        rm.alter_sender = self.link
        rm.producer_ids = ProducerIdManager(self.link.allocate_producer_ids, self.clock)
        self.link.on_registered = rm.producer_ids.prefetch
        await self.link.start()
        write_atomic(o.data_dir / "endpoint", f"{o.listen_host}:{port}\n")
        write_atomic(o.data_dir / "pid", f"{os.getpid()}\n")
        log.info("broker_started", broker_id=o.node_id, endpoint=f"{o.listen_host}:{port}", advertised=self.address,
                 data_dir=str(o.data_dir), controller=o.controller)

    def _record_cluster_id(self, cluster_id: str) -> None:
        """The first registration named the cluster this data dir now belongs to: recorded, so that a later
        start registering with another cluster's controller is refused (INCONSISTENT_CLUSTER_ID)."""
        assert self.rm is not None
        try:
            record_cluster_id(self.opts.data_dir, self.opts.node_id, cluster_id)
        except DataDirError as exc:
            self._dir_failed(self.opts.data_dir, str(exc))
            return
        self.rm.metadata.cluster_id = cluster_id
        log.info("cluster_id_recorded", broker_id=self.opts.node_id, cluster_id=cluster_id)

    def _dir_failed(self, data_dir: Path, error: str) -> None:
        """The data dir failed (the ``LogManager`` reports its first I/O error): log it, then halt.

        Once ``stop`` has stopped serving requests (the last part of a shutdown: fetchers, checkpoints,
        closing the logs) the halt waits until ``stop`` has closed what it can. That keeps data safest
        there: no request is served any more and leadership has been handed off, so nothing new is
        accepted; what is left is fsyncing the other logs' unflushed appends (acknowledged with acks=1, or
        by every replica of a partition) and writing their recovery points. A log whose own I/O failed is
        not flushed again and keeps its older recovery point (recovery re-validates it at the next start),
        so going on cannot make anything on disk look more durable than it is. Before that point (also
        during the controlled shutdown, while this broker may still lead) it halts at once, as Kafka."""
        if self.dir_failure is not None:
            return
        self.dir_failure = (data_dir, error)
        log.critical("log_dir_failed", broker_id=self.opts.node_id, data_dir=str(data_dir), error=error,
                     action="exit after closing the logs" if self._stopping else "halt",
                     message=f"halting the broker: its only log dir {data_dir} has failed")
        if self._stopping:
            self._halt_after_stop = True
            return
        self._on_dir_failure(data_dir, error)

    async def stop(self) -> None:
        """Stop (see the module doc); every step runs even if an earlier one failed. A data dir failure
        after the HTTP server stopped ends the stop with the halt (non-zero exit) once the logs are closed."""
        rm = self.rm
        if rm is not None:
            rm.shutting_down = True
        if rm is not None and rm.producer_ids is not None:
            await self._step("producer_ids_close", rm.producer_ids.close)
        if self.link is not None:
            await self._step("controlled_shutdown", self.link.controlled_shutdown)
            await self._step("controller_link_close", self.link.close)
        if rm is not None:
            rm.stop_waiting()
        if self._runner is not None:
            await self._step("http_server_close", self._runner.cleanup)
        self._stopping = True  # no request is served from here on: a dir failure halts after the logs close
        if rm is not None:
            await self._step("replica_manager_shutdown", rm.shutdown)
            log.info("broker_stopped", broker_id=self.opts.node_id)
        self._unlock()
        if self._halt_after_stop and self.dir_failure is not None:
            self._halt_after_stop = False
            self._on_dir_failure(*self.dir_failure)

    async def _step(self, name: str, step: Callable[[], Any]) -> None:
        try:
            await step()
        except Exception as exc:
            log.exception("shutdown_step_failed", broker_id=self.opts.node_id, step=name, error=str(exc))


async def run(opts: BrokerOptions) -> int:
    proc = BrokerProcess(opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await proc.start()
        await stop.wait()
    finally:
        await proc.stop()
    return 0
