"""Helpers shared by the CLI tests: run the real ``minibroker`` entry point, pick ports, clean up."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shlex
import signal
import socket
import sys
from pathlib import Path

# the stand-in controller and broker of fake_processes.py, as a cluster's --exec
FAKE_SCRIPT = Path(__file__).with_name("fake_processes.py")
FAKE = shlex.join([sys.executable, str(FAKE_SCRIPT)])


def minibroker() -> list[str]:
    script = Path(sys.executable).parent / "minibroker"
    if script.exists():
        return [sys.executable, str(script)]
    return [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


async def run(*argv: str, stdin: bytes = b"", timeout_s: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*minibroker(), *argv, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def free_base_port(count: int = 4) -> int:
    """A base port with ``count`` consecutive free ports (bounded number of tries)."""
    for _ in range(50):
        base = random.randint(20_000, 32_000)  # below the ephemeral range (32768+), where clients bind
        ok = True
        for port in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


def kill_recorded(data_dir: Path) -> None:
    """Last-resort cleanup: SIGKILL the pids this test's cluster recorded (only if still ours)."""
    from cli import cluster

    with contextlib.suppress(Exception):
        for m in cluster.load(data_dir).members:
            cluster.send_signal(m, signal.SIGKILL)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def member_pids(data_dir: Path) -> list[int]:
    """Pids of every process on this machine whose command line names a directory inside ``data_dir``: the
    members of a cluster there, recorded in its cluster.json or not (the commands themselves name ``data_dir``
    only)."""
    prefix = f"{data_dir}/".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(prefix) for a in argv):
            pids.append(int(entry.name))
    return pids


def kill_pids(pids: list[int]) -> None:
    """Last-resort cleanup of processes a test started (found by ``member_pids``): SIGCONT, then SIGKILL."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
