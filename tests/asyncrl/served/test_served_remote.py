"""A served module called by the envs of remote hosts (``asyncrl worker --connect``).

Their calls cross the network as declared messages (``asyncrl/_protocol/served.py``) on
the link each worker was admitted on; the trainer checks every call against the
module's layout, makes it through one of the module's slots (batched with the local
envs' calls) and answers with the output and its version.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
from contextlib import AbstractContextManager
from typing import Any

import anyio
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl._protocol import ServedAnswer, ServedCall, ServedRoute
from asyncrl._worker.served_calls import ServedCallError, ServedCalls, route_for
from asyncrl.metrics import CollectorMetrics
from asyncrl.served import ServedModule, ServedModuleScheme
from asyncrl.served._remote_calls import RemoteCalls, ServedCallRouter
from tests.asyncrl.worker_hosts import worker_host
from transports import Link, Message, ProtocolError

from .served_envs import (
    REMOTE_NAME,
    Scale,
    Slow,
    checked_versions,
    rewarded_env,
    served_refusal,
)

pytestmark = pytest.mark.anyio
#: Tests that start processes run once; the trainer's end alone runs on both backends.
processes = pytest.mark.parametrize("anyio_backend", ["asyncio"])

NAME = REMOTE_NAME
VERSIONS = ("next", "served_versions", NAME)
ENV = "tests.asyncrl.served.served_envs:remote_rewarded_env"
LIMIT = 150


def remote_host(endpoint: str) -> AbstractContextManager[subprocess.Popen[bytes]]:
    return worker_host(endpoint, ENV, "--envs-per-worker", "2")


def example() -> dict[str, torch.Tensor]:
    return {"next_observation": torch.zeros(3)}


def remote_calls(collector: Any) -> RemoteCalls:
    calls: RemoteCalls = collector.weight_sender(NAME).remote_calls
    return calls


@processes
async def test_a_remote_hosts_envs_get_rewards_from_the_served_module() -> None:
    with anyio.fail_after(LIMIT):
        async with ServedModule(Scale(1.0), name=NAME, example=example(), clients=8) as served:
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=1,
                    remote_workers=1, listen="tcp://127.0.0.1:0", envs_per_worker=2,
                    frames_per_batch=64, total_frames=64 * 3,
                    info_keys=[served.handle.info_key],
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                with remote_host(collector.endpoint):
                    seen = []
                    async for batch in collector:
                        version = checked_versions(batch, NAME)
                        workers = batch["collector", "worker_id"].unique().tolist()
                        assert sorted(workers) == [0, 1]  # the local worker and the remote one
                        seen.append(sorted(version.unique().tolist()))
                        new = {"scale": torch.tensor([float(served.version + 2)])}
                        await collector.update_policy_weights(new, model_id=NAME)
                assert seen == [[0], [1], [2]]  # sync: each batch after its update
                calls = remote_calls(collector)
                assert calls.answered >= 32 * 3  # the remote host's steps, over the wire
                assert calls.refusals == []


@processes
async def test_a_stranger_is_refused_and_the_run_goes_on() -> None:
    with anyio.fail_after(LIMIT):
        async with ServedModule(Scale(2.0), name=NAME, example=example(), clients=8) as served:
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=1,
                    remote_workers=1, listen="tcp://127.0.0.1:0", envs_per_worker=2,
                    frames_per_batch=32, total_frames=32 * 2,
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                events = collector.events()
                async with Link(collector.endpoint, identity=b"stranger") as stranger:
                    call = ServedCall(NAME, 7, {"next_observation": torch.ones(3)})
                    await stranger.send(call.to_body(), kind=ServedCall.KIND)
                    answer: Message = await stranger.recv()
                    assert answer.kind == ServedAnswer.KIND
                    assert answer.body["call"] == 7 and "output" not in answer.body
                    assert "not a live admitted worker" in answer.body["error"]
                calls = remote_calls(collector)
                assert calls.answered == 0
                assert len(calls.refusals) == 1 and "stranger" in calls.refusals[0]
                # as the collector's other refusals: counted by reason, and an event
                assert collector.statistics().served_refusals == {"not admitted": 1}
                registry = CollectorRegistry()  # and in the Prometheus exposition
                CollectorMetrics(collector, registry=registry)
                lines = generate_latest(registry).decode().splitlines()
                assert 'asyncrl_served_refusals_total{reason="not admitted"} 1.0' in lines
                assert 'asyncrl_served_refusals_total{reason="busy"} 0.0' in lines
                refused = await served_refusal(events)
                assert refused.name == "stranger"
                assert refused.reason.startswith(
                    "served_call refused (not admitted): served_call from a peer that is "
                    "not a live admitted worker of this collector"), refused.reason
                with remote_host(collector.endpoint):
                    async for batch in collector:  # the run goes on
                        t = batch["next", "observation"][..., 0]
                        assert torch.equal(batch["next", "reward"].squeeze(-1), 2 * t)
                assert calls.answered > 0


class _Sent:
    """A fake hub's send: what the trainer answered, kept."""

    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []

    async def __call__(self, peer: bytes, body: Any, kind: str) -> None:
        assert kind == ServedAnswer.KIND
        self.answers.append(body)


