"""Start and stop real minibroker processes for integration tests.

``start_broker`` / ``start_controller`` launch ``python -m cli.main ...`` with
``--listen 127.0.0.1:0``, wait for ``<data-dir>/endpoint`` and return a
``Proc``; stderr (structlog JSON lines) goes to ``<data-dir>.stderr.log``.
``Procs`` tracks everything a test started and stops it in ``close()`` (use the
``procs`` fixture or ``with Procs() as procs``). Processes are only ever
stopped by their own PID.

Disk faults without root: ``spawn_piped`` / ``Procs.broker_piped`` run a
process whose stderr reaches the same log file through a pipe, so a file-size
limit (RLIMIT_FSIZE, which does not apply to pipes) makes its data writes fail
with EFBIG (SIGXFSZ ignored) but never its logging: from the start
(``fsize_limit``) or later (``limit_file_size``, on a running process).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


# Settings for a fast-failing-over test cluster of real processes: fenced after 2 s of silence, short fetch
# waits and timeouts, a bounded controlled shutdown.
SESSION_MS = 2000
HEARTBEAT_MS = 300
CONTROLLER_SETS = {"broker.session.timeout.ms": SESSION_MS,
                   "auto.leader.rebalance.enable": False}
BROKER_SETS = {"broker.heartbeat.interval.ms": HEARTBEAT_MS, "broker.session.timeout.ms": SESSION_MS,
               "replica.fetch.wait.max.ms": 200, "request.timeout.ms": 5000, "replica.fetch.backoff.ms": 200,
               "replica.socket.timeout.ms": 3000, "controlled.shutdown.max.wait.ms": 3000}


@dataclass
class Proc:
    role: str
    args: list[str]
    data_dir: Path
    stderr_path: Path
    popen: subprocess.Popen[bytes]
    address: str = ""
    node_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def logs(self) -> list[dict[str, Any]]:
        """The structlog JSON events written so far (non-JSON lines are skipped)."""
        out = []
        for line in self.stderr_text().splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]


def _settings(sets: Mapping[str, Any] | None) -> list[str]:
    out: list[str] = []
    for k, v in (sets or {}).items():
        out += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


def spawn(role: str, args: list[str], data_dir: Path, *, wait: bool = True,
          env: Mapping[str, str] | None = None, piped: bool = False, fsize_limit: int | None = None) -> Proc:
    """Run ``python -m cli.main <args>``, its stderr appended to ``<data-dir>.stderr.log``; with ``wait``,
    block until ``<data-dir>/endpoint`` appears. With ``piped`` the stderr goes there through a pipe copied by
    a thread (a pipe is not limited by RLIMIT_FSIZE); with ``fsize_limit`` (piped too) the process runs under
    that RLIMIT_FSIZE from its start (see the module doc)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    endpoint = data_dir / "endpoint"
    with contextlib.suppress(FileNotFoundError):
        endpoint.unlink()
    stderr_path = data_dir.parent / f"{data_dir.name}.stderr.log"
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env.update(env or {})
    argv = [sys.executable, "-m", "cli.main", *args] if fsize_limit is None else \
        [sys.executable, "-c", _UNDER_FSIZE_LIMIT, str(fsize_limit), *args]
    extra: dict[str, Any] = {}
    if piped or fsize_limit is not None:
        popen = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, env=full_env)
        assert popen.stderr is not None
        extra["pump"] = pump = threading.Thread(target=_copy_lines, args=(popen.stderr, stderr_path), daemon=True,
                                                name=f"stderr-{role}-{popen.pid}")
        pump.start()
    else:
        with open(stderr_path, "ab") as err:
            popen = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=err, env=full_env)
    proc = Proc(role, args, data_dir, stderr_path, popen, extra=extra)
    if wait:
        try:
            proc.address = wait_endpoint(proc)
        except BaseException:
            kill(proc)
            raise
    return proc


# Runs cli.main under RLIMIT_FSIZE = argv[1]; SIGXFSZ ignored (kept across exec), so a write past the limit
# fails with EFBIG instead of killing the process.
_UNDER_FSIZE_LIMIT = ("import os, resource, signal, sys\n"
                      "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                      "limit = int(sys.argv[1])\n"
                      "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
                      "os.execv(sys.executable, [sys.executable, '-m', 'cli.main', *sys.argv[2:]])\n")


