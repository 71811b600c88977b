"""Weights by torch.distributed broadcast (gloo over 127.0.0.1): real worker processes.

Exact weights and exact versions per frame, a worker killed mid-run (a clear
error within a bound, never a hang), fixed membership refused where a run
would need it to change, and a CUDA run that skips without CUDA.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys

import anyio
import pytest
import torch
from torch import nn

from asyncrl import MultiCollector, WorkerLostError
from asyncrl.testing import (
    CountingEnv,
    ValuePolicy,
    collect_with_updates,
    fill_parameters,
    version_problems,
)
from asyncrl.weights import (
    DistributedWeightSyncScheme,
    WeightSyncError,
    WeightSyncScheme,
)
from asyncrl.weights._collective import FlatLayout, Group, chain_order
from transports import LocalHub

pytestmark = pytest.mark.anyio
LOSS = (WeightSyncError, WorkerLostError)
WAIT = 120  # worker processes on a loaded 2-core machine: a bound, not a speed claim


@pytest.mark.parametrize(("sync", "algorithm"), [(True, "broadcast"), (False, "broadcast"),
                                                 (False, "chain")],
                         ids=["sync", "async", "async-chain"])
async def test_frames_keep_exact_versions_under_broadcast(sync: bool, algorithm: str) -> None:
    policy = ValuePolicy(0.0)
    scheme = DistributedWeightSyncScheme(timeout=60, algorithm=algorithm)
    with anyio.fail_after(WAIT):
        async with MultiCollector([CountingEnv] * 2, policy, sync=sync, frames_per_batch=16,
                                  total_frames=16 * 12,
                                  weight_sync_schemes={"policy": scheme}) as collector:
            sender = collector.weight_sender()
            with pytest.raises(ValueError, match="broadcasts to every worker"):
                await sender.send_async(worker_ids=[0])  # a collective reaches them all
            batches, values = await collect_with_updates(collector, policy, sync=sync)
            await sender.wait_ack(timeout=60)
            assert sender.acked_versions == {0: sender.version, 1: sender.version}
            assert sender.broadcasts == sender.version  # one collective per update
            # The workers' own weights are exactly the trainer's last ones.
            answers = await collector.state_dict()
    assert version_problems(batches, values) == []
    seen = {int(v) for b in batches for v in b["collector", "policy_version"].reshape(-1)}
    assert len(seen) >= 3
    assert sorted(answers) == ["worker0", "worker1"]
    for answer in answers.values():
        state = answer["policy_state_dict"]
        assert {float(v) for t in state.values() for v in t.reshape(-1)} == {values[max(values)]}


@pytest.mark.parametrize(("workers", "options"), [
    (1, {}),
    # 3 ranks forward along the chain in 4 KiB pieces; the buffer (9.3 KiB) ends mid-piece
    (3, {"algorithm": "chain", "chunk_bytes": 4096}),
], ids=["broadcast", "chain"])
async def test_every_tensor_arrives_exactly(workers: int, options: dict) -> None:
    """A model with several dtypes and shapes: each worker's state dict equals the trainer's."""
    torch.manual_seed(0)
    policy = MixedPolicy()
    scheme = DistributedWeightSyncScheme(timeout=60, **options)
    with anyio.fail_after(WAIT):
        async with MultiCollector([CountingEnv] * workers, policy, sync=True,
                                  frames_per_batch=8 * workers, total_frames=-1,
                                  weight_sync_schemes={"policy": scheme}) as collector:
            for _ in range(2):
                with torch.no_grad():
                    for p in policy.parameters():
                        p.normal_()
                    policy.count += 3
                await collector.update_policy_weights()
            answers = await collector.state_dict()
    expected = policy.state_dict()
    assert sorted(answers) == [f"worker{i}" for i in range(workers)]
    for answer in answers.values():
        got = answer["policy_state_dict"]
        assert sorted(got) == sorted(expected)
        for key, tensor in expected.items():
            assert torch.equal(torch.as_tensor(got[key]), tensor), key


class MixedPolicy(nn.Module):
    """Float weights of odd sizes and an integer buffer: the flat layout's alignment."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 3)
        self.wide = nn.Linear(48, 47)  # 9.2 KiB: a chain sends it in several pieces
        self.extra = nn.Parameter(torch.zeros(5, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


@pytest.mark.parametrize("algorithm", ["broadcast", "chain"])
@pytest.mark.parametrize("how", ["killed", "hung"])
async def test_a_lost_worker_fails_the_update_within_a_bound(how: str, algorithm: str) -> None:
    """Killed: gloo sees the closed connection at once (or the process watcher sees the
    death first). Hung (SIGSTOP): the group's ``timeout`` ends the broadcast. Either
    way a clear error, never a hang, and every later update raises too. In a chain the
    victim is the middle rank: the trainer's own link to rank 1 stays fine."""
    policy = ValuePolicy(0.0)
    scheme = DistributedWeightSyncScheme(timeout=3, algorithm=algorithm)
    with anyio.fail_after(WAIT):
        async with MultiCollector([CountingEnv] * 3, policy, sync=True, frames_per_batch=12,
                                  total_frames=-1,
                                  weight_sync_schemes={"policy": scheme}) as collector:
            await collector.update_policy_weights()  # the group is formed and works
            await collector.__anext__()
            victim = collector.worker_pids[1]
            os.kill(victim, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            try:
                with anyio.fail_after(30), pytest.raises(LOSS) as caught:
                    for _ in range(50):
                        fill_parameters(policy, 2.0)
                        await collector.update_policy_weights()
                with pytest.raises(LOSS):
                    await collector.update_policy_weights()
            finally:
                if how == "hung":
                    os.kill(victim, signal.SIGCONT)
    # Whoever sees it first: the broadcast (gloo), or the run's loss handling
    # (on_worker_loss="raise": the process watcher saw the SIGKILL).
    text = str(caught.value)
    if isinstance(caught.value, WeightSyncError):
        assert "the broadcast of version" in text and "died or hung" in text
    else:
        assert "worker 1" in text and "SIGKILL" in text


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend per test
async def test_a_remote_worker_joins_from_its_welcome_config() -> None:
    """A remote host (``asyncrl worker --connect``) learns the scheme from its welcome,
    joins as rank ``index + 1`` and gets exact weights, beside a local worker."""
    from asyncrl.weights._collective import free_port

    policy = ValuePolicy(0.0)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    scheme = DistributedWeightSyncScheme(init_method=init_method, timeout=60)
    with anyio.fail_after(WAIT):
        async with MultiCollector("asyncrl.testing:CountingEnv", policy, sync=True,
                                  num_workers=1, remote_workers=1, listen="tcp://127.0.0.1:0",
                                  frames_per_batch=16, total_frames=16 * 5,
                                  weight_sync_schemes={"policy": scheme}) as collector:
            host = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect",
                 collector.endpoint, "--env", "asyncrl.testing:CountingEnv",
                 "--policy", "asyncrl.testing:ValuePolicy"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                batches, values = await collect_with_updates(collector, policy, sync=True)
            except BaseException:
                host.kill()
                raise
        code = await anyio.to_thread.run_sync(host.wait, 60)
    assert code == 0, host.stdout.read() if host.stdout else ""
    assert scheme.world_size == 3
    assert version_problems(batches, values) == []
    workers = {int(w) for b in batches for w in b["collector", "worker_id"].reshape(-1)}
    assert workers == {0, 1}


def test_restart_policies_are_refused_with_the_alternatives_named() -> None:
    for policy in ("continue", "wait", "restart"):
        with pytest.raises(ValueError, match="ZmqWeightSyncScheme") as caught:
            MultiCollector([CountingEnv] * 2, ValuePolicy(0.0), sync=True, frames_per_batch=16,
                           on_worker_loss=policy,
                           weight_sync_schemes={"policy": DistributedWeightSyncScheme()})
        assert f"on_worker_loss={policy!r}" in str(caught.value)


def test_configuration_is_checked_and_round_trips() -> None:
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        DistributedWeightSyncScheme(init_method="127.0.0.1:29500")
    with pytest.raises(ValueError, match="backend"):
        DistributedWeightSyncScheme(backend="mpi")
    with pytest.raises(ValueError, match="max_interval"):
        DistributedWeightSyncScheme(max_interval=2)
    with pytest.raises(ValueError, match="remote workers needs init_method"):
        DistributedWeightSyncScheme().plan(workers=3, remote_workers=1)
    scheme = DistributedWeightSyncScheme(backend="nccl", timeout=5)
    scheme.plan(workers=2)
    assert scheme.world_size == 3 and scheme.init_method.startswith("tcp://127.0.0.1:")
    again = WeightSyncScheme.from_config(scheme.to_config())
    assert isinstance(again, DistributedWeightSyncScheme)
    assert (again.backend, again.world_size, again.init_method, again.timeout) == (
        "nccl", 3, scheme.init_method, 5.0)
    with pytest.raises(ValueError, match=r"algorithm must be one of \('broadcast', 'chain'\)"):
        DistributedWeightSyncScheme(algorithm="ring")
    with pytest.raises(ValueError, match="NCCL's own broadcast already pipelines"):
        DistributedWeightSyncScheme(backend="nccl", algorithm="chain")
    with pytest.raises(ValueError, match="Pass algorithm='chain' with it"):
        DistributedWeightSyncScheme(chunk_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"chunk_bytes must be an int in \[4096, 2\*\*30\]"):
        DistributedWeightSyncScheme(algorithm="chain", chunk_bytes=100)
    chain = DistributedWeightSyncScheme(algorithm="chain", chunk_bytes=1 << 20)
    assert repr(chain) == "DistributedWeightSyncScheme(algorithm='chain', chunk_bytes=1048576)"
    again = WeightSyncScheme.from_config(chain.to_config())
    assert (again.algorithm, again.chunk_bytes) == ("chain", 1 << 20)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="world_size= and init_method="):
        DistributedWeightSyncScheme().init_on_sender("policy", hub=LocalHub(),
                                                     model=nn.Linear(2, 1))


def test_the_chain_visits_the_hosts_one_after_the_other() -> None:
    """Indices follow the order workers joined (hosts interleave); the chain groups by host,
    in the order each host first appears, so each host's link carries one copy each way."""
    addresses = {1: "10.0.0.3", 2: "10.0.0.2", 3: "10.0.0.3", 4: "10.0.0.4", 5: "10.0.0.2"}
    order = chain_order(addresses)
    assert order == [0, 1, 3, 2, 5, 4]
    hops = [(addresses.get(a, "trainer"), addresses[b]) for a, b in itertools.pairwise(order)]
    assert sum(a != b for a, b in hops) == 3  # one hop into each of the 3 hosts
    neighbours = {rank: (group.before, group.after) for rank in range(6)
                  if (group := Group(None, rank, 6, "gloo", 1.0, None, order=order))}
    assert neighbours == {0: (None, 1), 1: (0, 3), 3: (1, 2), 2: (3, 5), 5: (2, 4), 4: (5, None)}


def test_flat_layout_aligns_every_tensor() -> None:
    flat = dict(MixedPolicy().state_dict())
    layout = FlatLayout.of(flat)
    assert [k for k, *_ in layout.entries] == sorted(flat)
    assert all(offset % 64 == 0 for *_, offset in layout.entries)
    buffer = layout.empty(torch.device("cpu"))
    views = layout.views(buffer)
    for key, tensor in flat.items():
        views[key].copy_(tensor)
        assert views[key].dtype == tensor.dtype and views[key].shape == tensor.shape
    assert layout.difference(layout.describe()) == ""
    other = FlatLayout.of({**flat, "linear.bias": torch.zeros(4)})
    assert "linear.bias" in other.difference(layout.describe())


async def test_a_worker_with_another_architecture_is_named_before_any_broadcast() -> None:
    scheme = DistributedWeightSyncScheme(timeout=30)
    scheme.plan(workers=1)
    sender = scheme.init_on_sender("policy", hub=LocalHub(), model=nn.Linear(2, 1),
                                   workers={0: b"w0"})
    import pickle

    worker_scheme = pickle.loads(pickle.dumps(scheme))
    receiver = worker_scheme.init_on_worker("policy", model=nn.Linear(3, 1))
    try:
        with anyio.fail_after(WAIT):
            receiver.admitted(0)
            with pytest.raises(WeightSyncError, match="differs from the trainer's"):
                await sender.connect()
    finally:
        await sender.aclose()
        await receiver.aclose()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_cuda_workers_get_exact_weights() -> None:
    """CUDA policy on the trainer and the workers: gloo (always), NCCL with 2+ GPUs."""
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    policy = ValuePolicy(0.0).cuda()
    scheme = DistributedWeightSyncScheme(backend=backend, timeout=30)
    devices = {"policy_device": "cuda:1"} if backend == "nccl" else {"policy_device": "cuda"}
    with anyio.fail_after(60):
        async with MultiCollector([CountingEnv], policy, sync=True, frames_per_batch=16,
                                  total_frames=16 * 5, **devices,
                                  weight_sync_schemes={"policy": scheme}) as collector:
            batches, values = await collect_with_updates(collector, policy, sync=True)
    assert version_problems(batches, values) == []


def test_torchrl_distributed_scheme_translates_with_its_backend() -> None:
    from asyncrl.weights._torchrl import from_torchrl_scheme

    class DistributedWeightSyncScheme:  # stands in for TorchRL's class
        __module__ = "torchrl.weight_update._distributed"
        strategy_str, sync, backend, _timeout = "state_dict", True, "nccl", 3600.0

    translated = from_torchrl_scheme("policy", DistributedWeightSyncScheme())
    assert type(translated).__name__ == "DistributedWeightSyncScheme"
    assert (translated.backend, translated.strategy.extract_as, translated.timeout) == (
        "nccl", "state_dict", 60.0)
