"""``ZmqWeightSyncScheme(in_place=True)``: big versions written into the model itself.

No receive buffer: one copy of the model, never two. The chunks of a version
are written into the model's own tensors only while it is not in use (the
rollout waits at a step boundary, or the worker is between batches); chunks
that come before wait in a backlog. Frames keep exact versions, and a stream
that fails once writing began fails the next step instead of stepping with a
half-written model.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from asyncrl.testing import fill_parameters
from asyncrl.weights import (
    StreamedWeightReceiver,
    WeightApplier,
    WeightSyncError,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from asyncrl.weights._receiver import WeightReceiverGroup
from tests.asyncrl.weights.test_weights_chunked import CHUNK, _body, net, stream, values
from transports import LocalHub, ProtocolError

pytestmark = pytest.mark.anyio
WAIT = 20


def in_place_receiver(model: nn.Module) -> StreamedWeightReceiver:
    receiver = ZmqWeightSyncScheme(chunk_bytes=CHUNK, in_place=True).init_on_worker(
        "policy", model=model)
    assert isinstance(receiver, StreamedWeightReceiver) and receiver.in_place
    return receiver


def pointers(model: nn.Module) -> list[int]:
    return [p.data_ptr() for p in model.parameters()]


def test_chunks_wait_until_the_model_is_held_then_go_into_its_own_tensors() -> None:
    model = net(0.0)
    before = pointers(model)
    receiver = in_place_receiver(model)
    messages = stream(net(2.0), 2)
    assert len(messages) == 6
    for message in messages[:3]:
        receiver.on_message(message)
    # The rollout may be stepping: nothing written yet, but the next boundary must stop.
    assert values(model) == {0.0} and receiver.needs_park and receiver.has_pending
    receiver.park()  # the rollout waits at a step boundary: the backlog goes in
    assert values(model) == {0.0, 2.0} and receiver.pending_version is None
    for message in messages[3:]:
        receiver.on_message(message)  # written as they come
    assert values(model) == {2.0} and not receiver.needs_park
    assert receiver.pending_version == 2 and receiver.version == 0
    assert receiver.apply_pending() and receiver.version == 2
    assert pointers(model) == before  # the model's own storage: no buffer, no swap
    assert receiver._spare is None  # and no receive buffer kept for the next version
    assert [ack.version for ack in receiver.take_acks()] == [2]


def test_an_idle_worker_is_written_as_the_chunks_come() -> None:
    model = net(0.0)
    receiver = in_place_receiver(model)
    receiver.park()  # no stream yet: nothing to hold
    assert not receiver.needs_park
    messages = stream(net(1.0), 1)
    receiver.on_message(messages[0])
    receiver.park()  # idle between batches (what WeightApplier.deliver does)
    for message in messages[1:]:
        receiver.on_message(message)
    assert receiver.apply_pending() and values(model) == {1.0}
    assert receiver.torn is None and [a.version for a in receiver.take_acks()] == [1]


def test_a_stream_failing_after_writing_began_fails_the_step_until_a_whole_version() -> None:
    model = net(0.0)
    receiver = in_place_receiver(model)
    group = WeightReceiverGroup([receiver])
    messages = _body(3, torch.zeros(3, dtype=torch.uint8))(stream(net(2.0), 2))
    receiver.on_message(messages[0])
    receiver.park()
    for message in messages[1:]:
        receiver.on_message(message)
    assert values(model) == {0.0, 2.0}  # chunks 0-2 went in; chunk 3 was refused
    acks = receiver.take_acks()
    assert [a.version for a in acks] == [None]
    assert isinstance(acks[0].error, ProtocolError) and "chunk 3" in str(acks[0].error)
    assert receiver.torn is not None and "after 3 of its 6 chunks" in receiver.torn
    assert receiver.has_pending and not receiver.needs_park
    with pytest.raises(WeightSyncError, match="half-written until a complete version comes; "
                                              "this worker does not step with it"):
        group.check_whole()
    for message in stream(net(3.0), 3):  # a whole version mends it
        receiver.on_message(message)
    receiver.park()
    assert receiver.apply_pending() and values(model) == {3.0} and receiver.torn is None
    group.check_whole()
    assert [a.version for a in receiver.take_acks()] == [3]


def test_a_newer_stream_takes_the_held_model_over_and_answers_the_older_one() -> None:
    model = net(0.0)
    receiver = in_place_receiver(model)
    for message in stream(net(2.0), 2):
        receiver.on_message(message)  # all of version 2 in the backlog: not held yet
    assert receiver.needs_park and values(model) == {0.0}
    newer = stream(net(3.0), 3)
    receiver.on_message(newer[0])  # version 2 is superseded before a byte of it was written
    receiver.park()
    assert receiver.torn is None and receiver.needs_park
    for message in newer[1:]:
        receiver.on_message(message)
    assert receiver.apply_pending() and receiver.version == 3 and values(model) == {3.0}
    assert sorted(a.version for a in receiver.take_acks()) == [3, 3]  # v2's too, with 3


def test_a_stream_cut_halfway_while_held_is_taken_over_without_letting_the_rollout_go() -> None:
    model = net(0.0)
    receiver = in_place_receiver(model)
    first, *rest = stream(net(2.0), 2)[:3]  # its last chunk never comes
    receiver.on_message(first)
    receiver.park()
    for message in rest:
        receiver.on_message(message)
    newer = stream(net(3.0), 3)
    receiver.on_message(newer[0])
    # Half of version 2 is in the model: torn, and still held (version 3 is coming).
    assert receiver.torn is not None and receiver.needs_park
    for message in newer[1:]:
        receiver.on_message(message)
    assert receiver.torn is None and not receiver.needs_park
    assert receiver.apply_pending() and values(model) == {3.0}


def test_a_restarted_coordinator_drops_the_held_stream_of_the_old_one() -> None:
    model = net(0.0)
    receiver = in_place_receiver(model)
    receiver.follow("first")
    for message in stream(net(2.0), 2):
        receiver.on_message(message)  # all in the backlog: the model was never held
    assert receiver.needs_park
    assert receiver.follow("second")  # versions count afresh: version 2 means nothing now
    assert not receiver.needs_park and not receiver.has_pending and receiver.torn is None
    receiver.park()
    assert values(model) == {0.0} and receiver.version == 0 and receiver.take_acks() == []


def test_in_place_is_configuration_and_refuses_what_does_not_apply() -> None:
    scheme = ZmqWeightSyncScheme(chunk_bytes=1 << 20, in_place=True)
    again = WeightSyncScheme.from_config(scheme.to_config())
    assert isinstance(again, ZmqWeightSyncScheme) and again.in_place
    assert (again.chunk_bytes, again.zero_copy) == (1 << 20, False)
    assert repr(ZmqWeightSyncScheme(in_place=True)) == "ZmqWeightSyncScheme(in_place=True)"
    with pytest.raises(ValueError, match="no receive buffer for zero_copy"):
        ZmqWeightSyncScheme(in_place=True, zero_copy=True)
    with pytest.raises(ValueError, match="give chunk_bytes > 0"):
        ZmqWeightSyncScheme(in_place=True, chunk_bytes=0)


def refused_in_place(model: nn.Module, names: list[str]) -> None:
    """Stream a version into ``model`` in place: refused, naming ``names``; the model as it was."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    receiver = in_place_receiver(model)
    for message in stream(nn.Linear(8, 8), 1):
        receiver.on_message(message)
        receiver.park()
    (ack,) = receiver.take_acks()
    assert isinstance(ack.error, WeightSyncError)
    assert f"must be contiguous CPU tensors; {names} are not" in str(ack.error)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert receiver.torn is None and not receiver.needs_park and receiver.version == 0


