"""A host's relay refused because the run is full asks again; any other refusal is final.

As ``asyncrl worker --join-timeout``: a relay hello refused *only* for lack of a
place (``Refuse.full``: as many relays as ``remote_workers`` registered) is said
again, backing off from 0.5 s, for ``join_timeout`` seconds; a refusal for any
other reason (protocol, a collector that takes no remote worker) is not.
"""

from __future__ import annotations

import anyio
import pytest

from asyncrl import MultiAsyncCollector
from asyncrl._protocol import Refuse, RelayWelcome
from asyncrl._worker.relay import HostRelay
from asyncrl.testing import ParamPolicy
from transports import Hub, Message

pytestmark = pytest.mark.anyio
LIMIT = 60
CHANNEL = {"heartbeat_interval": 0.2, "peer_timeout": 2.0}


async def registered(relay: HostRelay) -> None:
    while not relay.statistics().registered:
        await anyio.sleep(0.02)  # bounded by the test's fail_after


async def test_a_relay_refused_because_the_run_is_full_registers_once_a_place_frees() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector("CartPole-v1", ParamPolicy(), num_workers=0,
                                       remote_workers=1, listen="tcp://127.0.0.1:0",
                                       frames_per_batch=20, total_frames=-1, **CHANNEL) as c:
            scheduler = c._run.coordinator
            assert scheduler is not None
            first = HostRelay(c.endpoint, [b"a0"], **CHANNEL)
            async with first, HostRelay(c.endpoint, [b"b0"], join_timeout=LIMIT,
                                        **CHANNEL) as second:
                await registered(first)
                while second.refused is None:
                    await anyio.sleep(0.02)
                assert "takes at most 1 remote worker(s), and as many relays" in second.refused
                assert not second.statistics().registered
                await first.aclose()  # says goodbye: its place is free at once
                await registered(second)
                assert second.refused is None
                assert set(scheduler.roster.relays) == {second.name}


async def fake_coordinator(answers: list[Refuse | None], join_timeout: float | None,
                           quiet: float) -> tuple[list[Message], HostRelay]:
    """A hub that answers each relay hello with the next of ``answers`` (None: a
    welcome) and then listens ``quiet`` more seconds; the hellos it got."""
    hellos: list[Message] = []
    async with Hub("tcp://127.0.0.1:0", **CHANNEL) as hub, \
            HostRelay(hub.endpoint, [b"w0"], join_timeout=join_timeout, **CHANNEL) as relay:
        for answer in answers:
            message = await hub.recv()
            while not isinstance(message, Message):  # the relay's "joined" event
                message = await hub.recv()
            assert message.kind == "relay_hello", message
            hellos.append(message)
            if answer is None:
                await hub.send(message.peer, RelayWelcome(1, instance="i").to_body(),
                               kind=RelayWelcome.KIND)
            else:
                await hub.send(message.peer, answer.to_body(), kind=Refuse.KIND)
        with anyio.move_on_after(quiet):  # nothing more comes (heartbeats are not messages)
            while True:
                item = await hub.recv()
                if isinstance(item, Message):
                    hellos.append(item)
        return hellos, relay


async def test_a_full_refusal_is_asked_again_until_welcomed() -> None:
    with anyio.fail_after(LIMIT):
        hellos, relay = await fake_coordinator(
            [Refuse("full", full=True), Refuse("full", full=True), None], join_timeout=30,
            quiet=0.5)
    assert len(hellos) == 3 and relay.statistics().registered and relay.refused is None


async def test_any_other_refusal_is_final() -> None:
    with anyio.fail_after(LIMIT):
        hellos, relay = await fake_coordinator(
            [Refuse("protocol: coordinator speaks 9, relay 1")], join_timeout=30, quiet=2.0)
    assert len(hellos) == 1  # a "full" refusal would have been asked again within 0.625 s
    assert relay.refused == "protocol: coordinator speaks 9, relay 1"
    assert not relay.statistics().registered


async def test_without_join_timeout_a_full_refusal_is_not_asked_again() -> None:
    with anyio.fail_after(LIMIT):
        hellos, relay = await fake_coordinator([Refuse("full", full=True)], join_timeout=None,
                                               quiet=2.0)
    assert len(hellos) == 1 and relay.refused == "full"


async def test_a_relay_still_refused_at_its_join_timeout_stops_asking() -> None:
    # pauses of 0.5-0.625 s then 1-1.25 s: within 1 s only the second hello fits
    with anyio.fail_after(LIMIT):
        hellos, relay = await fake_coordinator(
            [Refuse("full", full=True), Refuse("full", full=True)], join_timeout=1.0, quiet=2.0)
    assert len(hellos) == 2 and relay.refused == "full"
    assert not relay.statistics().registered
