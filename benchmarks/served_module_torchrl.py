"""TorchRL's cases of ``benchmarks.served_module``: its ``RayModuleTransform`` and a copy per env.

Run through ``python -m benchmarks.served_module --torchrl`` (its docstring has the
workload). The same reward MLP, CartPole-v1 (TorchRL's ``GymEnv``), a random policy
(the collector's own, ``policy=None``), TorchRL's ``MultiSyncCollector`` with
``--workers`` workers, each a ``SerialEnv`` of ``--envs-per-worker`` envs, and
``--frames-per-batch``:

- ``torchrl-ray``: one ``ModuleTransform(use_ray_service=True, actor_name=...)``
  (TorchRL's ``RayModuleTransform``: the module in one Ray actor) built by the trainer;
  every env of every worker gets a transform on that named actor (each env calls it at
  every step: ``ray.get`` of one remote call). With ``--update-weights`` the trainer
  pushes new weights through ``RayModuleTransformScheme`` after each batch.
  The workers join the case's Ray cluster by its address (not ``address="auto"``:
  other Ray clusters may run on the machine).
- ``torchrl-ray-worker``: the same actor, its transform on each worker's ``SerialEnv``
  instead of on each env: one call per worker step for all its envs (TorchRL's way to
  batch the calls a worker makes; asyncrl batches across workers);
- ``torchrl-copied``: each env's transform is a plain ``ModuleTransform`` over the
  worker's copy of the model (one copy per worker process, shared by its envs, as in
  the ``copied`` case).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

#: TorchRL's cases, in the order each repeat runs them.
CASES = ("torchrl-ray", "torchrl-ray-worker", "torchrl-copied")
#: The Ray namespace the trainer and the workers share (named actors live in one).
NAMESPACE = "asyncrl-served-bench"


def missing(case: str) -> str | None:
    """Why ``case`` cannot run here (None: it can)."""
    try:
        import torchrl.collectors
        import torchrl.envs  # noqa: F401
    except Exception as exc:  # not installed, or broken against this torch
        return f"torchrl is not importable ({type(exc).__name__}: {exc})"
    if case.startswith("torchrl-ray"):
        try:
            import ray  # noqa: F401
        except Exception as exc:
            return f"ray is not importable ({type(exc).__name__}: {exc})"
    return None


def reward_module(hidden: int) -> Any:
    """The reward MLP as TorchRL's transform wants it: ``observation -> reward``.

    The transform runs on the step's ``next`` tensordict, so its ``observation`` is
    the next observation, as ``ServedReward`` and ``CopiedReward`` see it.
    """
    import torch
    from tensordict.nn import TensorDictModule

    from benchmarks.served_module import reward_model

    torch.set_num_threads(1)  # as the asyncrl hosts (threads=1) and the copied workers
    return TensorDictModule(reward_model(hidden), in_keys=["observation"], out_keys=["reward"])


@functools.cache  # one copy per worker process, shared by its envs
def shared_module(hidden: int) -> Any:
    return reward_module(hidden)


def _no_second_actor() -> Any:
    raise RuntimeError("the trainer's reward actor is gone: a worker found no actor by its "
                       "name and would have started a second one")


def _transform(actor_name: str | None, hidden: int) -> Any:
    from torchrl.envs.transforms import ModuleTransform

    if actor_name is None:
        return ModuleTransform(module=shared_module(hidden), no_grad=True)
    return ModuleTransform(module_factory=_no_second_actor, no_grad=True,
                           use_ray_service=True, actor_name=actor_name)


def _cartpole() -> Any:
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def _one_env(actor_name: str | None, hidden: int) -> Any:
    from torchrl.envs import TransformedEnv

    return TransformedEnv(_cartpole(), _transform(actor_name, hidden))


def worker_env(envs: int, hidden: int, actor_name: str | None = None,
               address: str | None = None, per_worker: bool = False) -> Any:
    """A worker's envs: a ``SerialEnv`` of ``envs`` CartPoles, each with its transform
    (``per_worker``: one transform on the ``SerialEnv``)."""
    import warnings

    from torchrl.envs import SerialEnv, TransformedEnv

    warnings.filterwarnings("ignore", category=FutureWarning)  # use_ray_service's rename
    if address is not None:
        import ray

        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        ray.get_actor(actor_name)  # ValueError now, not a second actor later
    if per_worker:
        return TransformedEnv(SerialEnv(envs, _cartpole), _transform(actor_name, hidden))
    one = functools.partial(_one_env, actor_name, hidden)
    return one() if envs == 1 else SerialEnv(envs, one)


def versioned(base: Any, version: int) -> Any:
    """The TensorDict of parameters of ``version`` (see ``served_module.versioned``)."""
    import torch
    from tensordict import TensorDict

    with torch.no_grad():
        params = TensorDict.from_module(base).clone()
        params["module", "6", "bias"] += version
    return params


def run_case(case: str, args: Any) -> dict[str, float]:
    """One TorchRL case in this (fresh) interpreter, measured as ``served_module.run_case``."""
    import warnings

    import torch
    from torchrl.collectors import MultiSyncCollector

    from benchmarks.served_module import check_rewards, measure_pss, ray_init

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    ray = None
    actor_name = address = None
    if case.startswith("torchrl-ray"):
        import ray

        context = ray_init(namespace=NAMESPACE)
        address = context.address_info["address"]
        actor_name = f"served-bench-reward-{os.getpid()}"
    try:
        start = time.monotonic()
        scheme = transform = None
        if ray is not None:
            from torchrl.envs.transforms import ModuleTransform
            from torchrl.weight_update import RayModuleTransformScheme

            # The one actor every env calls, built here: the trainer owns it and, with the
            # scheme, is rank 0 of its weight group
            options = {}
            if args.update_weights:
                options["weight_sync_scheme"] = scheme = RayModuleTransformScheme()
            transform = ModuleTransform(
                module_factory=functools.partial(reward_module, args.hidden), no_grad=True,
                use_ray_service=True, actor_name=actor_name, **options)
        factory = functools.partial(worker_env, args.envs_per_worker, args.hidden,
                                    actor_name, address, case == "torchrl-ray-worker")
        collector = MultiSyncCollector(
            [factory] * args.workers, None, frames_per_batch=args.frames_per_batch,
            total_frames=args.frames_per_batch * (args.batches + 1))
        base = reward_module(args.hidden)  # the trainer's model (what it would train)
        version = 0
        batches = []
        update_s = []
        try:
            first = steady = 0.0
            frames = 0
            for batch in collector:
                now = time.monotonic()
                if not first:
                    first, steady = now - start, now
                else:
                    frames += batch.numel()
                batches.append((batch["next", "observation"], batch["next", "reward"], version))
                if scheme is not None:
                    t0 = time.monotonic()
                    version += 1
                    scheme.send(versioned(base, version))
                    update_s.append(time.monotonic() - t0)
            elapsed = time.monotonic() - steady
            pss = measure_pss()
        finally:
            collector.shutdown()
            if transform is not None and scheme is not None:
                scheme.shutdown()
        checked = check_rewards(base.module, batches)
        out = {"start_s": first, "frames_s": frames / elapsed, "pss_mb": pss, **checked}
        if update_s:
            out["update_ms"] = 1000 * sorted(update_s)[len(update_s) // 2]
        return out
    finally:
        if ray is not None:
            ray.shutdown()
