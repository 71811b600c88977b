"""A trainer restarted on the same port: its workers count weight versions afresh.

Weight versions are numbered per coordinator instance. A ``--reconnect`` worker
that held version 11 of a dead trainer must apply the new trainer's versions
1, 2, 3..., ack them in that numbering and stamp its frames with them.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import torch
import zmq

from asyncrl import MultiSyncCollector
from asyncrl.testing import ParamPolicy
from asyncrl.weights import WeightReceiver, WeightSender
from tests.multihost.processes import free_port, kill_group, wait_exit
from transports import Hub, Link, Message, RemoteError

pytestmark = pytest.mark.anyio
LIMIT = 120
HEARTBEAT = {"heartbeat_interval": 0.25, "peer_timeout": 2.0}

# The first trainer: brings its workers to version 11 of weights value=-7, then
# waits to be killed (no goodbye, as a crashed trainer).
FIRST_TRAINER = """
import sys, anyio
from asyncrl import MultiSyncCollector
from asyncrl.testing import ParamPolicy

async def main(endpoint, workers):
    async with MultiSyncCollector(
            "CartPole-v1", ParamPolicy(-7.0), num_workers=0, remote_workers=workers,
            listen=endpoint, frames_per_batch=10 * workers, total_frames=-1,
            heartbeat_interval=0.25, peer_timeout=2.0) as collector:
        batches = collector.__aiter__()
        await batches.__anext__()
        for _ in range(11):
            await collector.update_policy_weights()
        batch = await batches.__anext__()
        print("ready", batch["collector", "policy_version"].unique().tolist(), flush=True)
        await anyio.sleep_forever()

