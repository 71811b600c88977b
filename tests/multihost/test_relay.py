"""Per-host relay: one copy of each weight version per host, fanned out to its workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import pytest
import torch

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl._protocol import RELAY_TO
from asyncrl._worker.relay import HostRelay
from asyncrl._worker.spec import WorkerSpec
from asyncrl._worker.worker import run_worker
from asyncrl.testing import ParamPolicy
from asyncrl.weights import WEIGHTS_KIND, WeightSender, ZmqWeightSyncScheme
from tests.multihost.processes import alive, free_port, kill_group, wait_exit
from transports import Hub, Link, Message, PeerLostError, RemoteError, generate_keys

pytestmark = pytest.mark.anyio
LIMIT = 90


def cli_host(endpoint: str, *args: str, tmpdir: str | None = None) -> subprocess.Popen:
    env = None if tmpdir is None else {**os.environ, "TMPDIR": tmpdir}
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint,
         "--env", "CartPole-v1", "--policy", "asyncrl.testing:ParamPolicy", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=env)


async def wait_for_routes(collector: MultiSyncCollector | MultiAsyncCollector,
                          count: int) -> dict[int, bytes]:
    scheduler = collector._run.coordinator
    assert scheduler is not None
    while len(scheduler.roster.relay_routes()) < count:
        await anyio.sleep(0.02)
    return scheduler.roster.relay_routes()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend per test
async def test_one_weight_copy_per_host_reaches_every_worker_of_it(tmp_path) -> None:
    """A 3-worker host behind its relay, over CURVE (the relay authenticates like a worker)."""
    keys = generate_keys(tmp_path / "keys")
    policy = ParamPolicy()
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", policy, num_workers=0, remote_workers=3,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=60,
                                      total_frames=-1, curve_keys=str(keys)) as collector:
            host = cli_host(collector.endpoint, "--workers", "3", "--keys", str(keys))
            try:
                batches = collector.__aiter__()
                first = await batches.__anext__()
                routes = await wait_for_routes(collector, 3)
                sender = collector.weight_sender()
                copies_before = sender.copies_sent
                for step in range(1, 6):
                    with torch.no_grad():
                        policy.value.fill_(1.0 if step % 2 else -1.0)  # actions 1, 0, 1...
                    await collector.update_policy_weights()
                    batch = await batches.__anext__()
                    # On-policy through the relay: the whole batch used the new weights.
                    assert batch["collector", "policy_version"].unique().tolist() == [step]
                    assert batch["action"].unique().tolist() == [step % 2]
                copies = sender.copies_sent - copies_before
                relays = set(routes.values())
            finally:
                await collector.aclose()
                code = await wait_exit(host) if host.poll() is None else host.returncode
                if code is None:
                    kill_group(host)
    output = host.stdout.read()
    assert code == 0, output
    assert first.shape[0] == 3
    assert len(relays) == 1
    assert sorted(routes) == [0, 1, 2]
    assert copies == 5, f"one message per version for the whole host, got {copies} for 5"
    assert sender.acked_versions == {0: 5, 1: 5, 2: 5}
    assert collector.refused_peers == 0


# -- in-process: a collector, a relay and workers as tasks of the test ------------------------
SPEC = WorkerSpec(create_env_fn="CartPole-v1", policy_factory="asyncrl.testing:ParamPolicy")


@asynccontextmanager
async def in_process_host(endpoint: str, names: list[bytes]) -> AsyncIterator[HostRelay]:
    """A relay and its workers as tasks of this process (what `asyncrl worker` runs)."""
    async with anyio.create_task_group() as tg:
        async with HostRelay(endpoint, names, heartbeat_interval=0.2, peer_timeout=2.0) as relay:
            for name in names:
                tg.start_soon(partial(run_worker, endpoint, SPEC, identity=name,
                                      relay=relay.endpoint, relay_name=relay.name,
                                      heartbeat_interval=0.2, peer_timeout=2.0))
            try:
                yield relay
            finally:
                tg.cancel_scope.cancel()  # the workers, as a killed host would lose them


def collector(**options: object) -> MultiAsyncCollector:
    return MultiAsyncCollector("CartPole-v1", ParamPolicy(), num_workers=0, remote_workers=2,
                               listen="tcp://127.0.0.1:0", frames_per_batch=20,
                               total_frames=-1, heartbeat_interval=0.2, peer_timeout=2.0,
                               **options)


async def test_a_workers_error_comes_back_through_the_relay_with_its_type() -> None:
    with anyio.fail_after(LIMIT):
        async with collector() as c, in_process_host(c.endpoint, [b"w0", b"w1"]):
            await c.__aiter__().__anext__()
            await wait_for_routes(c, 2)
            with pytest.raises(RemoteError) as caught:
                await c.weight_sender().send({"value": torch.ones(3)}, timeout=30)
    error = caught.value
    assert "shape" in str(error) and "value" in str(error), str(error)
    assert error.peer in ("w0", "w1")
    assert any("reported by relay" in note for note in error.__notes__)


async def test_a_lost_relay_sends_its_workers_back_to_direct_weights() -> None:
    with anyio.fail_after(LIMIT):
        async with collector(on_worker_loss="continue") as c, \
                in_process_host(c.endpoint, [b"w0", b"w1"]) as relay:
            batches = c.__aiter__()
            await batches.__anext__()
            await wait_for_routes(c, 2)
            sender = c.weight_sender()
            await sender.send(timeout=30)
            assert sender.copies_sent == 1
            await relay.aclose()  # says goodbye: the coordinator forgets it at once
            scheduler = c._run.coordinator
            assert scheduler is not None
            while scheduler.roster.relays:
                await anyio.sleep(0.02)
            assert scheduler.roster.relay_routes() == {}
            applied = await sender.send(timeout=30)
            assert sender.acked_versions == {0: applied, 1: applied} == {0: 2, 1: 2}
            assert sender.copies_sent == 3  # one via the relay, then one per worker
            batch = await batches.__anext__()
            while int(batch["collector", "policy_version"].min()) < 2:
                batch = await batches.__anext__()  # credits granted before the update


async def test_pipelined_versions_through_the_relay_end_at_the_newest() -> None:
    with anyio.fail_after(LIMIT):
        async with collector() as c, in_process_host(c.endpoint, [b"w0", b"w1"]):
            await c.__aiter__().__anext__()
            await wait_for_routes(c, 2)
            sender = c.weight_sender()
            for _ in range(3):  # newest wins: a worker may ack version 1 with 2 or 3
                await sender.send_async()
            applied = await sender.wait_ack(timeout=30)
    assert applied == {0: 3, 1: 3}
    # One message per version through the relay, except a version replaced before it
    # was sent (2, queued while 1 was in transit, unless 1 was acked that soon).
    assert 2 <= sender.copies_sent <= 3


# -- hostile or faulty peers ---------------------------------------------------------------------
@asynccontextmanager
async def sender_behind_fake_relay() -> AsyncIterator[tuple[WeightSender, Link]]:
    """A trainer's sender whose one worker (w0) is routed through ``relay-x``, played here."""
    async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.2, peer_timeout=2.0) as hub:
        async with Link(hub.endpoint, identity=b"relay-x", heartbeat_interval=0.2,
                        peer_timeout=2.0) as relay:
            assert (await hub.recv()).event == "joined"
            sender = ZmqWeightSyncScheme().init_on_sender(
                "policy", hub=hub, model=ParamPolicy(), workers={0: b"w0"})
            sender.set_relay_routes(lambda: {0: b"relay-x"})
            yield sender, relay


