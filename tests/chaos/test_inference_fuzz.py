"""Chaos: a wire fuzzer against a live central-inference server (hypothesis, real sockets).

An :class:`~asyncrl.AsyncBatchedCollector` runs in its own process
(``inference_target.py``: an honest local env worker, one place for a remote env worker
on a tcp ``listen=`` without keys, a new weight version after every batch). Hypothesis
drives hostile env workers at it from this process: raw DEALER sockets that join with the
one hello (``role="env"``), then send valid and mutated instances of every kind an env
worker or a stranger can send central inference (hello of either role, ``obs``,
``chunk``, ``error``, ``log``, pings; unknown kinds; broken headers). After every step:
the honest worker's frames are exact (consecutive steps per env, each action the value
of the version it is stamped with), the target's peak RSS grew by at most 64 MB, its
event loop never stalled more than 0.5 s. After every example: the run went on, and if
a message that must be refused was sent (a stranger's anything but a valid hello, an
admitted worker's malformed one), the target reacted (a refusal: a rate-limited warning).
Every mutated body is also decoded here by its declared kind
(:mod:`asyncrl._protocol.central_inference`), which may raise ProtocolError and nothing
else.

CI runs a few short examples per backend with a fixed seed (its cost: about a minute);
``INFERENCE_FUZZ_EXAMPLES=200 pytest -s tests/chaos/test_inference_fuzz.py`` runs longer.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule
from tensordict import TensorDict

from asyncrl._protocol import (
    PROTOCOL,
    EnvChunk,
    EnvLayout,
    EnvWelcome,
    ErrorReport,
    Hello,
    LogEntry,
    Observations,
    WorkerLog,
)
from transports import ErrorPayload, ProtocolError
from transports._codec import decode_message

from .live_fuzz import Live, check_health, fuzz, live_fixture
from .wire_fuzz import Message, Peer, PeerFuzz, mutated, sendable

pytestmark = [pytest.mark.chaos]
EXAMPLES = int(os.environ.get("INFERENCE_FUZZ_EXAMPLES", "25"))
STEPS = int(os.environ.get("INFERENCE_FUZZ_STEPS", "20"))
SCRIPT = Path(__file__).with_name("inference_target.py")
TRANSPORT_KINDS = {"ack", "ping", "bye"}
#: The kinds an env worker (or a stranger) sends central inference.
KINDS = ["hello", "rollout_hello", "obs", "chunk", "error", "log", "ping"]
STATS: collections.Counter[str] = collections.Counter()


# -- a hostile env worker ------------------------------------------------------------------
class EnvPeer(Peer):
    """A raw DEALER that speaks an env worker's side: its welcome, refusals, answers."""

    def __init__(self, endpoint: str, identity: bytes) -> None:
        super().__init__(endpoint, identity)
        self.env_welcome: EnvWelcome | None = None
        self.answers = 0
        self.asked = 0  # valid requests sent (an honest worker waits for each answer)

    @property
    def admitted(self) -> bool:
        return self.env_welcome is not None and self.refused is None

    @property
    def welcomed(self) -> bool:
        return self.env_welcome is not None

    def hello_message(self, specs: dict[str, Any]) -> Message:
        return Message(Hello.KIND, env_hello(specs, self.identity))

    def take(self, kind: str, body: Any) -> bool:
        if kind == EnvWelcome.KIND:
            self.env_welcome = EnvWelcome.from_body(body)
            return True
        if kind == "act":
            self.answers += 1
            return False
        return super().take(kind, body)  # a refusal


def env_hello(specs: dict[str, Any], identity: bytes, role: str = "env") -> dict[str, Any]:
    return Hello(protocol=PROTOCOL, name=identity.decode(errors="replace"), host="fuzz",
                 pid=os.getpid(), specs=specs, role=role).to_body()  # type: ignore[arg-type]


