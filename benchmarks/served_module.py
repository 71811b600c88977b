"""A reward model served once (asyncrl.ServedModule) against a copy of it in every worker.

    python -m benchmarks.served_module                     # 3 repeats, interleaved
    python -m benchmarks.served_module --hidden 2048 --workers 2 --envs-per-worker 4 --repeats 3
    python -m benchmarks.served_module --ray --torchrl --update-weights   # TorchRL beside

Every case collects CartPole-v1 with a random policy on a multi-process sync collector
(``--workers`` x ``--envs-per-worker`` envs, ``--frames-per-batch``) whose reward comes
from the same MLP reward model (``next_observation -> reward``, ``--hidden`` units, 3
hidden layers):

- ``served``: one ``ServedModule`` in the trainer's process; every env calls it through
  ``asyncrl.ServedReward`` (its calls batched across envs);
- ``served-process``: the same, hosted in a process of its own
  (``server_backend="process"``);
- ``served-ray`` (with ``--ray``): the same, hosted in a Ray actor
  (``server_backend="ray"``) of a local Ray cluster the case starts (``ray.init``);
- ``torchrl-ray``, ``torchrl-ray-worker`` and ``torchrl-copied`` (with ``--torchrl``):
  TorchRL's ``MultiSyncCollector`` over ``SerialEnv`` workers, the reward from TorchRL's
  ``RayModuleTransform`` (one Ray actor every env calls, or every worker for its envs)
  or from a ``ModuleTransform`` on each env over its worker's copy
  (:mod:`benchmarks.served_module_torchrl`);
- ``copied``: each worker process builds its own copy of the model (one per worker,
  shared by its envs' wrappers) and each env calls it at every step.

``--cases`` picks cases by name instead. ``--update-weights``: after every batch the
trainer pushes new weights to the served module (``ServedModule.update``, or
``RayModuleTransformScheme.send`` for the ``torchrl-ray`` cases); copies are never updated.

Each case runs in a fresh interpreter; repeats alternate the cases. Reported per case:
``start_s`` (from opening the module / collector to the first batch; the Ray cases count
from after ``ray.init``), ``frames_s`` (frames per second over the batches after the
first, weight pushes included), ``pss_mb`` (the summed proportional set size of the
trainer and every process below it, read after the last batch while they are alive;
Ray's own daemons are left out, its actors counted: :func:`measure_pss`), ``update_ms``
(median push). Every frame's reward is checked against the model applied to its next
observation at a version the module had then (:func:`check_rewards`): a case that
computes anything else fails. Medians over the repeats, and ratios.
``SERVED_BENCH_PSS=N`` in the environment prints each process's PSS, counted or not, and
the first N bytes of its command line (on stderr of ``--case CASE``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks import served_module_torchrl as torchrl_cases
from benchmarks.pixels import descendants, pss_kb

#: The cases, in the order each repeat runs them (``copied``, the reference, last).
CASES = ("served", "served-process", "served-ray", *torchrl_cases.CASES, "copied")
BACKENDS = {"served": "thread", "served-process": "process", "served-ray": "ray"}


@functools.cache  # one copy per process (per worker, in ``copied``)
def shared_copy(hidden: int) -> Any:
    return reward_model(hidden)


def reward_model(hidden: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))


class CopiedReward(gym.Wrapper):  # type: ignore[type-arg]
    """The reward model copied into this env's process, called at every step."""

    def __init__(self, env: gym.Env, hidden: int) -> None:  # type: ignore[type-arg]
        import torch

        super().__init__(env)
        torch.set_num_threads(1)
        self.model = shared_copy(hidden)

    def step(self, action: Any) -> Any:
        import torch

        obs, _, terminated, truncated, info = self.env.step(action)
        with torch.no_grad():
            reward = float(self.model(torch.from_numpy(np.asarray(obs, np.float32))[None]))
        return obs, reward, terminated, truncated, info


def copied_env(hidden: int) -> gym.Env:  # type: ignore[type-arg]
    return CopiedReward(gym.make("CartPole-v1"), hidden)


def served_env(handle: Any) -> gym.Env:  # type: ignore[type-arg]
    from asyncrl import ServedReward

    return ServedReward(gym.make("CartPole-v1"), handle)


async def run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    """One asyncrl case in this (fresh) interpreter."""
    if case != "served-ray":
        return await _run_case(case, args)
    import ray

    ray_init()
    try:
        return await _run_case(case, args)
    finally:
        ray.shutdown()  # stops the cluster this case started


def ray_init(**options: Any) -> Any:
    """Start a Ray cluster of this case's own (never join one already on the machine)."""
    import ray

    return ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                    log_to_driver=False, **options)


