"""device / policy_device / env_device / storing_device, with TorchRL's meaning.

On a CPU-only machine (CI) the CUDA tests are skipped; they run on a GPU machine.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import anyio
import pytest
import torch
from torch import nn

from asyncrl import Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl._rollout.device_policy import DevicePolicyCall, check_policy_device
from asyncrl._rollout.devices import DeviceLayout, check_device, place_policy
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.loop import Rollout
from asyncrl._rollout.options import RolloutOptions
from asyncrl.testing import CountingEnv
from tests.asyncrl.device_probe import DeviceProbe
from tests.multihost.processes import wait_exit

LIMIT = 90  # generous bound on any single test's waits (2 shared cores, process spawns)
counting = functools.partial(CountingEnv, length=4)
CPU = torch.device("cpu")
has_cuda = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not has_cuda, reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(has_cuda, reason="checks the error of a machine without CUDA")
DEVICE_ARGS = ("device", "policy_device", "env_device", "storing_device")


def multi(**kwargs: object) -> MultiSyncCollector:
    return MultiSyncCollector(counting, num_workers=1, frames_per_batch=8, **kwargs)  # type: ignore[arg-type]


def in_process(**kwargs: object) -> Collector:
    return Collector(counting, frames_per_batch=8, **kwargs)  # type: ignore[arg-type]


# -- resolution: TorchRL's rules -----------------------------------------------------------------
@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("policy_device", [None, "cpu"])
@pytest.mark.parametrize("env_device", [None, "cpu"])
@pytest.mark.parametrize("storing_device", [None, "cpu"])
def test_resolution_matches_torchrl(device: str | None, policy_device: str | None,
                                    env_device: str | None, storing_device: str | None) -> None:
    collectors = pytest.importorskip("torchrl.collectors")
    theirs = collectors.Collector._get_devices(
        storing_device=storing_device, policy_device=policy_device, env_device=env_device,
        device=device)
    ours = DeviceLayout.resolve(device=device, policy_device=policy_device,
                                env_device=env_device, storing_device=storing_device)
    assert (ours.storing_device, ours.policy_device, ours.env_device) == tuple(theirs)


def test_device_fills_the_three_others_and_explicit_ones_win() -> None:
    layout = DeviceLayout.resolve(device="cpu")
    assert (layout.policy_device, layout.env_device, layout.storing_device) == (CPU, CPU, CPU)
    assert DeviceLayout.resolve(policy_device="cpu").storing_device is None  # env unset
    assert DeviceLayout.resolve(policy_device="cpu", env_device="cpu").storing_device == CPU


@pytest.mark.parametrize("make", [multi, in_process])
def test_explicit_cpu_everywhere_is_accepted(make: object) -> None:
    collector = make(device="cpu", policy_device="cpu", env_device="cpu",  # type: ignore[operator]
                     storing_device="cpu")
    assert collector.devices == DeviceLayout(CPU, CPU, CPU)


# -- a device this machine lacks: an error at construction -----------------------------------------
@no_cuda
@pytest.mark.parametrize("make", [multi, in_process])
@pytest.mark.parametrize("name", DEVICE_ARGS)
def test_cuda_without_cuda_fails_at_construction_naming_the_argument(make: object,
                                                                     name: str) -> None:
    with pytest.raises(ValueError) as info:
        make(**{name: "cuda"})  # type: ignore[operator]
    message = str(info.value)
    assert message.startswith(f"{name}='cuda' but this machine has no CUDA device (torch ")
    assert f"pass {name}='cpu' or leave it unset" in message


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="this machine has a cuda:3")
def test_a_missing_cuda_index_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^policy_device='cuda:3' (but this machine has "
                                         r"(no CUDA device|\d cuda device))"):
        multi(policy_device="cuda:3")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_mps_without_mps_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^device='mps' but MPS \(Apple GPUs\) is not available"):
        in_process(device="mps")


@pytest.mark.parametrize("value", ["meta", torch.device("meta")])
def test_meta_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"^storing_device=.*meta.*: a meta tensor holds no data"):
        multi(storing_device=value)


@pytest.mark.parametrize(("value", "expected"), [
    ("gpu", r"^device='gpu' is not a device: expected a torch.device or a device name"),
    (True, r"^device must be a torch.device, a device name .* got bool True"),
    (["cpu", "cpu"], r"^device=\['cpu', 'cpu'\]: one device for every worker is supported"),
])
def test_values_that_are_not_one_device_are_refused(value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        multi(device=value)


def test_an_unavailable_accelerator_type_is_refused() -> None:
    accelerator = torch.accelerator.current_accelerator() \
        if torch.accelerator.is_available() else None
    if accelerator is not None and accelerator.type == "xpu":
        pytest.skip("this machine has an XPU")
    with pytest.raises(ValueError, match=r"^env_device='xpu': device type 'xpu' is not "
                                         r"available on this machine"):
        check_device("env_device", "xpu")


@no_cuda
def test_the_worker_cli_checks_its_device_on_its_host() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", "tcp://127.0.0.1:1",
         "--env", "CartPole-v1", "--device", "cuda"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("asyncrl worker: --device='cuda' but this machine has no "
                                  "CUDA device")


# -- the policy runs on policy_device -----------------------------------------------------------
def test_a_module_elsewhere_than_policy_device_is_refused_by_the_rollout() -> None:
    policy = nn.Linear(2, 2, device="meta")
    with pytest.raises(ValueError, match=r"^the policy's 'weight' is on meta but policy_device "
                                         r"is cpu: move the policy there once"):
        check_policy_device(policy, CPU)


def test_place_policy_moves_a_workers_own_module_and_copies_the_trainers() -> None:
    policy = nn.Linear(2, 2)
    assert place_policy(policy, CPU, copy_module=True) is policy  # already there: no copy
    assert place_policy(policy, None, copy_module=True) is policy
    meta = torch.device("meta")  # any other device shows the move; meta needs no hardware
    copied = place_policy(policy, meta, copy_module=True)
    assert copied is not policy and copied.weight.device == meta
    assert policy.weight.device == CPU  # the trainer's module stays where it is
    moved = place_policy(policy, meta, copy_module=False)
    assert moved is policy and policy.weight.device == meta


def collect_probe(monkeypatch: pytest.MonkeyPatch | None) -> tuple[object, list[object]]:
    """One batch of a DeviceProbe rollout; with ``monkeypatch`` through a DevicePolicyCall."""
    seen: list[object] = []
    probe = DeviceProbe(1.0)

    def policy(td: object) -> object:
        seen.append(td.get("observation"))  # type: ignore[attr-defined]
        return probe(td)  # type: ignore[arg-type]

    if monkeypatch is not None:
        # The device path on the CPU: observations are copied into the call's own
        # tensors and actions copied back, as they are for a CUDA policy.
        monkeypatch.setattr(DeviceLayout, "moves_observations", property(lambda self: True))
    with Rollout(make_env_pool(counting, num_envs=2), policy, 8,
                 options=RolloutOptions(policy_device="cpu")) as rollout:
        batches = [rollout.collect().clone() for _ in range(3)]  # buffers reused
        return torch.cat(batches, 1), [rollout.env_pool.obs_arrays[0], *seen]


def test_the_device_path_copies_inputs_in_and_actions_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    direct, (pool_obs, *direct_inputs) = collect_probe(None)
    bridged, (bridge_pool_obs, *bridged_inputs) = collect_probe(monkeypatch)
    # Same frames, actions and extras (the probe's keys, kept on the device side, then
    # copied once per batch) either way.
    assert (direct == bridged).all()  # type: ignore[union-attr]
    assert direct["probe", "value"].eq(1.0).all()  # type: ignore[index]
    # A host policy reads the pool's own buffer (no copy) ...
    assert all(t.data_ptr() == torch.from_numpy(pool_obs).data_ptr()  # type: ignore[arg-type]
               for t in direct_inputs)
    # ... the device path one tensor of its own, the same at every step (no allocation).
    pointers = {t.data_ptr() for t in bridged_inputs}  # type: ignore[attr-defined]
    assert len(pointers) == 1
    assert pointers != {torch.from_numpy(bridge_pool_obs).data_ptr()}  # type: ignore[arg-type]


def test_device_policy_call_allocates_its_inputs_once() -> None:
    obs = torch.zeros(2, 3)
    call = DevicePolicyCall(lambda td: td.set("action", td["observation"].sum(-1)),
                            ["observation"], [obs], CPU, action=torch.zeros(2))
    inputs = call.inputs[0]
    obs.fill_(2.0)
    assert call(None)["action"].tolist() == [6.0, 6.0]
    assert call.td.get("observation") is inputs and inputs.data_ptr() != obs.data_ptr()


async def probe_batches(collector: object, count: int = 2) -> list[object]:
    batches = []
    with anyio.fail_after(LIMIT):
        async with collector:  # type: ignore[attr-defined]
            async for batch in collector:  # type: ignore[attr-defined]
                batches.append(batch)
                if len(batches) == count:
                    break
    return batches


def makers(device: str) -> list[object]:
    return [
        lambda **kw: Collector(counting, DeviceProbe(1.0), frames_per_batch=8, **kw),
        lambda **kw: MultiSyncCollector(counting, DeviceProbe(1.0), num_workers=1,
                                        frames_per_batch=8, **kw),
        lambda **kw: MultiAsyncCollector(counting, DeviceProbe(1.0), num_workers=1,
                                         frames_per_batch=8, **kw),
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("which", [0, 1, 2], ids=["Collector", "MultiSync", "MultiAsync"])
async def test_the_policy_sees_inputs_on_policy_device_cpu(which: int) -> None:
    collector = makers("cpu")[which](policy_device="cpu", storing_device="cpu")  # type: ignore[operator]
    for batch in await probe_batches(collector):
        assert batch.device == CPU  # type: ignore[attr-defined]
        assert batch["probe", "input"].eq(0).all()  # type: ignore[index]
        assert batch["probe", "param"].eq(0).all()  # type: ignore[index]


# -- CUDA (run on a GPU machine) ------------------------------------------------------------------
@needs_cuda
@pytest.mark.anyio
@pytest.mark.parametrize("which", [0, 1, 2], ids=["Collector", "MultiSync", "MultiAsync"])
async def test_the_policy_runs_on_cuda_and_batches_are_stored_there(which: int) -> None:
    collector = makers("cuda")[which](device="cuda")  # type: ignore[operator]
    assert collector.devices.storing_device == torch.device("cuda", 0)  # type: ignore[attr-defined]
    for batch in await probe_batches(collector):
        assert batch.device == torch.device("cuda", 0)  # type: ignore[attr-defined]
        assert batch["probe", "input"].eq(1).all()  # type: ignore[index]
        assert batch["probe", "param"].eq(1).all()  # type: ignore[index]


@needs_cuda
@pytest.mark.anyio
@pytest.mark.parametrize("which", [0, 1], ids=["Collector", "MultiSync"])
async def test_cuda_policy_with_batches_stored_on_the_cpu(which: int) -> None:
    collector = makers("cuda")[which](policy_device="cuda", storing_device="cpu")  # type: ignore[operator]
    for batch in await probe_batches(collector):
        assert batch.device == CPU  # type: ignore[attr-defined]
        assert batch["probe", "input"].eq(1).all()  # type: ignore[index]


@needs_cuda
@pytest.mark.anyio
@pytest.mark.parametrize("which", [0, 1], ids=["Collector", "MultiSync"])
async def test_weights_reach_the_policy_on_its_cuda_device(which: int) -> None:
    policy = DeviceProbe(1.0)  # the trainer's, on the CPU
    if which == 0:
        collector = Collector(counting, policy, frames_per_batch=8, policy_device="cuda")
    else:
        collector = MultiSyncCollector(counting, policy, num_workers=1, frames_per_batch=8,
                                       policy_device="cuda")
    with anyio.fail_after(LIMIT):
        async with collector:
            first = await collector.__anext__()
            assert first["probe", "value"].eq(1.0).all()
            with torch.no_grad():
                policy.value.fill_(-2.0)
            await collector.update_policy_weights()
            second = await collector.__anext__()
    assert policy.value.device == CPU  # the trainer's module stayed where it was
    assert second["probe", "param"].eq(1).all()
    assert second["probe", "value"].eq(-2.0).all()
    assert second["action"].eq(0).all()


@needs_cuda
def test_env_device_must_be_the_host_or_the_policy_device() -> None:
    with pytest.raises(ValueError, match=r"^env_device=cuda:0 with policy_device=cpu: "):
        DeviceLayout.resolve(env_device="cuda", policy_device="cpu")
    assert DeviceLayout.resolve(device="cuda").env_device == torch.device("cuda", 0)


@needs_cuda
def test_cuda_rollout_buffers_are_pinned() -> None:
    with Rollout(make_env_pool(counting, num_envs=2), None, 8,
                 options=RolloutOptions(storing_device="cuda")) as rollout:
        batch = rollout.collect()
        assert batch.device == torch.device("cuda", 0) or batch.device.type == "cuda"
        assert rollout.buffers.data[("observation",)].is_pinned()
    with Rollout(make_env_pool(counting, num_envs=2), DeviceProbe(1.0).cuda(), 8,
                 options=RolloutOptions(policy_device="cuda:0")) as rollout:
        batch = rollout.collect()
        assert batch.device is None and batch["probe", "input"].eq(1).all()
        buffers = rollout.buffers
        assert buffers.act_t.is_pinned() and buffers.data[("probe", "value")].is_pinned()


# -- remote workers: `asyncrl worker --device` --------------------------------------------------
async def remote_probe_batch(device: str) -> object:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("asyncrl.testing:CountingEnv", num_workers=0,
                                      remote_workers=1, listen="tcp://127.0.0.1:0",
                                      frames_per_batch=8, total_frames=8,
                                      storing_device="cpu") as collector:
            host = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect",
                 collector.endpoint, "--env", "asyncrl.testing:CountingEnv",
                 "--policy", "tests.asyncrl.device_probe:DeviceProbe", "--device", device],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                batches = [b async for b in collector]
            except BaseException:
                host.kill()
                raise
        code = await wait_exit(host)  # told to close when the collector closed
    assert code == 0, host.stdout.read()  # type: ignore[union-attr]
    (batch,) = batches
    assert batch.device == CPU  # stored by the trainer
    return batch


# The device is chosen and checked inside the `asyncrl worker` process, which runs
# its own event loop whatever the trainer's: one backend is enough for this (slow:
# a fresh interpreter) check. A remote worker joining a collector on trio is covered
# by tests/multihost/test_remote_workers.py (both backends).
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_remote_worker_runs_its_policy_on_its_device_cpu() -> None:
    batch = await remote_probe_batch("cpu")
    assert batch["probe", "input"].eq(0).all()  # type: ignore[index]
    assert batch["probe", "param"].eq(0).all()  # type: ignore[index]


@needs_cuda
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_remote_worker_runs_its_policy_on_its_device_cuda() -> None:
    batch = await remote_probe_batch("cuda")
    assert batch["probe", "input"].eq(1).all()  # type: ignore[index]
    assert batch["probe", "param"].eq(1).all()  # type: ignore[index]


def test_ray_actors_check_their_device_where_they_run() -> None:
    pytest.importorskip("ray")
    from asyncrl.launch.ray import _host_spec, _spec_kwargs

    spec = _host_spec(_spec_kwargs("CartPole-v1", None, 2, "cpu"))
    assert spec.rollout.policy_device == CPU and spec.envs_per_worker == 2
    assert _host_spec(_spec_kwargs("CartPole-v1", None, 1)).rollout.policy_device is None
    if not has_cuda:
        with pytest.raises(ValueError, match=r"^--device='cuda' but this machine has no CUDA"):
            _host_spec(_spec_kwargs("CartPole-v1", None, 1, "cuda"))
