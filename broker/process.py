"""One broker process: data dir, log manager, replica manager, fetchers, HTTP server, controller link.

Start-up: check/write ``meta.properties`` (refuse another node's data dir),
load the logs, listen, write ``<data-dir>/endpoint`` and ``<data-dir>/pid``,
register with the controller. The broker starts with no leadership.

SIGTERM/SIGINT: controlled shutdown (bounded), stop heartbeats, answer every
waiting request (retriable error), stop accepting and finish in-flight
requests, stop fetchers, write checkpoints, close logs; exit status 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
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
from common.wire import MAX_INT32
from storage.checkpoint import read_properties, write_atomic

log = get_logger("broker")

META_FILE = "meta.properties"
DEFAULT_CLUSTER_ID = "minibroker"


class DataDirError(Exception):
    """The data dir cannot be used by this node (one readable line)."""


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
        return split_host_port(text, allow_port_zero=allow_port_zero)
    except ValueError as exc:
        raise DataDirError(f"{what}: {exc}") from None


def _shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for a one-line message, cut to ``limit`` characters."""
    return repr(text[:limit] + "..." if len(text) > limit else text)


def _unusable_meta(path: Path, data_dir: Path, what: str) -> DataDirError:
    return DataDirError(f"{path} has no usable node.id ({what}); if {data_dir} is not another broker's "
                        f"data dir, remove {path} and start again")


def check_meta(data_dir: Path, node_id: int) -> str:
    """Create the data dir and meta.properties, or refuse a dir that belongs to another node. -> cluster id."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / META_FILE
    cluster_id = DEFAULT_CLUSTER_ID
    if path.exists():
        try:
            props = read_properties(path)
        except UnicodeDecodeError:
            raise _unusable_meta(path, data_dir, "it is not UTF-8 text") from None
        except OSError as exc:
            raise DataDirError(f"cannot read {path}: {exc}") from None
        owner = props.get("node.id")
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
        cluster_id = props.get("cluster.id", cluster_id)
    write_atomic(path, f"version=1\nnode.id={node_id}\ncluster.id={cluster_id}\n")
    return cluster_id


class BrokerProcess:
    def __init__(self, opts: BrokerOptions, clock: Clock | None = None,
                 log_manager_factory: Callable[[Path, Config, Clock], Any] | None = None) -> None:
        self.opts = opts
        self._log_manager_factory = log_manager_factory
        self.clock = clock or SystemClock()
        self.rm: ReplicaManager | None = None
        self.link: ControllerLink | None = None
        self._runner: web.ServerRunner | None = None
        self._lock_fd: int | None = None
        self.address = ""

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

    async def _start(self, cluster_id: str) -> None:
        from fetcher.manager import ReplicaFetcherManager

        o = self.opts
        factory = self._log_manager_factory
        if factory is None:
            from storage.log_manager import LogManager
            factory = LogManager
        log_manager = factory(o.data_dir, o.config, self.clock)
        await log_manager.load()
        rm = ReplicaManager(o.node_id, o.config, self.clock, log_manager, MetadataCache(cluster_id),
                            BrokerMetrics())
        rm.fetcher = ReplicaFetcherManager(rm, o.config, self.clock, registry=rm.metrics.registry)
        # retention never deletes past the HW; the manager's periodic flush/retention/checkpoints run here
        log_manager.high_watermarks = rm.high_watermarks
        log_manager.start()
        self.rm = rm
        self._runner = web.ServerRunner(build_server(rm, access_log=None), handle_signals=False, shutdown_timeout=5.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, o.listen_host, o.listen_port, backlog=1024)
        await site.start()
        port = self._runner.addresses[0][1]
        host, adv_port = o.advertise if o.advertise else (o.listen_host, port)
        if o.advertise and o.advertise[1] == 0:
            adv_port = port
        self.address = f"{host}:{adv_port}"
        await rm.start()
        self.link = ControllerLink(rm, o.controller, host, adv_port, o.config, self.clock)
        rm.alter_sender = self.link
        rm.producer_ids = ProducerIdManager(self.link.allocate_producer_ids, self.clock)
        self.link.on_registered = rm.producer_ids.prefetch
        await self.link.start()
        write_atomic(o.data_dir / "endpoint", f"{o.listen_host}:{port}\n")
        write_atomic(o.data_dir / "pid", f"{os.getpid()}\n")
        log.info("broker_started", broker_id=o.node_id, endpoint=f"{o.listen_host}:{port}", advertised=self.address,
                 data_dir=str(o.data_dir), controller=o.controller)

    async def stop(self) -> None:
        rm = self.rm
        if rm is not None and rm.producer_ids is not None:
            await rm.producer_ids.close()
        if self.link is not None:
            await self.link.controlled_shutdown()
            await self.link.close()
        if rm is not None:
            rm.stop_waiting()
        if self._runner is not None:
            await self._runner.cleanup()
        if rm is not None:
            await rm.shutdown()
            log.info("broker_stopped", broker_id=self.opts.node_id)
        self._unlock()


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
