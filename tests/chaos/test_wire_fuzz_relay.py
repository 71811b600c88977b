"""Chaos: the wire fuzzer against a live host relay (hypothesis, stateful; #43.2).

A real :class:`~asyncrl._worker.relay.HostRelay` with two honest members runs in its own
process (``relay_target.py``) and registers with a hostile coordinator: a raw ROUTER in
this process (:class:`Upstream`) that welcomes it, pings it as a hub does, and sends it
valid and mutated weights messages (whole, chunked, naming strangers, of another
instance) and other kinds. A stranger (:class:`~tests.chaos.wire_fuzz.Peer`) connects to
the relay's own endpoint, where only members belong, and sends what the fuzzer makes of
every kind: it is refused (a ``ProtocolError`` logged, rate-limited) and dropped. After
each example an honest version (a *probe*) goes through the relay.

It asserts: a malformed weights message from upstream is refused with a ``ProtocolError``
(the error ack names it), never a crash; the stranger gets nothing, costs a warning and
is dropped (the relay's hub keeps its members only);
every probe reaches both members exactly and the relay acks the version of each; the
relay's peak RSS grows by at most 64 MB and its event loop never stalls more than 0.5 s.
``WIRE_FUZZ_EXAMPLES`` and ``WIRE_FUZZ_STEPS`` run longer, as for the other fuzzers.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from asyncrl._protocol import (
    WEIGHTS_KIND,
    RelayHello,
    RelayWelcome,
    WeightChunk,
    WeightMeta,
)
from transports._codec import Decoded

from .live_fuzz import WAIT, FuzzMachine, Live, check_gauges, fuzz, live_fixture
from .relay_target import MEMBERS, probe_value
from .wire_fuzz import Message, Peer, mutated, sendable
from .wire_hub import INSTANCE, Router

pytestmark = [pytest.mark.chaos]
EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "6"))
STEPS = int(os.environ.get("WIRE_FUZZ_STEPS", "10"))
SCRIPT = Path(__file__).with_name("relay_target.py")


class Upstream(Router):
    """Plays the coordinator for one relay: welcomes it, pings it, reads its acks."""

    def __init__(self) -> None:
        super().__init__()
        self.acks: dict[int, tuple[Any, dict[str, Any]]] = {}  # seq -> (body, meta)
        self.seq = 0

    def take(self, peer: bytes, message: Decoded) -> None:
        if message.kind == RelayHello.KIND:
            self.peer = peer
            self.send(Message(RelayWelcome.KIND, RelayWelcome(1, INSTANCE).to_body()))
        elif message.kind == "ack":
            self.acks[message.seq] = (message.body, message.meta)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def weights(upstream: Upstream, version: int, *, chunked: bool = False,
            members: list[bytes] | None = None, extra: dict[str, Any] | None = None) -> Message:
    """A valid weights message for the relay's members (``version`` of ``policy``)."""
    value = probe_value(version)
    relay_to = list(MEMBERS) if members is None else members
    if chunked:
        chunk = WeightChunk(0, 1, (("value", 0, value.numel() * 4),),
                            (("value", "float32", tuple(value.shape)),))
        meta = WeightMeta("policy", version, INSTANCE, relay_to=tuple(relay_to),
                          chunk=chunk).to_meta()
        body: Any = [value.view(torch.uint8)]
    else:
        meta = WeightMeta("policy", version, INSTANCE, relay_to=tuple(relay_to)).to_meta()
        body = {"value": value}
    return Message(WEIGHTS_KIND, body, meta={**meta, **(extra or {})},
                   seq=upstream.next_seq(), ack=True)


class Session(Live):
    """The hostile coordinator, the relay process, the stranger."""

    def __init__(self, backend: str, root: Path) -> None:
        self.token = secrets.token_hex(8)
        self.upstream = Upstream()
        super().__init__(backend, root, SCRIPT, self.upstream.endpoint, self.token)
        self.version = 1000  # the probes' versions; the fuzzer's are below
        self.stranger = Peer(self.target.endpoint, b"stranger-" + secrets.token_hex(4).encode())
        self.stranger.connect()
        deadline = time.monotonic() + 60
        while not self.ready():
            assert time.monotonic() < deadline, f"the relay never got ready: {self.target.stderr}"
            self.upstream.pump(0.2)
        self.probe()
        self.target.command("baseline", "baseline")

    def ready(self) -> bool:
        report = self.target.report()
        return bool(report["registered"]) and report["attached"] == len(MEMBERS)

    def probe(self) -> None:
        """An honest version through the relay: exact at both members, acked for both."""
        self.version += 1
        message = weights(self.upstream, self.version, extra={"probe": self.token},
                          chunked=self.version % 2 == 0)
        self.upstream.send(message)
        deadline = time.monotonic() + WAIT
        while message.seq not in self.upstream.acks:
            assert time.monotonic() < deadline, (
                f"the relay never acked probe version {self.version}: "
                f"{self.target.report()['warnings']}")
            self.upstream.pump(0.05)
        body, meta = self.upstream.acks[message.seq]
        assert not meta.get("error"), f"probe version {self.version} refused: {body}"
        assert body["versions"] == {m: self.version for m in MEMBERS}, body
        report = self.target.report()
        for member in MEMBERS:
            got = report["probes"][member.decode()].get(str(self.version))
            assert got is True, f"{member!r} got probe version {self.version}: {got}"

    def close(self) -> None:
        self.stranger.close()
        super().close()
        self.upstream.close()


