"""ErrorPayload: how an exception crosses the wire, written once and read once."""

from __future__ import annotations

import pickle
from typing import Any

import msgpack
import pytest

from transports import ErrorPayload, ProtocolError, RemoteError


def _fails_deep() -> None:
    raise ValueError("weights of shape [3, 2] do not fit the model")


def _caught() -> ValueError:
    try:
        _fails_deep()
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


class _Outer:
    class Inner(Exception):
        pass


def test_an_exception_becomes_its_type_path_message_and_traceback() -> None:
    payload = ErrorPayload.from_exception(_caught())
    assert payload.type == "builtins.ValueError"
    assert payload.message == "weights of shape [3, 2] do not fit the model"
    assert "_fails_deep" in payload.traceback
    assert payload.traceback.rstrip().endswith(
        "ValueError: weights of shape [3, 2] do not fit the model")


def test_a_nested_class_is_spelled_module_dot_qualname() -> None:
    payload = ErrorPayload.from_exception(_Outer.Inner("x"))
    assert payload.type == f"{__name__}._Outer.Inner"


def test_a_remote_error_passed_on_keeps_the_original() -> None:
    original = ErrorPayload("builtins.KeyError", "'obs'", "Traceback ...")
    forwarded = ErrorPayload.from_exception(original.to_remote_error(b"w0"))
    assert forwarded == original


def test_the_body_round_trips_through_msgpack_with_the_same_keys() -> None:
    payload = ErrorPayload.from_exception(_caught())
    body = msgpack.unpackb(msgpack.packb(payload.to_body()))
    assert set(body) == {"type", "message", "traceback"}
    assert ErrorPayload.from_body(body) == payload


def test_the_remote_error_names_the_peer_type_message_and_traceback() -> None:
    error = ErrorPayload("builtins.ValueError", "bad", "Traceback: here").to_remote_error(b"w0")
    assert isinstance(error, RemoteError)
    assert (error.peer, error.remote_type, error.remote_message, error.remote_traceback) == (
        "w0", "builtins.ValueError", "bad", "Traceback: here")
    assert str(error).splitlines()[0] == "builtins.ValueError on peer 'w0': bad"
    assert pickle.loads(pickle.dumps(error)).remote_traceback == "Traceback: here"


@pytest.mark.parametrize(("body", "named"), [
    (["type", "message"], "must be a map"),
    (None, "must be a map"),
    ({"message": "m", "traceback": ""}, "^error acknowledgement field 'type' is missing$"),
    ({"type": 3, "message": "m", "traceback": ""}, "field 'type' must be str, got int"),
    ({"type": "T", "message": b"m", "traceback": ""}, "field 'message' must be str, got bytes"),
    ({"type": "T", "message": "m"}, "field 'traceback' is missing"),
    ({"type": "T", "message": "m", "traceback": ["x"]}, "field 'traceback' must be str, got list"),
])
def test_a_hostile_body_is_a_protocol_error_naming_the_field(body: Any, named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        ErrorPayload.from_body(body, "error acknowledgement")


def test_the_error_text_names_the_message_that_carried_it() -> None:
    with pytest.raises(ProtocolError, match=r"^relay ack failure field 'type'"):
        ErrorPayload.from_body({"type": 1}, "relay ack failure")


def test_texts_are_bounded_however_the_payload_is_made() -> None:
    huge = ErrorPayload("T" * 10_000, "m" * 1_000_000, "head\n" + "t" * 1_000_000 + "\nraise")
    assert len(huge.type) == ErrorPayload.MAX_TYPE
    assert len(huge.message) == ErrorPayload.MAX_MESSAGE
    # The traceback keeps its tail: the frame that raised and the exception line.
    assert huge.traceback.endswith("\nraise")
    assert huge.traceback.startswith("(traceback cut)\n")
    assert len(huge.traceback) <= ErrorPayload.MAX_TRACEBACK + len("(traceback cut)\n")
    read = ErrorPayload.from_body({"type": "T", "message": "m" * 1_000_000, "traceback": ""})
    assert len(read.message) == ErrorPayload.MAX_MESSAGE


@pytest.mark.parametrize("body", [None, {"type": "T"}, ["not", "a", "map"]])
def test_a_hub_reads_a_malformed_error_ack_as_that_peers_failure(body: Any) -> None:
    from transports._hub import _remote_error  # the Hub's reader of an error ack

    error = _remote_error(b"w0", body)
    assert (error.peer, error.remote_type) == ("w0", "transports.ProtocolError")
    assert error.remote_message.startswith("a malformed error: error acknowledgement ")


def test_a_hub_reads_a_well_formed_error_ack_as_sent() -> None:
    from transports._hub import _remote_error

    sent = ErrorPayload.from_exception(_caught())
    error = _remote_error(b"w0", wire_body := msgpack.unpackb(msgpack.packb(sent.to_body())))
    assert ErrorPayload.from_body(wire_body) == sent
    assert (error.remote_type, error.remote_message, error.remote_traceback) == (
        sent.type, sent.message, sent.traceback)
