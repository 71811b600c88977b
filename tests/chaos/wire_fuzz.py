"""The wire fuzzer's pieces: a hostile peer, valid messages, mutations, the peers' machine.

:class:`Peer` is a raw pyzmq DEALER that speaks the real wire format
(:func:`transports._codec.encode_message`) from the test's thread, so that hypothesis's
sync rules drive it directly while the target's event loop runs on (the target, its
health and the run: ``live_fuzz.py``). :func:`valid_messages` builds a valid instance of
every kind a worker, a relay or a stranger can send a trainer (each class's
``to_body()``), :func:`mutate_body` breaks them (:func:`mutated`). :class:`PeerFuzz` is the
state machine of hostile peers against a target that admits them (a trainer, a
central-inference server).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from tensordict import TensorDict

from asyncrl._protocol import (
    PROTOCOL,
    Batch,
    Collect,
    ErrorReport,
    Hello,
    Leaving,
    LogEntry,
    Progress,
    Refuse,
    RelayAck,
    RelayHello,
    SharedBatch,
    WeightsApplied,
    Welcome,
    WorkerLog,
)
from asyncrl._protocol import compact as compact_frames
from asyncrl._rollout.env_specs import (
    EnvSpecs,
    array_spec_from_space,
    observation_specs_from_space,
)
from asyncrl.testing import identity_env
from transports import ErrorPayload, ProtocolError
from transports._codec import decode_message, encode_message

from .live_fuzz import FuzzMachine, Live, check_health

Key = tuple[str, ...]


@dataclass
class Message:
    """One message to send: its kind, msgpack body, header meta and sequence number."""

    kind: str
    body: Any
    meta: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    note: str = ""  # how it was made (a valid kind, then the mutations applied)
    ack: bool = False  # asks the receiver for an ack (weights, control)

    def frames(self) -> list[Any]:
        return encode_message(self.body, kind=self.kind, seq=self.seq, meta=self.meta or None,
                              ack=self.ack)


class Peer:
    """A raw DEALER on the target's endpoint: sends frames as they are, reads what comes."""

    def __init__(self, endpoint: str, identity: bytes) -> None:
        self.identity = identity
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 2000)
        self.socket.setsockopt(zmq.IDENTITY, identity)
        self.socket.connect(endpoint)
        self.requests: list[int] = []  # collect requests not answered yet
        self.connected = False
        self.welcome: Welcome | None = None
        self.refused: str | None = None
        self.answers: list[Any] = []  # served_answer bodies (the last 100)

    def connect(self, timeout: float = 10.0) -> None:
        """Wait until the target hears us: it pings a stranger back at its first message
        (else what we send could still sit in our queue when the example ends)."""
        deadline = time.monotonic() + timeout
        while not self.connected and time.monotonic() < deadline:
            self.socket.send_multipart(Message("ping", None).frames())
            if self.socket.poll(200):
                self.connected = True
                self.read()

    def send(self, message: Message) -> None:
        if not self.connected:
            self.connect()
        try:
            self.socket.send_multipart(message.frames())
        except zmq.Again:
            pass  # the hub stopped reading us (a limit): what a hostile peer earns

    @property
    def welcomed(self) -> bool:
        return self.welcome is not None

    def hello_message(self, specs: dict[str, Any]) -> Message:
        """The valid hello this peer says."""
        return Message(Hello.KIND, hello(specs, self.identity))

    def read(self, timeout: float = 0.0) -> None:
        """Take in what came, waiting at most ``timeout`` (less: an answer to a hello)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if not self.socket.poll(max(0, int(left * 1000))):
                return
            try:
                decoded = decode_message(self.socket.recv_multipart())
            except Exception:
                continue
            if self.take(decoded.kind, decoded.body):
                return

    def take(self, kind: str, body: Any) -> bool:
        """Note a message of the target's (a welcome, a refusal, credits); True for an
        answer to a hello."""
        if kind == Welcome.KIND:
            self.welcome = Welcome.from_body(body)
            return True
        if kind == Refuse.KIND:
            self.refused = Refuse.from_body(body).reason
            return True
        if kind == Collect.KIND:
            collect = Collect.from_body(body)
            self.requests.extend([collect.request] * collect.credits)
        if kind == "served_answer":
            self.answers = [*self.answers[-99:], body]
        return False

    def join(self, specs: dict[str, Any], timeout: float = 10.0, *, retry: bool = True) -> bool:
        """Say a valid hello, again while refused as full (``retry``), until welcomed or
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.welcomed and time.monotonic() < deadline:
            self.refused = None
            self.send(self.hello_message(specs))
            while not self.welcomed and self.refused is None \
                    and time.monotonic() < deadline:
                self.read(0.2)
                self.send(Message("ping", None))  # liveness: any message keeps us heard
            if self.refused is not None:
                if not retry:
                    return False
                time.sleep(0.3)  # full: a place frees when its holder is lost (1.5 s)
        return self.welcomed

    def close(self) -> None:
        """Say goodbye (the target frees its place at once, not after peer_timeout)."""
        if self.connected:
            try:
                self.socket.send_multipart(Message("bye", None).frames(), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self.socket.close(linger=200)


# -- valid messages --------------------------------------------------------------------------
def identity_specs() -> dict[str, Any]:
    """The env specs an honest worker of the target says in its hello."""
    env = identity_env()
    return EnvSpecs(observation=observation_specs_from_space(env.observation_space),
                    action=array_spec_from_space(env.action_space), num_envs=1).to_dict()


def hello(specs: dict[str, Any], identity: bytes) -> dict[str, Any]:
    return Hello(protocol=PROTOCOL, name=identity.decode(errors="replace"), host="fuzz",
                 pid=os.getpid(), specs=specs, slot=-1).to_body()


def frames_from(layout: list[list[Any]], steps: int | None = None, *,
                worker: int = 1) -> TensorDict:
    """A batch of ``layout`` (``[key path, dtype, shape]`` of each leaf of a yielded batch,
    ``[T, ...]``) as a worker sends it (``[1, T, ...]``), with ``[pid 1, instance 1, step]``
    observations that no honest env makes."""
    leaves = {}
    for path, dtype, shape in layout:
        shape = [1, shape[0] if steps is None else steps, *shape[1:]]
        leaves[tuple(path)] = torch.zeros(shape, dtype=getattr(torch, dtype))
    t = next(iter(leaves.values())).shape[1]
    td = TensorDict({}, batch_size=[1, t])
    for path, value in leaves.items():
        td.set(path, value)
    steps_ = torch.arange(1, t + 1, dtype=torch.float64)
    for key in (("observation",), ("next", "observation")):
        if key in leaves and leaves[key].shape[-1] == 3 and leaves[key].is_floating_point():
            obs = td.get(key)
            obs[..., 0], obs[..., 1] = 1.0, 1.0
            obs[..., 2] = steps_.to(obs.dtype) - int(key == ("observation",))
    if ("collector", "worker_id") in leaves:
        td.get(("collector", "worker_id")).fill_(worker)
    return td


def compact_batch(layout: list[list[Any]], request: int, worker: int = 1) -> dict[str, Any]:
    """A valid compact batch (``next`` patch) for ``layout``."""
    frames = frames_from(layout, worker=worker)
    wire, patch = compact_frames(frames, min_bytes=0)
    assert patch is not None
    return Batch(request, wire, patch).to_body()


def valid_messages(layout: list[list[Any]], specs: dict[str, Any], identity: bytes,
                   request: int, worker: int = 1) -> dict[str, Callable[[], Message]]:
    """A factory of one valid message per kind a trainer's hub reads from a peer."""
    err = ErrorPayload("builtins:RuntimeError", "fuzzed", "Traceback: none")
    return {
        "hello": lambda: Message(Hello.KIND, hello(specs, identity)),
        "relay_hello": lambda: Message(RelayHello.KIND, RelayHello(
            protocol=PROTOCOL, name="relay", host="fuzz", pid=1,
            members=[identity]).to_body()),
        "batch": lambda: Message(Batch.KIND, Batch(
            request, frames_from(layout, worker=worker)).to_body()),
        "batch_next": lambda: Message(Batch.KIND, compact_batch(layout, request, worker)),
        "shared_batch": lambda: Message(SharedBatch.KIND, SharedBatch(
            request, "asyncrl_1_fuzz", 0, 20).to_body()),
        "error": lambda: Message(ErrorReport.KIND, ErrorReport(err, fatal=False).to_body()),
        "leaving": lambda: Message(Leaving.KIND, Leaving("fuzzed").to_body()),
        "log": lambda: Message(WorkerLog.KIND, WorkerLog(
            [LogEntry(30, "fuzz", "a forwarded record")]).to_body()),
        "progress": lambda: Message(Progress.KIND, Progress(request, 5).to_body()),
        "ack": lambda: Message("ack", WeightsApplied("policy", 1).to_body(), seq=1),
        "relay_ack": lambda: Message("ack", RelayAck("policy", {identity: 1}).to_body(),
                                     seq=1),
        "ping": lambda: Message("ping", None),
    }


KINDS = ["hello", "relay_hello", "batch", "batch_next", "shared_batch", "error", "leaving",
         "log", "progress", "ack", "relay_ack", "ping"]


# -- mutations -------------------------------------------------------------------------------
def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every field in a body (dict keys, list indexes, TensorDict keys)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k)
            yield from _leaves(v, (*path, k))
    elif isinstance(value, TensorDict):
        for k in value.keys(include_nested=True, leaves_only=True):
            yield (*path, ("td", k if isinstance(k, tuple) else (k,)))
    elif isinstance(value, list):
        for i, v in enumerate(value[:8]):
            yield (*path, i)
            yield from _leaves(v, (*path, i))


