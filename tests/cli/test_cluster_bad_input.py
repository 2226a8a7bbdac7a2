"""``cluster`` commands given bad input: a data dir that is a file, a missing or unsplittable ``--exec``, a
hand-edited cluster.json, bad ``--set`` values, an empty ``--data-dir``. Each is one ``minibroker: error:``
line with a non-zero exit, never a traceback, and a failed ``cluster up`` leaves nothing behind. Only the
tests that need a running member start one (the stand-ins of fake_processes.py, via ``--exec``)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli import cluster
from cli.main import main
from tests.cli.helpers import FAKE, FAKE_SCRIPT, free_base_port, run


def one_line_error(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("minibroker: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1, err


# -- a data dir that is a regular file ---------------------------------------------------------------

@pytest.mark.parametrize("action", [["status"], ["kill", "1"], ["down"], ["start", "1"]])
async def test_a_data_dir_that_is_a_file_is_named(tmp_path: Path, action: list[str]) -> None:
    f = tmp_path / "f"
    f.write_text("not a directory\n")
    one_line_error(*(await run("cluster", *action, "--data-dir", str(f)))[::2], f"{f} is not a directory")


async def test_a_data_dir_file_from_the_environment_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "f"
    f.write_text("")
    monkeypatch.setenv("MINIBROKER_DATA_DIR", str(f))
    one_line_error(*(await run("cluster", "status"))[::2], f"{f} is not a directory")


async def test_up_into_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("keep")
    code, _, err = await run("cluster", "up", "--detach", "--data-dir", str(f), "--base-port", str(free_base_port()))
    one_line_error(code, err, "is not a directory")
    assert f.read_text() == "keep" and sorted(os.listdir(tmp_path)) == ["f"]


# -- --exec ------------------------------------------------------------------------------------------

async def test_up_with_a_missing_executable_creates_nothing(tmp_path: Path) -> None:
    d = tmp_path / "c"
    code, _, err = await run("cluster", "up", "--detach", "--data-dir", str(d), "--base-port", str(free_base_port()),
                             "--exec", "/nonexistent/bin --flag")
    one_line_error(code, err, "cannot run '/nonexistent/bin': not found or not executable")
    assert not d.exists()
    d.mkdir()  # an existing, empty dir stays empty
    code, _, err = await run("cluster", "up", "--detach", "--data-dir", str(d), "--base-port", str(free_base_port()),
                             "--exec", str(tmp_path))  # a directory is not a program either
    one_line_error(code, err, "not found or not executable")
    assert os.listdir(d) == []


async def test_a_member_that_cannot_be_started_leaves_nothing(tmp_path: Path) -> None:
    """The program exists and is executable, but exec fails (its interpreter is missing): caught at spawn."""
    script = tmp_path / "bad.sh"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    d = tmp_path / "new" / "c"
    code, _, err = await run("cluster", "up", "--detach", "--data-dir", str(d), "--base-port", str(free_base_port()),
                             "--exec", str(script))
    assert code == 2 and "Traceback" not in err
    assert "minibroker: error: cannot start controller" in err
    assert not (tmp_path / "new").exists()  # the dirs it made, parents included, are gone
    d.mkdir(parents=True)
    (d / "controller.log").write_text("an earlier run\n")  # what was there before stays as it was
    code, _, err = await run("cluster", "up", "--detach", "--data-dir", str(d), "--base-port", str(free_base_port()),
                             "--exec", str(script))
    assert code == 2 and "cannot start controller" in err and "Traceback" not in err
    assert os.listdir(d) == ["controller.log"] and (d / "controller.log").read_text() == "an earlier run\n"


def test_a_later_spawn_failure_stops_and_removes_what_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The controller starts (a real stand-in process), then broker-1 cannot: the controller is stopped and
    the directories, logs and cluster.json of this attempt are removed."""
    real_command = cluster.command

    def command(spec: cluster.ClusterSpec, m: cluster.Member, python: str = sys.executable) -> list[str]:
        argv = real_command(spec, m, python)
        return ["/nonexistent/broker", *argv[1:]] if m.kind == "broker" else argv

    started: list[cluster.Member] = []
    real_spawn = cluster.spawn

    def spawn(spec: cluster.ClusterSpec, m: cluster.Member) -> cluster.Member:
        started.append(real_spawn(spec, m))
        return started[-1]

    monkeypatch.setattr(cluster, "command", command)
    monkeypatch.setattr(cluster, "spawn", spawn)
    monkeypatch.setattr(cluster, "check_executables", lambda _spec: None)  # let it get as far as spawning
    data_dir = tmp_path / "c"
    try:
        code = main(["cluster", "up", "--detach", "--brokers", "1", "--base-port", str(free_base_port(2)),
                     "--data-dir", str(data_dir), "--exec", FAKE, "--timeout", "30"])
        err = capsys.readouterr().err
        assert code == 2 and "cannot start broker-1: /nonexistent/broker" in err
        assert [m.name for m in started] == ["controller"]
        assert not cluster.is_running(started[0])
        assert not data_dir.exists()
    finally:
        cluster.stop_members(started, timeout_s=5)


