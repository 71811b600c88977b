"""The typed messages of _protocol: weights meta, weight and relay acks, error reports.

Each round-trips through msgpack with the keys the wire always had, and a
hostile body is a ProtocolError that names the bad field.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import torch
from torch import nn

from asyncrl._errors import rebuild_remote_exception
from asyncrl._protocol import (
    MAX_RELAY_MEMBERS,
    RELAY_TO,
    ErrorReport,
    Hello,
    RelayAck,
    RelayAttached,
    WeightMeta,
    WeightsApplied,
)
from asyncrl.weights import WeightSender
from asyncrl.weights._in_flight import parse_relay_ack
from transports import ErrorPayload, LocalHub, PeerLostError, ProtocolError, RemoteError

pytestmark = pytest.mark.anyio


def wire(body: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(body))


# -- weights meta --------------------------------------------------------------------------
def test_weight_meta_keeps_the_wire_keys_and_omits_what_is_unsaid() -> None:
    assert WeightMeta("policy", 3).to_meta() == {"model_id": "policy", "version": 3}
    relayed = WeightMeta("policy", 3, "abc", (b"w0", b"w1"))
    assert wire(relayed.to_meta()) == {"model_id": "policy", "version": 3, "instance": "abc",
                                       RELAY_TO: [b"w0", b"w1"]}
    assert WeightMeta.from_meta(wire(relayed.to_meta())) == relayed
    assert WeightMeta.from_meta({"model_id": "policy", "version": 3}) == WeightMeta("policy", 3)


@pytest.mark.parametrize(("meta", "named"), [
    ([1], "weights message body must be a map, got list"),
    ({"version": 1}, "weights message field 'model_id' is missing"),
    ({"model_id": "", "version": 1}, "'model_id' must be str of length >= 1, got str of length 0"),
    ({"model_id": "p" * 2000, "version": 1}, "'model_id' must be str of length <= 1024, got str "
     "of length 2000"),
    ({"model_id": "p", "version": "1"}, "field 'version' must be int, got str"),
    ({"model_id": "p", "version": True}, "field 'version' must be int, got bool"),
    ({"model_id": "p", "version": 0}, "field 'version' must be int >= 1, got 0"),
    ({"model_id": "p", "version": 1, "instance": 7}, "field 'instance' must be str, got int"),
    ({"model_id": "p", "version": 1, "instance": "i" * 65},
     "'instance' must be str of length <= 64, got str of length 65"),
    ({"model_id": "p", "version": 1, RELAY_TO: "w0"}, "'relay_to' must be list, got str"),
    ({"model_id": "p", "version": 1, RELAY_TO: [[1, 2]]},
     r"'relay_to\[0\]' must be bytes, got list"),
    ({"model_id": "p", "version": 1, RELAY_TO: [b""]},
     r"'relay_to\[0\]' must be bytes of length >= 1, got bytes of length 0"),
    ({"model_id": "p", "version": 1, RELAY_TO: [b"w"] * (MAX_RELAY_MEMBERS + 1)},
     f"'relay_to' must be list of length <= {MAX_RELAY_MEMBERS}, got list of length "
     f"{MAX_RELAY_MEMBERS + 1}"),
])
def test_a_hostile_weight_meta_names_the_bad_field(meta: Any, named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        WeightMeta.from_meta(meta)


# -- a worker's weight ack -----------------------------------------------------------------
def test_weights_applied_round_trips_with_the_wire_keys() -> None:
    body = WeightsApplied("policy", 4).to_body()
    assert body == {"model_id": "policy", "version": 4}
    assert WeightsApplied.from_body(wire(body)) == WeightsApplied("policy", 4)


@pytest.mark.parametrize(("body", "named"), [
    (None, "weights ack message body must be a map, got NoneType"),
    ({"version": 1}, "weights ack message field 'model_id' is missing"),
    ({"model_id": "p", "version": "seven"}, "field 'version' must be int, got str"),
    ({"model_id": "p", "version": -1}, "field 'version' must be int >= 1, got -1"),
])
def test_a_hostile_weight_ack_names_the_bad_field(body: Any, named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        WeightsApplied.from_body(body)


async def test_a_malformed_weight_ack_fails_the_send_instead_of_counting_as_applied() -> None:
    hub = LocalHub(encode=True)
    link = hub.connect(b"w0")
    sender = WeightSender("policy", hub, model=nn.Linear(2, 1), workers={0: b"w0"})
    await sender.send_async()
    await link.ack(await link.recv(), {"version": 1})  # no model_id: not a weights ack
    with pytest.raises(RemoteError, match=r"malformed answer .*'model_id' is missing"):
        await sender.wait_ack(timeout=5)
    assert sender.acked_versions == {0: 0}


# -- a relay's ack -------------------------------------------------------------------------
def test_relay_ack_round_trips_with_the_wire_keys() -> None:
    ack = RelayAck("policy", {b"w0": 3}, {b"w1": RelayAck.lost("not attached"),
                                          b"w2": ErrorPayload("builtins.ValueError", "bad", "tb")})
    body = wire(ack.to_body())
    assert body["failed"][b"w1"] == {"type": "transports.PeerLostError",
                                     "message": "not attached", "traceback": ""}
    assert set(body) == {"model_id", "versions", "failed"}
    assert RelayAck.from_body(body) == ack


@pytest.mark.parametrize(("body", "named"), [
    ("ack", "relay ack message body must be a map, got str"),
    ({"failed": {}, "model_id": "p"}, "relay ack message field 'versions' is missing"),
    ({"versions": {"w0": 1}, "failed": {}, "model_id": "p"}, "'versions' must have bytes keys"),
    ({"versions": {b"w0": "seven"}, "failed": {}, "model_id": "p"},
     r"'versions\[...\]' must be int, got str"),
    ({"versions": {b"w%d" % i: 1 for i in range(MAX_RELAY_MEMBERS + 1)}, "failed": {},
      "model_id": "p"},
     f"'versions' must be map of length <= {MAX_RELAY_MEMBERS}, got dict of length "
     f"{MAX_RELAY_MEMBERS + 1}"),
    ({"versions": {}, "model_id": "p"}, "relay ack message field 'failed' is missing"),
    ({"versions": {}, "failed": {b"w0": "lost"}, "model_id": "p"},
     "relay ack failure must be a map"),
    ({"versions": {}, "failed": {b"w0": {"type": "T", "message": 1, "traceback": ""}},
      "model_id": "p"}, "relay ack failure field 'message' must be str"),
    ({"versions": {}, "failed": {}}, "relay ack message field 'model_id' is missing"),
])
def test_a_hostile_relay_ack_names_the_bad_field(body: Any, named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        RelayAck.from_body(body)


def test_a_relay_ack_is_read_member_by_member() -> None:
    ack = RelayAck("policy", {b"a": 2, b"b": 9}, {
        b"c": RelayAck.lost("the worker left"),
        b"d": ErrorPayload("builtins.ValueError", "no fit", "Traceback: d"),
    })
    members = {b"a": 0, b"b": 1, b"c": 2, b"d": 3, b"e": 4}
    applied, errors = parse_relay_ack(wire(ack.to_body()), members, b"relay-x", 2, 3)
    assert applied == {0: 2}
    assert "without a valid version for this worker (got 9); expected an int in 2..3" in str(
        errors[1])
    assert isinstance(errors[2], PeerLostError) and errors[2].peers == [b"c"]
    assert "relay relay-x: the worker left" in str(errors[2])
    assert (errors[3].remote_type, errors[3].remote_traceback) == ("builtins.ValueError",
                                                                   "Traceback: d")
    assert "(got None)" in str(errors[4])


def test_a_malformed_relay_ack_fails_every_member_and_says_why() -> None:
    applied, errors = parse_relay_ack({"versions": {b"a": 1}, "model_id": "p"},
                                      {b"a": 0, b"b": 1}, b"r", 1, 1)
    assert applied == {}
    assert sorted(errors) == [0, 1]
    assert "its ack is malformed: relay ack message field 'failed' is missing" in str(errors[0])


def test_relay_attached_has_no_body() -> None:
    assert RelayAttached().to_body() is None
    assert RelayAttached.KIND == "relay_attached"
    assert RelayAttached.from_body(None) == RelayAttached()
    with pytest.raises(ProtocolError, match="relay_attached message body must be a map, got list"):
        RelayAttached.from_body([1])


# -- error reports -------------------------------------------------------------------------
def test_an_error_report_puts_its_payload_beside_its_own_fields() -> None:
    report = ErrorReport(ErrorPayload.from_exception(KeyError("obs")), fatal=False, slot=2,
                         token="t")
    body = wire(report.to_body())
    assert set(body) == {"type", "message", "traceback", "fatal", "slot", "token"}
    assert body["type"] == "builtins.KeyError"
    assert ErrorReport.from_body(body) == report


@pytest.mark.parametrize(("change", "named"), [
    ({"type": None}, "error message field 'type' must be str, got NoneType"),
    ({"traceback": 3}, "error message field 'traceback' must be str, got int"),
    ({"fatal": 1}, "error message field 'fatal' must be bool, got int"),
    ({"slot": "0"}, "error message field 'slot' must be int, got str"),
    ({"token": b"t"}, "error message field 'token' must be str, got bytes"),
])
def test_a_hostile_error_report_names_the_bad_field(change: dict[str, Any], named: str) -> None:
    body = {**ErrorReport(ErrorPayload("builtins.KeyError", "obs")).to_body(), **change}
    with pytest.raises(ProtocolError, match=named):
        ErrorReport.from_body(body)


# -- rebuilding a worker's exception -------------------------------------------------------
class _Outer:
    class InnerError(Exception):
        pass


@pytest.mark.parametrize("error", [KeyError("obs"), _Outer.InnerError("deep"),
                                   torch.cuda.OutOfMemoryError("oom")])
def test_a_sent_exception_comes_back_with_its_own_type(error: Exception) -> None:
    rebuilt = rebuild_remote_exception(ErrorPayload.from_exception(error), peer="w0")
    assert type(rebuilt) is type(error)
    assert isinstance(rebuilt.__cause__, RemoteError)
    assert rebuilt.__cause__.peer == "w0"


def test_a_type_in_a_module_not_imported_here_stays_a_remote_error() -> None:
    rebuilt = rebuild_remote_exception(ErrorPayload("not_imported_anywhere.pkg.Error", "x"))
    assert type(rebuilt) is RemoteError
    assert rebuilt.remote_type == "not_imported_anywhere.pkg.Error"


def test_a_remote_error_is_rebuilt_with_its_peer() -> None:
    remote = ErrorPayload("builtins.ValueError", "bad", "tb").to_remote_error(b"w3")
    rebuilt = rebuild_remote_exception(remote)
    assert type(rebuilt) is ValueError
    assert rebuilt.__cause__ is remote
    assert "raised in worker w3; its traceback:\n  tb" in rebuilt.__notes__


@pytest.mark.parametrize("body", ["a string", 7, None, [1, 2], b"bytes"])
def test_a_hello_whose_body_is_no_map_is_a_protocol_error(body: object) -> None:
    # The optional fields (group, relay, attempt) are read first: they too check the map.
    with pytest.raises(ProtocolError, match=r"hello message body must be a map"):
        Hello.from_body(body)


# -- every kind declared once, decoded in one place (asyncrl._protocol.decoding) ------------
def _valid_bodies() -> dict[str, tuple[Any, dict[str, Any]]]:
    """A valid body of each kind the trainer (and a worker) reads, as the codec hands it over."""
    from tensordict import TensorDict

    from asyncrl._protocol import (
        Batch,
        BatchSlots,
        Closing,
        Collect,
        Control,
        Leaving,
        LogEntry,
        Preempt,
        Progress,
        Refuse,
        Rejoin,
        RelayHello,
        RelayWelcome,
        SharedBatch,
        WeightChunk,
        Welcome,
        WorkerLog,
    )

    share = TensorDict({"observation": torch.zeros(1, 4, 3)}, batch_size=[1, 4])
    messages = [
        Hello(2, "w0", "host", 7, {"observation": {"shape": [3]}}, slot=0, token="t",
              group="g", group_size=2),
        RelayHello(2, "relay", "host", 7, [b"w0", b"w1"]),
        Batch(1, share),
        SharedBatch(1, "asyncrl_1_ab", 0, 4),
        ErrorReport(ErrorPayload("builtins.KeyError", "obs", "tb"), fatal=False),
        Leaving("SIGTERM"), Rejoin("silent"), Refuse("full", full=True),
        WorkerLog([LogEntry(20, "user", "m", "")], dropped=1),
        Progress(1, 40), Collect(1, 2), Preempt(1), Control("seed", {"seed": 3}),
        RelayWelcome(2, "abc"),
        Welcome(0, 8, 2, {"policy": {"kind": "zmq"}}, 1, "abc", True, True,
                {"max_frames_per_traj": 5}),
        Closing(finished=False),
        BatchSlots("asyncrl_1_ab", [("observation",), ("next", "reward")]),
        WeightMeta("policy", 3, "abc", (b"w0", b"w1"), WeightChunk(
            0, 2, (("0.weight", 0, 8),), (("0.weight", "float32", (2, 1)),))),
        WeightChunk(1, 2, (("0.weight", 8, 8),)),
        WeightsApplied("policy", 3, published=True),
        RelayAck("policy", {b"w0": 3}, {b"w1": RelayAck.lost("gone")}),
        RelayAttached(),
    ]
    return {type(m).__name__: (type(m), _wire_form(m)) for m in messages}


def _wire_form(message: Any) -> Any:
    """What a kind sends: its body, a weights message's meta, a control's arguments."""
    for writer in ("to_body", "to_meta", "to_args"):
        if hasattr(message, writer):
            return getattr(message, writer)() or {}  # relay_attached's nil: an empty map
    raise AssertionError(message)


#: Kinds whose body may be nil: nothing to say (relay_attached), no arguments (close).
NIL_BODY = {"Closing", "RelayAttached"}


JUNK = [None, True, -1, 1 << 70, 1.5, "", "x\x1b[2J" * 300, b"\xff" * 300, [], [[1, "a"]],
        {}, {"\x00": [None]}, {1: 2}]


@pytest.mark.parametrize("name", sorted(_valid_bodies()))
def test_every_kind_decodes_its_own_body_and_refuses_any_junk_field_with_a_protocol_error(
        name: str) -> None:
    from asyncrl._protocol import decode

    kind, body = _valid_bodies()[name]
    bounds = {"max_frames": 4} if name == "Batch" else {}
    assert _wire_form(decode(kind, dict(body), **bounds)).keys() == body.keys()
    for field in [*body, "unknown_field"]:
        for junk in JUNK:
            try:  # what we check: nothing but a ProtocolError, whatever the field holds
                decode(kind, {**body, field: junk}, **bounds)
            except ProtocolError as exc:
                assert kind.KIND in str(exc) or "batch field" in str(exc), str(exc)
    for junk in JUNK:
        if not isinstance(junk, dict) and not (junk is None and name in NIL_BODY):
            with pytest.raises(ProtocolError, match="message body must be a map"):
                decode(kind, junk, **bounds)


@pytest.mark.parametrize(("body", "named"), [
    ({"steps": 3}, "progress message field 'request' is missing"),
    ({"request": "3", "steps": 3}, "progress message field 'request' must be int, got str"),
    ({"request": True, "steps": 3}, "progress message field 'request' must be int, got bool"),
    ({"request": 3, "steps": -1},
     "progress message field 'steps' must be an int in 0..9223372036854775807, got -1"),
    ({"request": 3, "steps": None}, "progress message field 'steps' must be an int in 0..9"),
])
def test_a_refusal_names_the_kind_the_field_what_was_expected_and_what_came(
        body: Any, named: str) -> None:
    from asyncrl._protocol import Progress, decode

    with pytest.raises(ProtocolError) as caught:
        decode(Progress, body)
    assert named in str(caught.value)


def test_a_peers_strings_are_printable_and_cut_where_they_are_declared() -> None:
    from asyncrl._protocol import RelayHello, decode

    hello = decode(Hello, {"protocol": 2, "name": "w\x1b[2J" + "n" * 500, "host": "h\u202e",
                           "pid": 1, "specs": {"obs\x07": ["float32\n"]}})
    assert hello.name.startswith("w\\x1b[2Jnnn") and len(hello.name) <= 200
    assert hello.host == "h\\u202e"
    assert hello.specs == {"obs\\x07": ["float32\\n"]}
    with pytest.raises(ProtocolError, match=r"relay_hello message field 'members\[1\]' must be "
                       r"bytes of length >= 1, got bytes of length 0"):
        decode(RelayHello, {"protocol": 2, "name": "r", "host": "h", "pid": 1,
                            "members": [b"w", b""]})
    with pytest.raises(ProtocolError, match=r"field 'members\[0\]' must be bytes, got str"):
        decode(RelayHello, {"protocol": 2, "name": "r", "host": "h", "pid": 1,
                            "members": ["dzA="]})  # msgspec would read it as base64: b"w0"
    with pytest.raises(ProtocolError, match=r"field 'specs' must have str keys"):
        decode(Hello, {"protocol": 2, "name": "w", "host": "h", "pid": 1, "specs": {1: 2}})


def test_the_decoding_doctests() -> None:
    import doctest

    import asyncrl._protocol.decoding

    assert doctest.testmod(asyncrl._protocol.decoding).failed == 0