@pytest.mark.parametrize("answer", [
    {"versions": {b"w0": "seven"}},
    {"versions": {b"w0": 99}},
    {"versions": {}},
    ["not", "a", "map"],
])
async def test_a_relay_cannot_claim_an_update_it_did_not_deliver(answer: object) -> None:
    with anyio.fail_after(LIMIT):
        async with sender_behind_fake_relay() as (sender, relay):
            await sender.send_async()
            message = await relay.recv()
            assert message.kind == WEIGHTS_KIND and message.meta[RELAY_TO] == [b"w0"]
            await relay.ack(message, answer)
            with pytest.raises(RemoteError, match="without a valid version"):
                await sender.wait_ack(timeout=30)


async def test_a_relay_lost_before_acking_fails_its_workers() -> None:
    with anyio.fail_after(LIMIT):
        async with sender_behind_fake_relay() as (sender, relay):
            await sender.send_async()
            await relay.recv()
            await relay.aclose()  # goodbye before the ack
            with pytest.raises(PeerLostError, match="relay relay-x went silent") as caught:
                await sender.wait_ack(timeout=30)
    assert caught.value.peers == [b"w0"]


async def test_the_relay_refuses_weights_for_workers_it_does_not_serve() -> None:
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.2, peer_timeout=2.0) as hub, \
                HostRelay(hub.endpoint, [b"mine"], heartbeat_interval=0.2,
                          peer_timeout=2.0) as relay:
            joined = await hub.recv()
            hello = await hub.recv()
            assert joined.event == "joined" and hello.kind == "relay_hello"
            assert hello.body["members"] == [b"mine"]
            ticket = await hub.send_async([joined.peer], {"w": torch.ones(2)}, kind=WEIGHTS_KIND,
                                          meta={"model_id": "policy", "version": 1,
                                                RELAY_TO: [b"someone-else"]})
            with pytest.raises(RemoteError, match="does not serve") as caught:
                await hub.wait_ack(ticket, timeout=30)
            assert caught.value.remote_type.endswith("ProtocolError")
            for bad in ([[1, 2]], "mine", [b"mine"] * 2000):  # unhashable, not a list, too long
                ticket = await hub.send_async([joined.peer], {"w": torch.ones(2)},
                                              kind=WEIGHTS_KIND,
                                              meta={"model_id": "policy", "version": 1,
                                                    RELAY_TO: bad})
                with pytest.raises(RemoteError, match="relay_to"):
                    await hub.wait_ack(ticket, timeout=30)
            # A member that never attached is reported lost, not waited for.
            ticket = await hub.send_async([joined.peer], {"w": torch.ones(2)}, kind=WEIGHTS_KIND,
                                          meta={"model_id": "policy", "version": 1,
                                                RELAY_TO: [b"mine"]})
            answer = await hub.wait_ack(ticket, timeout=30)
            assert answer[joined.peer]["versions"] == {}
            assert answer[joined.peer]["failed"][b"mine"]["type"] == "transports.PeerLostError"
            assert relay.statistics().failed == 1


