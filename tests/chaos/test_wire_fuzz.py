"""Chaos: a wire fuzzer against a live trainer (hypothesis, stateful, real sockets).

A trainer runs in its own process (``wire_target.py``: an honest local worker, one place
for a remote worker on a tcp ``listen=`` without keys, a new weight version after every
batch). Hypothesis drives hostile peers at it from this process: raw DEALER sockets that
join (a valid hello), then send valid and mutated instances of every kind a worker, a relay
or a stranger can send (hello, relay_hello, batch, a compact batch's ``next`` patch,
shared_batch, error, leaving, log, progress, weight acks, pings; unknown kinds; broken
headers), and ``served_call`` to the module the target serves (valid, NaN, of a wrong
layout or dtype, claiming huge shapes, to an unknown module, mutated; from strangers and
from the admitted peer: see :func:`served_calls`). After every step: the honest worker's
frames are exact, the target's peak RSS grew by at most 64 MB, its event loop never stalled
more than 0.5 s. After every example: the run went on (the honest worker delivers again),
and if a message the decoders refuse was read, the target reacted (a refusal, a warning, a
rate-limited log). Every mutated body is also decoded here by its class's ``from_body``,
which may raise ProtocolError and nothing else.

CI runs a few dozen short examples per backend with a fixed seed;
``WIRE_FUZZ_EXAMPLES=500 pytest tests/chaos/test_wire_fuzz.py`` runs longer.
"""

from __future__ import annotations

import collections
import copy
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule
from tensordict import TensorDict

from asyncrl._protocol import (
    Batch,
    ErrorReport,
    Hello,
    Leaving,
    Progress,
    RelayAck,
    RelayHello,
    ServedAnswer,
    ServedCall,
    SharedBatch,
    WeightsApplied,
    WorkerLog,
)
from asyncrl._protocol.served import inline_inputs
from transports import ProtocolError
from transports._codec import decode_message

from .live_fuzz import Live, check_health, fuzz, live_fixture
from .wire_fuzz import (
    KINDS,
    Message,
    Peer,
    PeerFuzz,
    claim_batch,
    compact_batch,
    identity_specs,
    mutated,
    patch_rows,
    sendable,
    valid_messages,
)
from .wire_target import SERVED, SERVED_LAYOUT

pytestmark = [pytest.mark.chaos]
EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "25"))
STEPS = int(os.environ.get("WIRE_FUZZ_STEPS", "15"))
#: The served fuzz's examples (its swarms of rules wait more often for the remote place to
#: free: about 3 s an example on 2 shared cores, against 0.4 s for the plain fuzz).
SERVED_EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "15"))

#: Holes the fuzzer leaves to their own regression tests (below) while they are open:
#: ``{name: reason}``, the names :func:`_hole` gives. Empty: (a) a ``next`` patch nesting a
#: key under an observation and (b) a huge claimed batch of zero-size leaves are fixed
#: (issue 43), so the fuzzer draws them too.
KNOWN_HOLES: dict[str, str] = {}
#: Which class decodes each kind the trainer's hub dispatches (the rest: the hub's own).
DECODERS: dict[str, Any] = {
    Hello.KIND: Hello, RelayHello.KIND: RelayHello, Batch.KIND: Batch,
    SharedBatch.KIND: SharedBatch, ErrorReport.KIND: ErrorReport, Leaving.KIND: Leaving,
    WorkerLog.KIND: WorkerLog, Progress.KIND: Progress,
}
#: Kinds the coordinator decodes whoever sends them (a batch, a log, a shared batch are
#: read only from an admitted worker).
READ_FROM_ANYONE = {Hello.KIND, RelayHello.KIND, ErrorReport.KIND, Leaving.KIND,
                    Progress.KIND, ServedCall.KIND}
TRANSPORT_KINDS = {"ack", "ping", "bye"}
#: What the fuzzer did, for ``pytest -s`` (coverage of a run: how much was read as an
#: admitted worker's, how much refused).
STATS: collections.Counter[str] = collections.Counter()


