"""Configuration with Kafka's names and defaults.

``BROKER_CONFIGS`` / ``CONTROLLER_CONFIGS`` list every key a process accepts
(``--set key=value``). Topic-level overrides use Kafka's topic names
(``segment.bytes``), which map to broker defaults (``log.segment.bytes``) as in
Kafka's ``LogConfig``. Unknown keys and values of the wrong type are errors
with a readable message, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common.wire import MAX_FETCH_WAIT_MS

DAY_MS = 24 * 60 * 60 * 1000
# Kafka's INT and LONG config types. A value beyond them would not fit the wire or the controller's journal.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: type
    default: Any
    doc: str
    topic_name: str | None = None  # the per-topic override, when Kafka allows one
    min_value: int | None = None
    max_value: int = INT64_MAX  # INT32_MAX where Kafka declares the config an INT
    choices: tuple[str, ...] = ()  # a string setting's only values (exact case, as Kafka's ValidString)


def _defs(*items: ConfigDef) -> dict[str, ConfigDef]:
    return {d.name: d for d in items}


IDLE_DOC = ("a client connection with no request for this long, or a request body that stops coming for this "
            "long, is closed (the body's with HTTP 408)")

BROKER_CONFIGS: dict[str, ConfigDef] = _defs(
    # log
    ConfigDef("log.segment.bytes", int, 1024 * 1024 * 1024, "segment file size before a roll",
              "segment.bytes", 1024, max_value=INT32_MAX),
    ConfigDef("log.roll.ms", int, 7 * DAY_MS, "segment age before a roll", "segment.ms", 1),
    ConfigDef("log.retention.bytes", int, -1, "max log size (-1 = unlimited)", "retention.bytes"),
    ConfigDef("log.retention.ms", int, 7 * DAY_MS, "max record age (-1 = unlimited)", "retention.ms",
              -1),
    ConfigDef("log.index.interval.bytes", int, 4096, "bytes between offset index entries",
              "index.interval.bytes", 0, max_value=INT32_MAX),
    ConfigDef("log.flush.interval.messages", int, INT64_MAX, "fsync after this many messages",
              "flush.messages", 1),
    ConfigDef("log.flush.interval.ms", int, INT64_MAX, "fsync after this long", "flush.ms", 0),
    ConfigDef("log.retention.check.interval.ms", int, 300_000, "how often retention runs", None, 1),
    ConfigDef("log.flush.offset.checkpoint.interval.ms", int, 60_000,
              "recovery-point checkpoint interval", None, 1, max_value=INT32_MAX),
    ConfigDef("producer.id.expiration.ms", int, DAY_MS,
              "a producer id with no append for this long is forgotten (its retries are no longer deduplicated)",
              None, 1, max_value=INT32_MAX),
    ConfigDef("message.max.bytes", int, 1024 * 1024 + 12, "largest record batch accepted",
              "max.message.bytes", 0, max_value=INT32_MAX),
    # Kafka's KIP-937 bounds on producer timestamps, with Kafka 4.0's defaults (KIP-1030: one hour ahead):
    # a batch stamped far in the future kept its segment, and every later one, from time-based retention
    # and rolling
    ConfigDef("log.message.timestamp.after.max.ms", int, 3_600_000,
              "refuse a batch (INVALID_TIMESTAMP) with a timestamp more than this far ahead of the broker's time",
              "message.timestamp.after.max.ms", 0),
    ConfigDef("log.message.timestamp.before.max.ms", int, INT64_MAX,
              "refuse a batch (INVALID_TIMESTAMP) with a timestamp more than this far behind the broker's time",
              "message.timestamp.before.max.ms", 0),
    ConfigDef("log.message.timestamp.type", str, "CreateTime",
              "CreateTime: records keep the producer's timestamps; LogAppendTime: the leader's time of append "
              "replaces them (the two bounds above then do not apply)", "message.timestamp.type",
              choices=("CreateTime", "LogAppendTime")),
    # replication
    ConfigDef("min.insync.replicas", int, 1, "ISR size needed for acks=all, for topics without their own",
              "min.insync.replicas", 1, max_value=INT32_MAX),
    # the topic-level override only: the controller elects leaders, so the cluster's default is the controller's
    # setting (see BROKER_REFUSED)
    ConfigDef("unclean.leader.election.enable", bool, False, "elect an out-of-sync replica if no ISR is live",
              "unclean.leader.election.enable"),
    ConfigDef("replica.lag.time.max.ms", int, 30_000, "follower not caught up this long leaves the ISR",
              None, 1),
    ConfigDef("replica.high.watermark.checkpoint.interval.ms", int, 5_000, "HW checkpoint interval",
              None, 1),
    ConfigDef("num.replica.fetchers", int, 1, "fetcher tasks per source broker", None, 1, max_value=INT32_MAX),
    # at most what a leader accepts as a fetch's max_wait_ms: above it every follower fetch was refused (HTTP 400)
    # and the followers copied nothing while staying in the ISR
    ConfigDef("replica.fetch.wait.max.ms", int, 500, "follower fetch long-poll wait", None, 0,
              max_value=MAX_FETCH_WAIT_MS),
    ConfigDef("replica.fetch.min.bytes", int, 1,
              "follower fetch waits at the leader for this many bytes (at most replica.fetch.wait.max.ms): "
              "fewer, larger fetches for throughput, slower acks=all under light load", None, 1, max_value=INT32_MAX),
    ConfigDef("replica.fetch.max.bytes", int, 1024 * 1024, "follower fetch bytes per partition", None, 1,
              max_value=INT32_MAX),
    ConfigDef("replica.fetch.response.max.bytes", int, 10 * 1024 * 1024, "follower fetch bytes per response",
              None, 1, max_value=INT32_MAX),
    ConfigDef("replica.fetch.backoff.ms", int, 1_000, "park a failing partition this long", None, 0,
              max_value=INT32_MAX),
    ConfigDef("replica.socket.timeout.ms", int, 30_000, "follower request timeout", None, 1, max_value=INT32_MAX),
    ConfigDef("request.timeout.ms", int, 30_000, "how long an AlterPartition to the controller is retried", None, 1,
              max_value=INT32_MAX),
    ConfigDef("connections.max.idle.ms", int, 600_000, IDLE_DOC, None, 1),
    # controller link
    ConfigDef("broker.heartbeat.interval.ms", int, 2_000, "broker -> controller heartbeat interval", None, 1,
              max_value=INT32_MAX),
    ConfigDef("broker.session.timeout.ms", int, 9_000, "broker fenced after this silence", None, 1,
              max_value=INT32_MAX),
    ConfigDef("controlled.shutdown.enable", bool, True, "move leaderships away before stopping"),
    ConfigDef("controlled.shutdown.max.wait.ms", int, 30_000, "bound on controlled shutdown", None, 0),
)

CONTROLLER_CONFIGS: dict[str, ConfigDef] = _defs(
    ConfigDef("broker.session.timeout.ms", int, 9_000, "broker fenced after this silence", None, 1,
              max_value=INT32_MAX),
    ConfigDef("auto.leader.rebalance.enable", bool, True, "move leadership back to preferred replicas"),
    ConfigDef("leader.imbalance.check.interval.seconds", int, 300, "preferred election timer", None, 1),
    ConfigDef("leader.imbalance.per.broker.percentage", int, 10, "imbalance threshold per broker", None, 0,
              max_value=INT32_MAX),
    ConfigDef("default.replication.factor", int, 1, "replication factor when none is given", None, 1,
              max_value=INT32_MAX),
    ConfigDef("num.partitions", int, 1, "partitions when none are given", None, 1, max_value=INT32_MAX),
    ConfigDef("metadata.snapshot.interval.records", int, 1_000, "journal records between snapshots", None, 1),
    ConfigDef("unclean.leader.election.enable", bool, False,
              "elect an out-of-sync replica if no ISR is live, for topics without their own"),
    ConfigDef("connections.max.idle.ms", int, 600_000, IDLE_DOC, None, 1),
)

TOPIC_CONFIGS: dict[str, ConfigDef] = {d.topic_name: d for d in BROKER_CONFIGS.values() if d.topic_name}

# Keys one process refuses because the other one reads them. A setting that is accepted and never read looks
# applied and is not: the brokers' min.insync.replicas was once also a controller setting copied into every
# new topic, so `--set min.insync.replicas=2` on the brokers changed nothing.
BROKER_REFUSED = {"unclean.leader.election.enable": "a controller setting (it elects leaders; per topic: "
                                                    "--config unclean.leader.election.enable)"}
CONTROLLER_REFUSED = {
    "min.insync.replicas": "a broker setting (the leader applies it; per topic: --config min.insync.replicas)",
    "broker.heartbeat.interval.ms": "a broker setting (each broker sends its heartbeats at its own interval)",
}


class ConfigError(ValueError):
    """A bad key or value; the message says which and why."""


def parse_bool(key: str, raw: object) -> bool:
    """A boolean setting as Kafka reads one: a bool, or ``true`` / ``false`` in any case (surrounding blanks
    ignored), nothing else (not ``1``, ``yes`` or ``on``); ``ConfigError`` naming ``key`` otherwise. The one
    parser for every boolean the user sets: topic and broker configs, the producer's ``enable.idempotence``."""
    if isinstance(raw, bool):
        return raw
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in ("true", "false"):
        return text == "true"
    raise ConfigError(f"{key}: expected true or false, got {raw!r}")


