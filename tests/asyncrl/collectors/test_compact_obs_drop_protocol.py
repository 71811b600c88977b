"""``compact_obs=True`` decided between trainer and worker (without a socket, then with one).

The welcome tells a worker to drop the ``("next", K)`` twins; a worker says in its
hello that it knows how. Either field is optional (a peer of the release before
leaves it out), so every mix of releases still talks: a worker that does not drop
them has them dropped by the coordinator on receipt, and a worker that said it
drops them may not smuggle one in.
"""

from __future__ import annotations

import logging
import os
import uuid
from functools import partial
from typing import Any

import anyio
import anyio.abc
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from asyncrl._coordinator.batch_sink import BatchSink
from asyncrl._coordinator.coordinator import Coordinator
from asyncrl._coordinator.state import CoordinatorState, Send
from asyncrl._protocol import (
    PROTOCOL,
    Batch,
    Collect,
    Hello,
    Refuse,
    Welcome,
    compact,
    drop_twins,
)
from asyncrl._worker.outgoing import OutgoingBatches
from asyncrl._worker.simulated import make_share, make_specs, sim_worker
from tests.asyncrl.coordinator.rules import rules
from transports import Hub, Link, ProtocolError

FRAMES, OBS = 8, 64  # 256 bytes per observation: compact batches compact it
TWINS = {("next", "observation")}


def keys_of(td: TensorDictBase) -> set[Any]:
    return {k if isinstance(k, tuple) else (k,)
            for k in td.keys(include_nested=True, leaves_only=True)}


def hello(*, drops: bool | None) -> Hello:
    """A remote worker's hello, through its wire form; ``drops=None``: a worker before the
    field (it leaves it out)."""
    body = Hello(protocol=PROTOCOL, name="w", host="h", pid=os.getpid(), specs=make_specs(OBS),
                 drops_next_obs=bool(drops)).to_body()
    if drops is None:
        del body["drops_next_obs"]
    return Hello.from_body(body)


def state(*, compact_obs: bool, sync: bool = False, workers: int = 1) -> CoordinatorState:
    return CoordinatorState(*rules(sync=sync, share_frames=[FRAMES] * workers,
                                   accept_remote=True, compact_obs=compact_obs,
                                   first_remote_index=0))


def admit(s: CoordinatorState, peer: bytes, *, drops: bool | None) -> Welcome:
    actions = s.hello(peer, hello(drops=drops))
    assert isinstance(actions[0], Send) and isinstance(actions[0].message, Welcome), actions
    return actions[0].message


def received(frames: TensorDictBase, request: int = 0, patch: Any = None) -> Batch:
    """``frames`` as the coordinator reads them (a compact ``patch`` rebuilt on the way in)."""
    return Batch.from_body(Batch(request, frames, patch).to_body())


# -- the fields, and releases before them ------------------------------------------------------
def test_the_welcome_says_compact_obs_and_a_welcome_without_the_field_means_keep_them() -> None:
    s = state(compact_obs=True)
    assert admit(s, b"a", drops=True).compact_obs is True
    assert admit(state(compact_obs=False), b"a", drops=True).compact_obs is False
    body = Welcome(index=0, share_frames=FRAMES, compact_obs=True).to_body()
    assert Welcome.from_body(body).compact_obs is True
    del body["compact_obs"]  # a trainer of the release before
    assert Welcome.from_body(body).compact_obs is False


def test_a_hello_without_the_field_is_a_worker_that_does_not_drop() -> None:
    assert hello(drops=None).drops_next_obs is False
    assert hello(drops=True).drops_next_obs is True
    body = hello(drops=True).to_body()
    body["drops_next_obs"] = 1
    with pytest.raises(ProtocolError,
                       match=r"hello message field 'drops_next_obs' must be bool, got int"):
        Hello.from_body(body)


def test_a_worker_told_compact_obs_sends_neither_twin_nor_patch() -> None:
    frames = make_share(FRAMES, OBS)
    out = OutgoingBatches()
    out.welcomed(Welcome(index=0, share_frames=FRAMES, compact_batches=True, compact_obs=True))
    batch = out.take(frames, 3)
    assert isinstance(batch, Batch) and batch.next is None
    assert keys_of(batch.frames) == keys_of(frames) - TWINS
    assert batch.frames["observation"].data_ptr() != frames["observation"].data_ptr()  # a copy
    assert torch.equal(batch.frames["observation"], frames["observation"])