@pytest.mark.parametrize("inputs, problem", [
    ({"next_observation": torch.ones(4)}, r"float32\[4\]"),  # a shape the module lacks
    ({"next_observation": torch.ones(3, dtype=torch.float64)}, r"float64\[3\]"),
    ({"next_observation": torch.ones(3), "extra": torch.ones(1)}, "got keys"),
    ({}, "got keys"),
    ("not a map", "must be a map"),
    ({"next_observation": torch.ones(1 << 20)}, r"float32\[1048576\]"),  # big: refused
])
async def test_a_malformed_call_from_an_admitted_worker_is_refused_never_reaching_the_module(
        inputs: Any, problem: str) -> None:
    with anyio.fail_after(60):
        async with ServedModule(Scale(3.0), name=NAME, example=example(), clients=2) as served:
            sent = _Sent()
            calls = RemoteCalls(served, sent)
            async with anyio.create_task_group() as tg:
                tg.start_soon(calls.run)
                bad = Message(peer=b"w", kind=ServedCall.KIND, seq=0, body=ServedCall(
                    NAME, 5, inputs).to_body())
                await calls.on_message(object(), bad)
                assert len(sent.answers) == 1
                refusal = sent.answers[0]
                assert refusal["call"] == 5 and "output" not in refusal
                assert refusal["error"].startswith("refused: served_call message field "
                                                   "'inputs'")
                assert re.search(problem, refusal["error"]), refusal["error"]
                assert served.statistics().calls == 0  # the module never saw it
                good = Message(peer=b"w", kind=ServedCall.KIND, seq=1, body=ServedCall(
                    NAME, 6, {"next_observation": torch.ones(3)}).to_body())
                await calls.on_message(object(), good)  # the next call is served
                while len(sent.answers) < 2:
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
            answer = sent.answers[1]
            assert answer["call"] == 6 and answer["version"] == 0 and "error" not in answer
            assert answer["output"].tolist() == [3.0]


@processes
async def test_a_remote_host_lost_mid_call_frees_its_slot_and_the_run_goes_on() -> None:
    with anyio.fail_after(LIMIT):
        async with ServedModule(Slow(), name=NAME, example=example(), clients=8) as served:
            async with MultiAsyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=1,
                    remote_workers=1, listen="tcp://127.0.0.1:0", envs_per_worker=2,
                    frames_per_batch=16, total_frames=-1, on_worker_loss="continue",
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                calls = remote_calls(collector)
                with remote_host(collector.endpoint) as host:
                    async for batch in collector:
                        if 1 in batch["collector", "worker_id"].unique().tolist():
                            break  # the remote host collects
                    await served.update({"delay": torch.tensor([1.0])})  # each call: 1 s
                    while calls.in_flight == 0:  # a remote call is in the module now
                        await anyio.sleep(0.01)
                    os.kill(host.pid, signal.SIGKILL)
                    host.wait(timeout=30)
                    while calls.in_flight:  # answered to nobody; the slot is free again
                        await anyio.sleep(0.05)
                await served.update({"delay": torch.tensor([0.0])})
                answered = calls.answered
                got = 0
                async for batch in collector:  # the local worker carries on, still served
                    t = batch["next", "observation"][..., 0]
                    assert torch.equal(batch["next", "reward"].squeeze(-1), t)
                    got += 1
                    if got == 3:
                        break
                assert calls.answered >= answered  # nothing broke the gateway
                assert calls.refusals == []