def test_a_model_that_cannot_be_written_in_place_is_refused_by_name() -> None:
    model = nn.Linear(8, 8)
    model.weight.data = torch.zeros(8, 8).t()  # not contiguous
    refused_in_place(model, ["weight"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_model_is_refused_by_name_and_left_as_it_was() -> None:
    refused_in_place(nn.Linear(8, 8).cuda(), ["weight", "bias"])


class FakeRollout:
    """What WeightApplier drives: a hook at every step boundary and the stamped version."""

    def __init__(self) -> None:
        self.before_step: Any = None
        self.policy_version = 0


async def test_the_rollout_waits_at_a_boundary_and_never_steps_with_a_half_written_model(
        ) -> None:
    hub = LocalHub(encode=True)
    trainer, worker = net(0.0), net(0.0)
    stepping = threading.Event()
    done = threading.Event()
    applier = WeightApplier(hub.connect(b"w0", deliver=lambda m: applier.deliver(m)),
                            busy=stepping.is_set)
    applier.add(ZmqWeightSyncScheme(chunk_bytes=CHUNK, in_place=True).init_on_worker(
        "policy", model=worker))
    rollout = FakeRollout()
    applier.attach(rollout)
    sender = ZmqWeightSyncScheme(chunk_bytes=CHUNK).init_on_sender(
        "policy", hub=hub, model=trainer, workers={0: b"w0"})
    steps: list[tuple[int, set[float]]] = []

    def step_until_done() -> None:
        while not done.is_set():
            rollout.before_step()
            steps.append((rollout.policy_version, values(worker)))  # "the policy acts"

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(applier.send_acks)
            stepping.set()
            tg.start_soon(anyio.to_thread.run_sync, step_until_done)
            for version in (1, 2, 3, 4):
                fill_parameters(trainer, float(version))
                await sender.send_async()
                assert await sender.wait_ack(timeout=WAIT) == {0: version}
            done.set()
            stepping.clear()
            applier.close()
    assert steps and all(seen == {float(v)} for v, seen in steps), steps[:20]
    assert {v for v, _ in steps} >= {3, 4}