# -- served calls ----------------------------------------------------------------------------
def _inline(dtype: str, shape: list[int], data: bytes) -> list[Any]:
    return [dtype, shape, data]


#: One call's valid ``next_observation`` input (NaN and inf too), and hostile forms.
SERVED_INPUT = st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=3,
                        max_size=3).map(
    lambda v: inline_inputs({"x": np.array(v, np.float32)})["x"])
#: Claims of a huge shape in a few bytes: 4 TiB, 200 MB (what a target that allocated
#: from a claim would hold: the memory gauge sees it), 4 TiB in two dimensions, a negative
#: and an overflowing dimension. Half of the hostile inputs.
CLAIMS = [[1 << 40], [50_000_000], [1 << 20, 1 << 20], [-1], [1 << 62, 0]]
HOSTILE_INPUTS = st.sampled_from([
    *[_inline("float32", shape, b"\0" * 12) for shape in CLAIMS],
    _inline("float64", [3], b"\0" * 24),  # wrong dtype
    _inline("float32", [4], b"\0" * 16),  # wrong shape
    _inline("float32", [3], b"\0" * 8),  # too few bytes for its claim
    _inline("float32", [1 << 18], b"\0" * (1 << 20)),  # 1 MiB that came: no claim
    torch.ones(3),  # a tensor frame (an earlier worker's form)
    _inline("bfloat16", [3], b"\0" * 6),
] + [_inline("float32", shape, b"\0" * 12) for shape in CLAIMS])


@st.composite
def served_calls(draw: st.DrawFn) -> Message:
    """A ``served_call`` to the target's module: valid, or of a wrong layout, dtype or
    name, or claiming a huge shape (then maybe mutated as every kind is)."""
    valid = draw(st.integers(0, 9)) >= 4
    inputs: Any = {"next_observation": draw(SERVED_INPUT if valid else HOSTILE_INPUTS)}
    if draw(st.integers(0, 5)) == 5:
        inputs = draw(st.sampled_from([{}, {**inputs, "extra": inputs["next_observation"]},
                                       "not a map", [inputs["next_observation"]]]))
    name = draw(st.sampled_from(["env.transform[9]", "", "\x1b[2J", 7])) \
        if draw(st.integers(0, 4)) == 0 else SERVED
    call = draw(st.sampled_from([0, (1 << 63) - 1, -1, 1 << 64, "1"])) \
        if draw(st.integers(0, 4)) == 0 else draw(st.integers(1, 1 << 20))
    return Message(ServedCall.KIND, {"name": name, "call": call, "inputs": inputs},
                   note=f" name={name!r} call={call} inputs={inputs!r:.60}")


def served_verdict(body: Any) -> str | None:
    """How the target's router and module end judge a ``served_call`` body from an admitted
    peer: None if it is answered with an output, else why it is refused."""
    name = body.get("name") if isinstance(body, dict) else None
    if name != SERVED:
        return f"unknown module {name!r}"
    try:
        ServedCall.from_body(body, layout=SERVED_LAYOUT)
    except ProtocolError as exc:
        return str(exc)
    except Exception as exc:
        raise AssertionError(f"ServedCall.from_body raised {type(exc).__name__}: {exc} "
                             "(expected ProtocolError)") from exc
    return None


def known_hole(message: Message) -> str | None:
    """The hole of :data:`KNOWN_HOLES` that ``message`` would hit (its inputs are tested
    apart, see below), or None."""
    hole = _hole(message)
    return hole if hole in KNOWN_HOLES else None


def _hole(message: Message) -> str | None:
    body = message.body
    if message.kind != Batch.KIND or not isinstance(body, dict):
        return None
    frames, patch = body.get("frames"), body.get("next")
    if isinstance(frames, TensorDict) and frames.batch_size.numel() >= 100_000:
        return "huge-claim"
    if isinstance(patch, dict):
        rows = patch.get("rows")
        keys = (rows.keys(include_nested=True, leaves_only=True)
                if isinstance(rows, TensorDict) else [])
        if isinstance(rows, dict) or any(isinstance(k, tuple) and len(k) > 1 for k in keys):
            return "next-nested-key"
    return None


