"""A served module opened after the collector: remote hosts learn routes in their welcome.

A worker learns how to call a served module when it joins (its welcome); a module
opened after the collector is offered to no host. Each place a user can meet that says
so and names the fix, "open the ServedModule before the collector": a MultiCollector
refuses to open with a scheme whose module is not open; a remote env that asks for a
module its welcome did not name is refused naming it; a call to it (a host that sent one
anyway) is refused saying it was opened after the collector.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch

from asyncrl import MultiSyncCollector
from asyncrl._protocol import ServedCall
from asyncrl._worker.served_calls import ServedCalls
from asyncrl.served import ServedModule, ServedModuleError, ServedModuleScheme
from asyncrl.served._remote_calls import RemoteCalls, ServedCallRouter, route_of
from asyncrl.served._remote_client import connect
from asyncrl.testing import identity_env
from transports import Link, Message

from .served_envs import Scale

pytestmark = pytest.mark.anyio
NAME = "env.transform[0]"
LATE = "env.transform[1]"
EXAMPLE = {"next_observation": torch.zeros(3)}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_multicollector_refuses_a_scheme_whose_module_is_not_open_yet() -> None:
    served = ServedModule(Scale(2.0), name=NAME, example=EXAMPLE)  # not opened
    with anyio.fail_after(60), pytest.raises(ServedModuleError) as refused:
        async with MultiSyncCollector(
                identity_env, num_workers=0, remote_workers=1, listen="tcp://127.0.0.1:0",
                frames_per_batch=8, total_frames=8,
                weight_sync_schemes={NAME: ServedModuleScheme(served)}):
            pass
    assert str(refused.value).startswith(
        f"weight_sync_schemes[{NAME!r}]: served module {NAME!r} is not open: open the "
        "ServedModule ('async with ServedModule(...)') before the collector"), refused.value


def test_a_remote_env_asking_for_a_module_its_welcome_did_not_name_is_told_the_order() -> None:
    with pytest.raises(ServedModuleError) as refused:
        connect(LATE)  # this process's welcome (none here) named no route to it
    text = str(refused.value)
    assert f"served module {LATE!r} is not reachable from this process" in text
    assert "open the ServedModule before the collector, a module opened later is offered " \
        "to no host" in text


class _Sent:
    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []

    async def __call__(self, peer: bytes, body: Any, kind: str) -> None:
        self.answers.append(body)


async def test_a_call_to_a_module_opened_after_the_collector_is_refused_saying_so() -> None:
    sent = _Sent()
    with anyio.fail_after(60):
        async with ServedModule(Scale(2.0), name=NAME, example=EXAMPLE) as first:
            router = ServedCallRouter(sent, "the served modules open in the trainer's "
                                      "process as the collector opened")
            router.add(RemoteCalls(first, sent))  # what the collector serves at its open
            async with ServedModule(Scale(3.0), name=LATE, example=EXAMPLE):  # then this
                await router.on_message(object(), Message(
                    b"host", ServedCall.KIND, 0,
                    ServedCall(LATE, 4, {"next_observation": torch.ones(3)}).to_body()))
    assert sent.answers == [{
        "name": LATE, "call": 4, "version": 0, "timeout": False,
        "error": f"refused: served_call names module {LATE!r}; this run serves [{NAME!r}] "
                 "(the served modules open in the trainer's process as the collector "
                 f"opened); {LATE!r} is open in the trainer's process but was opened after "
                 "this collector, whose remote hosts learn the routes in their welcome: open "
                 "the ServedModule before the collector"}]
    assert router.refusals.counts() == {"unknown module": 1}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_worker_of_the_release_before_served_modules_is_welcomed_by_a_trainer_serving_one(
        ) -> None:
    """A worker before served modules knows no "served" weight scheme: the route travels in
    ``Welcome.served`` (a field such a worker ignores), never among the schemes it builds
    receivers from, so it joins; a worker of this release reads its routes there."""
    from asyncrl.weights import WeightSyncScheme
    from tests.chaos.wire_fuzz import hello, identity_specs

    with anyio.fail_after(60):
        async with ServedModule(Scale(2.0), name=NAME, example=EXAMPLE) as served, \
                MultiSyncCollector(identity_env, num_workers=0, remote_workers=1,
                                   listen="tcp://127.0.0.1:0", frames_per_batch=8,
                                   total_frames=8, weight_sync_schemes={
                                       NAME: ServedModuleScheme(served)}) as collector, \
                Link(collector.endpoint, identity=b"older") as link:
            await link.send(hello(identity_specs(), b"older"), kind="hello")
            welcome = await link.recv()
            route = route_of(served).to_config()
    assert welcome.kind == "welcome", welcome.body
    before = set(WeightSyncScheme._registry) - {"served"}  # what such a worker can build
    assert {config["scheme"] for config in welcome.body["schemes"].values()} <= before
    assert welcome.body["served"] == [route]
    calls = ServedCalls(None)  # type: ignore[arg-type]  # a worker of this release
    try:
        assert calls.take(welcome.body["schemes"], welcome.body["served"]) \
            == welcome.body["schemes"]
        assert calls.routes[NAME].to_config() == route
    finally:
        calls.close()