async def _run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    import contextlib

    import torch

    from asyncrl import MultiSyncCollector, ServedModule

    torch.set_num_threads(1)
    start = time.monotonic()
    actor = -1
    served = None
    async with contextlib.AsyncExitStack() as stack:
        if case.startswith("served"):
            served = await stack.enter_async_context(ServedModule(
                reward_model(args.hidden), name="reward",
                example={"next_observation": torch.zeros(4)},
                clients=args.workers * args.envs_per_worker, threads=1,
                server_backend=BACKENDS[case]))
            actor = served.pid if case == "served-ray" else -1
            factory = functools.partial(served_env, served.handle)
        else:
            factory = functools.partial(copied_env, args.hidden)
        collector = await stack.enter_async_context(MultiSyncCollector(
            factory, num_workers=args.workers, envs_per_worker=args.envs_per_worker,
            frames_per_batch=args.frames_per_batch,
            total_frames=args.frames_per_batch * (args.batches + 1)))
        base = reward_model(args.hidden)  # the trainer's model (what it would train)
        first = steady = 0.0
        frames = version = 0
        batches = []
        update_s = []
        async for batch in collector:
            now = time.monotonic()
            if not first:
                first, steady = now - start, now
            else:
                frames += batch.numel()
            batches.append((batch["next", "observation"], batch["next", "reward"], version))
            if served is not None and args.update_weights:
                t0 = time.monotonic()
                version += 1
                await served.update(versioned(base, version))
                update_s.append(time.monotonic() - t0)
        elapsed = time.monotonic() - steady
        pss = measure_pss(actor)
    out = {"start_s": first, "frames_s": frames / elapsed, "pss_mb": pss,
           **check_rewards(base, batches)}
    if update_s:
        out["update_ms"] = 1000 * statistics.median(update_s)
    return out


def versioned(base: Any, version: int) -> dict[str, Any]:
    """The weights of ``version``: ``base``'s, its output bias raised by ``version``.

    So a reward computed at version v is the base model's reward + v: the check reads
    each frame's version back from its reward.
    """
    weights = {k: v.detach().clone() for k, v in base.state_dict().items()}
    weights["6.bias"] += version
    return weights


def check_rewards(base: Any, batches: list[tuple[Any, Any, int]]) -> dict[str, float]:
    """Check that every frame's reward is the model applied to its next observation.

    ``batches``: (next observations, rewards, the version pushed before the batch came)
    of each batch. A reward must be ``base(next_observation) + v``, v that version or
    the one before (workers may have begun the batch before the push). Raises
    ``AssertionError`` otherwise: the case did not do the work it is measured for.
    Returns how many frames were checked and the share computed by the newest version.
    """
    import torch

    checked = newest = 0
    for obs, reward, version in batches:
        with torch.no_grad():
            expected = base(obs.reshape(-1, 4).float()).reshape(-1)
        offset = reward.reshape(-1).float() - expected
        v = offset.round()
        err = (offset - v).abs().max().item()
        if err > 1e-3 or v.min() < max(version - 1, 0) or v.max() > version:
            raise AssertionError(
                f"rewards are not the reward model's: largest distance to base + version "
                f"{err:.2e}, versions {v.min().item():.0f}..{v.max().item():.0f} in a batch "
                f"that came at version {version}")
        checked += v.numel()
        newest += int((v == version).sum())
    return {"checked_frames": checked, "newest_version_share": newest / max(checked, 1)}


def measure_pss(actor: int = -1) -> float:
    """PSS (MB) of this process and every one below it, Ray's own daemons left out.

    Ray's daemons (GCS, raylet, dashboard, its agents and idle workers) are this
    driver's children too; of Ray's processes only the actors count (``actor``, and
    every other ``ray::Name`` process but Ray's own agents): the asyncrl host's,
    TorchRL's transform actor and its weight-sync rendezvous actor.
    """
    me = os.getpid()
    counted = [p for p in [me, *descendants(me)] if p == actor or not _ray_daemon(p)]
    if os.environ.get("SERVED_BENCH_PSS"):  # which processes count, on stderr
        for p in [me, *descendants(me)]:
            print(f"PSS {pss_kb(p) // 1024:6d} MB {'counted' if p in counted else 'left  '} "
                  f"{_cmdline(p)[:int(os.environ['SERVED_BENCH_PSS'])]!r}", file=sys.stderr)
    return sum(pss_kb(p) for p in counted) / 1024


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _ray_daemon(pid: int) -> bool:
    argv = _cmdline(pid).split(b"\0")
    if argv[0].startswith(b"ray::"):  # a Ray worker process: its daemons' are named too
        return argv[0] in RAY_DAEMON_WORKERS
    # The program (or the script python runs) only: a process started after ray.init
    # carries Ray's paths in its arguments (the fork server's sys.path, for one)
    return any(b"/ray/" in arg for arg in argv[:3])