def local_verdict(message: Message) -> str | None:
    """Decode ``message`` here as the trainer would: None if valid, else why refused.

    Raises AssertionError when a decoder raises anything but ProtocolError: a crash
    waiting for the message to reach a loop that catches only ProtocolError.
    """
    try:
        decoded = decode_message(message.frames())
    except ProtocolError as exc:
        return f"header: {exc}"
    if decoded.kind == ServedCall.KIND:
        return served_verdict(decoded.body)
    decoder = DECODERS.get(decoded.kind)
    if decoder is None:
        return None if decoded.kind in TRANSPORT_KINDS else f"unknown kind {decoded.kind!r}"
    try:
        decoder.from_body(decoded.body)
    except ProtocolError as exc:
        return str(exc)
    except Exception as exc:
        raise AssertionError(
            f"{decoder.__name__}.from_body raised {type(exc).__name__}: {exc} (expected "
            f"ProtocolError) for {message.kind!r} message made as{message.note}") from exc
    return None


def acks_valid(message: Message) -> None:
    """Acks are decoded by the weight sender: only ProtocolError may come out of them."""
    if message.kind != "ack" or not isinstance(message.body, dict):
        return
    for decoder in (WeightsApplied, RelayAck):
        try:
            decoder.from_body(message.body)
        except ProtocolError:
            pass
        except Exception as exc:
            raise AssertionError(f"{decoder.__name__}.from_body raised "
                                 f"{type(exc).__name__}: {exc} for{message.note}") from exc


# -- the live target -----------------------------------------------------------------------
class TrainerLive(Live):
    """A started trainer whose run began (a starter peer joined, the honest worker delivered)."""

    def __init__(self, backend: str, root: Path) -> None:
        super().__init__(backend, root)
        self.specs = identity_specs()
        starter = Peer(self.target.endpoint, b"fuzz-starter")
        try:  # the run waits for its remote place to fill before its first batch
            assert starter.join(self.specs, timeout=60), f"starter refused: {starter.refused}"
            self.layout: list[list[Any]] = self.target.wait("ready", 90)["layout"]
        finally:
            starter.close()  # silent from now on: lost in 1.5 s, its place free again


live = live_fixture(TrainerLive, "fuzz-")