session = live_fixture(Session, "fuzzr-")


def upstream_messages(upstream: Upstream) -> dict[str, Any]:
    """One valid message per kind a relay reads from its coordinator (versions 1..999)."""
    draw = iter(range(1, 1000))
    return {
        "weights": lambda: weights(upstream, next(draw)),
        "weights_chunk": lambda: weights(upstream, next(draw), chunked=True),
        "weights_stranger": lambda: weights(upstream, next(draw), members=[b"someone"]),
        "weights_instance": lambda: weights(upstream, next(draw), extra={"instance": "other"}),
        "welcome": lambda: Message(RelayWelcome.KIND, RelayWelcome(1, INSTANCE).to_body()),
        "ping": lambda: Message("ping", None, meta={"hub": INSTANCE}),
        "unknown": lambda: Message("collect", {"request": 1, "credits": 1}),
    }


UPSTREAM_KINDS = ["weights", "weights", "weights_chunk", "weights_chunk", "weights_stranger",
                  "weights_instance", "welcome", "ping", "unknown"]
#: What a stranger on the relay's endpoint sends: a member's ack, a hello, noise.
STRANGER_KINDS = {
    "ack": lambda: Message("ack", {"model_id": "policy", "version": 1}, seq=1),
    "hello": lambda: Message("relay_hello", {"protocol": 1, "members": [b"m0"]}),
    "weights": lambda: Message(WEIGHTS_KIND, {"value": torch.ones(4)},
                               meta={"model_id": "policy", "version": 1}, ack=True),
}


def check(report: dict[str, Any], what: str) -> None:
    check_gauges(report, what, "relay")
    assert report["registered"], f"{what}: the relay is no longer registered"


class RelayFuzz(FuzzMachine):
    session: Session

    @rule(data=st.data(), kind=st.sampled_from(UPSTREAM_KINDS), mutations=st.integers(0, 3))
    def from_upstream(self, data: st.DataObject, kind: str, mutations: int) -> None:
        upstream = self.session.upstream
        message = mutated(data.draw, upstream_messages(upstream)[kind](), kind, mutations)
        message.ack, message.seq = True, upstream.next_seq()
        if not sendable(message):
            return
        self.history.append(f"upstream {message.kind!r} made as {message.note}"[:300])
        upstream.send(message)
        upstream.pump(0.1)
        refused = mutations == 0 and kind in ("weights_stranger", "weights_instance")
        if refused:  # a valid message the relay must refuse: it says why
            deadline = time.monotonic() + WAIT
            while message.seq not in upstream.acks and time.monotonic() < deadline:
                upstream.pump(0.05)
            body, meta = upstream.acks[message.seq]
            assert meta.get("error") and body["type"].endswith(".ProtocolError"), body

    @rule(data=st.data(), kind=st.sampled_from(sorted(STRANGER_KINDS)),
          mutations=st.integers(0, 2))
    def from_stranger(self, data: st.DataObject, kind: str, mutations: int) -> None:
        message = mutated(data.draw, STRANGER_KINDS[kind](), kind, mutations)
        if not sendable(message):
            return
        self.history.append(f"stranger {message.kind!r} made as {message.note}"[:300])
        self.session.stranger.send(message)
        self.session.upstream.pump(0.05)

    @invariant()
    def healthy(self) -> None:
        with self.noted():
            check(self.session.target.report(),
                  f"after {self.history[-1] if self.history else 'start'}")

    def teardown(self) -> None:
        with self.noted():
            self.session.upstream.pump(0.2)
            self.session.probe()
            check(self.session.target.report(), "after the example")
            deadline = time.monotonic() + WAIT  # the stranger was dropped: members only
            while (peers := self.session.target.report()["peers"]) != len(MEMBERS):
                assert time.monotonic() < deadline, f"the relay keeps {peers} peers"
                self.session.upstream.pump(0.1)


@pytest.mark.parametrize("session", ["asyncio", "trio"], indirect=True)
def test_the_wire_fuzzer_crashes_no_relay_and_its_members_get_exact_weights(
        session: Session) -> None:
    fuzz(RelayFuzz, examples=EXAMPLES, steps=STEPS, session=session)
    report = session.target.report()
    assert report["reactions"].get("stranger", 0) >= 1  # the stranger was seen, and refused
    print(f"relay fuzz on {session.target.backend}: probes up to {session.version}, "
          f"reactions {report['reactions']}")
