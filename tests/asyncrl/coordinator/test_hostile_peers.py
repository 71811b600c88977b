"""Peers that lie: strangers, forged reports, bogus batches, stolen identities, floods.

A coordinator that listens on a network must not let anyone who can reach its
port end, truncate or poison a run, nor make it hold unbounded memory.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
import torch
import zmq
from anyio.abc import TaskGroup
from tensordict import TensorDict

from asyncrl import MultiAsyncCollector
from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._errors import BadBatchError, rebuild_remote_exception
from asyncrl._protocol import (
    PROTOCOL,
    Batch,
    Collect,
    ErrorReport,
    Hello,
    Refuse,
    Welcome,
    decode,
)
from asyncrl._worker.simulated import make_share, make_specs
from tests.asyncrl.coordinator.rules import rules
from transports import ErrorPayload, Hub, Link, ProtocolError, RemoteError, random_identity
from transports._codec import encode_message

pytestmark = pytest.mark.anyio
LIMIT = 90
FRAMES = 10


# -- helpers ----------------------------------------------------------------------------
def forged_error(type_path: str = "builtins:RuntimeError") -> dict[str, Any]:
    return ErrorReport(ErrorPayload(type_path, "forged: the run is over"), fatal=True).to_body()


def hello(name: str, *, protocol: int = PROTOCOL, obs_dim: int = 4) -> dict[str, Any]:
    return Hello(protocol=protocol, name=name, host="test", pid=os.getpid(),
                 specs=make_specs(obs_dim), slot=-1).to_body()


async def recv_kind(link: Link, *kinds: str) -> Any:
    """The next message of one of ``kinds`` (pings and other kinds are skipped)."""
    while True:
        message = await link.recv()
        if message.kind in kinds:
            return message


async def join(link: Link) -> int:
    await link.send(hello(link.identity.decode()), kind=Hello.KIND)
    message = await recv_kind(link, Welcome.KIND, Refuse.KIND)
    assert message.kind == Welcome.KIND, message.body
    return Welcome.from_body(message.body).index


def scheduler(hub: Hub, *, sync: bool = False, **options: Any) -> Coordinator:
    return Coordinator(hub, *rules(sync=sync, share_frames=[FRAMES], check_specs=check_specs,
                                   accept_remote=True, **options))


def inproc() -> str:
    return f"inproc://hostile-{uuid.uuid4().hex}"


def cartpole(**options: Any) -> MultiAsyncCollector:
    return MultiAsyncCollector("CartPole-v1", num_workers=1, listen="tcp://127.0.0.1:0",
                               frames_per_batch=20, **options)


# -- 1. a stranger cannot end a run; a peer's word never becomes control flow -----------
@pytest.mark.parametrize("type_path", [
    "builtins:StopAsyncIteration", "builtins:StopIteration", "builtins:GeneratorExit",
    "builtins:KeyboardInterrupt", "builtins:SystemExit", "builtins:BaseException",
    "asyncio.exceptions:CancelledError", "asyncio:CancelledError", "trio:Cancelled",
])
def test_control_flow_exceptions_come_back_as_remote_errors(type_path: str) -> None:
    import trio  # noqa: F401  (loaded, as in a trio trainer: still refused)

    error = rebuild_remote_exception(ErrorPayload(type_path, "forged"), peer="w")
    assert type(error) is RemoteError
    assert error.remote_type == type_path


def test_plain_exceptions_keep_their_type() -> None:
    error = rebuild_remote_exception(ErrorPayload("builtins:ValueError", "bad", "tb"), peer="w")
    assert type(error) is ValueError
    assert isinstance(error.__cause__, RemoteError)


async def test_a_forged_stop_async_iteration_from_a_worker_fails_the_round() -> None:
    with anyio.fail_after(LIMIT):
        async with Hub(inproc()) as hub, Link(hub.endpoint, identity=b"w") as link:
            sched = scheduler(hub, sync=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sched.run)
                await join(link)
                await sched.wait_for_workers(1)
                await link.send(forged_error("builtins:StopAsyncIteration"),
                                kind=ErrorReport.KIND)
                with pytest.raises(RemoteError, match="forged"):
                    await sched.next_round()
                tg.cancel_scope.cancel()


@pytest.mark.parametrize("type_path", ["builtins:RuntimeError", "builtins:StopAsyncIteration"])
async def test_a_stranger_cannot_end_a_run(type_path: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with anyio.fail_after(LIMIT):
        async with cartpole(total_frames=100) as collector:
            async with Link(collector.endpoint, identity=random_identity("stranger")) as link:
                for _ in range(50):
                    await link.send(forged_error(type_path), kind=ErrorReport.KIND)
                # Answered in order: once refused, the forged reports were all handled.
                await link.send(hello("stranger", protocol=PROTOCOL + 99), kind=Hello.KIND)
                await recv_kind(link, Refuse.KIND)
            frames = 0
            async for batch in collector:
                frames += batch.numel()
    assert frames == 100
    ignored = [r for r in caplog.records if "not an admitted worker" in r.getMessage()]
    assert 1 <= len(ignored) <= 2, [r.getMessage() for r in ignored]  # rate-limited


# -- 2. remote_workers is a limit ---------------------------------------------------------
async def test_remote_workers_is_a_limit_and_a_lost_worker_frees_its_place() -> None:
    with anyio.fail_after(LIMIT):
        async with Hub(inproc(), heartbeat_interval=0.2, peer_timeout=1.0) as hub:
            sched = scheduler(hub, max_remote_workers=1, on_worker_loss="continue")
            async with anyio.create_task_group() as tg:
                tg.start_soon(sched.run)
                async with Link(hub.endpoint, identity=b"first") as first:
                    await join(first)
                    async with Link(hub.endpoint, identity=b"second") as second:
                        await second.send(hello("second"), kind=Hello.KIND)
                        refused = await recv_kind(second, Welcome.KIND, Refuse.KIND)
                        assert refused.kind == Refuse.KIND
                        assert "at most 1 remote worker" in refused.body["reason"]
                # "first" said goodbye: its place is free.
                while sched.roster.live_workers:
                    await anyio.sleep(0.05)
                async with Link(hub.endpoint, identity=b"third") as third:
                    await join(third)
                tg.cancel_scope.cancel()


# -- 3. a batch is checked before it is counted ------------------------------------------
def huge_empty_batch(index: int) -> TensorDict:
    return TensorDict({}, batch_size=[1, 10**12])


def wrong_obs_batch(index: int) -> TensorDict:
    share = make_share(FRAMES, 4, worker_id=index)
    share["observation"] = torch.zeros(1, FRAMES, 7)
    return share


def wrong_worker_id_batch(index: int) -> TensorDict:
    return make_share(FRAMES, 4, worker_id=index + 1)


def short_batch(index: int) -> TensorDict:
    return make_share(FRAMES // 2, 4, worker_id=index)


@pytest.mark.parametrize("bad", [huge_empty_batch, wrong_obs_batch, wrong_worker_id_batch,
                                 short_batch])
async def test_a_bad_batch_is_never_counted(bad: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with Hub(inproc()) as hub, Link(hub.endpoint, identity=b"rogue") as rogue:
            sched = scheduler(hub)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sched.run)
                index = await join(rogue)
                collect = Collect.from_body((await recv_kind(rogue, Collect.KIND)).body)
                await rogue.send(Batch(collect.request, bad(index)).to_body(), kind=Batch.KIND)
                with pytest.raises(BadBatchError, match="not what was asked") as caught:
                    await sched.next_batch()
                refused = await recv_kind(rogue, Refuse.KIND)
                assert "rejected" in refused.body["reason"]
                assert not sched.roster.live_workers
                assert len(sched.state.rounds.ready) == 0
                tg.cancel_scope.cancel()
    print(caught.value)


@dataclass
class RogueAndGood:
    """A coordinator under ``on_worker_loss="continue"`` with two admitted remote workers,
    the rogue holding its first credit (``collect``)."""

    sched: Coordinator
    tg: TaskGroup
    rogue: Link
    good: Link
    rogue_index: int
    good_index: int
    collect: Collect

    def serve_good(self) -> None:
        """The honest worker answers every request with an exact share, from now on."""
        async def serve() -> None:
            while True:
                request = Collect.from_body((await recv_kind(self.good, Collect.KIND)).body)
                share = make_share(FRAMES, 4, worker_id=self.good_index)
                await self.good.send(Batch(request.request, share).to_body(), kind=Batch.KIND)

        self.tg.start_soon(serve)


@asynccontextmanager
async def rogue_and_good() -> AsyncIterator[RogueAndGood]:
    async with Hub(inproc()) as hub, Link(hub.endpoint, identity=b"rogue") as rogue, \
            Link(hub.endpoint, identity=b"good") as good:
        sched = Coordinator(hub, *rules(sync=False, share_frames=[FRAMES, FRAMES],
                                        check_specs=check_specs, accept_remote=True,
                                        on_worker_loss="continue", batch_budget=3))
        async with anyio.create_task_group() as tg:
            tg.start_soon(sched.run)
            rogue_index = await join(rogue)
            good_index = await join(good)
            collect = Collect.from_body((await recv_kind(rogue, Collect.KIND)).body)
            yield RogueAndGood(sched, tg, rogue, good, rogue_index, good_index, collect)
            tg.cancel_scope.cancel()


async def test_under_continue_a_rogue_is_dropped_and_the_others_go_on() -> None:
    with anyio.fail_after(LIMIT):
        async with rogue_and_good() as run:
            await run.rogue.send(Batch(run.collect.request, huge_empty_batch(0)).to_body(),
                                 kind=Batch.KIND)
            await recv_kind(run.rogue, Refuse.KIND)
            run.serve_good()
            frames = 0
            for _ in range(3):  # the budget: the rogue's credit went back to it
                worker, batch = await run.sched.next_batch()
                assert worker.index == run.good_index != run.rogue_index
                frames += batch.numel()
            assert frames == 3 * FRAMES


def nested_patch_batch(index: int) -> tuple[TensorDict, dict[str, Any]]:
    """A compact batch whose patch nests a key under the observation tensor."""
    share = make_share(FRAMES, 4, worker_id=index)
    wire = share.exclude(("next", "observation"))
    rows = TensorDict({("observation", "x"): torch.zeros(1, 4)}, batch_size=[1])
    return wire, {"at": torch.tensor([FRAMES - 1]), "rows": rows}


def claimed_huge_batch(index: int) -> tuple[TensorDict, dict[str, Any]]:
    """A batch of a few bytes claiming 50 million frames (zero-size leaves), with a patch."""
    claim = [50_000_000, 1]
    frames = TensorDict({"observation": torch.zeros(*claim, 0)}, batch_size=claim)
    rows = TensorDict({"observation": torch.zeros(0, 0)}, batch_size=[0])
    return frames, {"at": torch.zeros(0, dtype=torch.int64), "rows": rows}


def float_positions_batch(index: int) -> tuple[TensorDict, dict[str, Any]]:
    """A compact batch whose patch header breaks its declaration: positions as floats."""
    wire, _ = nested_patch_batch(index)
    rows = TensorDict({"observation": torch.zeros(1, 4)}, batch_size=[1])
    return wire, {"at": torch.tensor([FRAMES - 1.0]), "rows": rows}


def _current_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("bad", [nested_patch_batch, claimed_huge_batch, float_positions_batch])
async def test_a_malformed_compact_batch_drops_its_worker_and_the_run_goes_on(bad: Any) -> None:
    # Before: the nested key raised ValueError out of the hub loop (the run ended), and
    # the huge claim made the trainer allocate gigabytes before refusing the patch.
    with anyio.fail_after(LIMIT):
        async with rogue_and_good() as run:
            frames, patch = bad(run.rogue_index)
            peak_rss_reset()
            before, peak_before = _current_rss(), peak_rss()
            await run.rogue.send(Batch(run.collect.request, frames, patch).to_body(),
                                 kind=Batch.KIND)
            refused = await recv_kind(run.rogue, Refuse.KIND)
            grew = max(_current_rss() - before, peak_rss() - peak_before)
            assert grew < 64 << 20, f"the trainer grew by {grew >> 20} MiB"
            assert "rejected" in refused.body["reason"]
            if bad is claimed_huge_batch:
                assert "batch size [50000000, 1] (50000000 frames)" in refused.body["reason"]
                assert f"at most {FRAMES} frames" in refused.body["reason"]
            elif bad is float_positions_batch:  # the header, declared (CompactPatch)
                assert "batch field 'next' 'at' must be a 1-d int64 tensor, got torch.float32" \
                    in refused.body["reason"]
            else:
                assert "('observation',) is a tensor, not a map" in refused.body["reason"]
            run.serve_good()
            for _ in range(3):
                worker, batch = await run.sched.next_batch()
                assert worker.index == run.good_index
                assert bool((batch == make_share(FRAMES, 4, worker_id=run.good_index)).all())
            assert [w.index for w in run.sched.roster.live_workers] == [run.good_index]


async def test_a_malformed_error_report_is_dropped_naming_the_field_and_the_run_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    # The payload is transports' ErrorPayload, declared like every kind: a bad field is a
    # ProtocolError at decode (logged, rate-limited), never the end of the run.
    with anyio.fail_after(LIMIT), caplog.at_level(logging.WARNING, "asyncrl.coordinator"):
        async with rogue_and_good() as run:
            body = {**forged_error("builtins.ValueError"), "type": 3}
            await run.rogue.send(body, kind=ErrorReport.KIND)
            share = make_share(FRAMES, 4, worker_id=run.rogue_index)
            await run.rogue.send(Batch(run.collect.request, share).to_body(), kind=Batch.KIND)
            worker, batch = await run.sched.next_batch()  # the sender's next message: read
            assert worker.index == run.rogue_index
            assert bool((batch == share).all())
            assert {w.index for w in run.sched.roster.live_workers} == {run.rogue_index,
                                                                  run.good_index}
    assert "error message field 'type' must be str, got int" in caplog.text


def test_a_batch_size_over_the_share_is_refused_before_anything_is_built() -> None:
    frames, patch = claimed_huge_batch(0)
    body = Batch(1, frames, patch).to_body()
    with pytest.raises(ProtocolError, match=r"batch size \[50000000, 1\] \(50000000 frames\); "
                       r"this worker's share is at most 10 frames"):
        decode(Batch, body, max_frames=FRAMES)
    # Each dimension is bounded too: [0, 10**12] claims no frame but a huge row.
    with pytest.raises(ProtocolError, match="no dimension may exceed it"):
        decode(Batch, {"request": 1, "frames": TensorDict({}, [0, 10**12])}, max_frames=FRAMES)


def test_any_exception_while_decoding_is_a_protocol_error() -> None:
    frames, patch = nested_patch_batch(0)
    with pytest.raises(ProtocolError, match="is a tensor, not a map"):
        decode(Batch, Batch(1, frames, patch).to_body(), max_frames=FRAMES)

    class Fragile:
        KIND = "fragile"

        @classmethod
        def from_body(cls, body: Any) -> Fragile:
            raise ValueError("tripped")

    with pytest.raises(ProtocolError, match="fragile message could not be decoded: "
                       "ValueError: tripped"):
        decode(Fragile, {})


@pytest.mark.parametrize("bad", [huge_empty_batch, wrong_obs_batch])
@pytest.mark.parametrize("on_worker_loss", ["raise", "continue"])
async def test_a_rogue_remote_worker_does_not_complete_the_run_with_bogus_frames(
        bad: Any, on_worker_loss: str) -> None:
    frames = 0
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector("CartPole-v1", num_workers=1, remote_workers=1,
                                       listen="tcp://127.0.0.1:0", frames_per_batch=FRAMES,
                                       total_frames=100, on_worker_loss=on_worker_loss) as c, \
                Link(c.endpoint, identity=random_identity("rogue")) as rogue:
            assert c._run.coordinator is not None
            specs = c._run.coordinator.state.admission.specs
            await rogue.send(Hello(protocol=PROTOCOL, name="rogue", host="test", pid=1,
                                   specs=specs).to_body(), kind=Hello.KIND)
            welcome = await recv_kind(rogue, Welcome.KIND, Refuse.KIND)
            index = Welcome.from_body(welcome.body).index
            collect = Collect.from_body((await recv_kind(rogue, Collect.KIND)).body)
            batches = c.__aiter__()
            frames += (await batches.__anext__()).numel()  # both joined: the run is on
            await rogue.send(Batch(collect.request, bad(index)).to_body(), kind=Batch.KIND)
            if on_worker_loss == "raise":
                with pytest.raises(BadBatchError, match=f"worker {index}"):
                    async for batch in batches:
                        frames += batch.numel()
                        assert batch.numel() == FRAMES
            else:
                async for batch in batches:
                    frames += batch.numel()
                    assert not bool((batch["collector", "worker_id"] == index).any())
                assert frames == 100
            assert (await recv_kind(rogue, Refuse.KIND)).body["reason"]
    assert frames <= 100


# -- 4. identities cannot be guessed -------------------------------------------------------
async def test_a_guessed_identity_does_not_take_over_a_local_worker() -> None:
    with anyio.fail_after(LIMIT):
        async with cartpole(total_frames=200) as collector:
            batches = collector.__aiter__()
            await batches.__anext__()  # the worker is in: its identity is in use
            pid = collector.worker_pids[0]
            guessed = f"local-0-{pid}".encode()  # what identities looked like
            received: list[str] = []
            async with Link(collector.endpoint, identity=guessed) as thief:

                async def listen() -> None:
                    async for message in thief:
                        received.append(message.kind)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(listen)
                    frames = 20
                    async for batch in batches:
                        frames += batch.numel()
                    tg.cancel_scope.cancel()
    assert frames == 200
    assert not {"collect", "weights", "welcome", "control"} & set(received), received


def test_identities_carry_128_random_bits() -> None:
    identity = random_identity("local-0-123")
    assert identity.startswith(b"local-0-123-")
    assert len(identity.rsplit(b"-", 1)[1]) == 32  # hex digits
    assert random_identity("x") != random_identity("x")


# -- 5. memory before authentication is bounded ---------------------------------------------
def peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_strangers_streaming_large_messages_hold_little_memory() -> None:
    size = 300 << 20
    blob = bytearray(size)  # allocated (and touched) before the measurement
    blob[::4096] = b"x" * len(blob[::4096])
    small = bytes(8 << 20)  # under the message cap, above what a stranger may send
    header = encode_message(None, kind="error")[0]
    context = zmq.Context()
    sockets = [context.socket(zmq.DEALER) for _ in range(3)]
    try:
        with anyio.fail_after(LIMIT):
            async with cartpole(total_frames=100) as collector:
                hub = collector._run.hub
                assert hub is not None
                bad_before = hub.statistics().bad_messages
                peak_rss_reset()
                before = peak_rss()
                for sock in sockets:
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.connect(collector.endpoint)
                    for _ in range(3):
                        sock.send_multipart([header, memoryview(blob)], copy=False)
                    for _ in range(4):
                        sock.send_multipart([header, small])
                while hub.statistics().bad_messages < bad_before + 12:
                    await anyio.sleep(0.05)  # the small ones, dropped unread
                frames = 0
                async for batch in collector:
                    frames += batch.numel()
                growth = peak_rss() - before
    finally:
        for sock in sockets:
            sock.close(0)
        context.term()
    assert frames == 100
    assert growth < 200 << 20, f"trainer peak memory grew by {growth >> 20} MiB"


# -- 6. warnings from hostile input are rate-limited, counters stay exact --------------------
async def test_a_fuzz_makes_few_log_lines_and_exact_counters(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="transports")
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0") as hub:
            context = zmq.Context()
            sock = context.socket(zmq.DEALER)
            try:
                sock.connect(hub.endpoint)
                for i in range(2000):
                    sock.send_multipart([b"\xc1garbage" + str(i).encode()])
                while hub.statistics().bad_messages < 2000:
                    await anyio.sleep(0.05)
            finally:
                sock.close(0)
                context.term()
            assert hub.statistics().bad_messages == 2000
    lines = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert 1 <= len(lines) <= 5, len(lines)


def test_rate_limited_log_counts_what_it_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    from transports import RateLimitedLog

    caplog.set_level(logging.WARNING)
    limited = RateLimitedLog(logging.getLogger("t"), interval=3600)
    assert limited.warning("r", "one")
    assert not any(limited.warning("r", "two") for _ in range(10))
    limited._next["r"] = 0.0  # as if the interval passed
    assert limited.warning("r", "three")
    assert "10 more like this" in caplog.records[-1].getMessage()