class WireFuzz(PeerFuzz):
    """Hostile peers against ``live``: join, send valid and mutated messages, check."""

    live: TrainerLive

    @initialize()
    def admitted(self) -> None:
        """Each example starts with a peer in the remote place (the last example's peers
        said goodbye): most of what follows is read as an admitted worker's."""
        peer = Peer(self.live.target.endpoint, f"fuzz-{next(self.live.names)}".encode())
        self.peers.append(peer)
        STATS["joins welcomed" if peer.join(self.live.specs, timeout=5) else
              f"joins refused: {(peer.refused or 'no answer')[:50]}"] += 1

    def peer(self, draw: Any) -> Peer:
        if self.peers and draw(st.booleans()):
            return self.peers[0]  # the admitted one (if its place is still its own)
        if not self.peers or draw(st.integers(0, 9)) == 0:
            name = f"fuzz-{next(self.live.names)}".encode()
            self.peers.append(Peer(self.live.target.endpoint, name))
            if len(self.peers) > 3:
                self.peers.pop(1).close()
            STATS["strangers"] += 1
        return draw(st.sampled_from(self.peers))

    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        """A new peer says a valid hello (admitted if the remote place is free)."""
        name = f"fuzz-{next(self.live.names)}".encode()
        peer = Peer(self.live.target.endpoint, name)
        self.peers.append(peer)
        welcomed = peer.join(self.live.specs, timeout=2, retry=False)
        STATS["joins welcomed" if welcomed else
              f"joins refused: {(peer.refused or 'no answer')[:50]}"] += 1
        if len(self.peers) > 3:
            self.peers.pop(1).close()

    # Batches weigh more: the biggest decoder, and the one that allocates from a claim.
    @rule(data=st.data(), kind=st.sampled_from([*KINDS, *["batch", "batch_next"] * 4]),
          mutations=st.integers(0, 3))
    def send(self, data: st.DataObject, kind: str, mutations: int) -> None:
        """A valid message of ``kind``, then ``mutations`` mutations of it."""
        peer = self.peer(data.draw)
        peer.read()
        request = peer.requests[0] if peer.requests else 1
        index = peer.welcome.index if peer.welcome is not None else 1
        message = mutated(data.draw, valid_messages(self.live.layout, self.live.specs,
                                                    peer.identity, request, index)[kind](),
                          kind, mutations)
        self.deliver(peer, message)

    def deliver(self, peer: Peer, message: Message) -> None:
        """Send ``message`` from ``peer``, noting whether the target must refuse it."""
        if known_hole(message) is not None:
            return  # tested apart (see KNOWN_HOLES)
        if not sendable(message):
            return
        self.last = f"{message.kind!r} made as {message.note}"[:300]
        with self.noted():
            acks_valid(message)
            verdict = local_verdict(message)
        admitted = peer.welcome is not None and peer.refused is None
        if verdict is None and message.kind == ServedCall.KIND and not admitted:
            verdict = "a stranger's served_call"  # refused whatever it holds
        if verdict is not None and (message.kind in READ_FROM_ANYONE or admitted
                                    or verdict.startswith(("header", "unknown"))):
            self.refusable.append(f"{message.note}: {verdict[:100]}")
        STATS["sent"] += 1
        STATS["sent as admitted" if admitted else "sent as stranger"] += 1
        STATS["refusable"] += verdict is not None
        STATS[f"kind {message.kind[:12]!r}"] += 1
        if message.kind == Batch.KIND and verdict is None and peer.requests:
            peer.requests.pop(0)
        self.last = f"{message.kind!r} made as {message.note}"[:300]
        self.history.append(("admitted " if admitted else "stranger ") + self.last)
        peer.send(message)


class ServedWireFuzz(WireFuzz):
    """:class:`WireFuzz` (its own rules unchanged, so that its examples stay the ones it
    always drew) plus ``served_call`` messages to the module the target serves."""

    @rule(data=st.data(), message=served_calls(), mutations=st.integers(0, 2))
    def call_served(self, data: st.DataObject, message: Message, mutations: int) -> None:
        """A served call (valid or hostile as :func:`served_calls` draws it), then
        ``mutations`` mutations of it, from the admitted peer or a stranger."""
        peer = self.peer(data.draw)
        peer.read()
        drawn = message.note
        message.body = copy.deepcopy(message.body)  # mutated in place; st.just's are shared
        message = mutated(data.draw, message, ServedCall.KIND, mutations)
        message.note = ServedCall.KIND + drawn + message.note.removeprefix(ServedCall.KIND)
        self.deliver(peer, message)


@pytest.mark.parametrize("live", ["asyncio", "trio"], indirect=True)
def test_the_wire_fuzzer_neither_ends_the_run_nor_spoils_an_honest_workers_frames(
        live: TrainerLive) -> None:
    fuzz(WireFuzz, examples=EXAMPLES, steps=STEPS, live=live)
    print(f"wire fuzz on {live.target.backend}: {dict(sorted(STATS.items()))}")
    print(f"target at the end: {live.target.report()}")


