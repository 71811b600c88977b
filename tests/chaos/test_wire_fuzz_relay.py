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

import contextlib
import json
import os
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from asyncrl._protocol import (
    WEIGHTS_KIND,
    RelayHello,
    RelayWelcome,
    WeightChunk,
    WeightMeta,
)
from transports._codec import decode_message

from .relay_target import MEMBERS, probe_value
from .wire_fuzz import (
    MAX_GAP,
    RSS_GROWTH_MB,
    WAIT,
    Message,
    Peer,
    TargetEnded,
    mutate_body,
    noting_first_failure,
)
from .wire_hub import INSTANCE

pytestmark = [pytest.mark.chaos]
EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "6"))
DERANDOMIZE = not os.environ.get("WIRE_FUZZ_RANDOM")
STEPS = int(os.environ.get("WIRE_FUZZ_STEPS", "10"))
SCRIPT = Path(__file__).with_name("relay_target.py")
FIRST_FAILURE: list[str] = []


class RelayTarget:
    """``relay_target.py`` in its own process; ``report()`` asks it for its numbers."""

    def __init__(self, backend: str, upstream: str, token: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), backend, upstream, token], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put({"event": "exit"})

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr = [*self.stderr[-200:], line.rstrip()]

    def wait(self, event: str, timeout: float = WAIT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TargetEnded(f"the relay did not answer {event!r} in {timeout:.0f} s; "
                                  f"stderr ends: {self.stderr[-15:]}") from None
            if got["event"] == event:
                return got
            if got["event"] in ("ended", "exit"):
                raise TargetEnded(f"the relay ended while waiting for {event!r}: "
                                  f"{got.get('error', 'its process exited')}\n"
                                  f"{got.get('traceback', '')}\nstderr ends: {self.stderr[-15:]}")

    def command(self, line: str, event: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        return self.wait(event)

    def report(self) -> dict[str, Any]:
        return self.command("report", "report")

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()


class Upstream:
    """A ROUTER that plays the coordinator for one relay: welcomes it, pings it, reads acks."""

    def __init__(self) -> None:
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 2000)
        self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.relay: bytes | None = None
        self.acks: dict[int, tuple[Any, dict[str, Any]]] = {}  # seq -> (body, meta)
        self.seq = 0

    def send(self, message: Message) -> None:
        if self.relay is None:
            return
        with contextlib.suppress(zmq.Again):
            self.socket.send_multipart([self.relay, *message.frames()])

    def pump(self, seconds: float = 0.0) -> None:
        """Read what the relay sent for ``seconds`` (pinging it, welcoming each hello)."""
        deadline = time.monotonic() + seconds
        while True:
            self.send(Message("ping", None, meta={"hub": INSTANCE}))
            if self.socket.poll(max(0, min(200, int((deadline - time.monotonic()) * 1000)))):
                frames = self.socket.recv_multipart()
                try:
                    decoded = decode_message(frames[1:])
                except Exception:
                    continue
                if decoded.kind == RelayHello.KIND:
                    self.relay = frames[0]
                    self.send(Message(RelayWelcome.KIND,
                                      RelayWelcome(1, INSTANCE).to_body()))
                elif decoded.kind == "ack":
                    self.acks[decoded.seq] = (decoded.body, decoded.meta)
            if time.monotonic() >= deadline:
                return

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def close(self) -> None:
        self.socket.close(linger=0)


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


class Session:
    """The hostile coordinator, the relay process, the stranger."""

    def __init__(self, backend: str, root: Path) -> None:
        self.backend, self.root = backend, root
        self.env = dict(os.environ, TMPDIR=str(root))
        here = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, self.env.get("PYTHONPATH")]))
        self.token = secrets.token_hex(8)
        self.upstream = Upstream()
        self.target = RelayTarget(backend, self.upstream.endpoint, self.token, self.env)
        self.version = 1000  # the probes' versions; the fuzzer's are below
        endpoint = self.target.wait("listening", 90)["endpoint"]
        self.stranger = Peer(endpoint, b"stranger-" + secrets.token_hex(4).encode())
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
        self.target.close()
        self.upstream.close()


@pytest.fixture
def session(request: pytest.FixtureRequest) -> Iterator[Session]:
    root = Path(tempfile.mkdtemp(prefix="fuzzr-", dir="/tmp"))
    live = Session(request.param, root)
    try:
        yield live
    finally:
        live.close()
        shutil.rmtree(root, ignore_errors=True)


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
    assert report["rss_growth_mb"] <= RSS_GROWTH_MB, (
        f"{what}: the relay's peak memory grew by {report['rss_growth_mb']} MB "
        f"(at most {RSS_GROWTH_MB})")
    assert report["max_busy"] <= MAX_GAP, (
        f"{what}: the relay's event loop stalled {report['max_busy']} s (at most {MAX_GAP})")
    assert report["registered"], f"{what}: the relay is no longer registered"


class RelayFuzz(RuleBasedStateMachine):
    session: Session

    def __init__(self) -> None:
        super().__init__()
        self.history: list[str] = []

    @rule(data=st.data(), kind=st.sampled_from(UPSTREAM_KINDS), mutations=st.integers(0, 3))
    def from_upstream(self, data: st.DataObject, kind: str, mutations: int) -> None:
        upstream = self.session.upstream
        message = upstream_messages(upstream)[kind]()
        message.note = kind
        for _ in range(mutations):
            message = mutate_body(data.draw, message)
        message.ack, message.seq = True, upstream.next_seq()
        try:
            message.frames()
        except (TypeError, ValueError, OverflowError):
            return  # nothing msgpack can carry
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
        message = STRANGER_KINDS[kind]()
        message.note = kind
        for _ in range(mutations):
            message = mutate_body(data.draw, message)
        try:
            message.frames()
        except (TypeError, ValueError, OverflowError):
            return
        self.history.append(f"stranger {message.kind!r} made as {message.note}"[:300])
        self.session.stranger.send(message)
        self.session.upstream.pump(0.05)

    @invariant()
    def healthy(self) -> None:
        with noting_first_failure(self.history, FIRST_FAILURE):
            check(self.session.target.report(),
                  f"after {self.history[-1] if self.history else 'start'}")

    def teardown(self) -> None:
        with noting_first_failure(self.history, FIRST_FAILURE):
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
    machine: Any = type("RelayFuzzLive", (RelayFuzz,), {"session": session})
    FIRST_FAILURE.clear()
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
            derandomize=DERANDOMIZE, database=None, suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate]))
    except Exception as exc:
        if FIRST_FAILURE:
            raise AssertionError(FIRST_FAILURE[0]) from exc
        raise
    report = session.target.report()
    assert report["reactions"].get("stranger", 0) >= 1  # the stranger was seen, and refused
    print(f"relay fuzz on {session.backend}: probes up to {session.version}, "
          f"reactions {report['reactions']}")
