"""Memory (PSS) of a 4-env pixel run: asyncrl's workers against gymnasium's AsyncVectorEnv.

    python -m benchmarks.pixels                     # 3 repeats, interleaved
    python -m benchmarks.pixels --repeats 5 --batches 20 --cases vector,asyncrl,asyncrl-late

A synthetic Atari-like env (``PixelEnv``: 4x84x84 uint8 frames, 6 actions, a cheap
step, episodes of 500 steps) and a small CNN (Nature-DQN shaped, narrower) that picks
the arg-max action. Each case runs in a fresh interpreter (one after the other, in
turn, repeated), collects ``--batches`` batches of 512 frames, then reads the
proportional set size (PSS: shared pages divided among the processes that map them,
``/proc/<pid>/smaps_rollup``) of the trainer and of every process below it, while the
run is still alive (and, for context, frames/s over the batches after the first):

- ``vector``: ``gymnasium.vector.AsyncVectorEnv(shared_memory=True)``, 4 envs, the CNN
  batched in the trainer (the baseline of issue 38);
- ``asyncrl``: ``MultiSyncCollector``, 4 workers x 1 env, the CNN in each worker;
- ``asyncrl-late``: the same with ``ASYNCRL_EARLY_FORK_SERVER=0`` (the fork server
  spawned by the collector's constructor, as before);
- ``asyncrl-2x2``: ``MultiAsyncCollector``, 2 workers x 2 envs (the fastest layout of
  :mod:`benchmarks.pixels_throughput`), not in the default set.

Each process's PSS is split by what its pages map: torch's libraries, other shared
libraries, anonymous memory (Python objects, tensors, malloc), shared memory, other
files (``/proc/<pid>/smaps``). Target (issue 38 item 3): asyncrl's total <= 1.5x
``vector``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

if os.environ.get("PIXELS_CASE", "").startswith("asyncrl"):
    # As a training script does: at module level, which starts the fork server early
    # (an import inside a function does not: asyncrl/_spawn/early.py).
    import asyncrl  # noqa: F401

OBS_SHAPE = (4, 84, 84)
N_ACTIONS = 6
EPISODE = 500
N_ENVS = 4
FRAMES_PER_BATCH = 512


class PixelEnv:
    """Atari-shaped frames for almost no work: a step rolls a preallocated frame stack."""

    metadata: dict[str, Any] = {"render_modes": []}
    render_mode = None
    spec = None

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(N_ACTIONS)
        self._frames = np.random.default_rng(0).integers(0, 255, (8, *OBS_SHAPE), np.uint8)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        self._t = 0
        return self._frames[0], {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._t += 1
        return self._frames[self._t % 8], float(action == 1), False, self._t >= EPISODE, {}

    def close(self) -> None:
        pass

    @property
    def unwrapped(self) -> PixelEnv:
        return self

    def get_wrapper_attr(self, name: str) -> Any:
        return getattr(self, name)


class Env(gym.Env):  # type: ignore[misc]
    """``PixelEnv`` behind the checks gymnasium's vector envs expect."""

    def __init__(self) -> None:
        self.inner = PixelEnv()
        self.observation_space = self.inner.observation_space
        self.action_space = self.inner.action_space

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        return self.inner.reset()

    def step(self, action: Any) -> Any:
        return self.inner.step(action)


def make_env() -> Env:
    """The pixel env, as a gymnasium env."""
    return Env()