def test_an_unreachable_coordinator_is_one_clear_line_per_worker() -> None:
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", f"tcp://127.0.0.1:{port}",
         "--env", "CartPole-v1", "--workers", "2", "--peer-timeout", "1"],
        capture_output=True, text=True, timeout=LIMIT)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    assert output.count(f"no coordinator answered at tcp://127.0.0.1:{port} within 1.0 s") == 2
    assert "Traceback" not in output


def test_cli_help_names_the_relay_switch() -> None:
    result = subprocess.run([sys.executable, "-m", "asyncrl.cli", "worker", "--help"],
                            capture_output=True, text=True, timeout=LIMIT)
    text = " ".join(result.stdout.split())  # argparse wraps lines
    assert "--no-relay" in text and "one copy per host" in text


def relay_dirs(tmpdir: Path) -> set[str]:
    return {name for name in os.listdir(tmpdir) if name.startswith("asyncrl-relay-")}


# End to end (a host process, its relay and workers): each signal on one backend.
@pytest.mark.parametrize(("anyio_backend", "how"), [("asyncio", signal.SIGKILL),
                                                    ("trio", signal.SIGTERM)],
                         ids=["asyncio-SIGKILL", "trio-SIGTERM"])
async def test_killing_the_host_process_takes_its_workers_and_relay_down(
        how: signal.Signals, tmp_path: Path) -> None:
    # The host's temporary files go to a directory of this test's own (TMPDIR):
    # another run on the machine making relays cannot disturb the count.
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector("CartPole-v1", ParamPolicy(), num_workers=0,
                                       remote_workers=2, listen="tcp://127.0.0.1:0",
                                       frames_per_batch=20, total_frames=-1,
                                       on_worker_loss="continue", heartbeat_interval=0.2,
                                       peer_timeout=2.0) as collector:
            host = cli_host(collector.endpoint, "--workers", "2", "--peer-timeout", "2",
                            tmpdir=str(tmp_path))
            try:
                await collector.__aiter__().__anext__()
                await wait_for_routes(collector, 2)
                assert len(relay_dirs(tmp_path)) == 1  # the relay's, while it runs
                children = [int(pid) for pid in subprocess.run(
                    ["pgrep", "-P", str(host.pid)], capture_output=True, text=True,
                    check=True).stdout.split()]
                assert len(children) >= 2  # the workers (plus multiprocessing's tracker)
                os.kill(host.pid, how)  # the relay's process, not its children
                while any(alive(pid) for pid in children):  # they watch their parent
                    await anyio.sleep(0.05)
                while host.poll() is None:
                    await anyio.sleep(0.05)
                scheduler = collector._run.coordinator
                assert scheduler is not None
                while scheduler.roster.live_workers or scheduler.roster.relays:
                    await anyio.sleep(0.05)
            finally:
                kill_group(host)
    # Its ipc directory goes too: removed by the relay (SIGTERM) or by the orphans (SIGKILL).
    assert relay_dirs(tmp_path) == set()
    if how == signal.SIGTERM:
        assert host.returncode != -signal.SIGTERM  # it handled the signal and cleaned up