def _get(body: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        body = body.get(step[1]) if isinstance(step, tuple) and step[:1] == ("td",) \
            else body[step]
    return body


def _set(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``body`` with the field at ``path`` replaced (``DROP``: removed)."""
    if not path:
        return value
    *parent_path, last = path
    parent = _get(body, tuple(parent_path))
    if isinstance(last, tuple) and last[:1] == ("td",):
        if value is DROP:
            parent.del_(last[1])
        elif isinstance(value, torch.Tensor) and value.shape[:2] == parent.batch_size:
            parent.set(last[1], value)
        else:  # a leaf that does not fit the batch size: the whole TensorDict goes
            return _set(body, tuple(parent_path), _td_with(parent, last[1], value))
    elif value is DROP:
        if isinstance(parent, dict):
            parent.pop(last, None)
        else:
            del parent[last]
    else:
        parent[last] = value
    return body


def _td_with(td: TensorDict, key: Key, value: Any) -> Any:
    """``td`` as a plain dict of its leaves with ``key`` replaced: the codec sends it as
    nested maps of tensors, a shape TensorDict itself would refuse to hold."""
    flat: dict[str, Any] = {}
    for k, v in td.items(include_nested=True, leaves_only=True):
        k = k if isinstance(k, tuple) else (k,)
        node = flat
        for part in k[:-1]:
            node = node.setdefault(part, {})
        node[k[-1]] = value if k == key else v
    return flat


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()

#: Values that replace a field: wrong types, extremes, deep nesting, long strings.
ODD_VALUES = st.one_of(
    st.just(DROP), st.none(), st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
    st.sampled_from([-1, 0, 1 << 31, 1 << 62, -(1 << 62), 50_000_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.just("x" * 70_000), st.just("\x1b[2J\x00" * 100),
    st.binary(max_size=300), st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(-9, 1 << 40), max_size=3),
    st.integers(min_value=10, max_value=60).map(lambda d: _nested(d)),
)


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"a": [value]}
    return value


DTYPES = [torch.float16, torch.float64, torch.int8, torch.bool, torch.uint8, torch.int64,
          torch.complex64]


@st.composite
def tensors(draw: st.DrawFn, batch: tuple[int, ...] = (1, 20)) -> torch.Tensor:
    """A tensor of a wrong dtype or shape (or zero-size leaves with a huge claimed batch)."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.one_of(
        st.just(list(batch)),
        st.lists(st.integers(0, 5), min_size=0, max_size=4),
        st.just([*batch, 7]), st.just([0]), st.just([1, 0, 0]),
    ))
    return torch.zeros(shape, dtype=dtype)