@processes
async def test_the_served_module_killed_fails_the_remote_env_step_with_a_clear_error() -> None:
    with anyio.fail_after(LIMIT):
        async with ServedModule(Scale(1.0), name=NAME, example=example(), clients=8,
                                server_backend="process") as served:
            async with MultiSyncCollector(
                    functools.partial(rewarded_env, served.handle), num_workers=0,
                    remote_workers=1, listen="tcp://127.0.0.1:0", envs_per_worker=2,
                    frames_per_batch=16, total_frames=-1,
                    weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
                with remote_host(collector.endpoint):
                    async for _ in collector:
                        break  # the remote host is served
                    os.kill(served.pid, signal.SIGKILL)
                    with pytest.raises(Exception) as caught:
                        async for _ in collector:
                            pass
        text = str(caught.value)
        assert f"served module {NAME!r} failed and serves no more calls" in text, text
        assert "SIGKILL" in text or "killed" in text, text


def _call(number: int, value: float = 1.0, name: str = NAME) -> Message:
    return Message(peer=b"w", kind=ServedCall.KIND, seq=number, body=ServedCall(
        name, number, {"next_observation": torch.full((3,), value)}).to_body())


async def _answers(sent: _Sent, count: int) -> None:
    while len(sent.answers) < count:
        await anyio.sleep(0.01)


async def test_a_call_the_module_does_not_answer_in_time_is_answered_as_a_timeout() -> None:
    with anyio.fail_after(60):
        async with ServedModule(Slow(), name=NAME, example=example(), clients=2,
                                call_timeout=0.5) as served:
            sent = _Sent()
            calls = RemoteCalls(served, sent)
            async with anyio.create_task_group() as tg:
                tg.start_soon(calls.run)
                await served.update({"delay": torch.tensor([1.5])})
                await calls.on_message(object(), _call(1))
                await _answers(sent, 1)
                assert sent.answers[0]["timeout"] is True
                assert "did not send its answer within call_timeout=0.5 s" in \
                    sent.answers[0]["error"]
                await served.update({"delay": torch.tensor([0.0])})
                await calls.on_message(object(), _call(2, 4.0))  # its own answer, not the late one
                await _answers(sent, 2)
                tg.cancel_scope.cancel()
            assert sent.answers[1]["output"].tolist() == [4.0]
            assert calls.in_flight == 0


async def test_more_calls_than_slots_wait_bounded_and_the_rest_are_answered_busy() -> None:
    with anyio.fail_after(60):
        async with ServedModule(Scale(1.0), name=NAME, example=example(), clients=1) as served:
            sent = _Sent()
            calls = RemoteCalls(served, sent)
            # not served yet (run() is not running): one call waits, the next is "busy"
            await calls.on_message(object(), _call(1))
            await calls.on_message(object(), _call(2))
            assert len(sent.answers) == 1 and sent.answers[0]["call"] == 2
            assert "is busy: more calls wait than its 1 client slots" in sent.answers[0]["error"]
            assert calls.refused == {"busy": 1}  # counted as the other refusals
            async with anyio.create_task_group() as tg:
                tg.start_soon(calls.run)
                await _answers(sent, 2)
                tg.cancel_scope.cancel()
            assert sent.answers[1]["call"] == 1 and sent.answers[1]["output"].tolist() == [1.0]


async def test_a_call_to_a_module_the_run_does_not_serve_is_refused_naming_those_it_does() -> None:
    with anyio.fail_after(60):
        async with ServedModule(Scale(1.0), name=NAME, example=example()) as served:
            sent = _Sent()
            router = ServedCallRouter(sent)
            router.add(RemoteCalls(served, sent))
            await router.on_message(object(), _call(3, name="other"))
            assert sent.answers == [{"name": "other", "call": 3, "version": 0,
                                     "error": "refused: served_call names module 'other'; "
                                     "this run serves ['env.transform[0]'] (weight_sync_schemes "
                                     "with a ServedModuleScheme)", "timeout": False}]


def test_a_worker_refuses_a_malformed_answer_and_a_call_from_its_event_loop() -> None:
    calls = ServedCalls(None)  # type: ignore[arg-type]  # nothing is sent here
    try:
        route = ServedRoute(NAME, [("next_observation", "float32", [3])],
                            ("output", "float32", [1]), 1.0)
        assert calls.take({NAME: {"scheme": "served", "strategy": "tensordict",
                                  "route": route.to_config()},
                           "policy": {"scheme": "zmq"}}) == {"policy": {"scheme": "zmq"}}
        assert calls.routes == {NAME: route}
        for body, problem in [
                ({"name": NAME, "call": 1, "version": 0, "output": torch.ones(2)},
                 r"'output' must hold exactly \{'output': float32\[1\]\}"),
                ({"name": "other", "call": 1, "version": 0, "output": torch.ones(1)},
                 "a module this worker does not call"),
                ({"name": NAME, "call": -1, "version": 0, "output": torch.ones(1)}, "'call'"),
                ([1, 2], "must be a map")]:
            with pytest.raises(ProtocolError, match=problem):
                calls.deliver(Message(peer=b"", kind=ServedAnswer.KIND, seq=0, body=body))
        with pytest.raises(ServedCallError, match="from the rollout's thread only"):
            calls.call(NAME, {"next_observation": torch.zeros(3).numpy()})  # not bound
        with pytest.raises(ProtocolError, match="served route"):
            calls.take({NAME: {"scheme": "served", "route": {"name": NAME, "inputs": [],
                                                              "output": ["o", "float32", [1]],
                                                              "call_timeout": 1.0}}})
    finally:
        calls.close()  # the route is this process's: other tests must not find it
    assert route_for(NAME) is None


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20) | st.builds(torch.ones, st.integers(0, 5))
    | st.tuples(st.sampled_from(["float32", "float64", "bool", "x"]),  # an inline input
                st.lists(st.integers(-2, 1 << 50), max_size=3),
                st.binary(max_size=24)).map(list),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "call", "inputs", "next_observation", "version", "output",
                         "error", "timeout", "x"]), inner, max_size=5),
    max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_values)