def parse_value(d: ConfigDef, raw: Any, key: str | None = None) -> Any:
    """``raw`` as ``d``'s type; ``ConfigError`` names ``key`` (the name the user gave, e.g. a topic's
    ``retention.ms`` for ``log.retention.ms``)."""
    key = key or d.name
    if d.type is bool:
        return parse_bool(key, raw)
    if d.type is int:
        value = parse_int(key, raw)
        low = -INT64_MAX - 1 if d.min_value is None else d.min_value
        given = _as_typed(raw) if isinstance(raw, str) else value  # parse_int clamps a huge number
        if value < low:
            raise ConfigError(f"{key}: must be >= {low}, got {given}")
        if value > d.max_value:
            raise ConfigError(f"{key}: must be at most {d.max_value}, got {given}")
        return value
    if not isinstance(raw, str) or (d.choices and raw.strip() not in d.choices):
        raise ConfigError(f"{key}: expected one of {', '.join(d.choices)}, got {raw!r}" if d.choices
                          else f"{key}: expected a string, got {raw!r}")
    return raw.strip()


def _as_typed(raw: str) -> str:
    text = raw.strip()
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def parse_int(key: str, raw: object) -> int:
    """An integer as Java's ``Long.parseLong`` reads one: an int, or a string of an optional sign and ASCII
    digits (surrounding blanks ignored). Not ``int()``'s wider grammar: ``"9_000"``, fullwidth digits, or a float
    such as ``1e3``. A number of over 20 digits comes back as 20 nines (beyond every range)."""
    if type(raw) is int:
        return raw
    text = raw.strip() if isinstance(raw, str) else ""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise ConfigError(f"{key}: expected an integer, got {raw!r}")
    significant = digits.lstrip("0") or "0"
    if len(significant) > 20:  # beyond any range (and int() refuses strings of over 4300 digits)
        significant = "9" * 20
    return -int(significant) if text.startswith("-") else int(significant)


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; ``ConfigError`` on a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