def mutate_body(draw: st.DrawFn, message: Message) -> Message:
    """One mutation of ``message``: a field dropped or replaced, a tensor swapped, the
    body, the kind or the header's meta replaced."""
    body = message.body
    # (a compact batch's patch: a chunk's leaves as plain maps have a "next" map too)
    patched = isinstance(body, dict) and isinstance(body.get("next"), dict) \
        and "at" in body["next"]
    claims = isinstance(body, dict) and isinstance(body.get("frames"), TensorDict)
    how = draw(st.sampled_from(["field", "field", "field", "tensor", "body", "kind", "meta",
                                *["claim"] * (3 if claims else 0),
                                *["patch"] * (4 if patched else 0)]))
    paths = list(_leaves(body))
    if how == "field" and paths:
        path = draw(st.sampled_from(paths))
        value = draw(ODD_VALUES)
        message.body = _set(body, path, value)
        message.note += f" {path}={value!r:.40}"
    elif how == "tensor" and any(isinstance(p[-1], tuple) for p in paths):
        path = draw(st.sampled_from([p for p in paths if isinstance(p[-1], tuple)]))
        value = draw(tensors())
        message.body = _set(body, path, value)
        message.note += f" {path}={value.dtype}{list(value.shape)}"
    elif how == "claim" and isinstance(body, dict) and isinstance(body.get("frames"),
                                                                    TensorDict):
        n = draw(st.sampled_from([2, 1000, 5_000_000, 1 << 40]))
        message.body = claim_batch(body, n)
        message.note += f" batch_size [{n}, 1] zero-size leaves"
    elif how == "patch" and patched:
        key = draw(st.sampled_from(PATCH_KEYS))
        rows = len(body["next"]["at"])
        value = draw(st.one_of(  # mostly one row per position, as a patch must have
            tensors(batch=(rows,)),
            st.builds(torch.zeros, st.lists(st.integers(0, 4), max_size=2).map(
                lambda s: [rows, *s]), dtype=st.sampled_from(DTYPES))))
        message.body = patch_rows(body, key, value)
        message.note += f" next rows {key}={value.dtype}{list(value.shape)}"
    elif how == "body":
        message.body = draw(ODD_VALUES)
        message.note += f" body={message.body!r:.40}"
    elif how == "kind":
        message.kind = draw(st.sampled_from(["", "x" * 300, "welcome", "collect", "control",
                                             "weights", "bye", "rejoin", "\x00", "batch_slots",
                                             "refuse", "hello\n"]))
        message.note += f" kind={message.kind!r:.20}"
    elif how == "meta" and message.meta and draw(st.booleans()):
        path = draw(st.sampled_from([*_leaves(message.meta), ("chunk",)]))
        value = draw(ODD_VALUES)
        message.meta = _set(message.meta, path, value)
        message.note += f" meta {path}={value!r:.40}"
    else:
        message.meta = {"error": True} if draw(st.booleans()) else {"x": [1] * 1000}
        message.seq = draw(st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1))
        message.note += f" meta={message.meta!r:.30} seq={message.seq}"
    return message