def test_a_worker_welcomed_by_a_trainer_before_the_field_sends_the_compact_form() -> None:
    frames = make_share(FRAMES, OBS)
    body = Welcome(index=0, share_frames=FRAMES, compact_batches=True).to_body()
    del body["compact_obs"]
    out = OutgoingBatches()
    out.welcomed(Welcome.from_body(body))
    wire = out.take(frames, 3)
    assert isinstance(wire, Batch) and wire.next is not None  # compact, rebuilt on receipt
    rebuilt = received(wire.frames, wire.request, wire.next).frames
    assert keys_of(rebuilt) == keys_of(frames)
    assert torch.equal(rebuilt["next", "observation"], frames["next", "observation"])


# -- the coordinator's checks -----------------------------------------------------------------
def test_a_dropped_batch_is_counted_as_it_came() -> None:
    s = state(compact_obs=True)
    admit(s, b"a", drops=True)
    s.roster.workers[b"a"].credits = 1
    frames = drop_twins(make_share(FRAMES, OBS))
    assert s.batch(b"a", received(frames)) == []
    (_, delivered), = s.rounds.ready
    assert keys_of(delivered) == keys_of(frames)


def test_a_twin_smuggled_in_is_refused_naming_the_worker_and_the_key(
        caplog: pytest.LogCaptureFixture) -> None:
    s = state(compact_obs=True)
    admit(s, b"a", drops=True)
    with caplog.at_level(logging.ERROR, logger="asyncrl.coordinator"):
        actions = s.batch(b"a", received(make_share(FRAMES, OBS)))
    refuse = actions[0].message
    assert isinstance(refuse, Refuse)
    assert "('next', 'observation'): sent, but compact_obs=True drops it" in refuse.reason
    assert not s.roster.workers[b"a"].alive and not s.rounds.ready
    assert "worker 0 (w on h) sent a bad batch" in caplog.text


def test_a_twin_of_another_shape_is_refused_too() -> None:
    s = state(compact_obs=True)
    admit(s, b"a", drops=True)
    frames = drop_twins(make_share(FRAMES, OBS))
    frames["next", "observation"] = torch.zeros(1, FRAMES, OBS + 1)  # no twin by shape
    refuse = s.batch(b"a", received(frames))[0].message
    assert isinstance(refuse, Refuse) and "('next', 'observation'): sent" in refuse.reason


def test_a_twin_rebuilt_from_a_compact_patch_is_refused() -> None:
    s = state(compact_obs=True)
    admit(s, b"a", drops=True)
    frames = make_share(FRAMES, OBS)
    wire, patch = compact(frames)
    assert patch is not None  # the compact form: ("next", "observation") rebuilt on receipt
    refuse = s.batch(b"a", received(wire, 0, patch))[0].message
    assert isinstance(refuse, Refuse) and "('next', 'observation'): sent" in refuse.reason


@pytest.mark.parametrize("missing", [("observation",), ("next", "reward"), ("next", "done")])
def test_a_dropped_batch_missing_a_kept_key_is_refused(missing: tuple[str, ...]) -> None:
    s = state(compact_obs=True)
    admit(s, b"a", drops=True)
    frames = drop_twins(make_share(FRAMES, OBS)).exclude(missing)
    refuse = s.batch(b"a", received(frames))[0].message
    assert isinstance(refuse, Refuse) and f"{missing}: missing" in refuse.reason


def test_without_compact_obs_a_batch_without_twins_is_refused_as_before() -> None:
    s = state(compact_obs=False)
    admit(s, b"a", drops=True)
    refuse = s.batch(b"a", received(drop_twins(make_share(FRAMES, OBS))))[0].message
    assert isinstance(refuse, Refuse) and "('next', 'observation'): missing" in refuse.reason


# -- releases mixed -----------------------------------------------------------------------------
def sunk(s: CoordinatorState, peer: bytes, frames: TensorDictBase, request: int = 0) -> Batch:
    """``frames`` as the coordinator's batch sink hands them on (decoded, compacted)."""
    body = Batch.from_body(Batch(request, frames).to_body()).to_body()
    return BatchSink(s.config).from_socket(s.roster.workers[peer], body)