@pytest.mark.parametrize("workers", [1, 2])
async def test_workers_still_joining_exit_with_their_host_process(workers: int) -> None:
    with anyio.fail_after(LIMIT):
        # A coordinator that hears the hellos and never answers: the workers wait in
        # their join (its heartbeats keep them from giving up for 2 x 600 s).
        async with Hub("tcp://127.0.0.1:0") as silent:
            host = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", silent.endpoint,
                 "--env", "CartPole-v1", "--workers", str(workers), "--peer-timeout", "600"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                joining: set[bytes] = set()
                while len(joining) < workers:
                    item = await silent.recv()
                    if isinstance(item, Message) and item.kind == "hello":
                        joining.add(item.peer)
                children = [int(pid) for pid in subprocess.run(
                    ["pgrep", "-P", str(host.pid), "-f", "spawn_main"], capture_output=True,
                    text=True, check=True).stdout.split()]
                assert len(children) == workers
                os.kill(host.pid, signal.SIGKILL)
                while any(alive(pid) for pid in children):  # orphans must not linger
                    await anyio.sleep(0.05)
            finally:
                kill_group(host)


async def test_a_worker_without_the_synced_policy_stops_the_run_with_a_clear_error() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", ParamPolicy(), num_workers=0,
                                      remote_workers=1, listen="tcp://127.0.0.1:0",
                                      frames_per_batch=20, total_frames=40) as collector:
            host = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", collector.endpoint,
                 "--env", "CartPole-v1"],  # no --policy
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
            try:
                with pytest.raises(ValueError, match="start it with --policy"):
                    [b async for b in collector]
            finally:
                code = await wait_exit(host)
                kill_group(host)
    assert code == 1, host.stdout.read() if host.stdout else ""


