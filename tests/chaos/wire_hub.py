"""The wire fuzzer's hostile coordinator (:class:`Router`), and the worker it talks to.

:class:`Router` is a raw ROUTER that plays the coordinator for one peer: it pings it as a
hub does (so the peer hears a live coordinator) and hands what comes to :meth:`Router.take`.
:class:`FakeHub` plays it for one real ``asyncrl worker`` process (:class:`WorkerProcess`):
it welcomes it, asks for batches and counts what comes back, and sends whatever the fuzzer
makes of :func:`worker_messages` (each class's ``to_body()``); the relay fuzzer's
``Upstream`` plays it for a host relay.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import zmq

from asyncrl._protocol import (
    Batch,
    BatchSlots,
    Collect,
    Control,
    Hello,
    Preempt,
    Refuse,
    Rejoin,
    RelayAttached,
    SharedBatch,
    WeightChunk,
    WeightMeta,
    Welcome,
)
from transports._codec import Decoded, decode_message

from .wire_fuzz import Message

INSTANCE = "f022f022f022f022"  # the fake hub's instance, told in every ping
SCHEMES = {"policy": {"scheme": "zmq", "strategy": "tensordict"}}


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


class WorkerProcess:
    """``asyncrl worker`` for IdentityEnv + ValuePolicy, its output kept in a file."""

    def __init__(self, endpoint: str, backend: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint,
             "--env", "asyncrl.testing:IdentityEnv", "--policy", "asyncrl.testing:ValuePolicy",
             "--peer-timeout", "3", "--backend", backend],
            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.baseline_kib = 0

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def reset_peak(self) -> None:
        """Reset VmHWM to the current RSS (``/proc/PID/clear_refs``) and take the baseline."""
        try:
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
            self.baseline_kib = status_kib(self.process.pid, "VmRSS")
        except (OSError, LookupError):
            pass  # gone: the caller looks at how it ended

    def growth_mb(self) -> float:
        try:
            return (status_kib(self.process.pid, "VmHWM") - self.baseline_kib) / 1024
        except (OSError, LookupError):
            return 0.0

    def stop(self) -> None:
        if self.alive:
            os.killpg(self.process.pid, 9)
        self.process.wait()


class Router:
    """A ROUTER that plays a coordinator for one peer (:attr:`peer`, once it said hello)."""

    def __init__(self) -> None:
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 2000)
        self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.peer: bytes | None = None

    def send(self, message: Message) -> None:
        if self.peer is None:
            return
        try:
            self.socket.send_multipart([self.peer, *message.frames()])
        except zmq.Again:
            pass

    def ping(self) -> None:
        self.send(Message("ping", None, meta={"hub": INSTANCE}))

    def pump(self, seconds: float = 0.0) -> None:
        """Read what the peer sent for ``seconds`` (pinging it meanwhile)."""
        deadline = time.monotonic() + seconds
        while True:
            self.ping()
            if self.socket.poll(max(0, min(200, int((deadline - time.monotonic()) * 1000)))):
                frames = self.socket.recv_multipart()
                try:
                    decoded = decode_message(frames[1:])
                except Exception:
                    continue
                self.take(frames[0], decoded)
            if time.monotonic() >= deadline:
                return

    def take(self, peer: bytes, message: Decoded) -> None:
        """A message ``peer`` sent."""

    def close(self) -> None:
        self.socket.close(linger=0)


class FakeHub(Router):
    """A ROUTER that plays the coordinator for one worker."""

    def __init__(self) -> None:
        super().__init__()
        self.hello: Hello | None = None
        self.kinds: collections.Counter[str] = collections.Counter()
        self.batches = 0
        self.requests = 0
        self.version = 0
        self.welcomed = False  # the latest hello was answered

    def take(self, peer: bytes, message: Decoded) -> None:
        self.kinds[message.kind] += 1
        if message.kind == Hello.KIND:  # the first, or joining again (a rejoin)
            self.peer, self.hello = peer, Hello.from_body(message.body)
            self.welcomed = False
        elif message.kind in (Batch.KIND, SharedBatch.KIND):
            self.batches += 1

    def welcome(self, timeout: float = 60.0) -> None:
        """Wait for the worker's hello and welcome it."""
        deadline = time.monotonic() + timeout
        while self.hello is None and time.monotonic() < deadline:
            self.pump(0.2)
        assert self.hello is not None, f"no hello from the worker in {timeout:.0f} s"
        self.welcomed = True
        self.send(Message(Welcome.KIND, Welcome(
            index=0, share_frames=20, schemes=SCHEMES, attempt=self.hello.attempt,
            instance=INSTANCE, compact_batches=True).to_body()))

    def collect(self) -> int:
        self.requests += 1
        self.send(Message(Collect.KIND, Collect(self.requests).to_body()))
        return self.requests

    def delivers(self, timeout: float = 30.0) -> bool:
        """Ask for a batch; True once one more came within ``timeout``."""
        if not self.welcomed:  # it was told to rejoin, and did
            self.welcome()
        before = self.batches
        self.collect()
        deadline = time.monotonic() + timeout
        while self.batches == before and time.monotonic() < deadline:
            self.pump(0.1)
        return self.batches > before


