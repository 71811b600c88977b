"""ZeroMQ addresses are checked before a socket sees them (issue #35.4)."""

from __future__ import annotations

import pytest

import transports
from transports import Endpoint, check_resolves, parse_endpoint


@pytest.mark.parametrize(("text", "bind", "expected"), [
    ("tcp://127.0.0.1:5555", False, Endpoint("tcp://127.0.0.1:5555", "tcp", "127.0.0.1", 5555)),
    ("tcp://trainer.example:1", False, Endpoint("tcp://trainer.example:1", "tcp",
                                                "trainer.example", 1)),
    ("tcp://[::1]:65535", False, Endpoint("tcp://[::1]:65535", "tcp", "::1", 65535)),
    ("tcp://10.0.0.2:0;10.0.0.1:5555", False,  # libzmq's SOURCE;PEER: the peer counts
     Endpoint("tcp://10.0.0.2:0;10.0.0.1:5555", "tcp", "10.0.0.1", 5555)),
    ("tcp://*:5555", True, Endpoint("tcp://*:5555", "tcp", "*", 5555)),
    ("tcp://0.0.0.0:0", True, Endpoint("tcp://0.0.0.0:0", "tcp", "0.0.0.0", 0)),
    ("tcp://eth0:*", True, Endpoint("tcp://eth0:*", "tcp", "eth0", None)),
    ("ipc:///tmp/asyncrl-x/coordinator", False,
     Endpoint("ipc:///tmp/asyncrl-x/coordinator", "ipc", path="/tmp/asyncrl-x/coordinator")),
    ("inproc://hub", True, Endpoint("inproc://hub", "inproc", path="hub")),
])
def test_addresses_asyncrl_uses_parse(text: str, bind: bool, expected: Endpoint) -> None:
    assert parse_endpoint(text, argument="listen", bind=bind) == expected


@pytest.mark.parametrize(("text", "bind", "says"), [
    ("tcp://127.0.0.1", False, "has no port"),  # the case
    ("tcp://[::1]", False, "has no port"),
    ("tcp://127.0.0.1:", False, "has no port"),
    ("http://trainer:5555", False, "the scheme 'http'"),  # the case
    ("127.0.0.1:5555", False, "has no scheme"),
    ("tcp://:5555", False, "has no host"),
    ("tcp://h:0", False, "the port 0, out of range"),
    ("tcp://h:65536", True, "the port 65536, out of range"),
    ("tcp://h:http", False, "port 'http' that is not a number"),
    ("tcp://h:5555/path", False, "that is not a number"),
    ("tcp://*:5555", False, "connects to '*'"),
    ("tcp://h:*", False, "port '*' that is not a number"),
    ("tcp://::1:5555", True, "IPv6 host without brackets"),
    ("tcp://[nope]:5555", True, "not an IPv6 address"),
    ("tcp://tr ainer:5555", False, "characters a host name cannot hold"),
    ("ipc://", False, "names no path"),
    ("ipc:///" + "d" * 120, True, "at most 107"),
    ("inproc://", True, "names no name"),
    (5555, True, "is not a string (a int)"),
])
def test_a_bad_address_is_one_value_error_naming_the_argument(text: object, bind: bool,
                                                             says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_endpoint(text, argument="listen", bind=bind)
    message = str(caught.value)
    assert message.startswith(f"listen={text!r} ") and says in message, message
    assert "expected tcp://HOST:PORT, ipc://PATH or inproc://NAME" in message
    assert "\n" not in message


def test_without_an_argument_the_message_starts_with_the_address() -> None:
    with pytest.raises(ValueError, match=r"^'tcp://h' has no port"):
        parse_endpoint("tcp://h")


def test_a_name_that_does_not_resolve_says_so_with_the_name() -> None:
    # .invalid never resolves (RFC 2606); localhost and IP addresses always do.
    with pytest.raises(OSError, match=r"host name 'trainer\.invalid' in "
                                      r"tcp://trainer\.invalid:5555 does not resolve"):
        check_resolves(parse_endpoint("tcp://trainer.invalid:5555"))
    check_resolves(parse_endpoint("tcp://localhost:5555"))
    check_resolves(parse_endpoint("tcp://127.0.0.1:5555"))
    check_resolves(parse_endpoint("ipc:///nowhere/at/all"))  # no host: nothing to resolve


def test_the_checks_are_part_of_the_public_face() -> None:
    for name in ("Endpoint", "parse_endpoint", "check_resolves"):
        assert name in transports.__all__
