"""Start a real ``minibroker controller`` process for tests (port 0, waits for <data-dir>/endpoint)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class ControllerProc:
    def __init__(self, data_dir: Path, settings: Mapping[str, object] | None = None) -> None:
        self.data_dir = data_dir
        self.settings = dict(settings or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    def start(self, timeout_s: float = 20.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        endpoint = self.data_dir / "endpoint"
        endpoint.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "cli.main", "controller", "--listen", "127.0.0.1:0",
                "--data-dir", str(self.data_dir)]
        for k, v in self.settings.items():
            argv += ["--set", f"{k}={v}"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log)
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if endpoint.exists():
                self.address = endpoint.read_text().strip()
                return self.address
            if self.proc.poll() is not None:
                pytest.fail(f"controller exited {self.proc.returncode}: {self.log_text()[-2000:]}")
            time.sleep(0.02)
        pytest.fail("controller did not start")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
