"""The weight codec apart from the transport (#44.6): a scheme that sends another dtype
is a codec and one line, and the transports carry it unchanged.

``HalfScheme`` below is the whole of such a scheme: float32 tensors travel as
float16 over ZeroMQ's transport (one message, or a stream of chunks) and over
shared memory; the worker's model ends with the trainer's weights rounded to
half precision, its own dtype kept. The meta names the codec, so a worker with
the plain scheme refuses such weights instead of applying bytes it would misread,
and a transport that shares the model's own memory refuses the codec at init.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from asyncrl.weights import (
    LiveSharedMemWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from asyncrl.weights._codec import WeightCodec
from transports import LocalHub, Message, RemoteError

pytestmark = pytest.mark.anyio
WAIT = 30


class HalfCodec(WeightCodec):
    """float32 travels as float16: half the bytes on the wire."""

    name = "half"
    identity = False

    def encode(self, flat: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: t.half() if t.dtype == torch.float32 else t for k, t in flat.items()}

    def decode(self, received: Mapping[str, torch.Tensor],
               targets: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: t.to(targets[k].dtype) for k, t in received.items()}


class HalfZmq(ZmqWeightSyncScheme):
    codec = HalfCodec()


class HalfSharedMem(SharedMemWeightSyncScheme):
    codec = HalfCodec()


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2))


def fill(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for index, parameter in enumerate(model.parameters()):
            parameter.copy_(torch.linspace(-value, value, parameter.numel())
                            .view_as(parameter) + index / 3)


async def sync(trainer_scheme: WeightSyncScheme, worker_scheme: WeightSyncScheme,
               trainer: nn.Module, worker: nn.Module) -> tuple[list[Message], list[Any]]:
    """Two sends from ``trainer_scheme`` to a worker applying with ``worker_scheme``:
    the messages it got, and what each ``wait_ack`` gave (its result or its error)."""
    hub = LocalHub(encode=True)
    link = hub.connect(b"w0")
    receiver = worker_scheme.init_on_worker("policy", model=worker)
    sender = trainer_scheme.init_on_sender("policy", hub=hub, model=trainer,
                                           workers={0: b"w0"})
    messages: list[Message] = []
    outcomes: list[Any] = []

    async def serve() -> None:
        while True:
            message = await link.recv()
            messages.append(message)
            receiver.on_message(message)
            receiver.apply_pending()
            await receiver.flush_acks(link)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            for value in (1.0, 2.0):
                fill(trainer, value)
                await sender.send_async()
                try:
                    outcomes.append(await sender.wait_ack(timeout=WAIT))
                except RemoteError as exc:
                    outcomes.append(exc)
            tg.cancel_scope.cancel()
    await sender.aclose()
    receiver.close()
    return messages, outcomes


def rounded(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().half().float() for p in model.parameters()]


SCHEMES: dict[str, Callable[[], WeightSyncScheme]] = {
    "message": lambda: HalfZmq(chunk_bytes=0), "chunks": lambda: HalfZmq(chunk_bytes=512),
    "shared-memory": HalfSharedMem}


@pytest.mark.parametrize("transport", sorted(SCHEMES))
async def test_a_codec_plugs_into_each_transport_unchanged(transport: str) -> None:
    trainer, worker = net(), net()
    scheme = SCHEMES[transport]()
    messages, outcomes = await sync(scheme, SCHEMES[transport](), trainer, worker)
    assert outcomes == [{0: 1}, {0: 2}]
    assert all(m.meta["codec"] == "half" for m in messages)
    assert all(torch.equal(w, t) and w.dtype == torch.float32
               for w, t in zip(worker.parameters(), rounded(trainer), strict=True))
    assert not all(torch.equal(w, t) for w, t in zip(worker.parameters(), trainer.parameters(),
                                                      strict=True))  # it did travel as half
    if isinstance(scheme, ZmqWeightSyncScheme) and not scheme.chunk_bytes:
        body = messages[-1].body
        assert {t.dtype for t in body.values()} == {torch.float16}  # a state dict


async def test_a_worker_without_the_codec_refuses_its_weights_naming_both() -> None:
    trainer, worker = net(), net()
    before = [p.detach().clone() for p in worker.parameters()]
    _, outcomes = await sync(HalfZmq(chunk_bytes=0), ZmqWeightSyncScheme(chunk_bytes=0),
                             trainer, worker)
    assert all(isinstance(o, RemoteError) for o in outcomes)
    assert "encoded as 'half'" in str(outcomes[0]) and "'full tensors'" in str(outcomes[0])
    assert all(torch.equal(a, b) for a, b in zip(worker.parameters(), before, strict=True))


async def test_a_transport_that_shares_the_model_refuses_a_codec_at_init() -> None:
    class HalfLive(LiveSharedMemWeightSyncScheme):
        codec = HalfCodec()

    with pytest.raises(ValueError, match="cannot send them encoded as 'half'"):
        HalfLive().init_on_sender("policy", hub=LocalHub(encode=True), model=net(), workers={})


async def test_full_tensors_say_nothing_in_the_meta() -> None:
    messages, outcomes = await sync(ZmqWeightSyncScheme(chunk_bytes=0),
                                    ZmqWeightSyncScheme(chunk_bytes=0), net(), net())
    assert outcomes == [{0: 1}, {0: 2}] and all("codec" not in m.meta for m in messages)
