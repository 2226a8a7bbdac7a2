"""Network namespaces for the chaos ``partition`` fault: the pure plan, real namespaces (root only:
connectivity, a partition, healing, cleanup), and a short real chaos run with partitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import cluster as cl
from cli import netns
from cli.chaos import _faults, schedule
from cli.main import CliError
from tests.cli.helpers import free_base_port

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ["broker-1", "broker-2", "broker-3"]
NETNS_OK = netns.available() is None
needs_netns = pytest.mark.skipif(not NETNS_OK, reason=f"network namespaces unavailable: {netns.available()}")


def test_plan_names_and_addresses() -> None:
    p = netns.plan("123", netns.chaos_roles(3))
    assert [n.role for n in p.nodes] == ["controller", "broker-1", "broker-2", "broker-3", "client"]
    assert [n.ns for n in p.nodes] == ["mb123-controller", "mb123-broker-1", "mb123-broker-2", "mb123-broker-3",
                                       "mb123-client"]
    assert [n.address for n in p.nodes] == [f"10.213.0.{i}" for i in range(1, 6)]
    assert len({n.hub_if for n in p.nodes}) == 5 and all(len(n.hub_if) <= 15 for n in p.nodes)
    assert p.hub == "mb123-hub" and p.namespaces[0] == p.hub and len(p.namespaces) == 6
    assert netns.NetPlan.from_json(p.to_json()) == p
    assert p.node("broker-2").address == "10.213.0.3"
    with pytest.raises(CliError):
        p.node("broker-9")
    with pytest.raises(CliError):
        netns.plan("1", ["a", "a"])


def test_commands_stay_inside_the_namespaces() -> None:
    p = netns.plan("7", ["a", "b"], subnet=9)
    cmds = netns.setup_commands(p)
    assert cmds[0] == ["ip", "netns", "add", "mb7-hub"]
    # every command but `netns add` targets one of the run's namespaces: nothing in the root namespace
    for c in cmds:
        assert c[:3] == ["ip", "netns", "add"] or (c[1] == "-n" and c[2] in p.namespaces), c
    assert ["ip", "-n", "mb7-a", "addr", "add", "10.213.9.1/24", "dev", "eth0"] in cmds
    assert netns.partition_commands(p, "b") == [["ip", "-n", "mb7-hub", "link", "set", "h1", "down"]]
    assert netns.heal_commands(p, "b") == [["ip", "-n", "mb7-hub", "link", "set", "h1", "up"]]
    assert len(netns.heal_commands(p)) == 2


def test_schedule_includes_partitions() -> None:
    plan = schedule(4, 300, ("partition", "kill"), BROKERS, session_timeout_s=6)
    kinds = {f.kind for f in plan}
    assert "partition" in kinds
    end = 0.0
    for f in plan:
        assert f.at_s >= end
        end = f.at_s + f.hold_s
        if f.kind == "partition":
            assert f.target in [*BROKERS, "leader"] and 2.0 <= f.hold_s <= 9.0
    assert _faults("partition") == ("partition",)


def test_partition_without_namespaces_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "available", lambda: "not running as root")
    with pytest.raises(CliError, match="needs root and iproute2"):
        netns.require()


# ---------------------------------------------------------------- real namespaces (root)

SERVER = ("import http.server, sys; http.server.HTTPServer((sys.argv[1], 18080), "
          "http.server.SimpleHTTPRequestHandler).serve_forever()")
CLIENT = ("import sys, urllib.request; urllib.request.urlopen(f'http://{sys.argv[1]}:18080/', timeout=1.5).read(); "
          "print('ok')")


def reachable(p: netns.NetPlan, src: str, dst: str) -> bool:
    proc = subprocess.run([*netns.exec_prefix(p.node(src).ns), sys.executable, "-c", CLIENT, p.node(dst).address],
                          capture_output=True, text=True, timeout=10, check=False)
    return proc.returncode == 0 and "ok" in proc.stdout


def eventually(p: netns.NetPlan, src: str, dst: str, want: bool, tries: int = 10) -> bool:
    for _ in range(tries):  # bounded: at most `tries` requests of at most 1.5 s each
        if reachable(p, src, dst) == want:
            return True
        time.sleep(0.3)
    return False


@pytest.fixture
def net() -> Iterator[netns.NetPlan]:
    p = netns.plan(f"{os.getpid()}t", ["a", "b", "c"], subnet=7)
    try:
        netns.create(p)
        yield p
    finally:
        left = netns.destroy(p)
        assert not left, f"namespaces left behind: {left}"


@needs_netns
def test_real_namespaces_partition_and_heal(net: netns.NetPlan) -> None:
    assert set(net.namespaces) <= netns.existing()
    server = subprocess.Popen([*netns.exec_prefix(net.node("a").ns), sys.executable, "-c", SERVER,
                               net.node("a").address], cwd="/tmp", stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        assert eventually(net, "b", "a", True), "b reaches a's server through the hub"
        # the root namespace has no route to the test subnet: nothing leaves the namespaces
        assert subprocess.run([sys.executable, "-c", CLIENT, net.node("a").address], capture_output=True,
                              timeout=10, check=False).returncode != 0
        netns.partition(net, "a")
        assert eventually(net, "b", "a", False), "a partitioned: b cannot reach it"
        assert not reachable(net, "c", "a")
        netns.heal(net)
        assert eventually(net, "b", "a", True), "healed: b reaches a again"
        assert eventually(net, "c", "a", True)
    finally:
        server.kill()  # only the process this test started, by its handle
        server.wait(timeout=10)
    left = netns.destroy(net)
    assert not left and not set(net.namespaces) & netns.existing()


# ---------------------------------------------------------------- a short chaos run with partitions (root)

@pytest.mark.slow
@needs_netns
def test_short_partition_chaos_run_then_export_and_audit(tmp_path: Path, spark: Any) -> None:
    from audit.export import export
    from audit.spark_audit import Status, format_summary, run_audit

    data, out = tmp_path / "cluster", tmp_path / "out"
    before = netns.existing()
    try:
        proc = subprocess.run([sys.executable, "-m", "cli.main", "chaos", "run", "--duration", "30", "--seed", "3",
                               "--faults", "partition,kill", "--data-dir", str(data), "--out", str(out),
                               "--base-port", str(free_base_port()), "--heal-timeout", "60", "--inflight", "4"],
                              cwd=ROOT, capture_output=True, text=True, timeout=200, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert any(f.startswith("partition:") for f in summary["faults"]), summary["faults"]
        assert summary["isr_full_at_end"] is True
        assert summary["acked"] > 0 and summary["final_read"] >= summary["acked"]
        assert netns.existing() <= before, "the run removed its namespaces"
        export([data], out / "export", history=out)
        report = run_audit(spark, out / "export")
        assert report.ok, format_summary(report)
        assert report.stats["acked"] == summary["acked"]
        assert report.check("lost_writes").status is Status.OK
    finally:
        if (data / cl.CLUSTER_FILE).exists():
            cl.stop_members(list(reversed(cl.load(data).members)), timeout_s=10)
