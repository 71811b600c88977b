"""Simulated workers: the worker's side of the protocol, without envs, policy or process.

A worker without envs or policy that speaks the real protocol over a real
:class:`transports.Link`: a coordinator (``MultiCollector(listen=...)``, or the
``Coordinator`` in our tests) cannot tell it from a worker, so a test or a
scaling benchmark can admit many of them cheaply and count exactly what each saw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import anyio
import anyio.abc
import torch
from tensordict import TensorDict

from transports import Link, PeerLostError

from .._protocol import PROTOCOL, Batch, Collect, Hello, Welcome, decode
from .._rollout.env_specs import ArraySpec, EnvSpecs


def make_specs(obs_dim: int) -> dict[str, Any]:
    """The env specs a simulated worker announces: a CartPole-like Box(obs_dim) / Discrete(2).

    In the wire form of a hello (a plain dict).

    >>> make_specs(4)["observation"]["observation"]["shape"]
    [4]
    """
    specs = EnvSpecs(observation={"observation": ArraySpec(shape=(obs_dim,), dtype="float32")},
                     action=ArraySpec(shape=(), dtype="int64", low=0.0, high=1.0, n=2),
                     num_envs=1)
    return specs.to_dict()


def make_share(frames: int, obs_dim: int, *, worker_id: int = 0, seq: int = 0,
               policy_version: int = 0) -> TensorDict:
    """One worker's batch share of ``[1, frames]`` in TorchRL's layout, as a worker sends it.

    ``observation``, ``action``, the done flags, ``("next", ...)`` and
    ``("collector", ...)``; ``("collector", "traj_ids")`` holds ``seq`` so that a
    test can tell batches apart.

    >>> make_share(3, 4, seq=7)["collector", "traj_ids"].tolist()
    [[7, 7, 7]]
    """
    shape = (1, frames)

    def flags() -> torch.Tensor:
        return torch.zeros((*shape, 1), dtype=torch.bool)

    obs = torch.arange(frames * obs_dim, dtype=torch.float32).reshape(*shape, obs_dim)
    return TensorDict({
        "observation": obs,
        "action": torch.zeros(shape, dtype=torch.int64),
        "done": flags(), "terminated": flags(), "truncated": flags(),
        "next": TensorDict({
            "observation": obs + 1, "reward": torch.ones((*shape, 1)),
            "done": flags(), "terminated": flags(), "truncated": flags(),
        }, batch_size=shape),
        "collector": TensorDict({
            "traj_ids": torch.full(shape, seq, dtype=torch.int64),
            "worker_id": torch.full(shape, worker_id, dtype=torch.int64),
            "policy_version": torch.full(shape, policy_version, dtype=torch.int64),
        }, batch_size=shape),
    }, batch_size=shape)


@dataclasses.dataclass
class SimRecord:
    """What one :func:`sim_worker` saw and did (for exact accounting in tests)."""

    name: str
    index: int = -1  # the worker index the coordinator's welcome gave
    granted: int = 0  # credits received
    sent: int = 0  # batches sent
    max_outstanding: int = 0  # most credits held at once (received, not yet answered)
    requests: list[int] = dataclasses.field(default_factory=list)  # request of each batch sent


async def sim_worker(endpoint: str, name: str, *, frames: int, obs_dim: int = 4,
                     delay: float = 0.0, record: SimRecord | None = None,
                     task_status: anyio.abc.TaskStatus[SimRecord] = anyio.TASK_STATUS_IGNORED,
                     **link_options: Any) -> None:
    """A worker without envs: hello, then one ``[1, frames]`` batch per credit, in order.

    Joins the coordinator at ``endpoint`` as ``name`` (with ``slot=-1``, as a
    remote worker does) and answers each credit after ``delay`` seconds with a
    :func:`make_share` stamped with the worker's index and a per-worker
    sequence number (``("collector", "traj_ids")``). ``record`` (or a fresh
    :class:`SimRecord`) is filled as it goes and handed to ``task_status`` once
    the hello is sent: ``record = await task_group.start(sim_worker, ...)``.
    Runs until cancelled or the coordinator says goodbye; ``link_options`` go
    to :class:`transports.Link`.
    """
    record = record or SimRecord(name)
    pending: list[int] = []
    async with Link(endpoint, identity=name, **link_options) as link:
        hello = Hello(protocol=PROTOCOL, name=name, host="sim", pid=os.getpid(),
                      specs=make_specs(obs_dim), slot=-1)
        await link.send(hello.to_body(), kind=Hello.KIND)
        task_status.started(record)
        with contextlib.suppress(PeerLostError):
            async for message in link:
                if message.kind == Welcome.KIND:
                    record.index = decode(Welcome, message.body).index
                elif message.kind == Collect.KIND:
                    collect = decode(Collect, message.body)
                    record.granted += collect.credits
                    pending.extend([collect.request] * collect.credits)
                    record.max_outstanding = max(record.max_outstanding, len(pending))
                    while pending:  # one batch at a time, in the order credits came
                        if delay:
                            await anyio.sleep(delay)
                        request = pending.pop(0)
                        share = make_share(frames, obs_dim, worker_id=record.index,
                                           seq=record.sent)
                        await link.send(Batch(request, share).to_body(), kind=Batch.KIND)
                        record.sent += 1
                        record.requests.append(request)