def test_any_body_decodes_to_a_served_message_or_a_protocol_error(body: Any) -> None:
    layout = {"next_observation": ("float32", (3,))}
    for decode_one in (lambda: ServedCall.from_body(body, layout=layout),
                       lambda: ServedAnswer.from_body(body, layout={"output": ("float32", (1,))}),
                       lambda: ServedRoute.from_config(body)):
        try:
            decode_one()
        except ProtocolError:
            pass


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_rollout_that_fails_to_build_while_answers_are_read_raises_its_own_error(
        ) -> None:
    from collections import deque

    calls = ServedCalls(None)  # type: ignore[arg-type]
    calls.bind()

    async def recv() -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    def build() -> None:
        raise ValueError("env would not build")

    with anyio.fail_after(30), pytest.raises(ValueError, match="env would not build"):
        await calls.run_answering(build, recv, deque())


class _EchoLink:
    """A worker's link whose trainer answers every call at once (its output: the input's
    first element), or never (``silent``)."""

    endpoint = "tcp://trainer:1"

    def __init__(self, calls: ServedCalls | None = None, *, silent: bool = False) -> None:
        self.calls = calls
        self.silent = silent
        self.sent: list[Any] = []

    async def send(self, body: Any, *, kind: str) -> None:
        assert kind == ServedCall.KIND
        self.sent.append(body)
        if self.silent or self.calls is None:
            return
        dtype, _, data = body["inputs"]["next_observation"]  # [dtype, shape, bytes]
        value = torch.as_tensor(np.frombuffer(data, dtype=dtype)[:1].copy())
        self.calls.deliver(Message(peer=b"", kind=ServedAnswer.KIND, seq=0, body=ServedAnswer(
            NAME, body["call"], version=4, output=value).to_body()))


async def test_a_worker_call_goes_out_through_its_event_loop_and_waits_bounded() -> None:
    link = _EchoLink()
    calls = ServedCalls(link)  # type: ignore[arg-type]
    link.calls = calls
    calls.bind()
    calls.add(ServedRoute(NAME, [("next_observation", "float32", [3])],
                          ("output", "float32", [1]), 0.3))
    try:
        calls.admitted()
        with anyio.fail_after(30):
            output, version = await anyio.to_thread.run_sync(
                calls.call, NAME, {"next_observation": torch.full((3,), 5.0).numpy()})
            assert output.tolist() == [5.0] and version == 4
            link.silent = True  # the trainer says nothing: the call ends at call_timeout
            with pytest.raises(ServedCallError, match=r"within call_timeout=0\.3 s") as late:
                await anyio.to_thread.run_sync(
                    calls.call, NAME, {"next_observation": torch.ones(3).numpy()})
            assert late.value.timeout
            calls.lost("the trainer is gone")  # an admission that ended: refused at once
            with pytest.raises(ServedCallError, match="the trainer is gone"):
                await anyio.to_thread.run_sync(
                    calls.call, NAME, {"next_observation": torch.ones(3).numpy()})
        assert [b["call"] for b in link.sent] == [0, 1]
    finally:
        calls.close()