#: Ray's own processes that are named like its workers (``ray::Name``): not actors.
RAY_DAEMON_WORKERS = (b"ray::IDLE", b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")


def child(args: argparse.Namespace) -> None:
    if args.case in torchrl_cases.CASES:
        result = torchrl_cases.run_case(args.case, args)
    else:
        import anyio

        result = anyio.run(run_case, args.case, args)
    print("RESULT", json.dumps(result), flush=True)


def run_one(case: str, passed: list[str]) -> dict[str, float] | str:
    """One case in a fresh interpreter: its result, or why it failed."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.served_module", *passed,
                           "--case", case], capture_output=True, text=True, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode or line is None:
        return f"exit {done.returncode}\n{done.stderr[-3000:]}"
    result: dict[str, float] = json.loads(line[len("RESULT "):])
    return result


def pick_cases(args: argparse.Namespace) -> list[str]:
    """The cases asked for, in run order; raises ValueError naming an unknown one."""
    if args.cases:
        asked = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown = [c for c in asked if c not in CASES]
        if unknown:
            raise ValueError(f"unknown cases {unknown}; expected some of {', '.join(CASES)}")
    else:
        asked = ["served", "served-process", "copied"]
        asked += ["served-ray"] if args.ray else []
        asked += list(torchrl_cases.CASES) if args.torchrl else []
    return [c for c in CASES if c in asked]


def ratio_rows(med: dict[str, dict[str, float]]) -> list[tuple[str, str]]:
    """(numerator, denominator) of each ratio row the medians allow."""
    pairs = [(c, "copied") for c in CASES if c.startswith("served")]
    pairs += [(c, "torchrl-copied") for c in torchrl_cases.CASES[:-1]]
    pairs += [("served", "torchrl-ray"), ("served-ray", "torchrl-ray"),
              ("served", "torchrl-ray-worker"), ("served-ray", "torchrl-ray-worker"),
              ("copied", "torchrl-copied")]
    return [(a, b) for a, b in pairs if a in med and b in med]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.served_module",
                                description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--frames-per-batch", type=int, default=512)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray", action="store_true",
                   help="add the served-ray case (a local Ray cluster, the ray extra)")
    p.add_argument("--torchrl", action="store_true",
                   help="add TorchRL's cases: torchrl-ray (its RayModuleTransform on "
                        "each env), torchrl-ray-worker (on each worker's SerialEnv) and "
                        "torchrl-copied (a ModuleTransform per env)")
    p.add_argument("--cases", help="comma-separated cases to run instead: "
                   + ", ".join(CASES))
    p.add_argument("--update-weights", action="store_true",
                   help="push new weights to the served module after every batch (served "
                        "cases: ServedModule.update; torchrl-ray: RayModuleTransformScheme); "
                        "a copy per worker or env cannot be updated")
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        child(args)
        return 0
    try:
        cases = pick_cases(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    for case in [c for c in cases if c in torchrl_cases.CASES]:
        why = torchrl_cases.missing(case)
        if why is not None:
            print(f"# {case} skipped: {why}", flush=True)
            cases.remove(case)
    if not cases:
        print("no case can run here", file=sys.stderr)
        return 2
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    command = "python -m benchmarks.served_module " + " ".join(passed)
    print(f"# {command}\n# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          "(1 min) at the start", flush=True)
    rows: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    failed: set[str] = set()  # not run again
    for _ in range(args.repeats):
        for case in [c for c in rows if c not in failed]:
            result = run_one(case, passed)
            if isinstance(result, str):
                print(f"# {case} failed: {result}", flush=True)
                failed.add(case)
                continue
            rows[case].append(result)
            print(case, result, flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    print(f"command: {command}")
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for c, rs in rows.items() if rs}
    print("| case | start to first batch (s) | frames/s | PSS, all processes (MB) | "
          "update (ms) |")
    print("|---|---|---|---|---|")
    for case, m in med.items():
        update = f"{m['update_ms']:.0f}" if "update_ms" in m else "-"
        print(f"| {case} | {m['start_s']:.1f} | {m['frames_s']:.0f} | {m['pss_mb']:.0f} | "
              f"{update} |")
    for a, b in ratio_rows(med):
        x, y = med[a], med[b]
        print(f"| {a} / {b} | {x['start_s'] / y['start_s']:.2f}x | "
              f"{x['frames_s'] / y['frames_s']:.2f}x | {x['pss_mb'] / y['pss_mb']:.2f}x | |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