class CNN(nn.Module):
    """uint8 frames [..., 4, 84, 84] -> arg-max action [...]: a small Nature-DQN shape."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(4, 16, 8, stride=4), nn.ReLU(), nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 7 * 7, 256),
            nn.ReLU(), nn.Linear(256, N_ACTIONS))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        batch = obs.shape[:-3]
        logits = self.body(obs.reshape(-1, *OBS_SHAPE).float() / 255.0)
        return logits.reshape(*batch, N_ACTIONS).argmax(-1)


def make_cnn() -> CNN:
    """The CNN, seeded."""
    torch.manual_seed(0)
    return CNN()


# -- what a process's memory is made of -------------------------------------------------------
def pss_kb(pid: int) -> int:
    """``Pss`` of ``smaps_rollup`` in kB (0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def breakdown_kb(pid: int) -> dict[str, int]:
    """PSS by kind of mapping, from ``/proc/<pid>/smaps``."""
    out: dict[str, int] = defaultdict(int)
    kind = "anonymous"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(maxsplit=1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's header
                    parts = line.split()
                    kind = _kind(parts[5] if len(parts) > 5 else "")
                elif first == "Pss:":
                    out[kind] += int(line.split()[1])
    except OSError:
        pass
    return dict(out)


def _kind(path: str) -> str:
    if not path or path.startswith("[heap") or path.startswith("[anon") or path == "[stack]":
        return "anonymous"
    if "/torch/" in path:
        return "torch libraries"
    if path.startswith("/dev/shm") or path.startswith("/memfd") or "(deleted)" in path:
        return "shared memory"
    if ".so" in path or path.endswith("python3.11") or "/bin/python" in path:
        return "other libraries"
    return "other files"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def role(pid: int, trainer: int, workers: set[int], server: int | None) -> str:
    """What a process is: trainer, worker, fork server, resource tracker or env worker."""
    if pid == trainer:
        return "trainer"
    if pid in workers:
        return "worker"
    if pid == server:
        return "fork server"
    if pid == _torch_free_server():
        return "torch-free fork server"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode()
    except OSError:
        cmd = ""
    return "resource tracker" if "resource_tracker" in cmd else "env worker"


def _torch_free_server() -> int | None:
    """The pid of central inference's torch-free fork server, if this process runs one."""
    module = sys.modules.get("asyncrl._spawn.torch_free")  # (never imported here for it)
    server = getattr(module, "_server", None)
    return vars(server).get("_forkserver_pid") if server is not None else None


def by_role_mb(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """``snapshot``'s processes summed by role: ``{role: [count, PSS MB]}``."""
    out: dict[str, list[float]] = {}
    for row in rows:
        count, total = out.get(row["role"], [0, 0.0])
        out[row["role"]] = [count + 1, total + row["pss_mb"]]
    return out


def by_kind_mb(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``snapshot``'s processes summed by role, then by kind of mapping: ``{role: {kind: MB}}``."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        by_kind = out.setdefault(row["role"], {})
        for kind, mb in row["kinds_mb"].items():
            by_kind[kind] = by_kind.get(kind, 0.0) + mb
    return out


def snapshot(workers: set[int]) -> dict[str, Any]:
    """PSS of this process and its descendants, per process and by kind (MB)."""
    from multiprocessing import forkserver

    server = vars(forkserver._forkserver).get("_forkserver_pid")  # noqa: SLF001
    me = os.getpid()
    rows = []
    for pid in [me, *descendants(me)]:
        pss = pss_kb(pid)
        if pss:
            rows.append({"pid": pid, "role": role(pid, me, workers, server), "pss_mb": pss / 1024,
                         "kinds_mb": {k: v / 1024 for k, v in breakdown_kb(pid).items()}})
    return {"total_mb": sum(r["pss_mb"] for r in rows), "processes": rows}


# -- the two runs (each in its own interpreter) ---------------------------------------------
def run_vector(batches: int) -> dict[str, Any]:
    """AsyncVectorEnv(shared_memory=True), 4 envs, the CNN batched in the trainer."""
    cnn = make_cnn()
    envs = gym.vector.AsyncVectorEnv([make_env] * N_ENVS, shared_memory=True)
    obs, _ = envs.reset(seed=0)
    steps = FRAMES_PER_BATCH // N_ENVS
    with torch.no_grad():
        for step in range(batches * steps):
            if step == steps:  # the first batch (warm-up) is not timed, as for asyncrl
                start = time.perf_counter()
            action = cnn(torch.from_numpy(obs)).numpy()
            obs, *_ = envs.step(action)
    rate = (batches - 1) * FRAMES_PER_BATCH / (time.perf_counter() - start)
    result = {**snapshot(set()), "frames_per_s": rate}
    envs.close()
    return result


def run_asyncrl(batches: int, envs_per_worker: int = 1, sync: bool = True,
                compact_obs: bool = False) -> dict[str, Any]:
    """MultiSyncCollector, 4 workers x 1 env, the CNN in each worker (or ``4 / envs_per_worker``
    workers, each stepping its envs together and calling the CNN once for them); with
    ``compact_obs`` the next observations are neither kept nor shipped (AsyncVectorEnv
    has none either: its user keeps the previous observation)."""
    import anyio
    from tensordict.nn import TensorDictModule

    from asyncrl import MultiAsyncCollector, MultiSyncCollector

    policy = TensorDictModule(make_cnn(), in_keys=["observation"], out_keys=["action"])
    result: dict[str, Any] = {}
    cls = MultiSyncCollector if sync else MultiAsyncCollector

    async def main() -> None:
        async with cls(make_env, policy, num_workers=N_ENVS // envs_per_worker,
                       envs_per_worker=envs_per_worker, compact_obs=compact_obs,
                       frames_per_batch=FRAMES_PER_BATCH) as collector:
            count = 0
            async for _ in collector:
                count += 1
                if count == 1:
                    start = time.perf_counter()
                if count == batches:
                    rate = (batches - 1) * FRAMES_PER_BATCH / (time.perf_counter() - start)
                    result.update(snapshot(set(collector.worker_pids)), frames_per_s=rate)
                    break

    anyio.run(main)
    return result


#: case -> (environment, runner, runner's keyword arguments)
CASES: dict[str, tuple[dict[str, str], str, dict[str, Any]]] = {
    "vector": ({}, "run_vector", {}),
    "asyncrl": ({}, "run_asyncrl", {}),
    "asyncrl-late": ({"ASYNCRL_EARLY_FORK_SERVER": "0"}, "run_asyncrl", {}),
    # the fastest asyncrl layout of benchmarks.pixels_throughput: 2 workers x 2 envs, async
    "asyncrl-2x2": ({}, "run_asyncrl", {"envs_per_worker": 2, "sync": False}),
    # what docs/data_plane.md advises pixel users: next observations not kept twice
    "asyncrl-compact": ({}, "run_asyncrl", {"compact_obs": True}),
}


def _child(case: str, batches: int) -> None:
    _env, runner, kwargs = CASES[case]
    result = globals()[runner](batches, **kwargs)
    print("RESULT " + json.dumps(result), flush=True)


def run_case(case: str, batches: int) -> dict[str, Any]:
    """One case in a fresh interpreter (its own trainer, its own fork server)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, **CASES[case][0], "PIXELS_CASE": case}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-m", "benchmarks.pixels", "--child", case,
                          "--batches", str(batches)], capture_output=True, text=True,
                         env=env, cwd=root, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{case} exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(lines[0][len("RESULT "):])


def by_role(result: dict[str, Any]) -> dict[str, tuple[int, float, dict[str, float]]]:
    """role -> (processes, PSS MB, PSS MB by kind), summed over that role's processes."""
    out: dict[str, tuple[int, float, dict[str, float]]] = {}
    for row in result["processes"]:
        count, total, kinds = out.get(row["role"], (0, 0.0, {}))
        for kind, mb in row["kinds_mb"].items():
            kinds[kind] = kinds.get(kind, 0.0) + mb
        out[row["role"]] = (count + 1, total + row["pss_mb"], kinds)
    return out


def report(cases: list[str], results: dict[str, list[dict[str, Any]]]) -> None:
    """Medians of the totals, the ratio to ``vector``, and the last repeat's breakdown."""
    print("\ncommand: python -m benchmarks.pixels " + shlex.join(sys.argv[1:]))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    medians = {c: statistics.median(r["total_mb"] for r in results[c]) for c in cases}
    for case in cases:
        totals = ", ".join(f"{r['total_mb']:.0f}" for r in results[case])
        ratio = f" = {medians[case] / medians['vector']:.2f}x vector" if "vector" in medians else ""
        rate = statistics.median(r.get("frames_per_s", 0.0) for r in results[case])
        print(f"  {case:13s} PSS median {medians[case]:.0f} MB{ratio}  (runs: {totals}); "
              f"{rate:,.0f} frames/s (median; a busy machine moves it, memory less)")
    kinds = ["torch libraries", "other libraries", "anonymous", "shared memory", "other files"]
    print("\n| case | process | n | PSS MB | " + " | ".join(kinds) + " |")
    print("|---|---|---|---|" + "---|" * len(kinds))
    for case in cases:
        for name, (count, total, per_kind) in sorted(by_role(results[case][-1]).items()):
            cells = " | ".join(f"{per_kind.get(k, 0.0):.0f}" for k in kinds)
            print(f"| {case} | {name} | {count} | {total:.0f} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--cases", default="vector,asyncrl,asyncrl-late")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write every run's numbers here")
    args = parser.parse_args()
    if args.batches < 2:
        parser.error(f"--batches must be at least 2 (the first one is not timed), got "
                     f"{args.batches}")
    if args.child:
        _child(args.child, args.batches)
        return
    cases = args.cases.split(",")
    results = interleave(cases, args.repeats, lambda case: run_case(case, args.batches),
                         lambda row: f"{row['total_mb']:.0f} MB", args.json)
    report(cases, results)


def interleave(cases: list[str], repeats: int, run: Any, shown: Any,
               json_path: str | None) -> dict[str, list[dict[str, Any]]]:
    """Run every case in turn, ``repeats`` times (load drifts over all of them alike),
    printing each repeat's line; the rows per case, also written to ``json_path``."""
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for repeat in range(repeats):
        for case in cases:
            results[case].append(run(case))
        print(f"repeat {repeat}: " + ", ".join(
            f"{c} {shown(results[c][-1])}" for c in cases), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
