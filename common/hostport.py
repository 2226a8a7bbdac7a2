"""``HOST:PORT`` on the command line: the one parser the broker, the controller and the clients share.

The host is everything before the last colon and must not be empty, so the
forms accepted so far keep working: ``127.0.0.1:9092``, ``broker-1:9092``,
``[::1]:9092`` and bare ``::1:9092`` (host ``::1``). The port is ASCII digits
only: ``str.isdigit`` also takes ``'²'`` (which ``int`` then refuses with a
traceback) and ``'٣'`` (which ``int`` reads as 3).
"""

from __future__ import annotations

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
    # more than 5 significant digits is out of range anyway; int() of over 4300 digits (zeros too) raises
    significant = port.lstrip("0") or "0"
    value = int(significant) if len(significant) <= 5 else MAX_PORT + 1
    if not low <= value <= MAX_PORT:
        raise ValueError(f"port must be {low}-{MAX_PORT}, got {text!r}")
    return host, value