@pytest.mark.parametrize("in_place", [False, True], ids=["receive-buffer", "in-place"])
async def test_chunks_of_a_streamed_version_go_through_the_relay_in_order(
        in_place: bool) -> None:
    """The relay forwards each chunk as it comes; the member assembles and acks the last one
    (into a receive buffer, or into its model, held, with ``in_place=True``)."""
    from asyncrl._protocol import RelayWelcome
    from asyncrl.weights import WeightReceiverGroup

    trainer = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    worker = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    scheme = ZmqWeightSyncScheme(chunk_bytes=40, in_place=in_place)  # 232 bytes: 6 chunks
    group = WeightReceiverGroup([scheme.init_on_worker("policy", model=worker)])
    order: list[tuple[int, int, bool]] = []
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.2, peer_timeout=2.0) as hub, \
                HostRelay(hub.endpoint, [b"m0"], heartbeat_interval=0.2,
                          peer_timeout=2.0) as relay, \
                Link(relay.endpoint, identity=b"m0", heartbeat_interval=0.2,
                     peer_timeout=2.0) as member, anyio.create_task_group() as tg:
            joined = await hub.recv()
            assert (await hub.recv()).kind == "relay_hello"
            await hub.send(joined.peer, RelayWelcome(1, hub.instance).to_body(),
                           kind=RelayWelcome.KIND)
            assert (await member.recv()).kind == "relay_attached"
            while not relay.statistics().registered:
                await anyio.sleep(0.01)

            async def serve() -> None:
                while True:
                    message = await member.recv()
                    chunk = message.meta["chunk"]
                    order.append((message.meta["version"], chunk["index"], message.needs_ack))
                    group.on_message(message)
                    group.park()  # an idle worker: written as the chunks come (in_place)
                    group.apply_pending()
                    await group.flush_acks(member)

            tg.start_soon(serve)
            sender = scheme.init_on_sender("policy", hub=hub, model=trainer, workers={0: b"m0"})
            sender.set_relay_routes(lambda: {0: joined.peer})
            for version in (1, 2):
                with torch.no_grad():
                    for p in trainer.parameters():
                        p.fill_(float(version))
                assert await sender.send(timeout=30) == version
                assert all(torch.equal(a, b)
                           for a, b in zip(trainer.parameters(), worker.parameters(), strict=True))
            tg.cancel_scope.cancel()
    assert order == [(v, i, i == 5) for v in (1, 2) for i in range(6)]
    assert sender.copies_sent == 2  # one message stream per version to the host
    assert relay.statistics().received == 2 and relay.statistics().delivered == 2


async def test_the_relay_forwards_the_weights_meta_whole() -> None:
    """A field the relay does not know (a newer trainer's ``delta``) and every field it
    does (the codec, the chunk) reach the member as the trainer wrote them: only
    ``relay_to`` is taken off, and the instance stamped (#44.6: before, the relay
    rebuilt the meta field by field)."""
    from asyncrl._protocol import RelayWelcome

    meta = {"model_id": "policy", "version": 4, "codec": "delta", "delta": {"base": 3},
            "chunk": {"index": 0, "count": 1, "parts": [["w", 0, 8]],
                      "layout": [["w", "float32", [2]]]}}
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.2, peer_timeout=2.0) as hub, \
                HostRelay(hub.endpoint, [b"m0"], heartbeat_interval=0.2,
                          peer_timeout=2.0) as relay, \
                Link(relay.endpoint, identity=b"m0", heartbeat_interval=0.2,
                     peer_timeout=2.0) as member:
            joined = await hub.recv()
            assert (await hub.recv()).kind == "relay_hello"
            await hub.send(joined.peer, RelayWelcome(1, hub.instance).to_body(),
                           kind=RelayWelcome.KIND)
            assert (await member.recv()).kind == "relay_attached"
            while not relay.statistics().registered:
                await anyio.sleep(0.01)
            ticket = await hub.send_async([joined.peer], [torch.arange(8, dtype=torch.uint8)],
                                          kind=WEIGHTS_KIND, meta={**meta, RELAY_TO: [b"m0"]})
            got = await member.recv()
            while got.kind != WEIGHTS_KIND:  # (attached again after a slow heartbeat)
                got = await member.recv()
            await member.ack(got, {"model_id": "policy", "version": 4})
            answer = await hub.wait_ack(ticket, timeout=30)
    assert got.kind == WEIGHTS_KIND and got.meta == {**meta, "instance": hub.instance}
    assert torch.equal(got.body[0], torch.arange(8, dtype=torch.uint8))
    assert answer[joined.peer]["versions"] == {b"m0": 4}