#: Keys a compact batch's ``next`` rows may name: an observation, one nested under the
#: observation tensor, the flags, the collector's, a ``next`` key, one the frames lack.
PATCH_KEYS: list[Key] = [("observation",), ("observation", "x"), ("observation", "x", "y"),
                         ("done",), ("collector", "traj_ids"), ("next", "observation"),
                         ("nope",), ("action",)]


def patch_rows(body: dict[str, Any], key: Key, value: torch.Tensor) -> dict[str, Any]:
    """``body``'s compact patch with its rows replaced by ``key`` = ``value``."""
    at = body["next"]["at"]
    rows: Any = TensorDict({}, batch_size=[len(at)])
    try:
        rows.set(key, value)
    except Exception:
        node: dict[str, Any] = {}
        rows = node
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return dict(body, next={"at": at, "rows": rows})


def claim_batch(body: dict[str, Any], n: int) -> dict[str, Any]:
    """``body``'s batch as one claiming ``[n, 1]`` frames whose every leaf has zero size:
    a few bytes on the wire that promise ``n`` frames."""
    td = body["frames"]
    leaves = {k: torch.zeros((n, 1, 0), dtype=v.dtype)
              for k, v in td.items(include_nested=True, leaves_only=True)}
    claimed = TensorDict({}, batch_size=[n, 1])
    for k, v in leaves.items():
        claimed.set(k, v)
    out = dict(body, frames=claimed)
    if "next" in out:
        out["next"] = {"at": (torch.arange(1, n + 1) - 1) if n <= 1000
                       else torch.zeros(0, dtype=torch.int64),
                       "rows": TensorDict({}, batch_size=[min(n, 1000) if n <= 1000 else 0])}
    return out