@pytest.mark.parametrize("live", ["asyncio", "trio"], indirect=True)
def test_served_calls_in_the_wire_fuzz_neither_end_the_run_nor_cost_memory(
        live: TrainerLive) -> None:
    """The same fuzzer and checks, with ``served_call`` messages among the rest."""
    STATS.clear()
    start = live.target.report()
    fuzz(ServedWireFuzz, examples=SERVED_EXAMPLES, steps=STEPS, live=live)
    end = live.target.report()
    print(f"served wire fuzz on {live.target.backend}: {dict(sorted(STATS.items()))}")
    print(f"target at the end: {end}")
    assert end["served"] > start["served"], "no valid call reached the module"
    assert {"malformed", "unknown module"} <= set(end["served_refusals"]), (
        f"the fuzz drew too few kinds of refusal: {end['served_refusals']}")


# -- the fuzzer's starting points and its findings, as explicit examples ---------------------
LAYOUT = [[["observation"], "float64", [20, 3]], [["next", "observation"], "float64", [20, 3]],
          [["next", "reward"], "float32", [20, 1]], [["next", "done"], "bool", [20, 1]],
          [["next", "terminated"], "bool", [20, 1]], [["next", "truncated"], "bool", [20, 1]],
          [["action"], "int64", [20]], [["done"], "bool", [20, 1]],
          [["terminated"], "bool", [20, 1]], [["truncated"], "bool", [20, 1]],
          [["collector", "traj_ids"], "int64", [20]], [["collector", "worker_id"], "int64", [20]],
          [["collector", "policy_version"], "int64", [20]]]  # what the target's batches hold


@pytest.mark.parametrize("kind", KINDS)
def test_every_kinds_valid_instance_decodes(kind: str) -> None:
    """The fuzzer starts from valid messages: each decodes as its receiver reads it."""
    message = valid_messages(LAYOUT, identity_specs(), b"fuzz-0", 1)[kind]()
    assert local_verdict(message) is None
    acks_valid(message)


def nested_patch() -> Message:
    """Hole (a) of issue 43 (fixed): a compact batch whose ``next`` rows nest a key under the
    observation tensor."""
    body = compact_batch(LAYOUT, 1)
    rows = torch.zeros(len(body["next"]["at"]), 3, dtype=torch.float64)
    return Message(Batch.KIND, patch_rows(body, ("observation", "x"), rows),
                   note=" next rows ('observation', 'x')")


def test_a_next_patch_nesting_a_key_under_an_observation_is_a_protocol_error() -> None:
    assert local_verdict(nested_patch()) is not None


def join_free_place(live: TrainerLive, name: bytes) -> Peer:
    """A peer admitted to the target's remote place (free once the starter is lost)."""
    peer = Peer(live.target.endpoint, name + str(next(live.names)).encode())
    if peer.join(live.specs, timeout=30):
        peer.read(1.0)  # its first credits
        return peer
    peer.close()
    raise AssertionError(f"no free remote place in 30 s: {peer.refused}")


def assert_refused_and_unharmed(live: TrainerLive, message: Message) -> None:
    start = live.target.report()
    peer = join_free_place(live, b"fuzz-hole-")
    try:
        peer.send(message)
        end = live.target.progressed(after=live.target.report()["honest"])
        check_health(end, f"after {message.note}")
        assert sum(end["reactions"].values()) > sum(start["reactions"].values()), (
            f"no refusal seen for {message.note}")
    finally:
        peer.close()


@pytest.mark.parametrize("live", ["asyncio"], indirect=True)
def test_a_next_patch_nesting_a_key_under_an_observation_ends_no_run(live: TrainerLive) -> None:
    assert_refused_and_unharmed(live, nested_patch())


@pytest.mark.parametrize("live", ["trio"], indirect=True)
def test_a_huge_claimed_batch_of_zero_size_leaves_costs_no_memory(live: TrainerLive) -> None:
    """Hole (b) of issue 43 (fixed), at 5e6 claimed frames (the issue saw 2.5 GB at 5e7):
    a few hundred bytes must not cost the trainer more than the fuzzer's 64 MB."""
    body = claim_batch(compact_batch(LAYOUT, 1), 5_000_000)
    assert_refused_and_unharmed(live, Message(Batch.KIND, body,
                                              note=" batch_size [5_000_000, 1] zero-size"))