#: A refusal's env_source as a trainer sends it (an id this worker did not ask for).
ENV_SOURCE: dict[str, Any] = {
    "env_id": "CartPole-v1", "module": "gymnasium.envs.classic_control.cartpole",
    "package": "gymnasium", "spec": {
        "entry_point": "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        "reward_threshold": 475.0, "nondeterministic": False, "max_episode_steps": 500,
        "order_enforce": True, "disable_env_checker": False, "kwargs": {"render_mode": None},
        "vector_entry_point": "gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv"}}


def worker_messages(hub: FakeHub) -> dict[str, Callable[[], Message]]:
    """A factory of one valid message per kind a worker reads from its coordinator."""

    def weights(chunked: bool = False) -> Message:
        hub.version += 1
        value = torch.tensor([float(hub.version)])
        if not chunked:
            meta = WeightMeta("policy", hub.version, INSTANCE).to_meta()
            return Message("weights", {"value": value}, meta=meta, ack=True)
        chunk = WeightChunk(0, 1, (("value", 0, 4),), (("value", "float32", (1,)),))
        meta = WeightMeta("policy", hub.version, INSTANCE, chunk=chunk).to_meta()
        return Message("weights", [value.view(torch.uint8)], meta=meta, ack=True)

    hello_attempt = hub.hello.attempt if hub.hello is not None else 0
    return {
        "welcome": lambda: Message(Welcome.KIND, Welcome(
            index=0, share_frames=20, schemes=SCHEMES, attempt=hello_attempt,
            instance=INSTANCE, compact_batches=True).to_body()),
        "collect": lambda: Message(Collect.KIND, Collect(hub.requests + 1).to_body()),
        "preempt": lambda: Message(Preempt.KIND, Preempt(hub.requests).to_body()),
        "control_seed": lambda: Message(Control.KIND, Control("seed", {"seed": 7}).to_body(),
                                        ack=True),
        "control_state_dict": lambda: Message(Control.KIND, Control("state_dict").to_body(),
                                              ack=True),
        "control_getattr": lambda: Message(Control.KIND, Control(
            "getattr_env", {"attr": "length"}).to_body(), ack=True),
        "batch_slots": lambda: Message(BatchSlots.KIND, BatchSlots(
            "asyncrl_1_fuzz", [("observation",)]).to_body()),
        "weights": weights,
        "weights_chunk": lambda: weights(chunked=True),
        "relay_attached": lambda: Message(RelayAttached.KIND, RelayAttached().to_body()),
        "ping": lambda: Message("ping", None, meta={"hub": INSTANCE}),
        # These end the worker when valid (as they should): rarer in the fuzzer's draws.
        "refuse": lambda: Message(Refuse.KIND, Refuse("fuzzed").to_body()),
        # Its env_source declared (asyncrl._protocol.env_source): mutated, dropped at decode.
        "refuse_env_source": lambda: Message(Refuse.KIND, Refuse(
            "fuzzed", env_source=ENV_SOURCE).to_body()),
        "rejoin": lambda: Message(Rejoin.KIND, Rejoin("fuzzed").to_body()),
    }


#: Kinds the fuzzer draws, the ones that end a worker when valid (refuse, rejoin) once.
WORKER_KINDS = ["welcome", "collect", "preempt", "control_seed", "control_state_dict",
                "control_getattr", "batch_slots", "weights", "weights_chunk",
                "relay_attached", "ping"] * 3 + ["refuse", "refuse_env_source", "rejoin"]

__all__ = ["INSTANCE", "WORKER_KINDS", "FakeHub", "Router", "WorkerProcess", "worker_messages"]