async def test_an_unsplittable_exec_is_a_usage_error(tmp_path: Path) -> None:
    d = tmp_path / "c"
    base = str(free_base_port())
    code, _, err = await run("cluster", "up", "--data-dir", str(d), "--base-port", base, "--exec", '"unterminated')
    one_line_error(code, err, "--exec '\"unterminated' is not a valid command line (No closing quotation)")
    code, _, err = await run("cluster", "up", "--data-dir", str(d), "--base-port", base, "--exec", " ")
    one_line_error(code, err, "--exec must name a command")
    assert not d.exists()


# -- a hand-edited cluster.json ----------------------------------------------------------------------

def _set(path: tuple[Any, ...], value: Any) -> Callable[[Any], Any]:
    def edit(doc: Any) -> Any:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc
    return edit


@pytest.mark.parametrize(("edit", "message"), [
    (_set(("members", 0, "pid"), [1]), "member 1 (controller) has no integer pid"),
    (_set(("members", 1, "pid"), True), "member 2 (broker-1) has no integer pid"),
    (_set(("members", 1, "pid"), -1), "member 2 (broker-1) has no integer pid"),
    (lambda _doc: [], "it is not a JSON object"),
    (_set(("members",), "x"), "'members' is missing or not a non-empty list"),
    (_set(("members",), []), "'members' is missing or not a non-empty list"),
    (_set(("members", 1), "x"), "member 2 is not a JSON object"),
    (_set(("members", 1, "port"), "9191"), "member 2 (broker-1) has no port"),
    (_set(("members", 1, "data_dir"), ""), "member 2 (broker-1) has no data_dir"),
    (_set(("members", 1, "node_id"), None), "member 2 (broker-1) has no integer node_id"),
    (_set(("members", 1, "kind"), "zookeeper"), "member 2 (broker-1) has kind 'zookeeper'"),
    (lambda doc: {**doc, "members": doc["members"][1:]}, "it needs exactly one member of kind 'controller'"),
    (_set(("base_port",), "9090"), "'base_port' is missing or not an integer"),
    (_set(("settings",), "a=1"), "'settings' is not a list of strings"),
    (lambda doc: {k: v for k, v in doc.items() if k != "host"}, "'host' is missing"),
])
async def test_a_malformed_cluster_file_says_what_is_wrong(tmp_path: Path, edit: Callable[[Any], Any],
                                                           message: str) -> None:
    cluster.save(cluster.plan(tmp_path, 2, free_base_port(3), exec_argv=["/nonexistent/bin"]))
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    for action in (["status"], ["kill", "1"], ["down", "--timeout", "0"]):
        code, _, err = await run("cluster", *action, "--data-dir", str(tmp_path))
        one_line_error(code, err, f"{path} is not a valid cluster file: {message}")
        assert "indices" not in err and "unhashable" not in err


