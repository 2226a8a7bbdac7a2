"""CLI parsing, validation and cluster bookkeeping, without a running cluster."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cli import cluster
from cli.main import CliError, build_parser, main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse usage errors
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def test_help_lists_the_client_commands(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["--help"], capsys)
    assert status == 0
    for name in ("cluster", "topics", "produce", "consume", "perf", "demo"):
        assert name in out
    status, out, _ = run(["perf", "--help"], capsys)
    assert status == 0 and "produce" in out and "e2e" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["topics", "create", "t", "--partitions", "0", "--replication-factor", "1"], "--partitions must be > 0"),
    (["topics", "create", "t", "--partitions", "x", "--replication-factor", "1"], "must be an integer"),
    (["consume", "t", "--from-beginning", "--offset", "3"], "not allowed with"),
    (["produce", "t", "--acks", "2"], "invalid choice"),
    (["cluster", "kill", "1", "--signal", "HUP"], "invalid choice"),
    (["perf", "produce", "--topic", "t", "--num-records", "-5", "--record-size", "100"], "must be > 0"),
    # numeric flags of the benchmarks and of the commands that start processes: refused while parsing, before
    # anything starts (several of these once ended in a traceback, a hang or a silent nonsense run)
    (["perf", "broker", "--requests", "0"], "--requests must be > 0, got 0"),
    (["perf", "broker", "--rounds", "-1"], "--rounds must be > 0, got -1"),
    (["perf", "broker", "--concurrency", "-1"], "--concurrency must be > 0"),
    (["perf", "broker", "--records", "0"], "--records must be > 0"),
    (["perf", "broker", "--record-size", "-1"], "--record-size must be >= 0"),
    (["perf", "broker", "--retained-mb", "-1"], "--retained-mb must be >= 0"),
    (["perf", "controller", "--topics", "0"], "--topics must be > 0"),
    (["perf", "controller", "--brokers", "x"], "--brokers must be an integer, got 'x'"),
    (["perf", "controller", "--replication-factor", "4", "--brokers", "3"],
     "--replication-factor 4 needs at least as many --brokers (got 3)"),
    (["perf", "audit", "--batch", "0"], "--batch must be > 0"),
    (["chaos", "run", "--duration", "inf"], "--duration must be a finite number"),
    (["chaos", "run", "--inflight", "0"], "--inflight must be > 0"),
    (["chaos", "run", "--heal-timeout", "0"], "--heal-timeout must be > 0"),
    (["cluster", "up", "--base-port", "70000"], "--base-port must be at most 65535"),
    (["cluster", "up", "--timeout", "nan"], "--timeout must be a finite number"),
    (["cluster", "down", "--timeout", "-1"], "--timeout must be >= 0"),
    (["demo", "--records", "0"], "--records must be > 0"),
    (["perf", "produce", "--topic", "t", "--num-records", "1", "--record-size", "1", "--throughput", "nan"],
     "--throughput must be a finite number"),
    # an offset no request can carry once reached msgpack's encoder mid-poll (OverflowError)
    (["consume", "t", "--offset", str(2**64)], "--offset must be at most 9223372036854775807"),
    (["consume", "t", "--offset", "-1"], "--offset must be >= 0, got -1"),
    (["consume", "t", "--offset", "first"], "--offset must be an offset (an integer >= 0), 'earliest' or 'latest', "
                                            "got 'first'"),
    (["consume", "t", "--from-beginning", "--offset", "latest"], "not allowed with"),
])
def test_usage_errors_are_one_readable_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(argv, capsys)
    assert status == 2
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "message"), [
    (["topics", "create", "t", "--partitions", "1", "--replication-factor", "1", "--config", "nope=1"],
     "unknown topic config 'nope'"),
    (["topics", "create", "t", "--partitions", "1", "--replication-factor", "1", "--config", "min.insync.replicas"],
     "key=value"),
    # beyond Kafka's INT: once accepted here, then failed in the controller's journal as "no answer"
    (["topics", "create", "t", "--partitions", "1", "--replication-factor", "1", "--config",
      "min.insync.replicas=99999999999999999999999"], "min.insync.replicas: must be at most 2147483647"),
    (["topics", "create", "t", "--partitions", "1", "--replication-factor", "1", "--config", "retention.ms=-7"],
     "retention.ms: must be >= -1"),
    (["produce", "t", "--bootstrap", "localhost"], "expected HOST:PORT"),
    # an explicitly empty value is an error, not the default used unasked
    (["produce", "t", "--bootstrap", ""], "--bootstrap: no bootstrap address given"),
    (["topics", "list", "--controller", ""], "--controller: no bootstrap address given"),
    (["topics", "describe", ""], "topic name must not be empty"),
    (["produce", "t", "--key-separator", ""], "--key-separator must not be empty"),
    (["topics", "list", "--controller", "a:1,b:2"], "one HOST:PORT"),
    # booleans are true or false, as the message says ("yes" and "1" were taken here, and refused by produce)
    (["topics", "create", "t", "--partitions", "1", "--replication-factor", "1", "--controller", "127.0.0.1:1",
      "--config", "unclean.leader.election.enable=yes"],
     "--config: unclean.leader.election.enable: expected true or false, got 'yes'"),
    (["topics", "create", "t", "--partitions", "1", "--replication-factor", "1", "--controller", "127.0.0.1:1",
      "--config", "unclean.leader.election.enable=1"],
     "--config: unclean.leader.election.enable: expected true or false, got '1'"),
    (["produce", "t", "--bootstrap", "127.0.0.1:1", "--producer-property", "enable.idempotence=yes"],
     "--producer-property enable.idempotence: expected true or false, got 'yes'"),
    # integers as Kafka reads them, as for --set and --config (int() took "1_000" and fullwidth digits)
    (["produce", "t", "--bootstrap", "127.0.0.1:1", "--producer-property", "retries=1_000"],
     "--producer-property retries: expected an integer, got '1_000'"),
    (["produce", "t", "--bootstrap", "127.0.0.1:1", "--producer-property", "retries=\uff13"],
     "--producer-property retries: expected an integer, got '\uff13'"),
])
def test_bad_values_are_reported_without_contacting_anything(argv: list[str], message: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(argv, capsys)
    assert status == 2, err
    assert message in err and err.startswith("minibroker: error:")


def test_perf_help_gives_each_benchmark_its_own_linger_default(capsys: pytest.CaptureFixture[str]) -> None:
    # perf e2e's help said "(default 5; perf e2e uses 0)"
    for benchmark, default in (("e2e", 0), ("produce", 5)):
        status, out, _ = run(["perf", benchmark, "--help"], capsys)
        assert status == 0
        text = " ".join(out.split())
        assert f"linger.ms (default {default})" in text and "uses 0" not in text
        args = build_parser().parse_args(["perf", benchmark, "--topic", "t", "--num-records", "1",
                                          "--record-size", "100"])
        assert args.linger_ms == default


def test_unreachable_controller_is_one_line(capsys: pytest.CaptureFixture[str], unused_port: int) -> None:
    status, _, err = run(["topics", "list", "--controller", f"127.0.0.1:{unused_port}"], capsys)
    assert status == 1  # an operating condition, as consume against dead brokers; 2 is for unusable input
    assert err.startswith("minibroker: error:") and len(err.strip().splitlines()) == 1


def test_produce_to_unreachable_brokers_fails_cleanly(capsys: pytest.CaptureFixture[str], unused_port: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    status, _, err = run(["produce", "t", "--bootstrap", f"127.0.0.1:{unused_port}", "--max-block-ms", "300"], capsys)
    assert status == 1
    assert "minibroker: error:" in err and "Traceback" not in err


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_plan_and_cluster_file_round_trip(tmp_path: Path) -> None:
    spec = cluster.plan(tmp_path, 3, 9190, settings=["replica.lag.time.max.ms=5000"])
    assert [m.name for m in spec.members] == ["controller", "broker-1", "broker-2", "broker-3"]
    assert [m.port for m in spec.members] == [9190, 9191, 9192, 9193]
    assert spec.bootstrap == "127.0.0.1:9191,127.0.0.1:9192,127.0.0.1:9193"
    cmd = cluster.command(spec, spec.member("2"))
    assert cmd[cmd.index("--node-id") + 1] == "2"
    assert cmd[cmd.index("--controller") + 1] == "127.0.0.1:9190"
    assert cmd[cmd.index("--set") + 1] == "replica.lag.time.max.ms=5000"
    assert "-m" not in cmd  # see cluster.minibroker_argv
    cluster.save(spec.with_member(replace(spec.member("controller"), pid=123)))
    loaded = cluster.load(tmp_path)
    assert loaded.member("controller").pid == 123 and loaded.brokers == spec.brokers
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert doc["bootstrap"] == spec.bootstrap and doc["members"][1]["command"][-2:] == ["--set",
                                                                                        "replica.lag.time.max.ms=5000"]
    with pytest.raises(CliError, match="no cluster member"):
        spec.member("7")
    with pytest.raises(CliError, match="--brokers"):
        cluster.plan(tmp_path, 0, 9190)


def test_commands_on_a_missing_cluster_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for action in (["status"], ["down"], ["kill", "1"], ["start", "1"]):
        status, _, err = run(["cluster", *action, "--data-dir", str(tmp_path)], capsys)
        assert status == 2 and "no cluster in" in err


def test_pids_are_signalled_only_while_they_are_still_the_member(tmp_path: Path) -> None:
    """A recorded pid whose process is no longer the member (exited, or recycled) is left alone."""
    data_dir = tmp_path / "broker-1"
    proc = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(60)", str(data_dir)])
    try:
        m = cluster.Member("broker-1", "broker", 1, "127.0.0.1", 1, str(data_dir), str(tmp_path / "b.log"),
                           pid=proc.pid)
        other = cluster.Member("broker-2", "broker", 2, "127.0.0.1", 2, str(tmp_path / "elsewhere"),
                               str(tmp_path / "c.log"), pid=proc.pid)
        deadline = time.monotonic() + 10
        while not cluster.is_running(m) and time.monotonic() < deadline:
            time.sleep(0.02)  # between fork and exec the cmdline is still pytest's
        assert cluster.is_running(m)
        assert not cluster.is_running(other)
        assert not cluster.send_signal(other, signal.SIGTERM)
        assert cluster.send_signal(m, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not cluster._is_stopped(m) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cluster._is_stopped(m)
        assert cluster.stop_members([m], timeout_s=5) == []  # SIGCONT + SIGTERM is enough
        proc.wait(timeout=10)
        assert not cluster.is_running(m)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_refuses_a_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        status, _, err = run(["cluster", "up", "--detach", "--data-dir", str(tmp_path), "--base-port", str(port),
                              "--brokers", "1"], capsys)
    assert status == 2 and "already in use" in err
    assert not (tmp_path / "cluster.json").exists()


def test_entry_point_prints_one_line_errors() -> None:
    script = Path(sys.executable).parent / "minibroker"
    argv = [str(script)] if script.exists() else [sys.executable, "-c",
                                                  "import sys; from cli.main import main; sys.exit(main())"]
    proc = subprocess.run([*argv, "cluster", "status", "--data-dir", "/nonexistent/minibroker"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("minibroker: error: no cluster in") and "Traceback" not in proc.stderr


def test_perf_helpers() -> None:
    from cli.perf import LatencyStats, Throttle, percentile

    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51 and percentile(values, 0.99) == 100 and percentile([], 0.5) == 0
    throttle = Throttle(100, started_s=0.0)
    assert throttle.delay_s(50, now_s=0.1) == pytest.approx(0.4)
    assert throttle.delay_s(5, now_s=1.0) == 0
    assert Throttle(-1, 0.0).delay_s(10**6, 0.0) == 0
    out = io.StringIO()
    stats = LatencyStats(0.0, 1.0, out)
    for i in range(10):
        stats.record(float(i), 100, now_s=0.1 * i)
    stats.record(50.0, 100, now_s=1.5)  # closes a window
    summary = stats.print_final(now_s=2.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("11 records sent") and "ms max latency." in lines[0]
    assert lines[-1].startswith("11 records sent, 5.5 records/sec") and "99.9th." in lines[-1]
    assert summary["max_latency_ms"] == 50.0