anyio.run(main, sys.argv[1], int(sys.argv[2]))
"""


def worker_values(state: dict) -> list[float]:
    return [s["policy_state_dict"]["value"].item() for _, s in sorted(state.items())]


async def wait_for_routes(collector: MultiSyncCollector, count: int) -> None:
    scheduler = collector._run.coordinator
    assert scheduler is not None
    while len(scheduler.roster.relay_routes()) < count:
        await anyio.sleep(0.02)


@pytest.mark.parametrize("workers", [1, 2], ids=["direct", "relay"])
async def test_workers_of_a_restarted_trainer_take_its_versions(workers: int,
                                                                 anyio_backend: str) -> None:
    if anyio_backend == "trio":
        pytest.skip("processes and sockets are the same on both backends; once is enough")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = subprocess.Popen([sys.executable, "-c", FIRST_TRAINER, endpoint, str(workers)],
                             stdout=subprocess.PIPE, text=True)
    # --workers 2 puts a HostRelay in front of the workers (the default).
    host = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint, "--env",
         "CartPole-v1", "--policy", "asyncrl.testing:ParamPolicy", "--workers", str(workers),
         "--reconnect", "--peer-timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        with anyio.fail_after(LIMIT):
            line = await anyio.to_thread.run_sync(first.stdout.readline)
            assert line.strip() == "ready [11]", line
            first.kill()  # the trainer dies without a goodbye
            await wait_exit(first)
            policy = ParamPolicy(1.0)
            async with MultiSyncCollector(
                    "CartPole-v1", policy, num_workers=0, remote_workers=workers,
                    listen=endpoint, frames_per_batch=10 * workers,
                    total_frames=30 * workers, **HEARTBEAT) as collector:
                sender = collector.weight_sender()
                assert await sender.send_async() == 1  # nobody yet: the joiners' catch-up
                batches = collector.__aiter__()
                batch = await batches.__anext__()
                # The catch-up was applied before the first frame, in the new numbering.
                assert batch["collector", "policy_version"].unique().tolist() == [1]
                assert batch["action"].unique().tolist() == [1]
                assert worker_values(await collector.state_dict()) == [1.0] * workers
                if workers > 1:
                    await wait_for_routes(collector, workers)  # updates go through the relay
                for version, value in ((2, -2.0), (3, 3.0)):
                    with torch.no_grad():
                        policy.value.fill_(value)
                    await collector.update_policy_weights()
                    assert worker_values(await collector.state_dict()) == [value] * workers
                    batch = await batches.__anext__()
                    assert batch["collector", "policy_version"].unique().tolist() == [version]
                    assert batch["action"].unique().tolist() == [int(value > 0)]
                assert sender.acked_versions == dict.fromkeys(range(workers), 3)
                assert collector.frames_collected == 30 * workers  # the run is over
            code = await wait_exit(host)  # so its close sent the host home
    finally:
        if first.poll() is None:
            first.kill()
        if host.poll() is None:
            kill_group(host)
    output = host.stdout.read()
    assert code == 0, output
    assert "joined a restarted coordinator" in output


# -- the pieces, without processes ------------------------------------------------------------
def weights(seq: int, version: int, instance: str | None, value: float) -> Message:
    meta = {"model_id": "policy", "version": version}
    if instance is not None:
        meta["instance"] = instance
    return Message(b"", "weights", seq, {"value": torch.tensor([value])}, meta, True)


def test_a_receiver_told_a_new_instance_starts_afresh() -> None:
    receiver = WeightReceiver("policy", ParamPolicy(0.0))
    assert receiver.follow("A") is False  # the first coordinator: nothing to forget
    receiver.on_message(weights(1, 11, "A", -7.0))
    receiver.apply_pending()
    receiver.on_message(weights(2, 12, "A", -8.0))  # pending when A dies
    assert [a.version for a in receiver.take_acks()] == [11]
    assert receiver.follow("B") is True
    assert (receiver.version, receiver.pending_version) == (0, None)
    stale = receiver.take_acks()
    assert [a.message.seq for a in stale] == [2] and "restarted" in str(stale[0].error)
    receiver.on_message(weights(1, 1, "B", 5.0))
    receiver.on_message(weights(3, 13, "A", -9.0))  # a late forward of the dead trainer
    assert receiver.apply_pending() and receiver.version == 1
    assert receiver.model.value.item() == 5.0
    acks = {a.message.seq: a for a in receiver.take_acks()}
    assert acks[1].version == 1
    assert "stale" in str(acks[3].error) and "'A'" in str(acks[3].error)
    assert receiver.follow("B") is False and receiver.version == 1


async def test_a_direct_ack_outside_the_sent_versions_fails_the_send() -> None:
    # What a worker still counting in the old trainer's versions answered: a send of
    # version 1 acked with 11 must not count as applied.
    with anyio.fail_after(60):
        async with Hub("tcp://127.0.0.1:0", **HEARTBEAT) as hub, \
                Link(hub.endpoint, identity=b"w0", **HEARTBEAT) as link:
            await link.send("hi")
            await hub.recv()  # joined
            await hub.recv()  # hi
            sender = WeightSender("policy", hub, model=ParamPolicy(1.0), workers={0: b"w0"})
            await sender.send_async()
            message = await link.recv()
            assert message.meta["instance"] == hub.instance  # versions carry their numbering
            await link.ack(message, {"model_id": "policy", "version": 11})
            with pytest.raises(RemoteError, match=r"acknowledged version 11 .* expected 1\.\.1"):
                await sender.wait_ack(timeout=30)
            assert sender.acked_versions == {0: 0}


@asynccontextmanager
async def rebind(endpoint: str) -> AsyncIterator[Hub]:
    """A hub on the endpoint a hub of this process just closed (zmq unbinds in the background)."""
    while True:
        hub = Hub(endpoint, **HEARTBEAT)
        try:
            await hub.__aenter__()
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            await anyio.sleep(0.05)
            continue
        try:
            yield hub
        finally:
            await hub.__aexit__(None, None, None)
        return


async def test_a_relay_never_acks_a_dead_trainers_forward_to_its_successor() -> None:
    """The relay forwarded version 11 of trainer A; A is replaced by B before the member acks.

    The ack of A's message must not reach B: its sequence number would name one of
    B's messages (here B's version 1, sent with the same sequence number).
    """
    from asyncrl._protocol import RELAY_TO, RelayWelcome
    from asyncrl._worker.relay import ATTACHED_KIND, HostRelay
    from asyncrl.weights import WEIGHTS_KIND

    endpoint = f"tcp://127.0.0.1:{free_port()}"

    async def register(hub: Hub, version: int) -> tuple[bytes, int]:
        joined = await hub.recv()
        assert (await hub.recv()).kind == "relay_hello"
        await hub.send(joined.peer, {"members": 1, "instance": hub.instance},
                       kind=RelayWelcome.KIND)
        ticket = await hub.send_async([joined.peer], {"value": torch.tensor([1.0])},
                                      kind=WEIGHTS_KIND,
                                      meta={"model_id": "policy", "version": version,
                                            "instance": hub.instance, RELAY_TO: [b"m"]})
        return joined.peer, ticket

    with anyio.fail_after(60):
        async with HostRelay(endpoint, [b"m"], **HEARTBEAT) as relay, \
                Link(relay.endpoint, identity=b"m", **HEARTBEAT) as member:
            assert (await member.recv()).kind == ATTACHED_KIND
            async with Hub(endpoint, **HEARTBEAT) as first:
                _, old_ticket = await register(first, 11)
                old = await member.recv()  # forwarded, not applied yet when A goes
            async with rebind(endpoint) as second:
                relay_peer, ticket = await register(second, 1)
                assert ticket.seq == old_ticket.seq  # the collision this test is about
                new = await member.recv()
                await member.ack(old, {"model_id": "policy", "version": 11})
                await member.ack(new, {"model_id": "policy", "version": 1})
                answer = await second.wait_ack(ticket, timeout=30)
    assert answer[relay_peer]["versions"] == {b"m": 1}
    # Forwards carry their numbering: a member drops those of another instance.
    assert (old.meta.get("instance"), new.meta.get("instance")) == (first.instance,
                                                                    second.instance)
    assert relay.instance == second.instance