async def test_a_cluster_file_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_bytes(b"\xff{")
    one_line_error(*(await run("cluster", "status", "--data-dir", str(tmp_path)))[::2], "not JSON")


# -- --set / --controller-set ------------------------------------------------------------------------

@pytest.mark.parametrize(("flags", "message"), [
    (["--set", "min.insync.replicas=abc"], "--set: min.insync.replicas: expected an integer, got 'abc'"),
    (["--set", "min.insync.replicas=0"], "--set: min.insync.replicas: must be >= 1, got 0"),
    (["--set", "no.such.key=1"], "--set: unknown config 'no.such.key'"),
    (["--set", "min.insync.replicas"], "--set: expected key=value"),
    (["--controller-set", "num.partitions=x"], "--controller-set: num.partitions: expected an integer"),
    (["--controller-set", "log.segment.bytes=2048"], "--controller-set: unknown config 'log.segment.bytes'"),
    # the brokers would be fenced and unfenced for ever
    (["--controller-set", "broker.session.timeout.ms=1000"],
     "--controller-set: broker.session.timeout.ms (1000) must be above the brokers' broker.heartbeat.interval.ms"),
    (["--set", "broker.heartbeat.interval.ms=500", "--controller-set", "broker.session.timeout.ms=500"],
     "--controller-set: broker.session.timeout.ms (500) must be above"),
])
async def test_bad_settings_are_refused_before_anything_starts(tmp_path: Path, flags: list[str],
                                                               message: str) -> None:
    d = tmp_path / "c"
    code, _, err = await run("cluster", "up", "--detach", "--data-dir", str(d), "--base-port", str(free_base_port()),
                             *flags)
    one_line_error(code, err, message)
    assert not d.exists()


async def test_a_failed_start_shows_this_runs_log_lines_only(data_dir: Path, tmp_path: Path) -> None:
    """A data dir reused after an earlier failed start: the lines shown are the ones this start wrote."""
    wrapper = tmp_path / "members.py"  # broker: fail at once with a message; controller: the stand-in
    wrapper.write_text("import runpy, sys\n"
                       "if sys.argv[1] == 'broker':\n"
                       "    print('fresh failure of this run')\n"
                       "    sys.exit(3)\n"
                       f"sys.argv[0] = {str(FAKE_SCRIPT)!r}\n"
                       f"runpy.run_path({str(FAKE_SCRIPT)!r}, run_name='__main__')\n")
    data_dir.mkdir()
    (data_dir / "broker-1.log").write_text("minibroker: error: STALE error of an earlier run\n")
    code, _, err = await run("cluster", "up", "--detach", "--brokers", "1", "--base-port", str(free_base_port(2)),
                             "--data-dir", str(data_dir), "--exec", shlex.join([sys.executable, str(wrapper)]),
                             "--timeout", "30")
    assert code == 2 and "Traceback" not in err
    assert "broker-1 exited with status 3 during start" in err and "fresh failure of this run" in err
    assert "STALE" not in err
    spec = cluster.load(data_dir)
    assert not any(cluster.is_running(m) for m in spec.members)  # the controller was stopped again
    assert "STALE" in (data_dir / "broker-1.log").read_text()  # the log itself is kept whole


# -- an empty --data-dir -----------------------------------------------------------------------------

@pytest.mark.parametrize("action", [["status"], ["down"], ["kill", "1"], ["start", "1"],
                                    ["up", "--detach", "--exec", "/nonexistent/bin"]])
async def test_an_empty_data_dir_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  action: list[str]) -> None:
    monkeypatch.chdir(tmp_path)  # where the default ./minibroker-data would be
    monkeypatch.delenv("MINIBROKER_DATA_DIR", raising=False)
    extra = ["--base-port", str(free_base_port())] if action[0] == "up" else []
    code, _, err = await run("cluster", *action, *extra, "--data-dir", "")
    one_line_error(code, err, "--data-dir must not be empty")
    assert os.listdir(tmp_path) == []