def spawn_piped(role: str, args: list[str], data_dir: Path, *, fsize_limit: int | None = None, wait: bool = True,
                env: Mapping[str, str] | None = None) -> Proc:
    """``spawn`` with its stderr through a pipe (and ``fsize_limit``)."""
    return spawn(role, args, data_dir, wait=wait, env=env, piped=True, fsize_limit=fsize_limit)


def _copy_lines(src: Any, path: Path) -> None:
    with src, open(path, "ab") as out:
        for line in iter(src.readline, b""):
            out.write(line)
            out.flush()


def limit_file_size(proc: Proc, limit: int) -> None:
    """Set RLIMIT_FSIZE of a running process (``prlimit``): its writes past ``limit`` bytes of any file fail
    with EFBIG (Python ignores SIGXFSZ). Start it with ``spawn_piped``, or its log file is limited too."""
    hard = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)[1]
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, hard))


def wait_exit(proc: Proc, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Wait for the process to exit by itself and for its piped stderr to be copied; its exit status."""
    code = proc.popen.wait(timeout_s)
    pump = proc.extra.get("pump")
    if isinstance(pump, threading.Thread):
        pump.join(10)
    return code


def wait_endpoint(proc: Proc, timeout_s: float = START_TIMEOUT_S) -> str:
    path = proc.data_dir / "endpoint"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text().strip()
            if text:
                return text
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.role} exited with {proc.popen.returncode} before listening:\n"
                               f"{proc.stderr_text()[-3000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"{proc.role} did not write {path} within {timeout_s}s:\n{proc.stderr_text()[-3000:]}")


def start_broker(node_id: int, data_dir: Path, controller: str, *, sets: Mapping[str, Any] | None = None,
                 advertise: str | None = None, wait: bool = True) -> Proc:
    args = ["broker", "--node-id", str(node_id), "--listen", "127.0.0.1:0", "--controller", controller,
            "--data-dir", str(data_dir), *_settings(sets)]
    if advertise:
        args += ["--advertise", advertise]
    proc = spawn("broker", args, data_dir, wait=wait)
    proc.node_id = node_id
    return proc


def start_controller(data_dir: Path, *, sets: Mapping[str, Any] | None = None, wait: bool = True) -> Proc:
    args = ["controller", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), *_settings(sets)]
    return spawn("controller", args, data_dir, wait=wait)


def stop(proc: Proc, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit status."""
    if proc.popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill(proc)
    return proc.popen.wait()


def kill(proc: Proc) -> None:
    if proc.popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(10)


def pause(proc: Proc) -> None:
    os.kill(proc.pid, signal.SIGSTOP)


def resume(proc: Proc) -> None:
    os.kill(proc.pid, signal.SIGCONT)


class Procs:
    """Everything a test started; ``close()`` stops it all (SIGCONT first, then SIGTERM, then SIGKILL)."""

    def __init__(self) -> None:
        self.all: list[Proc] = []

    def broker(self, node_id: int, data_dir: Path, controller: str, **kw: Any) -> Proc:
        proc = start_broker(node_id, data_dir, controller, **kw)
        self.all.append(proc)
        return proc

    def broker_piped(self, node_id: int, data_dir: Path, controller: str, *, sets: Mapping[str, Any] | None = None,
                     fsize_limit: int | None = None, wait: bool = True) -> Proc:
        """``broker`` through ``spawn_piped`` (see the module doc)."""
        args = ["broker", "--node-id", str(node_id), "--listen", "127.0.0.1:0", "--controller", controller,
                "--data-dir", str(data_dir), *_settings(sets)]
        proc = spawn_piped("broker", args, data_dir, fsize_limit=fsize_limit, wait=wait)
        proc.node_id = node_id
        self.all.append(proc)
        return proc

    def controller(self, data_dir: Path, **kw: Any) -> Proc:
        proc = start_controller(data_dir, **kw)
        self.all.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.all:
            with contextlib.suppress(ProcessLookupError):
                if proc.alive():
                    os.kill(proc.pid, signal.SIGCONT)
        # Brokers first (in parallel), then the rest: a broker's controlled shutdown needs the controller,
        # and retries until controlled.shutdown.max.wait.ms if it is gone (what `cluster down` does too)
        brokers = [p for p in self.all if p.role == "broker"]
        for group in (brokers, [p for p in self.all if p.role != "broker"]):
            for proc in group:
                if proc.alive():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for proc in group:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.all:
            kill(proc)

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            kill(p)
