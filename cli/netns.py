"""Linux network namespaces for ``minibroker chaos run --faults partition``.

One namespace per node (``controller``, ``broker-<i>``, ``client``), named
``mb<pid>-<role>``, plus a ``mb<pid>-hub`` namespace holding a bridge. Each node
namespace has loopback up and an ``eth0`` with an address of the private test
subnet ``10.213.<k>.0/24``, the peer of a veth pair whose other end (``h<i>``)
is a port of the hub bridge. Nothing is attached to the root namespace: all
traffic stays between these namespaces. A partition sets a node's hub port down
(the node can reach no one, no one reaches it); healing sets it up again.
Removing the namespaces removes every link and the bridge with them.

``plan`` and the ``*_commands`` functions are pure; ``run`` checks every ``ip``
command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from cli.main import CliError

ENV = "MINIBROKER_CHAOS_NETNS"  # the plan (JSON) for a chaos run re-executed inside the client namespace
IP = "ip"


@dataclass(frozen=True, slots=True)
class Node:
    role: str  # "controller", "broker-<i>" or "client"
    ns: str
    address: str
    hub_if: str  # its veth end in the hub namespace (a bridge port)


@dataclass(frozen=True, slots=True)
class NetPlan:
    run_id: str
    hub: str
    bridge: str
    nodes: tuple[Node, ...]
    prefix: int = 24

    def node(self, role: str) -> Node:
        for n in self.nodes:
            if n.role == role:
                return n
        raise CliError(f"no network namespace for {role!r}")

    @property
    def namespaces(self) -> list[str]:
        return [self.hub, *(n.ns for n in self.nodes)]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> NetPlan:
        doc = json.loads(text)
        return NetPlan(doc["run_id"], doc["hub"], doc["bridge"], tuple(Node(**n) for n in doc["nodes"]),
                       int(doc["prefix"]))


def plan(run_id: str, roles: Sequence[str], subnet: int = 0) -> NetPlan:
    """Names and addresses (pure): ``roles`` get ``10.213.<subnet>.1`` onwards."""
    if not 0 <= subnet <= 255 or not 0 < len(roles) < 250 or len(set(roles)) != len(roles):
        raise CliError(f"cannot plan namespaces for {list(roles)} in subnet {subnet}")
    nodes = tuple(Node(role, f"mb{run_id}-{role}", f"10.213.{subnet}.{i + 1}", f"h{i}")
                  for i, role in enumerate(roles))
    return NetPlan(run_id, f"mb{run_id}-hub", "br0", nodes)


def chaos_roles(brokers: int) -> list[str]:
    return ["controller", *(f"broker-{i}" for i in range(1, brokers + 1)), "client"]


def setup_commands(p: NetPlan) -> list[list[str]]:
    hub = ["-n", p.hub]
    cmds = [[IP, "netns", "add", p.hub], [IP, *hub, "link", "set", "lo", "up"],
            [IP, *hub, "link", "add", p.bridge, "type", "bridge"], [IP, *hub, "link", "set", p.bridge, "up"]]
    for n in p.nodes:
        cmds += [[IP, "netns", "add", n.ns],
                 [IP, "-n", n.ns, "link", "set", "lo", "up"],
                 [IP, *hub, "link", "add", n.hub_if, "type", "veth", "peer", "name", "eth0", "netns", n.ns],
                 [IP, *hub, "link", "set", n.hub_if, "master", p.bridge],
                 [IP, *hub, "link", "set", n.hub_if, "up"],
                 [IP, "-n", n.ns, "addr", "add", f"{n.address}/{p.prefix}", "dev", "eth0"],
                 [IP, "-n", n.ns, "link", "set", "eth0", "up"]]
    return cmds


def partition_commands(p: NetPlan, role: str) -> list[list[str]]:
    return [[IP, "-n", p.hub, "link", "set", p.node(role).hub_if, "down"]]


def heal_commands(p: NetPlan, role: str | None = None) -> list[list[str]]:
    nodes = p.nodes if role is None else (p.node(role),)
    return [[IP, "-n", p.hub, "link", "set", n.hub_if, "up"] for n in nodes]


def exec_prefix(ns: str) -> list[str]:
    return [IP, "netns", "exec", ns]


# ---------------------------------------------------------------- the thin shell

def run(cmds: Sequence[Sequence[str]], timeout_s: float = 10.0) -> None:
    for cmd in cmds:
        try:
            proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CliError(f"`{' '.join(cmd)}` failed: {exc}") from None
        if proc.returncode != 0:
            raise CliError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")


def existing() -> set[str]:
    """Names of the namespaces ``ip netns list`` shows."""
    proc = subprocess.run([IP, "netns", "list"], capture_output=True, text=True, timeout=10, check=False)
    if proc.returncode != 0:
        raise CliError(f"`ip netns list` failed: {proc.stderr.strip()}")
    return {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}


def available() -> str | None:
    """None if namespaces can be created here (root, iproute2, a probe namespace); else why not."""
    if os.geteuid() != 0:
        return "not running as root"
    if shutil.which(IP) is None:
        return "no `ip` command (iproute2)"
    probe = f"mb{os.getpid()}-probe"
    try:
        run([[IP, "netns", "add", probe]])
        run([[IP, "netns", "del", probe]])
        existing()
    except CliError as exc:
        return str(exc)
    return None


def require() -> None:
    why = available()
    if why is not None:
        raise CliError(f"--faults partition needs root and iproute2 (`ip netns`) to create network namespaces: "
                       f"{why}")


def create(p: NetPlan) -> None:
    """Create everything in ``p``; on failure remove what was created and raise."""
    try:
        run(setup_commands(p))
    except BaseException:
        destroy(p)
        raise


def destroy(p: NetPlan) -> list[str]:
    """Remove every namespace of ``p`` (links and the bridge go with them); returns the ones still listed."""
    for ns in p.namespaces:
        subprocess.run([IP, "netns", "del", ns], capture_output=True, timeout=10, check=False)
    try:
        left = existing()
    except CliError:
        return p.namespaces
    return [ns for ns in p.namespaces if ns in left]


def partition(p: NetPlan, role: str) -> None:
    run(partition_commands(p, role))


def heal(p: NetPlan, role: str | None = None) -> None:
    run(heal_commands(p, role))