def test_a_worker_of_the_release_before_has_its_twins_dropped_on_receipt() -> None:
    s = state(compact_obs=True)
    assert admit(s, b"old", drops=None).compact_obs is True  # it ignores the field
    s.roster.workers[b"old"].credits = 1
    full = make_share(FRAMES, OBS)
    assert s.batch(b"old", sunk(s, b"old", full.clone())) == []
    (_, delivered), = s.rounds.ready
    assert keys_of(delivered) == keys_of(full) - TWINS
    for key in keys_of(delivered):
        assert torch.equal(delivered[key], full[key])


def test_a_sync_round_of_an_old_and_a_new_worker_has_one_layout() -> None:
    s = state(compact_obs=True, sync=True, workers=2)
    admit(s, b"old", drops=None)
    admit(s, b"new", drops=True)
    round_, _ = s.start_round()
    old, new = s.roster.workers[b"old"], s.roster.workers[b"new"]
    assert s.batch(b"old", sunk(s, b"old", make_share(FRAMES, OBS, worker_id=old.index),
                                round_.request)) == []
    assert s.batch(b"new", sunk(s, b"new", drop_twins(make_share(FRAMES, OBS,
                                                                   worker_id=new.index)),
                                round_.request)) == []
    assert round_.complete
    shares = [frames for _, frames in s.rounds.end_round(round_)]
    assert len(shares) == 2 and keys_of(shares[0]) == keys_of(shares[1])
    assert not TWINS & keys_of(shares[0])
    torch.stack(shares)  # the assembly stacks them: one layout


def test_drop_twins_copies_nothing() -> None:
    frames = TensorDict({"state": torch.zeros(2, 3, 5), ("next", "state"): torch.ones(2, 3, 5),
                         ("next", "reward"): torch.ones(2, 3, 1)}, [2, 3])
    dropped = drop_twins(frames)
    assert keys_of(dropped) == {("state",), ("next", "reward")}
    assert dropped["state"].data_ptr() == frames["state"].data_ptr()


# -- releases mixed, over a real socket ---------------------------------------------------------
async def new_worker(endpoint: str, welcomes: list[Welcome], *,
                     task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """A worker of this release: says it drops the twins, and drops them when told."""
    async with Link(endpoint, identity="new") as link:
        await link.send(hello(drops=True).to_body(), kind=Hello.KIND)
        task_status.started()
        async for message in link:
            if message.kind == Welcome.KIND:
                welcomes.append(Welcome.from_body(message.body))
            elif message.kind == Collect.KIND:
                frames = make_share(FRAMES, OBS, worker_id=welcomes[-1].index)
                if welcomes[-1].compact_obs:
                    frames = drop_twins(frames)
                collect = Collect.from_body(message.body)
                await link.send(Batch(collect.request, frames).to_body(), kind=Batch.KIND)


@pytest.mark.anyio
async def test_an_old_and_a_new_worker_deliver_one_layout_over_the_socket(
        anyio_backend: str) -> None:
    welcomes: list[Welcome] = []
    with anyio.fail_after(60):
        async with Hub(f"inproc://compact-obs-{uuid.uuid4().hex}") as hub:
            coordinator = Coordinator(hub, *rules(sync=True, share_frames=[FRAMES] * 2,
                                                  accept_remote=True, compact_obs=True))
            async with anyio.create_task_group() as tg:
                tg.start_soon(coordinator.run)
                await tg.start(partial(sim_worker, hub.endpoint, "old", frames=FRAMES,
                                       obs_dim=OBS))  # a release before: whole batches
                await tg.start(new_worker, hub.endpoint, welcomes)
                await coordinator.wait_for_workers(2)
                for _ in range(2):
                    shares = await coordinator.next_round()
                    assert len(shares) == 2
                    assert keys_of(shares[0][1]) == keys_of(shares[1][1]) == keys_of(
                        make_share(FRAMES, OBS)) - TWINS
                tg.cancel_scope.cancel()
    assert [w.compact_obs for w in welcomes] == [True]
