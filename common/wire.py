"""The wire: msgpack bodies over HTTP/1.1, ``POST /v1/<api>``.

``decode_body`` turns bytes into a dict or raises ``BadRequest`` (HTTP 400);
the ``field`` helpers pull typed, bounded fields out of a decoded body so a
handler never sees an ill-typed value. See ``docs/protocol.md`` for every API.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard, TypeVar

import msgpack

CONTENT_TYPE = "application/x-msgpack"
MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
MAX_INT32 = 2**31 - 1
MAX_FETCH_WAIT_MS = 5 * 60 * 1000  # a broker refuses a fetch whose max_wait_ms is above it (HTTP 400)


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class BadRequest(ValueError):
    """A malformed request body: answered with HTTP 400 and this message."""


_packers = threading.local()
_PACKER_KEEP_BYTES = 1 << 20


def encode(obj: Any) -> bytes:
    """msgpack, bytes as bin. One ``Packer`` per thread, reused: ``msgpack.packb`` builds a Packer and its
    256 KiB buffer on every call, ~0.8 us of the ~1.8 us a produce answer takes (several times that
    inside a loaded broker: docs/benchmarks/broker.md, tenth session). A Packer keeps the largest buffer it
    has grown to, so one that has packed more than a MiB is dropped. It empties its buffer when packing
    fails, so an error leaves nothing behind for the next call."""
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    data: bytes = packer.pack(obj)
    if len(data) > _PACKER_KEEP_BYTES:
        _packers.packer = None
    return data


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def decode_body(data: bytes) -> dict[str, Any]:
    try:
        obj = decode(data)
    except Exception as exc:  # msgpack raises several unrelated types
        raise BadRequest(f"body is not valid msgpack: {exc.__class__.__name__}") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"body must be a msgpack map, got {type(obj).__name__}")
    return obj


T = TypeVar("T")
_MISSING = object()


def field(body: Mapping[str, Any], name: str, kind: type[T], default: Any = _MISSING) -> T:
    """A required (or defaulted) field of one type; bool is never accepted as int."""
    value = body.get(name, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise BadRequest(f"missing field {name!r}")
        return default  # type: ignore[no-any-return]
    if kind is int and isinstance(value, bool):
        raise BadRequest(f"field {name!r} must be an integer, got bool")
    if not isinstance(value, kind):
        raise BadRequest(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def int_field(body: Mapping[str, Any], name: str, default: Any = _MISSING, *,
              lo: int = MIN_INT64, hi: int = MAX_INT64) -> int:
    value = field(body, name, int, default)
    if not lo <= value <= hi:
        raise BadRequest(f"field {name!r} out of range [{lo}, {hi}]: {value}")
    return value


_CLUSTER_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_cluster_id(value: object) -> TypeGuard[str]:
    """A cluster id as a controller makes them (22 base64url characters) or an operator could: 1-64 ASCII
    letters, digits, '_' and '-'."""
    return isinstance(value, str) and _CLUSTER_ID_RE.fullmatch(value) is not None


MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")


def topic_name_error(name: object) -> str | None:
    """None for a legal topic name, else why not (Kafka's ``Topic.validate``): the controller refuses
    to create such a topic, and a broker asked for its metadata answers INVALID_TOPIC_EXCEPTION."""
    if not isinstance(name, str) or not name:
        return "topic name must be a non-empty string"
    if name in (".", ".."):
        return "topic name cannot be '.' or '..'"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"topic name longer than {MAX_TOPIC_NAME_LENGTH} characters"
    if not _LEGAL_TOPIC.fullmatch(name):  # not match with "$": that lets a name end in a newline
        return "topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


MAX_HOST_LENGTH = 255
# what a host name or an IP address can contain: a DNS name or IPv4 address ("broker-1", "10.0.0.7"), an IPv6
# address bare or in brackets ("::1", "[::1]"), with a zone ("fe80::1%eth0"); '_' as hosts in containers are
# often named
_HOST_RE = re.compile(r"[A-Za-z0-9._:-]+(%[A-Za-z0-9._-]+)?|\[[A-Za-z0-9._:-]+(%[A-Za-z0-9._-]+)?\]")
HOST_RULE = (f"1-{MAX_HOST_LENGTH} characters: ASCII letters, digits, '-', '.', '_', ':', an IPv6 address "
             "optionally in [brackets] and with a %zone")


def is_host(host: str) -> bool:
    """A host name or IP address (``HOST_RULE``). It becomes part of every URL others build to reach that host,
    so a character such as '/', '@', '#', '?' or a space would make every request to it fail (or go elsewhere)."""
    return (len(host) <= MAX_HOST_LENGTH and _HOST_RE.fullmatch(host) is not None
            and ("%" not in host or ":" in host))  # a zone only on an IPv6 address


def host_field(body: Mapping[str, Any], name: str = "host") -> str:
    """A host name or IP address (``is_host``)."""
    host = field(body, name, str)
    if not is_host(host):
        raise BadRequest(f"field {name!r} must be a host name or IP address ({HOST_RULE}), got {host[:80]!r}")
    return host


def list_field(body: Mapping[str, Any], name: str, default: Any = _MISSING) -> list[Any]:
    return field(body, name, list, default)


def map_items(items: list[Any], what: str) -> list[dict[str, Any]]:
    """Every element must be a map; ``what`` names the list in the error."""
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest(f"each entry of {what!r} must be a map, got {type(item).__name__}")
    return items


def int_list(body: Mapping[str, Any], name: str, default: Any = _MISSING) -> list[int]:
    values = list_field(body, name, default)
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise BadRequest(f"field {name!r} must be a list of integers")
    return values
