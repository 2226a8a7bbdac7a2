"""The real controller process: endpoint/pid files, SIGTERM, and SIGKILL at any moment loses nothing acknowledged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.http import RpcClient, RpcError
from tests.controller.fakes import FakeBroker
from tests.controller.proc_util import ControllerProc
from tests.idle_connections import assert_idle_connections_are_closed

SETTINGS = {"broker.session.timeout.ms": 60_000, "metadata.snapshot.interval.records": 7}


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[ControllerProc]:
    proc = ControllerProc(tmp_path / "controller", SETTINGS)
    try:
        yield proc
    finally:
        proc.kill()


async def test_start_files_and_sigterm(ctl: ControllerProc) -> None:
    address = ctl.start()
    assert (ctl.data_dir / "pid").read_text().strip() == str(ctl.proc.pid if ctl.proc else -1)
    rpc = RpcClient(timeout_s=5)
    try:
        status = await rpc.get_json(address, "/v1/status")
        assert status["role"] == "controller" and status["controller_epoch"] == 1
    finally:
        await rpc.close()
    assert ctl.terminate() == 0
    events = [json.loads(line)["event"] for line in ctl.log_text().splitlines() if line.startswith("{")]
    assert "controller_started" in events and "controller_stopping" in events


async def test_sigkill_keeps_everything_acknowledged(ctl: ControllerProc) -> None:
    fake = FakeBroker(1)
    await fake.start()
    rpc = RpcClient(timeout_s=5)
    acked: set[str] = set()
    epochs: list[int] = []
    try:
        for round_ in range(3):
            address = ctl.start()
            reg = await rpc.call(address, "broker_registration",
                                 {"node_id": 1, "host": "127.0.0.1", "port": fake.port, "incarnation_id": "x"})
            epochs.append(int(reg["broker_epoch"]))

            async def create_many(address: str = address, round_: int = round_) -> None:
                for i in range(200):
                    name = f"r{round_}-t{i}"
                    try:
                        resp = await rpc.call(address, "create_topics", {"topics": [
                            {"name": name, "num_partitions": 2, "replication_factor": 1, "configs": {}}]})
                    except RpcError:
                        return
                    if resp["topics"][0]["error"] == 0:
                        acked.add(name)

            task = asyncio.create_task(create_many())
            await asyncio.sleep(0.3 + 0.2 * round_)
            ctl.kill()  # SIGKILL mid-stream
            await task
        address = ctl.start()
        md = await rpc.call(address, "metadata", {"topics": None})
        present = {t["topic"] for t in md["topics"]}
        assert acked, "some creations were acknowledged before the kill"
        assert acked <= present, f"lost acknowledged topics: {sorted(acked - present)[:5]}"
        assert all(len(t["partitions"]) == 2 for t in md["topics"])
        assert md["controller_epoch"] == 4
        assert epochs == sorted(epochs) and len(set(epochs)) == 3
    finally:
        await rpc.close()
        await fake.stop()


async def test_a_second_controller_on_the_same_data_dir_is_refused(ctl: ControllerProc, tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.controller.proc_util import ROOT

    ctl.start()
    second = subprocess.run([sys.executable, "-m", "cli.main", "controller", "--listen", "127.0.0.1:0",
                             "--data-dir", str(ctl.data_dir)], cwd=ROOT, capture_output=True, timeout=60)
    assert second.returncode == 2
    assert b"in use by another controller" in second.stderr
    assert ctl.proc is not None and ctl.proc.poll() is None, "the first one keeps running"


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    import subprocess
    import sys

    from controller.journal import JOURNAL_NAME, encode_frame
    from tests.controller.proc_util import ROOT

    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    newer = tmp_path / "newer"  # a journal record of a type this version does not know (a downgrade)
    newer.mkdir()
    (newer / JOURNAL_NAME).write_bytes(encode_frame({"offset": 1, "records": [{"type": "future_record"}]}))
    for data_dir, extra, message in (
            (tmp_path / "d", ["--listen", "nowhere"], "--listen: expected HOST:PORT, got 'nowhere'"),
            # '²' was once a ValueError traceback, '٣' was read as port 3
            (tmp_path / "d", ["--listen", "127.0.0.1:²"], "--listen: expected HOST:PORT, got '127.0.0.1:²'"),
            (tmp_path / "d", ["--listen", "127.0.0.1:٣"], "--listen: expected HOST:PORT, got '127.0.0.1:٣'"),
            (tmp_path / "d", ["--listen", "127.0.0.1:65536"], "--listen: port must be 0-65535, got '127.0.0.1:65536'"),
            (tmp_path / "d", ["--listen", "127.0.0.1:0", "--set", "nope=1"], "error"),
            (tmp_path / "d", ["--listen", "127.0.0.1:0", "--set", "broker.session.timeout.ms=abc"], "error"),
            (a_file, ["--listen", "127.0.0.1:0"], "error"),  # once a FileExistsError traceback
            (newer, ["--listen", "127.0.0.1:0"], "a journal frame does not decode")):  # once a ValueError traceback
        run = subprocess.run([sys.executable, "-m", "cli.main", "controller", "--data-dir", str(data_dir),
                              *extra], cwd=ROOT, capture_output=True, timeout=60)
        assert run.returncode == 2, run.stderr
        assert run.stderr.decode().strip().count("\n") == 0 and b"error" in run.stderr, run.stderr
        assert b"Traceback" not in run.stderr and message in run.stderr.decode(), run.stderr
    assert a_file.read_text() == "not a directory"


async def test_connections_idle_for_connections_max_idle_ms_are_closed(tmp_path: Path) -> None:
    """As the broker's: connections without progress for connections.max.idle.ms are closed."""
    proc = ControllerProc(tmp_path / "controller", {**SETTINGS, "connections.max.idle.ms": 300})
    try:
        address = await asyncio.to_thread(proc.start)
        await assert_idle_connections_are_closed(address)
    finally:
        proc.kill()


def test_a_journal_that_cannot_be_written_at_start_is_a_one_line_error(tmp_path: Path) -> None:
    # the start's own commit (the controller epoch) failing, as on a full disk, was an uncaught
    # JournalBrokenError and a traceback (found by a disk-full review). Here the file size limit stands in for
    # the full disk: the journal cannot grow (EFBIG; SIGXFSZ ignored, as its default would kill the process).
    import resource
    import signal
    import subprocess
    import sys

    from controller.journal import JOURNAL_NAME, encode_frame
    from tests.controller.proc_util import ROOT

    data_dir = tmp_path / "full"
    data_dir.mkdir()
    (data_dir / JOURNAL_NAME).write_bytes(encode_frame({"offset": 1, "records": []}))
    (data_dir / "meta.properties").write_text("version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\n")  # a past start's
    limit = (data_dir / JOURNAL_NAME).stat().st_size

    def no_room() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = subprocess.run([sys.executable, "-m", "cli.main", "controller", "--data-dir", str(data_dir),
                          "--listen", "127.0.0.1:0"], cwd=ROOT, capture_output=True, timeout=60,
                         preexec_fn=no_room)
    err = run.stderr.decode()
    assert run.returncode == 2, err
    assert b"Traceback" not in run.stderr and f"cannot write the metadata journal in {data_dir}" in err, err
