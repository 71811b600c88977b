"""Chaos: the wire fuzzer against a live worker (a hostile coordinator; hypothesis, stateful).

A real ``asyncrl worker`` process (IdentityEnv, ValuePolicy) joins a fake coordinator (a
raw ROUTER in this process, see ``wire_hub.py``) that welcomes it and then sends valid and
mutated instances of every kind a worker reads: welcome, collect, preempt, control (seed,
state_dict, getattr_env), batch_slots, weights (whole and chunked), relay_attached, pings,
refuse, rejoin, unknown kinds, broken headers. It asserts: the worker ends only by an order
(refuse, rejoin, a goodbye) or a refusal it explains, never by an unexpected exception (no
traceback, no exit 1); while alive it still delivers a batch when asked; its peak RSS grows
by at most 64 MB. ``WIRE_FUZZ_EXAMPLES`` runs longer, as for the trainer's fuzzer.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from .live_fuzz import RSS_GROWTH_MB, FuzzMachine, fuzz, live_fixture, target_env
from .wire_fuzz import mutated, sendable
from .wire_hub import WORKER_KINDS, FakeHub, WorkerProcess, worker_messages

pytestmark = [pytest.mark.chaos]
EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "8"))
STEPS = int(os.environ.get("WIRE_FUZZ_STEPS", "10"))
#: Exit codes of a worker told to go (refused 4, coordinator gone 3): an explained end.
EXPLAINED_EXITS = {0, 3, 4}


class Session:
    """The fake hub and its current worker (a new one after the last ended)."""

    def __init__(self, backend: str, root: Path) -> None:
        self.backend, self.root = backend, root
        self.env = target_env(root)
        self.hub: FakeHub | None = None
        self.worker: WorkerProcess | None = None
        self.started = 0

    def ready(self) -> tuple[FakeHub, WorkerProcess]:
        """A welcomed worker that delivers (a fresh hub and worker if the last one ended)."""
        if self.worker is None or not self.worker.alive:
            self.close()
            self.hub = FakeHub()
            self.started += 1
            self.worker = WorkerProcess(self.hub.endpoint, self.backend, self.env,
                                        self.root / f"worker-{self.started}.log")
            self.hub.welcome()
            assert self.hub.delivers(60), f"a new worker delivered nothing: {self.output()}"
            self.worker.reset_peak()
        assert self.hub is not None
        return self.hub, self.worker

    def output(self) -> str:
        return self.worker.output()[-3000:] if self.worker is not None else ""

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.hub is not None:
            self.hub.close()
        self.worker = self.hub = None


session = live_fixture(Session, "fuzzw-")


def check_worker(worker: WorkerProcess, what: str) -> None:
    """Alive within its memory bound, or ended for a reason it gave, without a crash."""
    growth = worker.growth_mb()
    assert growth <= RSS_GROWTH_MB, (
        f"{what}: the worker's peak memory grew by {growth:.0f} MB (at most {RSS_GROWTH_MB})")
    if worker.alive:
        return
    code, output = worker.process.returncode, worker.output()
    assert code in EXPLAINED_EXITS and "Traceback" not in output, (
        f"{what}: the worker crashed (exit {code}):\n{output[-3000:]}")


class WorkerFuzz(FuzzMachine):
    session: Session

    def __init__(self) -> None:
        super().__init__()
        self.hub, self.worker = self.session.ready()

    @rule(data=st.data(), kind=st.sampled_from(WORKER_KINDS), mutations=st.integers(0, 3))
    def send(self, data: st.DataObject, kind: str, mutations: int) -> None:
        message = mutated(data.draw, worker_messages(self.hub)[kind](), kind, mutations)
        if not sendable(message):
            return
        self.history.append(f"{message.kind!r} made as {message.note}"[:300])
        if kind == "collect" and message.kind == "collect":
            self.hub.requests += 1
        self.hub.send(message)
        self.hub.pump(0.05)

    @rule(frames=st.lists(st.binary(max_size=200), min_size=1, max_size=4))
    def garbage(self, frames: list[bytes]) -> None:
        self.history.append(f"garbage frames {frames!r:.200}")
        if self.hub.peer is not None:
            self.hub.socket.send_multipart([self.hub.peer, *frames])
        self.hub.pump(0.05)

    @invariant()
    def healthy(self) -> None:
        with self.noted():
            check_worker(self.worker, f"after {self.history[-1] if self.history else 'start'}")

    def teardown(self) -> None:
        with self.noted():
            self.hub.pump(0.3)
            check_worker(self.worker, "after the example")
            if self.worker.alive and not self.hub.delivers(30):
                # Told to go (a valid refuse) just before: it is on its way out.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.worker.process.wait(10)
                assert not self.worker.alive, (
                    f"the worker is alive but delivers no batch any more:\n"
                    f"{self.session.output()}")
                check_worker(self.worker, "after the example")


@pytest.mark.parametrize("session", ["asyncio", "trio"], indirect=True)
def test_the_wire_fuzzer_crashes_no_worker_and_leaves_it_collecting(session: Session) -> None:
    fuzz(WorkerFuzz, examples=EXAMPLES, steps=STEPS, session=session)
    print(f"worker fuzz on {session.backend}: {session.started} worker(s) started")
