"""docker-compose.yml and the Dockerfile agree with the CLI and with each other (no Docker engine here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import cluster
from cli.clients import DEFAULT_BOOTSTRAP, DEFAULT_CONTROLLER
from cli.main import build_parser
from tests.cli.helpers import subcommands

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def flags(command: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a process command."""
    out: dict[str, str] = {}
    for i, item in enumerate(command):
        if item.startswith("--"):
            assert i + 1 < len(command) and not command[i + 1].startswith("--"), f"{item} has no value"
            out[item] = command[i + 1]
    return out


def servers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if name != "cli"}


def published(service: dict[str, Any]) -> tuple[str, int, int]:
    """(host address, host port, container port) of a service's one published port."""
    (port,) = service["ports"]
    host, host_port, container_port = str(port).split(":")
    return host, int(host_port), int(container_port)


def test_services_are_a_controller_and_three_brokers_on_the_cli_ports(compose: dict[str, Any]) -> None:
    spec = cluster.plan(Path("/data"), 3, cluster.DEFAULT_BASE_PORT)
    svc = servers(compose)
    assert sorted(svc) == sorted(m.name for m in spec.members)
    for m in spec.members:
        s = svc[m.name]
        command = s["command"]
        assert command[0] == m.kind
        f = flags(command)
        listen_port = int(f["--listen"].rsplit(":", 1)[1])
        assert listen_port == m.port, f"{m.name} listens where `cluster up` puts it"
        assert published(s) == ("127.0.0.1", m.port, m.port)
        if m.kind == "broker":
            assert f["--node-id"] == str(m.node_id)
            assert f["--advertise"] == f"{m.name}:{m.port}"
            assert f["--controller"] == f"controller:{cluster.DEFAULT_BASE_PORT}"
            assert s["depends_on"]["controller"]["condition"] == "service_healthy"


def test_volumes_are_named_distinct_and_hold_the_data_dir(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    used: list[str] = []
    for name, s in servers(compose).items():
        (volume,) = s["volumes"]
        source, target = volume.split(":")
        assert source in declared, f"{name} uses an undeclared volume {source}"
        assert flags(s["command"])["--data-dir"] == target == f"/data/{name}"
        used.append(source)
    assert len(used) == len(set(used)) == len(declared)


def test_healthchecks_probe_each_members_own_status_endpoint(compose: dict[str, Any]) -> None:
    for name, s in servers(compose).items():
        test = " ".join(s["healthcheck"]["test"])
        port = flags(s["command"])["--listen"].rsplit(":", 1)[1]
        assert re.search(rf"http://127\.0\.0\.1:{port}/v1/status", test), name


def test_cli_service_points_at_the_brokers_and_controller(compose: dict[str, Any]) -> None:
    cli_env = compose["services"]["cli"]["environment"]
    advertised = [flags(s["command"])["--advertise"] for s in servers(compose).values() if "--advertise" in
                  flags(s["command"])]
    assert cli_env["MINIBROKER_BOOTSTRAP"].split(",") == advertised
    assert cli_env["MINIBROKER_CONTROLLER"] == f"controller:{cluster.DEFAULT_BASE_PORT}"
    # the host-side defaults of the CLI are the published ports
    ports = [published(s)[1] for n, s in servers(compose).items() if n != "controller"]
    assert [int(a.rsplit(":", 1)[1]) for a in DEFAULT_BOOTSTRAP.split(",")] == ports
    assert DEFAULT_CONTROLLER.endswith(f":{published(compose['services']['controller'])[1]}")


def test_commands_parse_with_the_cli_when_the_process_commands_exist(compose: dict[str, Any]) -> None:
    commands = subcommands(build_parser())
    checked = 0
    for name, s in servers(compose).items():
        kind = s["command"][0]
        if kind not in commands:
            continue  # that process's subcommand is not registered (yet); the flags are checked above
        args = build_parser().parse_args(s["command"])
        assert str(args.data_dir) == f"/data/{name}"
        checked += 1
    if checked == 0:
        pytest.skip("broker/controller subcommands not registered in this tree")


def test_dockerfile_runs_the_minibroker_entry_point_and_exposes_the_ports(compose: dict[str, Any]) -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["minibroker"\]', text, re.M)
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", text, re.M) for p in line.split()}
    ports = {published(s)[2] for s in servers(compose).values()}
    assert ports <= exposed
    for package in ("common", "storage", "broker", "fetcher", "controller", "client", "cli"):
        assert f"COPY {package} ./{package}" in text
    assert "VOLUME" in text and "/data" in text


def test_ports_are_published_on_the_loopback_only(compose: dict[str, Any]) -> None:
    # no authentication: a port on every interface is a topic anyone on the network can write and delete
    for name, s in compose["services"].items():
        for port in s.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


def test_a_member_that_cannot_start_is_not_restarted_for_ever(compose: dict[str, Any]) -> None:
    # a bad flag or data dir exits with status 2 at every start; `always` / `unless-stopped` would loop on it
    for name, s in servers(compose).items():
        policy, _, retries = s["restart"].partition(":")
        assert policy == "on-failure" and 0 < int(retries) <= 10, f"{name}: {s['restart']}"


def test_healthchecks_allow_for_a_slow_start(compose: dict[str, Any]) -> None:
    # journal replay and log recovery take a while on a big data dir: probes failing then must not count
    for name, s in servers(compose).items():
        hc = s["healthcheck"]
        start = hc["start_period"]
        assert re.fullmatch(r"\d+s", start) and int(start[:-1]) >= 10, f"{name}: {start}"


def test_the_image_is_built_here_never_pulled(compose: dict[str, Any]) -> None:
    # no registry publishes minibroker:latest: a service naming it without `build` would pull whatever
    # docker.io/library/minibroker is when the image is missing
    for name, s in compose["services"].items():
        if s.get("image", "").startswith("minibroker"):
            assert s.get("build") == "." or s.get("pull_policy") == "never", name
