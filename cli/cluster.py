"""``minibroker cluster``: a local cluster of real processes on 127.0.0.1.

``cluster up`` starts ``minibroker controller`` on the base port and
``minibroker broker`` i (1..N) on base port + i, each with its own data dir
and log file under ``--data-dir``, records them in ``<data-dir>/cluster.json``
and waits until the controller's ``/v1/status`` lists every broker as
registered and unfenced. ``status``, ``down``, ``kill`` and ``start`` work from
that file. A recorded pid is only signalled while ``/proc/<pid>/cmdline`` still
shows the member's data dir, so a recycled pid is never hit.

Layout of ``<data-dir>``::

    cluster.json             members, ports, pids, commands (rewritten via temp file + rename)
    .lock                    held (flock) by up, start, kill, down and chaos restarts around
                             reading cluster.json, starting or signalling members, and saving it
    controller/, controller.log
    broker-<i>/, broker-<i>.log
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

from cli.main import CliError
from common import fsutil
from common.cli_args import non_negative_float, port, positive, positive_float
from common.config import ConfigError, broker_config, controller_config, parse_assignments
from common.http import RpcClient, RpcError

DEFAULT_BASE_PORT = 9090
DEFAULT_HOST = "127.0.0.1"
CLUSTER_FILE = "cluster.json"
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "STOP": signal.SIGSTOP, "CONT": signal.SIGCONT}


def default_data_dir() -> Path:
    return Path(os.environ.get("MINIBROKER_DATA_DIR") or "./minibroker-data")


@dataclass(frozen=True, slots=True)
class Member:
    name: str  # "controller" or "broker-<i>"
    kind: str  # "controller" | "broker"
    node_id: int | None
    host: str
    port: int
    data_dir: str
    log: str
    pid: int | None = None
    netns: str | None = None  # run inside this network namespace (`ip netns exec`; chaos partition faults)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    data_dir: str
    host: str
    base_port: int
    members: tuple[Member, ...]
    settings: tuple[str, ...] = ()  # --set key=value passed to every broker
    controller_settings: tuple[str, ...] = ()  # --controller-set key=value passed to the controller
    exec_argv: tuple[str, ...] = ()  # how to run `minibroker` (default: this interpreter's)

    @property
    def controller(self) -> Member:
        return next(m for m in self.members if m.kind == "controller")

    @property
    def brokers(self) -> list[Member]:
        return [m for m in self.members if m.kind == "broker"]

    @property
    def bootstrap(self) -> str:
        return ",".join(m.address for m in self.brokers)

    def member(self, ident: str) -> Member:
        """``controller``, ``broker-2`` or ``2``."""
        key = ident.strip()
        for m in self.members:
            if key == m.name or (m.node_id is not None and key == str(m.node_id)):  # the controller has no id
                return m
        names = ", ".join(["controller", *(str(m.node_id) for m in self.brokers)])
        raise CliError(f"no cluster member {ident!r} (known: {names})")

    def with_member(self, member: Member) -> ClusterSpec:
        return replace(self, members=tuple(member if m.name == member.name else m for m in self.members))


def plan(data_dir: Path, brokers: int, base_port: int, host: str = DEFAULT_HOST,
         settings: Sequence[str] = (), controller_settings: Sequence[str] = (),
         exec_argv: Sequence[str] = ()) -> ClusterSpec:
    """The members of a cluster (pure)."""
    if brokers < 1:
        raise CliError(f"--brokers must be >= 1, got {brokers}")
    if base_port < 1 or base_port + brokers > 65535:
        raise CliError(f"--base-port {base_port} leaves no room for {brokers} brokers")
    check_settings(settings, controller_settings)
    root = data_dir.resolve()
    members = [Member("controller", "controller", None, host, base_port, str(root / "controller"),
                      str(root / "controller.log"))]
    for i in range(1, brokers + 1):
        members.append(Member(f"broker-{i}", "broker", i, host, base_port + i, str(root / f"broker-{i}"),
                              str(root / f"broker-{i}.log")))
    return ClusterSpec(str(root), host, base_port, tuple(members), tuple(settings), tuple(controller_settings),
                       tuple(exec_argv))


def check_settings(settings: Sequence[str], controller_settings: Sequence[str]) -> None:
    """``--set`` / ``--controller-set`` items the members would refuse, refused before anything starts; and a
    controller session timeout the brokers' heartbeat interval cannot keep alive (they would be fenced and
    unfenced again and again)."""
    resolved = []
    for flag, items, resolve in (("--set", settings, broker_config),
                                 ("--controller-set", controller_settings, controller_config)):
        try:
            resolved.append(resolve(parse_assignments(items)))
        except ConfigError as exc:
            raise CliError(f"{flag}: {exc}") from None
    interval = resolved[0].get_int("broker.heartbeat.interval.ms")
    session = resolved[1].get_int("broker.session.timeout.ms")
    if interval >= session:
        raise CliError(f"--controller-set: broker.session.timeout.ms ({session}) must be above the brokers' "
                       f"broker.heartbeat.interval.ms ({interval}; set it with --set)")


def minibroker_argv(python: str = sys.executable) -> list[str]:
    """How to run the ``minibroker`` CLI with this interpreter.

    Not ``python -m cli.main``: run that way, ``cli.main`` is loaded twice (as ``__main__`` and as
    ``cli.main``), so the ``CliError`` a subcommand raises is not the class ``main`` catches.
    """
    script = Path(python).parent / "minibroker"
    if script.is_file():
        return [python, str(script)]
    return [python, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def command(spec: ClusterSpec, m: Member, python: str = sys.executable) -> list[str]:
    """The argv that starts ``m`` (the same ``minibroker`` CLI, via this interpreter)."""
    base = list(spec.exec_argv) or minibroker_argv(python)
    if m.kind == "controller":
        argv = [*base, "controller", "--listen", m.address, "--data-dir", m.data_dir]
        settings = spec.controller_settings
    else:
        argv = [*base, "broker", "--node-id", str(m.node_id), "--listen", m.address,
                "--controller", spec.controller.address, "--data-dir", m.data_dir]
        settings = spec.settings
    for item in settings:
        argv += ["--set", item]
    if m.netns:  # `ip netns exec` execs the command: the pid stays the member's
        argv = ["ip", "netns", "exec", m.netns, *argv]
    return argv


# -- cluster.json ----------------------------------------------------------------------------------

def save(spec: ClusterSpec) -> None:
    path = Path(spec.data_dir) / CLUSTER_FILE
    doc = {"version": 1, "data_dir": spec.data_dir, "host": spec.host, "base_port": spec.base_port,
           "settings": list(spec.settings), "controller_settings": list(spec.controller_settings),
           "exec": list(spec.exec_argv), "controller": spec.controller.address, "bootstrap": spec.bootstrap,
           "members": [{**asdict(m), "address": m.address, "command": command(spec, m)} for m in spec.members]}
    # a temp name of its own: two writers never share (or rename away) one temp file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{CLUSTER_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load(data_dir: Path) -> ClusterSpec:
    path = data_dir / CLUSTER_FILE
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise CliError(f"no cluster in {data_dir} (no {CLUSTER_FILE}); start one with `minibroker cluster up`"
                       ) from None
    except OSError as exc:
        if data_dir.exists() and not data_dir.is_dir():
            raise CliError(f"{data_dir} is not a directory (--data-dir, or $MINIBROKER_DATA_DIR, names the "
                           "cluster directory)") from None
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{path} is not a valid cluster file: not JSON ({exc})") from None
    try:
        return _spec_from_doc(doc)
    except _BadClusterFile as exc:
        raise CliError(f"{path} is not a valid cluster file: {exc}") from None


class _BadClusterFile(Exception):
    pass


def _is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _strings(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    value = doc.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _BadClusterFile(f"{key!r} is not a list of strings")
    return tuple(value)


def _spec_from_doc(doc: Any) -> ClusterSpec:
    """A ``ClusterSpec`` from a parsed cluster.json, checking the type of every field it uses (the file may
    be hand-edited): ``_BadClusterFile`` says what is wrong in plain words."""
    if not isinstance(doc, dict):
        raise _BadClusterFile("it is not a JSON object")
    for key in ("data_dir", "host"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise _BadClusterFile(f"{key!r} is missing or not a non-empty string")
    if not _is_int(doc.get("base_port")):
        raise _BadClusterFile("'base_port' is missing or not an integer")
    raw_members = doc.get("members")
    if not isinstance(raw_members, list) or not raw_members:
        raise _BadClusterFile("'members' is missing or not a non-empty list")
    members = tuple(_member_from_doc(i, m) for i, m in enumerate(raw_members, 1))
    if sum(m.kind == "controller" for m in members) != 1:
        raise _BadClusterFile("it needs exactly one member of kind 'controller'")
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise _BadClusterFile("two members have the same name")
    return ClusterSpec(doc["data_dir"], doc["host"], doc["base_port"], members, _strings(doc, "settings"),
                       _strings(doc, "controller_settings"), _strings(doc, "exec"))


def _member_from_doc(i: int, m: Any) -> Member:
    if not isinstance(m, dict):
        raise _BadClusterFile(f"member {i} is not a JSON object")
    label = f"member {i}" + (f" ({m['name']})" if isinstance(m.get("name"), str) else "")
    # data_dir must not be empty: is_running matches it against a pid's command line
    for key in ("name", "host", "data_dir", "log"):
        if not isinstance(m.get(key), str) or not m[key]:
            raise _BadClusterFile(f"{label} has no {key} (a non-empty string)")
    if m.get("kind") not in ("controller", "broker"):
        raise _BadClusterFile(f"{label} has kind {m.get('kind')!r}; expected 'controller' or 'broker'")
    node_id = m.get("node_id")
    if m["kind"] == "broker" and not (_is_int(node_id) and node_id >= 0):
        raise _BadClusterFile(f"{label} has no integer node_id")
    if m["kind"] == "controller" and node_id is not None:
        raise _BadClusterFile(f"{label} is the controller and must have node_id null")
    if not (_is_int(m.get("port")) and 1 <= m["port"] <= 65535):
        raise _BadClusterFile(f"{label} has no port (an integer 1-65535)")
    pid = m.get("pid")
    if pid is not None and not (_is_int(pid) and 0 < pid < 2**31):
        raise _BadClusterFile(f"{label} has no integer pid (a positive integer, or null when not started)")
    netns = m.get("netns")
    if netns is not None and (not isinstance(netns, str) or not netns):
        raise _BadClusterFile(f"{label} has a netns that is not a non-empty string")
    return Member(name=m["name"], kind=m["kind"], node_id=node_id, host=m["host"], port=m["port"],
                  data_dir=m["data_dir"], log=m["log"], pid=pid, netns=netns)


# -- processes -------------------------------------------------------------------------------------

def is_running(m: Member) -> bool:
    """True if ``m.pid`` is alive and still is this member (its cmdline names the member's data dir)."""
    if not m.pid:
        return False
    child = _CHILDREN.get(m.pid)
    if child is not None:  # started by this process: the handle knows (also right after fork, before exec)
        return child.poll() is None
    try:
        cmdline = Path(f"/proc/{m.pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(m.pid, 0)
        except OSError:
            return False
        return True
    return m.data_dir.encode() in cmdline.split(b"\0")


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def spawn(spec: ClusterSpec, m: Member) -> Member:
    """Start ``m`` in its own session (Ctrl-C reaches only ``cluster up``); returns it with its pid."""
    if not m.netns and not port_free(m.host, m.port):
        raise CliError(f"port {m.port} ({m.name}) is already in use; is another cluster running? "
                       f"(`minibroker cluster down`, or pick --base-port)")
    Path(m.data_dir).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = command(spec, m)
    with open(m.log, "ab") as logf:
        _LOG_START[m.log] = logf.tell()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        except OSError as exc:
            raise CliError(f"cannot start {m.name}: {argv[0]}: {exc.strerror or exc}") from None
    _CHILDREN[proc.pid] = proc
    return replace(m, pid=proc.pid)


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # processes this process started (for reaping)
_LOG_START: dict[str, int] = {}  # log file -> its size when this process started the member


def reap() -> None:
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def exited(m: Member) -> int | None:
    """The exit status if ``m`` was started by this process and has exited."""
    proc = _CHILDREN.get(m.pid or -1)
    return None if proc is None else proc.poll()


def send_signal(m: Member, sig: signal.Signals) -> bool:
    if not is_running(m):
        return False
    assert m.pid is not None
    try:
        os.kill(m.pid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_members(members: Sequence[Member], timeout_s: float = 20.0) -> list[str]:
    """SIGTERM (after SIGCONT), wait up to ``timeout_s``, then SIGKILL; returns names that needed SIGKILL."""
    running = [m for m in members if is_running(m)]
    for m in running:
        send_signal(m, signal.SIGCONT)
        send_signal(m, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reap()
        running = [m for m in running if is_running(m)]
        if not running:
            return []
        time.sleep(0.1)
    for m in running:
        send_signal(m, signal.SIGKILL)
    end = time.monotonic() + 5
    while time.monotonic() < end and any(is_running(m) for m in running):
        reap()
        time.sleep(0.05)
    return [m.name for m in running]


def stop_cluster(spec: ClusterSpec, timeout_s: float = 40.0, controller_timeout_s: float | None = None) -> list[str]:
    """Stop every member of ``spec``: the brokers first, then the controller, as Kafka's docs advise (a
    broker's controlled shutdown asks the controller to move its leaderships away: with the controller gone it
    fails, connection refused). The brokers get ``timeout_s``, the controller ``controller_timeout_s`` (default
    the same) before SIGKILL; returns the names that needed SIGKILL. Every command that stops a whole cluster
    (``down``, Ctrl-C on ``up``, a failed ``up``, ``demo``, ``chaos run``) stops it through here."""
    killed = stop_members(spec.brokers, timeout_s=timeout_s)
    killed += stop_members([spec.controller], timeout_s=timeout_s if controller_timeout_s is None
                           else controller_timeout_s)
    return killed


# -- the cluster lock and signals ------------------------------------------------------------------

LOCK_WAIT_S = 30.0


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


@contextlib.contextmanager
def cluster_lock(data_dir: Path, wait_s: float = LOCK_WAIT_S, required: bool = True) -> Iterator[None]:
    """Hold ``<data-dir>/.lock`` (``common.fsutil.lock_dir``: flock, exclusive) around a read-modify-write of
    cluster.json and the processes it records (``up``, ``start``, ``kill``, ``down``, chaos restarts), so two
    commands never start one member twice or lose a recorded pid. Waits up to ``wait_s`` for another holder;
    then ``CliError``, or, unless ``required``, goes on without the lock (a stop that must happen anyway). No
    lock when ``data_dir`` is not a directory: ``load`` then says what is wrong."""
    if not data_dir.is_dir():
        yield
        return
    lock_path = data_dir / fsutil.LOCK_NAME
    deadline = time.monotonic() + wait_s
    fd: int | None = None
    while fd is None:
        try:
            fd = fsutil.lock_dir(data_dir, "minibroker cluster")
        except fsutil.DirLockedError:
            pass
        except OSError as exc:
            if required:
                raise CliError(f"cannot lock {lock_path}: {exc.strerror or exc}") from None
            break
        if fd is not None and not _same_file(fd, lock_path):
            os.close(fd)  # removed by a failed `up` that had created it, while we waited: lock the new one
            fd = None
        if fd is None:
            if time.monotonic() >= deadline:
                if required:
                    raise CliError(f"{data_dir} is in use by another minibroker command (it holds {lock_path}: "
                                   "a `cluster up` still starting, or a `cluster down` still stopping?); "
                                   "try again", status=1)
                break
            time.sleep(0.05)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _note(text: str) -> None:
    """A line on stderr from a signal handler: ``os.write``, as ``print`` there may be a reentrant call."""
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode())


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deferred_signals(note: str | None = None) -> Iterator[list[int]]:
    """Hold SIGINT, SIGTERM and SIGHUP while a few steps that must not be cut in two run (start a member and
    record its pid; stop what a command started); when they are done the first one held is passed on, once,
    to the handler that was in place (Ctrl-C's: ``KeyboardInterrupt``). ``note`` is printed for every further
    one. Not ``pthread_sigmask``: the processes started meanwhile would inherit the mask and never see
    SIGTERM."""
    held: list[int] = []  # yielded: the signals held so far
    if not _main_thread():
        yield held
        return

    def hold(signum: int, _frame: Any) -> None:
        if held and note:
            _note(note)
        held.append(signum)

    previous = {s: signal.signal(s, hold) for s in STOP_SIGNALS}
    try:
        yield held
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if held:
            signal.raise_signal(held[0])  # to the handler in place again; runs before raise_signal returns


class StopSignals:
    """A context manager for a command that starts processes (``cluster up``, ``chaos run``, ``demo``): SIGINT
    (Ctrl-C), SIGTERM and SIGHUP all mean "stop, and stop what you started". The first one is recorded in
    ``signum`` (and ``on_first`` called) and, while ``raising`` is on, raised as ``KeyboardInterrupt``; with
    it off the command looks at ``signum`` itself. Every later one only prints ``note``: the cleanup the first
    one began runs to its (bounded) end rather than being cut short, and no traceback shows. A signal that is
    ignored when the command starts (SIGHUP under ``nohup``) stays ignored."""

    def __init__(self, note: str) -> None:
        self.note = note
        self.signum: int | None = None
        self.raising = True
        self.on_first: Callable[[], None] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if _main_thread():
            for s in STOP_SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            _note(self.note)
            return
        self.signum = signum
        if self.on_first is not None:
            self.on_first()
        if self.raising:
            raise KeyboardInterrupt

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a command a signal ended (Ctrl-C: 130)."""
        return 128 + (self.signum or signal.SIGINT)


def start_member(spec: ClusterSpec, m: Member) -> ClusterSpec:
    """Start ``m`` and record its pid in cluster.json: a Ctrl-C (or SIGTERM) meanwhile is handled only once
    the pid is recorded, so that no member runs that nothing knows of (if it raises then, cluster.json has
    the pid; ``up``, which must stop what it started, does the same inline). Call it holding ``cluster_lock``."""
    with deferred_signals():
        spec = spec.with_member(spawn(spec, m))
        save(spec)
    return spec


def tail(path: str, lines: int = 5, start: int = 0) -> str:
    """The last ``lines`` lines of ``path`` written after byte ``start``."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


async def registered_brokers(controller: str, rpc: RpcClient) -> dict[int, int]:
    """Broker id -> broker epoch of the brokers the controller lists as registered and not fenced."""
    status = await rpc.get_json(controller, "/v1/status", timeout_s=2.0)
    return {int(b["node_id"]): int(b["broker_epoch"]) for b in status.get("brokers") or []
            if not b.get("fenced", False)}


async def _serving_at(broker: Member, epoch: int, rpc: RpcClient) -> bool:
    """The process on ``broker``'s address answers and holds the broker epoch the controller lists.

    The controller alone is not enough: a killed broker stays listed, unfenced, at its old epoch until its
    session times out, and a restarted controller counts every unfenced broker alive for a session."""
    with contextlib.suppress(RpcError, ValueError, KeyError, TypeError, AttributeError):
        status = await rpc.get_json(broker.address, "/v1/status", timeout_s=2.0)
        return int(status["broker_epoch"]) == epoch
    return False


async def wait_registered(spec: ClusterSpec, timeout_s: float) -> None:
    """Until the controller answers and every broker in ``spec`` is registered (bounded); an exited member
    fails fast with its last log lines."""
    brokers = {m.node_id: m for m in spec.brokers if m.node_id is not None}
    wanted = set(brokers)
    rpc = RpcClient()
    deadline = time.monotonic() + timeout_s
    next_report = time.monotonic() + 5
    seen: set[int] = set()  # registered, and serving at the epoch the controller lists
    answered = False
    try:
        while True:
            for m in spec.members:
                status = exited(m)
                if status is not None:
                    last = tail(m.log, start=_LOG_START.get(m.log, 0))  # this run's lines only
                    raise CliError(f"{m.name} exited with status {status} during start; "
                                   + (f"last lines of {m.log}:\n{last}" if last else f"it wrote nothing to {m.log}"))
            with contextlib.suppress(RpcError, ValueError, KeyError, TypeError, AttributeError):
                listed = await registered_brokers(spec.controller.address, rpc)
                answered = True
                for b in sorted(wanted & listed.keys() - seen):
                    if await _serving_at(brokers[b], listed[b], rpc):
                        seen.add(b)
            if answered and wanted <= seen:
                return
            if time.monotonic() >= next_report:
                next_report += 5
                print(f"waiting for brokers to register: {len(wanted & seen)}/{len(wanted)}", file=sys.stderr)
            if time.monotonic() >= deadline:
                missing = ", ".join(str(b) for b in sorted(wanted - seen))
                # a broker restarted before its previous incarnation's session ended is refused until it ends
                what = (f"brokers {missing} did not register (a restarted broker waits until its previous "
                        f"session ends: broker.session.timeout.ms)" if answered else "the controller did not answer")
                raise CliError(f"{what} within {timeout_s:.0f}s; see logs in {spec.data_dir}")
            await asyncio.sleep(0.2)
    finally:
        await rpc.close()


def check_executables(spec: ClusterSpec) -> None:
    """Every member's command names an executable program (before anything is created)."""
    for program in dict.fromkeys(command(spec, m)[0] for m in spec.members):
        if shutil.which(program) is None:
            raise CliError(f"cannot run {program!r}: not found or not executable"
                           + (" (check --exec)" if spec.exec_argv and program == spec.exec_argv[0] else ""))


def make_dirs(path: Path, flag: str) -> Path | None:
    """``common.fsutil.make_dirs`` with ``CliError`` naming ``flag`` when it cannot."""
    try:
        return fsutil.make_dirs(path)
    except FileExistsError:
        raise CliError(f"{flag} {path} exists and is not a directory") from None
    except OSError as exc:
        raise CliError(f"cannot create {flag} {path}: {exc.strerror or exc}") from None


remove_empty_dirs = fsutil.remove_empty_dirs


def preflight(spec: ClusterSpec) -> None:
    """What ``up`` checks before it creates anything: no cluster running in the data dir, which is a
    directory or can be one, the member commands exist, and the ports are free."""
    root = Path(spec.data_dir)
    if root.exists() and not root.is_dir():
        raise CliError(f"{root} exists and is not a directory (--data-dir names the cluster directory)")
    alive: list[str] = []
    if (root / CLUSTER_FILE).exists():
        alive = [m.name for m in load(root).members if is_running(m)]
    if alive:
        raise CliError(f"a cluster is already running in {spec.data_dir} ({', '.join(alive)}); "
                       f"`minibroker cluster down --data-dir {spec.data_dir}` first")
    check_executables(spec)
    for m in spec.members:
        if not m.netns and not port_free(m.host, m.port):
            raise CliError(f"port {m.port} ({m.name}) is already in use; pick another --base-port")


def up(spec: ClusterSpec, timeout_s: float) -> ClusterSpec:
    """Start every member and wait for registration; stops what it started if that fails (or a signal
    arrives: Ctrl-C raises ``KeyboardInterrupt`` here), and if a member could not even be started, also
    removes the files and directories this call created. Holds the cluster lock throughout, so a second
    ``up`` on the same directory waits, then finds this one's cluster running."""
    preflight(spec)
    root = Path(spec.data_dir)
    lock_path = root / fsutil.LOCK_NAME
    had_lock_file = lock_path.exists()
    created_root = make_dirs(root, "--data-dir")
    with contextlib.ExitStack() as held:
        locked = False
        try:
            held.enter_context(cluster_lock(root))
            locked = True
            preflight(spec)  # again, under the lock: another `up` may have started a cluster here meanwhile
        except BaseException:
            if locked and not had_lock_file:
                with contextlib.suppress(OSError):
                    lock_path.unlink()  # ours; one waiting for it sees the change (cluster_lock) and retries
            remove_empty_dirs(root, created_root)
            raise
        existing = {p for m in spec.members for p in (Path(m.data_dir), Path(m.log)) if p.exists()}
        if had_lock_file:
            existing.add(lock_path)
        had_cluster_file = (root / CLUSTER_FILE).exists()
        all_started = False
        try:
            for i, m in enumerate(spec.members):
                # a Ctrl-C between fork and here would leave a member nobody knows of
                with deferred_signals() as signals_held:
                    spec = spec.with_member(spawn(spec, m))
                    save(spec)
                    # set with the last pid's save while signals are held: a signal that came just after the
                    # block found it still False and removed cluster.json and the members' dirs, although every
                    # member had run (a flaky test_cluster_signals). One held during the last spawn still counts
                    # as a start interrupted before every member ran.
                    all_started = i == len(spec.members) - 1 and not signals_held
            asyncio.run(wait_registered(spec, timeout_s))
        except BaseException:
            with deferred_signals():  # another Ctrl-C does not cut the cleanup short
                stop_cluster(spec, timeout_s=5)
                if not all_started:
                    _remove_created(spec, created_root, existing, had_cluster_file)
                # else the logs stay: the error shows their last lines or points at them
            raise
    return spec


def _remove_created(spec: ClusterSpec, created_root: Path | None, existing: set[Path],
                    had_cluster_file: bool) -> None:
    """Undo a start that failed before every member ran: no leftovers of this attempt."""
    if created_root is not None:
        shutil.rmtree(created_root, ignore_errors=True)
        return
    paths = [p for m in spec.members for p in (Path(m.data_dir), Path(m.log))]
    if not had_cluster_file:
        paths.append(Path(spec.data_dir) / CLUSTER_FILE)
    paths.append(Path(spec.data_dir) / fsutil.LOCK_NAME)
    for p in paths:
        if p in existing:
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)


# -- subcommands -----------------------------------------------------------------------------------

def _data_dir(args: argparse.Namespace) -> Path:
    """``--data-dir``, else $MINIBROKER_DATA_DIR (empty = unset, as for the other MINIBROKER_* variables),
    else ./minibroker-data. An explicitly empty --data-dir is an error, not the default."""
    if args.data_dir is None:
        return default_data_dir()
    if not args.data_dir.strip():
        raise CliError("--data-dir must not be empty")
    return Path(args.data_dir)


def _exec_argv(text: str | None) -> list[str]:
    if text is None:
        return []
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise CliError(f"--exec {text!r} is not a valid command line ({exc})") from None
    if not argv:
        raise CliError("--exec must name a command")
    return argv


STOPPING_NOTE = "minibroker: already stopping the cluster (SIGKILL after a bounded wait); please wait"


def cmd_up(args: argparse.Namespace) -> int:
    spec = plan(_data_dir(args), args.brokers, args.base_port, settings=args.set or (),
                controller_settings=args.controller_set or (), exec_argv=_exec_argv(args.exec))
    preflight(spec)  # bad input fails in one line, before the announcement (up checks again)
    print(f"starting controller on {spec.controller.address} and {len(spec.brokers)} brokers "
          f"({spec.bootstrap}); data and logs in {spec.data_dir}", file=sys.stderr)
    # Ctrl-C, SIGTERM and SIGHUP alike: while starting, up stops what it started (exit 130); in the
    # foreground, the cluster is stopped (exit 0)
    with StopSignals(STOPPING_NOTE) as signals:
        try:
            spec = up(spec, args.timeout)
        except KeyboardInterrupt:  # up stopped what it had started
            print(f"minibroker: {signals.name or 'SIGINT'} while starting the cluster: stopped what had started",
                  file=sys.stderr)
            return signals.exit_status
        try:
            signals.raising = False  # from here on the code below looks at signals.signum itself
            if signals.signum is None:
                print(f"cluster up: controller {spec.controller.address}, bootstrap {spec.bootstrap}",
                      file=sys.stderr)
                if args.detach:
                    print(f"export MINIBROKER_BOOTSTRAP={spec.bootstrap} "
                          f"MINIBROKER_CONTROLLER={spec.controller.address}")
                    return 0
                _stream_logs(spec, signals)
        except KeyboardInterrupt:  # a signal after up returned, before `raising` was off: stop all the same
            pass
        except OSError:  # stdout or stderr gone (a closed pipe or terminal): stop the cluster all the same
            if args.detach:
                raise
        _stop_what_up_started(spec)
    return 0


def _stream_logs(spec: ClusterSpec, signals: StopSignals) -> None:
    """Stream every member's log, prefixed by its name, until a stop signal (Ctrl-C, SIGTERM, SIGHUP)."""
    files: dict[str, Any] = {}
    try:
        for m in spec.members:
            files[m.name] = open(m.log, "rb")  # noqa: SIM115 - closed in finally
            files[m.name].seek(_LOG_START.get(m.log, 0))  # this run's lines, not earlier runs'
        print("streaming logs; Ctrl-C stops the cluster", file=sys.stderr, flush=True)
        while signals.signum is None:
            quiet = True
            for name, f in files.items():
                for line in f.readlines(1 << 16):
                    quiet = False
                    sys.stdout.write(f"[{name}] {line.decode('utf-8', 'replace')}")
            sys.stdout.flush()
            reap()
            if quiet:
                time.sleep(0.2)
    finally:
        for f in files.values():
            f.close()


def _stop_what_up_started(spec: ClusterSpec) -> None:
    """The stop of a foreground ``cluster up``: every member cluster.json records now (one ``cluster start``
    may have replaced), brokers first (``stop_cluster``)."""
    with contextlib.suppress(OSError):
        print("stopping the cluster", file=sys.stderr, flush=True)
    root = Path(spec.data_dir)
    with cluster_lock(root, required=False):  # StopSignals (cmd_up) keeps a second Ctrl-C from cutting it short
        with contextlib.suppress(CliError):
            spec = load(root)
        stop_cluster(spec)


def member_status(spec: ClusterSpec) -> list[dict[str, Any]]:
    async def probe() -> list[Any]:
        rpc = RpcClient()
        try:
            async def one(m: Member) -> Any:
                if not is_running(m):
                    return None
                with contextlib.suppress(RpcError, ValueError):
                    return await rpc.get_json(m.address, "/v1/status", timeout_s=2.0)
                return None
            return list(await asyncio.gather(*(one(m) for m in spec.members)))
        finally:
            await rpc.close()

    statuses = asyncio.run(probe())
    controller_status = statuses[spec.members.index(spec.controller)]
    stopping = ({int(b["node_id"]) for b in controller_status.get("brokers") or [] if b.get("shutting_down")}
                if isinstance(controller_status, dict) else set())
    rows: list[dict[str, Any]] = []
    for m, st in zip(spec.members, statuses, strict=True):
        running = is_running(m)
        stopped = running and _is_stopped(m)
        row: dict[str, Any] = {"name": m.name, "kind": m.kind, "node_id": m.node_id, "address": m.address,
                               "pid": m.pid, "running": running, "paused": stopped,
                               "responding": st is not None, "log": m.log}
        if m.kind == "broker":
            # in controlled shutdown, as the controller or the broker itself says (the controller may be down)
            row["shutting_down"] = running and (m.node_id in stopping
                                                or (isinstance(st, dict) and st.get("shutting_down") is True))
        if isinstance(st, dict) and m.kind == "broker":
            parts = st.get("partitions") or []
            row["broker_epoch"] = st.get("broker_epoch")
            row["leader_for"] = sum(1 for p in parts if p.get("role") == "leader")
            row["replicas"] = len(parts)
        if isinstance(st, dict) and m.kind == "controller":
            row["controller_epoch"] = st.get("controller_epoch")
            row["registered_brokers"] = sorted(int(b["node_id"]) for b in st.get("brokers") or []
                                               if not b.get("fenced"))
        rows.append(row)
    return rows


def _is_stopped(m: Member) -> bool:
    try:
        stat = Path(f"/proc/{m.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")


def cmd_status(args: argparse.Namespace) -> int:
    spec = load(_data_dir(args))
    rows = member_status(spec)
    if args.json:
        print(json.dumps({"data_dir": spec.data_dir, "controller": spec.controller.address,
                          "bootstrap": spec.bootstrap, "members": rows}, indent=2))
        return 0
    print(f"{'MEMBER':<12} {'ADDRESS':<16} {'PID':>8}  {'STATE':<11} DETAILS")
    for r in rows:
        state = ("paused" if r["paused"] else "stopping" if r.get("shutting_down")
                 else "registering" if r["responding"] and r.get("broker_epoch", 0) < 0
                 else "up" if r["responding"] else "starting" if r["running"] else "down")
        details = ""
        if "leader_for" in r:
            details = f"leader for {r['leader_for']} of {r['replicas']} replicas, broker_epoch {r['broker_epoch']}"
        elif "registered_brokers" in r:
            details = (f"controller_epoch {r['controller_epoch']}, registered brokers "
                       f"{','.join(map(str, r['registered_brokers'])) or '-'}")
        print(f"{r['name']:<12} {r['address']:<16} {r['pid'] or '-':>8}  {state:<11} {details}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    with cluster_lock(data_dir):  # no `cluster start` in between: what it started would be missed
        return _down(load(data_dir), args.timeout)


def _down(spec: ClusterSpec, timeout_s: float) -> int:
    # Brokers first (their controlled shutdown needs the controller), then the controller, as Kafka's docs
    # advise. When every broker stops at once leadership has nowhere to go, so a broker may wait out
    # controlled.shutdown.max.wait.ms (30 s) before exiting: the default --timeout leaves room for that.
    if any(is_running(m) for m in spec.brokers):
        print(f"stopping {len(spec.brokers)} brokers (controlled shutdown; up to {timeout_s:.0f} s), "
              "then the controller", file=sys.stderr)
    forced = stop_cluster(spec, timeout_s=timeout_s)
    print(f"cluster in {spec.data_dir} stopped" + (f" (SIGKILL needed for {', '.join(forced)})" if forced else ""))
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    sig = SIGNALS[args.signal.upper()]
    with cluster_lock(data_dir):  # the pid recorded is the member's: no `cluster start` replacing it meanwhile
        m = load(data_dir).member(args.id)
        if not send_signal(m, sig):
            raise CliError(f"{m.name} is not running")
    print(f"sent SIG{args.signal.upper()} to {m.name} (pid {m.pid})")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    # The lock only to read the member: held through a stop of up to --timeout (40 s), it made a `cluster
    # start` of another member give up (LOCK_WAIT_S). A start of this one meanwhile finds it running.
    data_dir = _data_dir(args)
    with cluster_lock(data_dir):
        m = load(data_dir).member(args.id)
    if not is_running(m):
        raise CliError(f"{m.name} is not running")
    _stop_one(m, args.timeout)
    return 0


def _stop_one(m: Member, timeout_s: float) -> None:
    """SIGTERM and wait for the exit (a broker's controlled shutdown first moves its leaderships away), then
    SIGKILL after ``timeout_s``: what an operator's service manager does, and what a rolling restart needs
    before it starts the member again (`kill --signal TERM` returns at once)."""
    print(f"stopping {m.name} (pid {m.pid}; up to {timeout_s:.0f} s)", file=sys.stderr)
    forced = stop_members([m], timeout_s=timeout_s)
    print(f"stopped {m.name}" + (" (SIGKILL needed)" if forced else ""))


def cmd_restart(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    with cluster_lock(data_dir):
        m = load(data_dir).member(args.id)
    if is_running(m):
        _stop_one(m, args.stop_timeout)
    return cmd_start(args)


def cmd_start(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    with cluster_lock(data_dir):  # load, start, save: a concurrent `cluster start` of another member waits
        spec = load(data_dir)
        m = spec.member(args.id)
        if is_running(m):
            raise CliError(f"{m.name} is already running (pid {m.pid})"
                           + (" (stopping? `cluster stop` waits for the exit)" if m.kind == "broker" else ""))
        spec = start_member(spec, m)
        m = spec.member(m.name)
    if m.kind == "broker" and args.wait:
        asyncio.run(wait_registered(replace(spec, members=(spec.controller, m)), args.timeout))
    elif args.wait:
        asyncio.run(wait_registered(replace(spec, members=(m,)), args.timeout))  # the controller answers
    print(f"started {m.name} (pid {m.pid}) on {m.address}")
    return 0


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("cluster", help="run a local cluster: up, status, down, stop, start, restart, kill",
                       description="A local cluster of real processes on 127.0.0.1.")
    cs = p.add_subparsers(dest="cluster_command", metavar="ACTION")
    p.set_defaults(func=lambda _a: (p.print_help(sys.stderr), 2)[1])

    def member_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument("id", metavar="ID", help="broker id or 'controller'")

    def wait_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--no-wait", dest="wait", action="store_false", help="do not wait for broker registration")
        q.add_argument("--timeout", type=positive_float("--timeout"), default=60.0,
                       help="seconds to wait for the broker to register, or for the controller to answer "
                            "(default 60)")

    def sigkill_timeout_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument("--timeout", type=non_negative_float("--timeout"), default=40.0,
                       help="seconds before SIGKILL (default 40, above controlled.shutdown.max.wait.ms)")

    def data_dir_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument("--data-dir", default=None,
                       help="cluster directory (default: $MINIBROKER_DATA_DIR or ./minibroker-data)")

    q = cs.add_parser("up", help="start a controller and N brokers",
                      description="Start a controller on --base-port and --brokers brokers on the ports after it, "
                                  "wait until every broker is registered, then stream the logs until Ctrl-C "
                                  "(or SIGTERM, or SIGHUP) stops the cluster, brokers first (with --detach: "
                                  "return and leave it running). A signal while it starts stops what it started.")
    data_dir_arg(q)
    q.add_argument("--brokers", type=positive("--brokers"), default=3, help="number of brokers (default 3)")
    q.add_argument("--base-port", type=port("--base-port"), default=DEFAULT_BASE_PORT,
                   help="controller port; broker i listens on base+i (default 9090)")
    q.add_argument("--detach", action="store_true", help="return once every broker is registered")
    q.add_argument("--timeout", type=positive_float("--timeout"), default=60.0,
                   help="seconds to wait for registration (default 60)")
    q.add_argument("--set", action="append", metavar="KEY=VALUE", help="broker config for every broker")
    q.add_argument("--controller-set", action="append", metavar="KEY=VALUE", help="controller config")
    q.add_argument("--exec", default=None, metavar="COMMAND",
                   help="command that runs minibroker for the members (default: this installation's)")
    q.set_defaults(func=cmd_up)

    q = cs.add_parser("status", help="members, pids, and whether they answer",
                      description="Show each member of the local cluster: address, pid, and whether it is up, "
                                  "paused, starting, stopping (a broker in controlled shutdown) or down.")
    data_dir_arg(q)
    q.add_argument("--json", action="store_true",
                   help="print the members as JSON, with the data dir, controller and bootstrap addresses")
    q.set_defaults(func=cmd_status)

    q = cs.add_parser("down", help="stop every member (SIGTERM, then SIGKILL after --timeout)",
                      description="Stop every member of the local cluster, brokers first, then the controller "
                                  "(SIGTERM, then SIGKILL after --timeout).")
    data_dir_arg(q)
    sigkill_timeout_arg(q)
    q.set_defaults(func=cmd_down)

    q = cs.add_parser("stop", help="stop one member and wait for it (SIGTERM, then SIGKILL after --timeout)",
                      description="Stop one member of the local cluster: SIGTERM (a broker first moves its "
                                  "leaderships away: controlled shutdown), wait until it has exited, SIGKILL "
                                  "after --timeout. For a rolling restart: stop, start, next broker.")
    data_dir_arg(q)
    member_arg(q)
    sigkill_timeout_arg(q)
    q.set_defaults(func=cmd_stop)

    q = cs.add_parser("restart", help="stop one member, then start it again and wait for it",
                      description="`cluster stop` then `cluster start` of one member (if it is not running, "
                                  "only the start).")
    data_dir_arg(q)
    member_arg(q)
    q.add_argument("--stop-timeout", type=non_negative_float("--stop-timeout"), default=40.0,
                   help="seconds before SIGKILL when stopping (default 40)")
    wait_args(q)
    q.set_defaults(func=cmd_restart)

    q = cs.add_parser("kill", help="send a signal to one member",
                      description="Send a signal to one member of the local cluster and return at once, for "
                                  "chaos testing (to stop one and wait for it: `cluster stop`).")
    data_dir_arg(q)
    member_arg(q)
    q.add_argument("--signal", default="KILL", type=str.upper, choices=sorted(SIGNALS),
                   help="signal name, case-insensitive (default KILL)")
    q.set_defaults(func=cmd_kill)

    q = cs.add_parser("start", help="start one member again (same ports and data dir)",
                      description="Start one member of the local cluster again, with the same ports and data dir, "
                                  "and wait until it is registered (the controller: until it answers) unless "
                                  "--no-wait.")
    data_dir_arg(q)
    member_arg(q)
    wait_args(q)
    q.set_defaults(func=cmd_start)
