"""``minibroker topics``: create, list and describe topics (like kafka-topics.sh).

Admin requests go to the controller (``--controller``, env
``MINIBROKER_CONTROLLER``, default 127.0.0.1:9090). ``describe --json`` merges
the controller's view with each replica's ``/v1/status``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cli.clients import add_controller, controller_of, run_client
from cli.main import CliError
from common.cli_args import positive


def parse_configs(items: list[str] | None) -> dict[str, str]:
    """``--config k=v`` items, checked against the topic-level configs (readable errors)."""
    from common.config import ConfigError, parse_assignments, validate_topic_configs

    try:
        raw = parse_assignments(items or [])
        validate_topic_configs(raw)
    except ConfigError as exc:
        raise CliError(f"--config: {exc}") from None
    return raw


async def create_main(args: argparse.Namespace) -> int:
    from client.admin import Admin

    configs = parse_configs(args.config)
    async with Admin(controller_of(args)) as admin:
        await admin.create_topic(args.name, args.partitions, args.replication_factor, configs)
    print(f"Created topic {args.name}.")
    return 0


async def delete_main(args: argparse.Namespace) -> int:
    from client.admin import Admin

    async with Admin(controller_of(args)) as admin:
        await admin.delete_topic(args.name)
    print(f"Deleted topic {args.name}.")
    return 0


async def list_main(args: argparse.Namespace) -> int:
    from client.admin import Admin

    async with Admin(controller_of(args)) as admin:
        md = await admin.metadata(None)
    for name in sorted(str(t.get("topic")) for t in md.get("topics") or []):
        print(name)
    return 0


def describe_text(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    for t in doc["topics"]:
        if "error" in t:
            lines.append(f"Topic: {t['topic']}\tError: {t['error']}")
            continue
        parts = t["partitions"]
        rf = len(parts[0]["replicas"]) if parts else 0
        configs = ",".join(f"{k}={_config_text(v)}" for k, v in sorted((t.get("configs") or {}).items()))
        lines.append(f"Topic: {t['topic']}\tPartitionCount: {len(parts)}\tReplicationFactor: {rf}\t"
                     f"Configs: {configs}")
        for p in parts:
            states = " ".join(
                f"{s['broker']}:{'?' if s['hw'] is None else s['hw']}/{'?' if s['leo'] is None else s['leo']}"
                for s in p["replica_states"])
            lines.append(f"\tTopic: {t['topic']}\tPartition: {p['partition']}\tLeader: "
                         f"{p['leader'] if p['leader'] >= 0 else 'none'}\tLeaderEpoch: {p['leader_epoch']}\t"
                         f"Replicas: {','.join(map(str, p['replicas']))}\tIsr: {','.join(map(str, p['isr']))}\t"
                         f"HW/LEO: {states}")
    if any(s["hw"] is None for t in doc["topics"] for p in t.get("partitions") or [] for s in p["replica_states"]):
        lines.append("(HW/LEO ?/?: that replica's broker did not answer)")
    return "\n".join(lines)


def _config_text(value: Any) -> str:
    """A config value as it is written with --config (true, not Python's True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


async def describe_main(args: argparse.Namespace) -> int:
    from client.admin import Admin

    if args.name == "":  # not "every topic", which is what leaving NAME out asks for
        raise CliError("topic name must not be empty (leave NAME out to describe every topic)")
    async with Admin(controller_of(args)) as admin:
        doc = await admin.describe([args.name] if args.name is not None else None)
    if args.name and not doc["topics"]:
        raise CliError(f"unknown topic {args.name!r}", status=1)
    missing = [t for t in doc["topics"] if t.get("error")]
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(describe_text(doc))
    if args.name and missing:
        print(f"minibroker: error: topic {args.name!r}: {missing[0]['error']}", file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction[Any], perf: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("topics", help="create, list and describe topics",
                       description="Topic administration (sent to the controller).")
    ts = p.add_subparsers(dest="topics_command", metavar="ACTION")
    p.set_defaults(func=lambda _a: (p.print_help(sys.stderr), 2)[1])

    q = ts.add_parser("create", help="create a topic",
                      description="Create a topic of --partitions partitions with --replication-factor replicas "
                                  "each.")
    q.add_argument("name", metavar="NAME", help="topic name")
    q.add_argument("--partitions", type=positive("--partitions"), required=True, help="number of partitions")
    q.add_argument("--replication-factor", type=positive("--replication-factor"), required=True,
                   help="replicas of each partition")
    q.add_argument("--config", action="append", metavar="KEY=VALUE",
                   help="topic config, e.g. min.insync.replicas=2 (repeatable)")
    add_controller(q)
    q.set_defaults(func=lambda a: run_client(create_main(a)))

    q = ts.add_parser("delete", help="delete a topic (its partitions are removed from every broker)",
                      description="Delete a topic; its partitions are removed from every broker.")
    q.add_argument("name", metavar="NAME", help="topic name")
    add_controller(q)
    q.set_defaults(func=lambda a: run_client(delete_main(a)))

    q = ts.add_parser("list", help="topic names", description="Print every topic name, one per line, sorted.")
    add_controller(q)
    q.set_defaults(func=lambda a: run_client(list_main(a)))

    q = ts.add_parser("describe", help="partitions, leaders, ISR and per-replica HW/LEO",
                      description="Show the partitions, leaders, ISR and per-replica HW/LEO of one topic or of "
                                  "every topic.")
    q.add_argument("name", metavar="NAME", nargs="?", help="topic name (default: every topic)")
    q.add_argument("--json", action="store_true",
                   help="print JSON: the controller's view merged with each replica's /v1/status")
    add_controller(q)
    q.set_defaults(func=lambda a: run_client(describe_main(a)))
