"""``HOST:PORT`` on the command line: the one parser the broker, the controller and the clients share.

The host is everything before the last colon and must not be empty, so the
forms accepted so far keep working: ``127.0.0.1:9092``, ``broker-1:9092``,
``[::1]:9092`` and bare ``::1:9092`` (host ``::1``). The port is ASCII digits
only: ``str.isdigit`` also takes ``'²'`` (which ``int`` then refuses with a
traceback) and ``'٣'`` (which ``int`` reads as 3).
"""

from __future__ import annotations

from common.digits import parse_digits

MAX_PORT = 65535


def split_host_port(text: str, *, allow_port_zero: bool) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``, or ``ValueError`` with a one-line message.

    ``allow_port_zero``: a listen address may ask for any free port with 0; a
    connect target may not.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port or not (port.isascii() and port.isdigit()):
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    low = 0 if allow_port_zero else 1
    value = parse_digits(port, MAX_PORT)
    if value is None or value < low:
        raise ValueError(f"port must be {low}-{MAX_PORT}, got {text!r}")
    return host, value