@pytest.mark.parametrize("live", ["asyncio"], indirect=True)
def test_a_batch_claiming_2_to_the_40_frames_ends_no_run(live: TrainerLive) -> None:
    body = claim_batch(compact_batch(LAYOUT, 1), 1 << 40)
    assert_refused_and_unharmed(live, Message(Batch.KIND, body,
                                              note=" batch_size [2**40, 1] zero-size"))


def test_a_batch_claiming_2_to_the_40_frames_is_a_protocol_error() -> None:
    message = Message(Batch.KIND, claim_batch(compact_batch(LAYOUT, 1), 1 << 40))
    assert local_verdict(message) is not None


# -- served calls from the wire, explicitly ------------------------------------------------------
def _served(call: int, value: Any, name: str = SERVED) -> Message:
    inputs = inline_inputs({"next_observation": value}) if isinstance(value, np.ndarray) \
        else {"next_observation": value}
    return Message(ServedCall.KIND, {"name": name, "call": call, "inputs": inputs})


def _answers(peer: Peer, count: int, timeout: float = 20.0) -> dict[int, Any]:
    deadline = time.monotonic() + timeout
    while len(peer.answers) < count and time.monotonic() < deadline:
        peer.read(0.2)
    assert len(peer.answers) >= count, f"{len(peer.answers)} answers of {count}: {peer.answers}"
    return {answer["call"]: answer for answer in peer.answers}


def _more(end: dict[str, int], start: dict[str, int]) -> dict[str, int]:
    return {k: v - start.get(k, 0) for k, v in end.items() if v != start.get(k, 0)}


@pytest.mark.parametrize("live", ["asyncio"], indirect=True)
def test_served_calls_from_the_wire_are_answered_or_refused_and_counted(
        live: TrainerLive) -> None:
    """The admitted peer's valid call (NaN too) is answered by the module; a huge claimed
    shape, an unknown module and a stranger's call are refused saying why and counted by
    reason in the target's ``statistics().served_refusals``; the run goes on unharmed."""
    start = live.target.report()
    peer = join_free_place(live, b"fuzz-served-")
    stranger = Peer(live.target.endpoint, b"fuzz-served-stranger")
    try:
        peer.send(_served(1, np.array([1.0, 2.0, 3.0], np.float32)))
        peer.send(_served(2, ["float32", [1 << 40], b""]))
        peer.send(_served(6, ["float32", [50_000_000], b"\0" * 12]))  # 200 MB claimed
        peer.send(_served(3, np.array([np.nan, 0.0, 0.0], np.float32)))
        peer.send(_served(4, np.ones(3, np.float32), name="env.transform[9]"))
        stranger.send(_served(5, np.ones(3, np.float32)))
        answers, strangers = _answers(peer, 5), _answers(stranger, 1)
        output = {"output": ("float32", (1,))}
        assert ServedAnswer.from_body(answers[1], layout=output).output.tolist() == [14.5]
        assert np.isnan(ServedAnswer.from_body(answers[3], layout=output).output).all()
        assert answers[2]["error"] == (
            "refused: served_call message field 'inputs' must hold exactly "
            "{'next_observation': float32[3]}, got {'next_observation': float32[1099511627776]}")
        assert answers[4]["error"].startswith(
            "refused: served_call names module 'env.transform[9]'; this run serves "
            f"[{SERVED!r}]"), answers[4]
        assert answers[6]["error"].endswith("got {'next_observation': float32[50000000]}")
        assert "not a live admitted worker" in strangers[5]["error"], strangers
        end = live.target.progressed(after=live.target.report()["honest"])
        check_health(end, "after the served calls")
        assert end["served"] > start["served"]  # the module computed the valid ones
        assert _more(end["served_refusals"], start["served_refusals"]) == {
            "malformed": 2, "unknown module": 1, "not admitted": 1}
    finally:
        peer.close()
        stranger.close()