def obs_layout(specs: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """An ``obs`` message's layout for ``specs`` (one request of ``envs`` envs)."""
    envs = specs["envs"]
    return {f"o{i}": (d, (envs, *s)) for i, (d, s) in enumerate(specs["obs"])}


def chunk_of(schema: list[list[Any]], tag: int) -> TensorDict:
    steps = schema[0][2][1]
    chunk = TensorDict({}, batch_size=[1, steps])
    for path, dtype, shape in schema:
        chunk.set(tuple(path), torch.zeros(shape, dtype=getattr(torch, dtype)))
    chunk["collector", "traj_ids"].fill_(tag << 32)
    return chunk


def valid_messages(specs: dict[str, Any], schema: list[list[Any]], identity: bytes,
                   tag: int) -> dict[str, Callable[[], Message]]:
    """A factory of one valid message per kind central inference reads from a peer."""
    err = ErrorPayload("builtins:RuntimeError", "fuzzed", "Traceback: none")
    return {
        "hello": lambda: Message(Hello.KIND, env_hello(specs, identity)),
        "rollout_hello": lambda: Message(Hello.KIND, env_hello(specs, identity, "rollout")),
        "obs": lambda: Message(Observations.KIND, {
            k: torch.zeros(s, dtype=getattr(torch, d)) for k, (d, s) in
            obs_layout(specs).items()}),
        "chunk": lambda: Message(EnvChunk.KIND, chunk_of(schema, tag)),
        "error": lambda: Message(ErrorReport.KIND, ErrorReport(err, fatal=False).to_body()),
        "log": lambda: Message(WorkerLog.KIND, WorkerLog(
            [LogEntry(30, "fuzz", "a forwarded record")]).to_body()),
        "ping": lambda: Message("ping", None),
    }


def must_be_refused(message: Message, specs: dict[str, Any], schema: list[list[Any]],
                    tag: int, *, admitted: bool) -> str | None:
    """Why the target must refuse ``message`` (None: it may take it), decoding it here by
    its declared kind as the target does. Conservative: None where unsure.

    Raises AssertionError when a decoder raises anything but ProtocolError.
    """
    try:
        decoded = decode_message(message.frames())
    except ProtocolError as exc:
        return f"header: {exc}"
    kind, body = decoded.kind, decoded.body
    if kind in TRANSPORT_KINDS:
        return None
    try:
        if kind == Hello.KIND:
            hello = Hello.from_body(body)
            if admitted:
                return "a hello from an admitted env worker"
            return "a rollout worker's hello" if hello.role != "env" else None
        if not admitted:
            return f"a stranger's {kind!r:.40}"
        if kind == Observations.KIND:
            Observations.from_body(body, layout=obs_layout(specs))
        elif kind == EnvChunk.KIND:
            EnvChunk.from_body(body, schema={tuple(p): (getattr(torch, d), tuple(s))
                                             for p, d, s in schema},
                               tag=tag, max_version=1 << 62)
        elif kind == ErrorReport.KIND:
            ErrorReport.from_body(body)
            return "an error report (the worker is dropped)"
        elif kind == WorkerLog.KIND:
            WorkerLog.from_body(body)
        else:
            return f"unknown kind {kind!r:.40}"
    except ProtocolError as exc:
        return str(exc)
    except Exception as exc:
        raise AssertionError(f"decoding a {kind!r:.40} message raised {type(exc).__name__}: "
                             f"{exc} (expected ProtocolError); made as{message.note}") from exc
    return None


# -- the live target -------------------------------------------------------------------------
class InferenceLive(Live):
    """A started target whose honest env worker delivered its first batch."""

    def __init__(self, backend: str, root: Path) -> None:
        super().__init__(backend, root, SCRIPT)
        ready = self.target.wait("ready", 90)
        self.specs: dict[str, Any] = ready["specs"]
        self.schema: list[list[Any]] = ready["schema"]


live = live_fixture(InferenceLive, "ifuzz-")


class InferenceFuzz(PeerFuzz):
    """Hostile env workers against ``live``: join, send valid and mutated messages, check."""

    live: InferenceLive
    peers: list[EnvPeer]

    def new_peer(self) -> EnvPeer:
        peer = EnvPeer(self.live.target.endpoint,
                       f"ifuzz-{next(self.live.names)}".encode())
        self.peers.append(peer)
        if len(self.peers) > 3:
            self.peers.pop(1).close()
        return peer

    @initialize()
    def admitted_peer(self) -> None:
        """Each example starts with a peer that asks for the remote place (free once the
        last example's peers said goodbye; full while the last holder is still leaving):
        most of what follows is read as admitted."""
        peer = self.new_peer()
        peer.join(self.live.specs, timeout=10)
        STATS["joins welcomed" if peer.admitted else "joins refused"] += 1

    def peer(self, draw: Any) -> EnvPeer:
        # The same draws whatever the target did (who is admitted is its doing): hypothesis
        # refuses a strategy whose draws depend on external state.
        choice, index = draw(st.integers(0, 7)), draw(st.integers(0, 3))
        admitted = [p for p in self.peers if p.admitted]
        if admitted and choice >= 2:  # mostly the admitted one: what it sends is read in full
            return admitted[-1]
        if choice == 0 or not self.peers:
            STATS["strangers"] += 1
            return self.new_peer()
        return self.peers[index % len(self.peers)]

    @rule()
    def join(self) -> None:
        """A new peer says a valid hello: admitted if the remote place is free (its last
        holder was dropped for what it sent), else refused as full."""
        if any(p.admitted for p in self.peers):
            return  # the place is taken (by this example's own peer)
        peer = self.new_peer()
        self.history.append(f"join as {peer.identity!r}")
        STATS["joins welcomed" if peer.join(self.live.specs, timeout=2, retry=False) else
              "joins refused"] += 1

    @rule(data=st.data(), kind=st.sampled_from([*KINDS, "obs", "obs", "chunk", "chunk"]),
          mutations=st.integers(0, 3))
    def send(self, data: st.DataObject, kind: str, mutations: int) -> None:
        """A valid message of ``kind``, then ``mutations`` mutations of it."""
        peer = self.peer(data.draw)
        peer.read()
        if kind == "obs" and peer.admitted and peer.asked > peer.answers:
            peer.read(2.0)  # as an honest worker, its last request answered first
        tag = peer.env_welcome.traj_tag if peer.env_welcome is not None else 1
        message = mutated(data.draw, valid_messages(self.live.specs, self.live.schema,
                                                    peer.identity, tag)[kind](),
                          kind, mutations)
        if not sendable(message):
            return
        self.last = f"{message.kind!r} made as {message.note}"[:300]
        admitted = peer.admitted
        with self.noted():
            verdict = must_be_refused(message, self.live.specs, self.live.schema, tag,
                                      admitted=admitted)
        if verdict is not None:
            self.refusable.append(f"{message.note}: {verdict[:100]}")
        STATS["sent as admitted" if admitted else "sent as stranger"] += 1
        if admitted and message.kind == Observations.KIND and verdict is None:
            peer.asked += 1
        STATS["refusable"] += verdict is not None
        STATS[f"kind {message.kind[:12]!r}"] += 1
        self.history.append(("admitted " if admitted else "stranger ") + self.last)
        peer.send(message)


@pytest.mark.parametrize("live", ["asyncio", "trio"], indirect=True)
def test_the_inference_fuzzer_neither_ends_the_run_nor_spoils_an_honest_workers_frames(
        live: InferenceLive) -> None:
    STATS.clear()
    fuzz(InferenceFuzz, examples=EXAMPLES, steps=STEPS, live=live)
    print(f"inference fuzz on {live.target.backend}: {dict(sorted(STATS.items()))}")
    print(f"target at the end: {live.target.report()}")


# -- explicit examples: each kind's valid instance, and what must be refused ------------------
SPECS = EnvLayout(envs=1, obs=[("float64", [3])], action=("int64", [])).to_specs()  # type: ignore[list-item]
SCHEMA = [[list(p), str(d).removeprefix("torch."), list(s)] for p, (d, s) in EnvChunk.schema(
    [(("observation",), torch.float64, (3,))], [(("action",), torch.int64, ())], rows=1,
    steps=10, flag=torch.bool, reward=torch.float32, counter=torch.int64).items()]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kinds_valid_instance_decodes(kind: str) -> None:
    message = valid_messages(SPECS, SCHEMA, b"ifuzz-0", 1)[kind]()
    expected = {"rollout_hello": "a rollout worker's hello",
                "error": "an error report (the worker is dropped)"}.get(kind)
    admitted = kind not in ("hello", "rollout_hello")  # a hello is a stranger's first word
    assert must_be_refused(message, SPECS, SCHEMA, 1, admitted=admitted) == expected


def claimed_chunk(n: int) -> Message:
    """A chunk claiming ``[n, 10]`` transitions whose every entry has zero size."""
    chunk = TensorDict({}, batch_size=[n, 10])
    for path, dtype, _ in SCHEMA:
        chunk.set(tuple(path), torch.zeros((n, 10, 0), dtype=getattr(torch, dtype)))
    return Message(EnvChunk.KIND, chunk, note=f" chunk of [{n}, 10] zero-size entries")


@pytest.mark.parametrize("message", [
    claimed_chunk(5_000_000),
    Message(Observations.KIND, {"o0": torch.zeros(50_000, 3, dtype=torch.float64)},
            note=" obs of 50_000 rows for one env"),
    Message(Observations.KIND, {"o0": torch.zeros(1, 3), "o1": torch.zeros(1)},
            note=" obs with a key the layout lacks"),
    Message(Hello.KIND, env_hello({**SPECS, "envs": 1 << 40}, b"x"), note=" envs 2**40"),
], ids=["huge-chunk-claim", "huge-obs", "extra-obs-key", "huge-envs"])
def test_what_the_fuzzer_must_see_refused_is_a_protocol_error(message: Message) -> None:
    with pytest.raises(ProtocolError):
        decoded = decode_message(message.frames())
        if decoded.kind == Hello.KIND:
            EnvLayout.from_specs(Hello.from_body(decoded.body).specs, max_envs=1 << 20)
        elif decoded.kind == Observations.KIND:
            Observations.from_body(decoded.body, layout=obs_layout(SPECS))
        else:
            EnvChunk.from_body(decoded.body, schema={tuple(p): (getattr(torch, d), tuple(s))
                                                     for p, d, s in SCHEMA},
                               tag=1, max_version=0)


@pytest.mark.parametrize("live", ["asyncio"], indirect=True)
def test_a_huge_claimed_chunk_from_an_admitted_worker_costs_no_memory(
        live: InferenceLive) -> None:
    start = live.target.report()
    peer = EnvPeer(live.target.endpoint, b"ifuzz-claim")
    try:
        assert peer.join(live.specs, timeout=30, retry=False), peer.refused
        peer.send(claimed_chunk(5_000_000))
        end = live.target.progressed(after=live.target.report()["honest"])
        check_health(end, "after a chunk claiming [5_000_000, 10] zero-size entries")
        deadline = time.monotonic() + 5
        while peer.refused is None and time.monotonic() < deadline:
            peer.read(0.2)
        assert peer.refused is not None and "chunk message must be a TensorDict of batch " \
            "size [1, 10], got [5000000, 10]" in peer.refused
        # The refusal reached the peer; the target's count of it is read now (``end``
        # was read when the honest loop progressed, which a loaded machine can bring first).
        before = sum(start["reactions"].values())
        reactions = live.target.report()["reactions"]
        while sum(reactions.values()) <= before and time.monotonic() < deadline + 5:
            time.sleep(0.05)
            reactions = live.target.report()["reactions"]
        assert sum(reactions.values()) > before, reactions
    finally:
        peer.close()
