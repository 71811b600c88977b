"""``info_keys`` entries as hostile input (issue 43, item 7): what a remote host sends under
``"next"`` is refused for that batch and worker, never ends the trainer's loop, never
reaches the user's batch.

A collector listens for two remote workers, both played by the test over real
sockets: an honest one that answers every order with a share carrying the asked
``("next", "steps")``, and a rogue that answers its first order with a batch
whose info entries are not what was asked. The run must go on with the honest
worker's batches only, each holding exactly the keys of an honest share.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

from asyncrl import MultiAsyncCollector
from asyncrl._coordinator.info_entries import MAX_INFO_NUMEL, InfoEntries
from asyncrl._protocol import PROTOCOL, Batch, Collect, Hello, Refuse, Welcome
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.options import RolloutOptions
from asyncrl._worker.simulated import make_share
from tests.asyncrl.coordinator.test_hostile_peers import recv_kind
from transports import Link, random_identity

pytestmark = pytest.mark.anyio
LIMIT = 90
FRAMES = 10


def cartpole_specs() -> dict[str, Any]:
    """The specs the collector checks remote workers against (it builds one env itself)."""
    pool = make_env_pool("CartPole-v1", num_envs=1)
    try:
        return pool.specs.to_dict()
    finally:
        pool.close()


async def join(link: Link, specs: dict[str, Any]) -> int:
    await link.send(Hello(protocol=PROTOCOL, name=link.identity.decode(), host="test",
                          pid=os.getpid(), specs=specs, slot=-1,
                          # a host of this release: it runs with the welcome's options
                          rollout=RolloutOptions().to_wire()).to_body(), kind=Hello.KIND)
    message = await recv_kind(link, Welcome.KIND, Refuse.KIND)
    assert message.kind == Welcome.KIND, message.body
    return Welcome.from_body(message.body).index


def honest(index: int, steps: Any = None) -> TensorDict:
    share = make_share(FRAMES, 4, worker_id=index)
    share["next", "steps"] = torch.arange(FRAMES).reshape(1, FRAMES) if steps is None else steps
    return share


def unasked(index: int) -> TensorDict:
    share = honest(index)
    share["next", "secret"] = torch.full((1, FRAMES), 7.0)
    return share


def unasked_nested(index: int) -> TensorDict:
    share = honest(index)
    share["next", "episode", "r"] = torch.zeros(1, FRAMES)
    return share


def other_dtype(index: int) -> TensorDict:
    return honest(index, torch.zeros(1, FRAMES, dtype=torch.float32))


def other_shape(index: int) -> TensorDict:
    return honest(index, torch.zeros(1, FRAMES, 3, dtype=torch.int64))


def huge(index: int) -> TensorDict:
    return honest(index, torch.zeros(1, FRAMES, 2 * MAX_INFO_NUMEL, dtype=torch.int64))


def a_string(index: int) -> TensorDict:
    share = make_share(FRAMES, 4, worker_id=index)
    share.set_non_tensor(("next", "steps"), "a string, not a number")
    return share


def an_unasked_string(index: int) -> TensorDict:
    share = honest(index)
    share.set_non_tensor(("next", "note"), "text the trainer never asked for")
    return share


def missing(index: int) -> TensorDict:
    return make_share(FRAMES, 4, worker_id=index)


CASES: dict[str, tuple[Callable[[int], TensorDict], str]] = {
    "an entry the trainer did not ask for": (unasked, r"\('next', 'secret'\): sent, but the "
                                                      r"trainer did not ask for it"),
    "a nested entry the trainer did not ask for": (unasked_nested, r"\('next', 'episode', "
                                                                   r"'r'\): sent, but"),
    "another dtype": (other_dtype, r"\('next', 'steps'\): torch.float32 of per-frame shape "
                                   r"\[\], expected torch.int64 of shape \[\] \(its spec in "
                                   r"info_keys\)"),
    "another shape": (other_shape, r"\('next', 'steps'\): torch.int64 of per-frame shape \[3\]"),
    "a huge entry": (huge, r"\('next', 'steps'\): torch.int64 of per-frame shape \[8192\]"),
    "a string": (a_string, r"\('next', 'steps'\): NonTensorData, expected a tensor"),
    "an unasked object": (an_unasked_string, r"\('next', 'note'\): NonTensorData"),
    "no asked entry": (missing, r"lacks \('next', 'steps'\), which info_keys asked for"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_remote_hosts_bad_info_entries_are_refused_and_the_run_goes_on(
        case: str, caplog: pytest.LogCaptureFixture) -> None:
    bad, reason = CASES[case]
    batches = []
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(
                "CartPole-v1", num_workers=0, remote_workers=2, listen="tcp://127.0.0.1:0",
                frames_per_batch=FRAMES, total_frames=4 * FRAMES, on_worker_loss="continue",
                info_keys={"steps": "int64"}) as collector, \
                Link(collector.endpoint, identity=random_identity("good")) as good, \
                Link(collector.endpoint, identity=random_identity("rogue")) as rogue:
            specs = cartpole_specs()
            good_index = await join(good, specs)
            rogue_index = await join(rogue, specs)

            async def serve_good() -> None:
                while True:
                    order = Collect.from_body((await recv_kind(good, Collect.KIND)).body)
                    await good.send(Batch(order.request, honest(good_index)).to_body(),
                                    kind=Batch.KIND)

            async def play_rogue() -> None:
                order = Collect.from_body((await recv_kind(rogue, Collect.KIND)).body)
                await rogue.send(Batch(order.request, bad(rogue_index)).to_body(),
                                 kind=Batch.KIND)
                refused = Refuse.from_body((await recv_kind(rogue, Refuse.KIND)).body)
                assert "rejected" in refused.reason

            async with anyio.create_task_group() as tg:
                tg.start_soon(serve_good)
                tg.start_soon(play_rogue)
                async for batch in collector:
                    batches.append(batch.clone())
                tg.cancel_scope.cancel()
    assert len(batches) == 4
    expected = sorted(map(str, honest(good_index).keys(include_nested=True, leaves_only=True)))
    for batch in batches:
        assert (batch["collector", "worker_id"] == good_index).all()
        assert sorted(map(str, batch.keys(include_nested=True, leaves_only=True))) == expected
        assert batch["next", "steps"].tolist() == list(range(FRAMES))
    assert any(re.search(reason, r.getMessage()) for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


# -- the decisions themselves, where no spec is given ----------------------------------------
def _share(**next_entries: torch.Tensor) -> TensorDict:
    share = make_share(FRAMES, 4)
    for key, value in next_entries.items():
        share["next", key] = value
    return share


def test_without_a_spec_a_local_workers_first_batch_sets_it_and_remotes_follow() -> None:
    entries = InfoEntries(((("steps",), None),), first_remote_index=1)
    ints, floats = torch.zeros(1, FRAMES, dtype=torch.int64), torch.zeros(1, FRAMES)
    # a remote host's batch before any local one: judged, but it sets nothing
    assert entries.problems(_share(steps=floats), worker_index=1) == []
    assert entries.problems(_share(steps=ints), worker_index=0) == []  # local: sets int64 ()
    assert entries.problems(_share(steps=floats), worker_index=1) == [
        "('next', 'steps'): torch.float32 of per-frame shape [], expected torch.int64 of "
        "shape [] (the first batch with it): an info entry keeps its shape and dtype for "
        "the whole run"]
    assert entries.problems(_share(steps=ints), worker_index=1) == []


def test_without_a_spec_an_entry_is_bounded_whoever_sends_it_first() -> None:
    entries = InfoEntries(((("frame",), None),))  # no local worker: the first batch sets it
    big = torch.zeros(1, FRAMES, 64, 65, dtype=torch.uint8)
    assert entries.problems(_share(frame=big), worker_index=0) == [
        f"('next', 'frame'): 4160 numbers per frame (shape [64, 65]), more than the "
        f"{MAX_INFO_NUMEL} an info entry without a spec may hold; give its spec "
        "(info_keys={('frame',): ((shape), dtype)}) to allow it"]
    given = InfoEntries(((("frame",), ((64, 65), "uint8")),))
    assert given.problems(_share(frame=big), worker_index=0) == []


def test_flags_root_twins_and_asked_nested_entries_are_what_next_may_hold() -> None:
    entries = InfoEntries(((("episode",), None),))
    share = _share()
    share["hidden"] = torch.zeros(1, FRAMES, 8)  # a recurrent state and its twin
    share["next", "hidden"] = torch.zeros(1, FRAMES, 8)
    share["next", "episode", "r"] = torch.zeros(1, FRAMES, dtype=torch.float64)
    share["next", "episode", "l"] = torch.zeros(1, FRAMES, dtype=torch.int64)
    assert entries.problems(share, worker_index=0) == []
    del share["hidden"]  # ("next", "hidden") is no twin now
    assert entries.problems(share, worker_index=0)[0].startswith(
        "('next', 'hidden'): sent, but the trainer did not ask for it (info_keys asks "
        "[('episode',)]")