def mutated(draw: st.DrawFn, message: Message, kind: str, mutations: int) -> Message:
    """``message``, a valid ``kind``, after ``mutations`` of :func:`mutate_body` (its
    ``note`` says how it was made)."""
    message.note = kind
    for _ in range(mutations):
        message = mutate_body(draw, message)
    return message


def sendable(message: Message) -> bool:
    """msgpack can carry ``message`` (else the codec refuses it on our side)."""
    try:
        message.frames()
    except (TypeError, ValueError, OverflowError):
        return False
    return True


# -- hostile peers against a target that admits them ------------------------------------------
class PeerFuzz(FuzzMachine):
    """Hostile peers (:meth:`peer` picks one for a step) against ``live``, a trainer or a
    central-inference server. After every step the target is healthy (:func:`check_health`);
    after every example the run went on (the honest worker delivers again), and if a message
    it must refuse was sent (:attr:`refusable`) it reacted (a refusal, a warning, a
    rate-limited log)."""

    live: Live

    def __init__(self) -> None:
        super().__init__()
        self.peers: list[Any] = []
        self.refusable: list[str] = []  # what was sent that the target must refuse
        self.last = "nothing yet"  # the message of the step last taken
        self.start = self.live.target.report()
        check_health(self.start, "before the example")

    def peer(self, draw: Any) -> Peer:
        raise NotImplementedError

    @rule(data=st.data())
    def garbage(self, data: st.DataObject) -> None:
        """Frames that are not our wire format at all."""
        peer = self.peer(data.draw)
        frames = data.draw(st.lists(st.binary(max_size=200), min_size=1, max_size=4))
        self.last = f"garbage frames {frames!r:.200}"
        self.history.append(self.last)
        peer.connect()
        peer.socket.send_multipart(frames)
        try:
            decode_message(frames)
        except ProtocolError:
            self.refusable.append(f"garbage frames {frames!r:.60}")

    @invariant()
    def healthy(self) -> None:
        with self.noted():
            check_health(self.live.target.report(), f"after sending {self.last}")

    def reacted(self, report: dict[str, Any], timeout: float = 3.0) -> dict[str, Any]:
        """A report once the target reacted to something this example sent (the last
        messages may still be on their way), or the last one after ``timeout``."""
        deadline = time.monotonic() + timeout
        before = sum(self.start["reactions"].values())
        while (self.refusable and sum(report["reactions"].values()) == before
               and time.monotonic() < deadline):
            time.sleep(0.2)
            report = self.live.target.report()
        return report

    def teardown(self) -> None:
        try:
            with self.noted():
                end = self.live.target.progressed(after=self.start["honest"])
                check_health(end, "after the example")
                end = self.reacted(end)
                reacted = (sum(end["reactions"].values())
                           - sum(self.start["reactions"].values()))
                assert reacted > 0 or not self.refusable, (
                    f"the target showed no refusal (no warning, no rate-limited log) for "
                    f"{len(self.refusable)} bad message(s), e.g. {self.refusable[:3]}")
        finally:
            for peer in self.peers:
                peer.close()


__all__ = [
    "DROP",
    "KINDS",
    "Message",
    "Peer",
    "PeerFuzz",
    "claim_batch",
    "compact_batch",
    "frames_from",
    "identity_specs",
    "mutate_body",
    "mutated",
    "patch_rows",
    "sendable",
    "valid_messages",
]