class Config:
    """A resolved set of values: defaults overridden by explicit settings."""

    def __init__(self, defs: Mapping[str, ConfigDef], overrides: Mapping[str, Any] | None = None,
                 refused: Mapping[str, str] | None = None) -> None:
        self._defs = defs
        self._values: dict[str, Any] = {k: d.default for k, d in defs.items()}
        for key, raw in (overrides or {}).items():
            if refused and key in refused:
                raise ConfigError(f"{key} is {refused[key]}, not set here")
            if key not in defs:
                known = ", ".join(sorted(set(defs) - set(refused or ())))
                raise ConfigError(f"unknown config {key!r} (known: {known})")
            self._values[key] = parse_value(defs[key], raw)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def get_int(self, key: str) -> int:
        value = self._values[key]
        assert isinstance(value, int)
        return value

    def get_str(self, key: str) -> str:
        value = self._values[key]
        assert isinstance(value, str)
        return value

    def get_bool(self, key: str) -> bool:
        value = self._values[key]
        assert isinstance(value, bool)
        return value

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def with_topic_overrides(self, topic_configs: Mapping[str, Any]) -> Config:
        """The effective config for one topic: broker values overridden by topic-level keys."""
        overrides = dict(self._values)
        for key, raw in topic_configs.items():
            d = TOPIC_CONFIGS.get(key)
            if d is None:
                raise ConfigError(f"unknown topic config {key!r} (known: {', '.join(sorted(TOPIC_CONFIGS))})")
            overrides[d.name] = raw
        return Config(self._defs, overrides)


def broker_config(overrides: Mapping[str, Any] | None = None) -> Config:
    cfg = Config(BROKER_CONFIGS, overrides, BROKER_REFUSED)
    # Kafka's KafkaConfig.validateValues: the broker-wide retention is unlimited or at least 1 ms (a topic's
    # retention.ms may be 0)
    if cfg.get_int("log.retention.ms") == 0:
        raise ConfigError("log.retention.ms must be unlimited (-1) or at least 1, got 0")
    # Kafka's KafkaConfig.validateValues: a follower's fetch parked at the leader longer than the lag time
    # would drop it from the ISR while it is waiting, and one longer than the socket timeout would time out
    _require_at_most(cfg, "replica.fetch.wait.max.ms", "replica.lag.time.max.ms")
    _require_at_most(cfg, "replica.fetch.wait.max.ms", "replica.socket.timeout.ms")
    _require_heartbeat_within_session(cfg)
    return cfg


def controller_config(overrides: Mapping[str, Any] | None = None) -> Config:
    return Config(CONTROLLER_CONFIGS, overrides, CONTROLLER_REFUSED)


def _require_at_most(cfg: Config, small: str, large: str) -> None:
    if cfg.get_int(small) > cfg.get_int(large):
        raise ConfigError(f"{small} ({cfg.get_int(small)}) must be at most {large} ({cfg.get_int(large)})")


def _require_heartbeat_within_session(cfg: Config) -> None:
    """A heartbeat interval at or above the session timeout fences every broker between two heartbeats."""
    interval, session = cfg.get_int("broker.heartbeat.interval.ms"), cfg.get_int("broker.session.timeout.ms")
    if interval >= session:
        raise ConfigError(f"broker.heartbeat.interval.ms ({interval}) must be below broker.session.timeout.ms "
                          f"({session})")


def validate_topic_configs(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Parse topic-level configs into typed values; ``ConfigError`` names the bad one."""
    out: dict[str, Any] = {}
    for key, raw in configs.items():
        d = TOPIC_CONFIGS.get(key)
        if d is None:
            raise ConfigError(f"unknown topic config {key!r} (known: {', '.join(sorted(TOPIC_CONFIGS))})")
        out[key] = parse_value(d, raw, key)
    return out
