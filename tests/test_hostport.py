"""common.hostport.split_host_port: the one HOST:PORT parser of the broker, controller and client flags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.process import DataDirError, parse_host_port
from client.metadata import parse_bootstrap
from common.hostport import split_host_port


@pytest.mark.parametrize("zero", [True, False])
@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9092", ("127.0.0.1", 9092)),
    ("localhost:1", ("localhost", 1)),
    ("broker-1:65535", ("broker-1", 65535)),
    ("0.0.0.0:09092", ("0.0.0.0", 9092)),  # leading zeros were read as a number before too
    ("[::1]:9092", ("[::1]", 9092)),  # bracketed IPv6: the host keeps its brackets, as before
    ("::1:9092", ("::1", 9092)),  # bare IPv6: the port is after the last colon, as before
    ("[fe80::1%eth0]:80", ("[fe80::1%eth0]", 80)),
])
def test_valid_forms(text: str, expected: tuple[str, int], zero: bool) -> None:
    assert split_host_port(text, allow_port_zero=zero) == expected


@pytest.mark.parametrize("zero", [True, False])
@pytest.mark.parametrize("text", [
    "127.0.0.1:²",  # str.isdigit() says yes, int() raised a traceback
    "127.0.0.1:٣",  # Arabic-Indic 3: int() read it as port 3
    "h:\uff11\uff12",  # fullwidth digits 12
    "", ":", ":9", "h:", "h", "9092", "h:x", "h:-1", "h:+1", "h:1.0", "h: 1", "h:1 ", " h:1 ", "h:0x10",
])
def test_not_host_port(text: str, zero: bool) -> None:
    with pytest.raises(ValueError, match=r"^expected HOST:PORT, got ") as info:
        split_host_port(text, allow_port_zero=zero)
    assert repr(text) in str(info.value) and "\n" not in str(info.value)


def test_port_zero_only_where_asked() -> None:
    assert split_host_port("h:0", allow_port_zero=True) == ("h", 0)
    assert split_host_port("h:000", allow_port_zero=True) == ("h", 0)
    with pytest.raises(ValueError, match=r"^port must be 1-65535, got 'h:0'$"):
        split_host_port("h:0", allow_port_zero=False)


@pytest.mark.parametrize("zero", [True, False])
@pytest.mark.parametrize("text", ["h:65536", "h:99999", "h:100000", "h:" + "9" * 5000, "h:" + "0" * 5000 + "65536"])
def test_port_out_of_range(text: str, zero: bool) -> None:
    with pytest.raises(ValueError, match=r"^port must be [01]-65535, got "):
        split_host_port(text, allow_port_zero=zero)


def test_many_leading_zeros_are_no_traceback() -> None:
    assert split_host_port("h:" + "0" * 5000 + "7", allow_port_zero=False) == ("h", 7)


def _old(text: str, low: int) -> tuple[str, int] | None:
    """The parsers this one replaced (broker/process.py, controller/cli.py, client/metadata.py)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not low <= int(port) <= 65535:
        return None
    return host, int(port)


@given(st.text(alphabet=st.sampled_from("0123456789:[]ab.-% "), max_size=20), st.booleans())
def test_same_answers_as_the_old_parsers_on_ascii(text: str, zero: bool) -> None:
    try:
        new: tuple[str, int] | None = split_host_port(text, allow_port_zero=zero)
    except ValueError:
        new = None
    assert new == _old(text, 0 if zero else 1)


def test_callers_keep_their_messages() -> None:
    with pytest.raises(DataDirError, match=r"^--controller: expected HOST:PORT, got '127.0.0.1:²'$"):
        parse_host_port("127.0.0.1:²", "--controller", allow_port_zero=False)
    with pytest.raises(DataDirError, match=r"^--controller: port must be 1-65535, got '127.0.0.1:0'$"):
        parse_host_port("127.0.0.1:0", "--controller", allow_port_zero=False)
    assert parse_host_port("127.0.0.1:0", "--listen", allow_port_zero=True) == ("127.0.0.1", 0)
    assert parse_bootstrap(" a:09092 ,, [::1]:2") == ["a:9092", "[::1]:2"]
    for bad in ("a:²", "a:٣", "a:0", "a:1,b:0"):
        with pytest.raises(ValueError) as info:
            parse_bootstrap(bad)
        assert "invalid literal" not in str(info.value)
