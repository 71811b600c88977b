"""EnvPool at its own speed: asyncrl workers each stepping an EnvPool batch, against EnvPool alone.

    python -m benchmarks.envpool                       # every case, 3 repeats (about 3 min)
    python -m benchmarks.envpool --quick               # smoke run: 1 repeat, short windows
    python -m benchmarks.envpool --cases cleanrl,async-2x8 --repeats 5

Needs ``envpool`` importable (``pip install 'asyncrl[envpool]'``). What runs, in the same
invocation, each case in a fresh interpreter, the cases interleaved (repeat 1 of every case,
then repeat 2, ...), so drifts of the machine hit all alike:

- ``cleanrl``: EnvPool alone in CleanRL's loop (``ppo_continuous_action``'s rollout):
  ``envpool.make("Pendulum-v1", env_type="gymnasium", num_envs=16)``, per step the policy's
  forward in torch under ``no_grad``, ``env.step(action.numpy())``, and the step stored into
  preallocated ``[T, 16, ...]`` torch buffers (obs, action, reward, done) as CleanRL does;
  ``cleanrl-t1`` the same with ``num_threads=1`` (EnvPool's default: a thread per core);
- ``cleanrl-async``: the same with EnvPool's async API (``num_envs=16, batch_size=8``:
  ``recv`` the 8 envs that are ready, policy, ``send`` their actions), CleanRL's
  ``ppo_atari_envpool_async`` pattern: the policy of one half overlaps the step of the other;
- ``sync-2x8``, ``async-2x8``, ``async-1x16``: asyncrl's ``MultiSyncCollector`` /
  ``MultiAsyncCollector`` whose workers each step one EnvPool of 8 (16) envs, the trainer
  sending the policy's weights after every batch as a training loop does
  (``--no-update-weights`` turns it off); ``-t1`` cases give each worker's EnvPool
  ``num_threads=1`` (EnvPool's default is a thread per core in every worker); ``-p2``
  cases give the collector ``prefetch=2`` (a worker always holds a credit: it never waits
  while the trainer takes its last batch and sends weights).

Every case uses the same MLP-64 (``obs -> 64 -> 64 -> action``, Tanh, ``2 * tanh`` head;
`benchmarks.collect.make_policy`), CPU, ``--frames-per-batch`` frames per batch (1,024).
After one warm-up batch, ``--windows`` windows of ``--frames`` frames each are timed; a
run's frames/s is their median, a case's the median over ``--repeats`` runs (>= 3 for
numbers to publish); "CPU-s / 10k frames" is the CPU time (user + system, every thread,
EnvPool's included) over the timed windows of the one process for ``cleanrl``, of the
trainer plus every worker process for asyncrl, a measure that a busy machine disturbs less
than frames/s. Ratios are against ``cleanrl``; target (issue 38 item 5): the best
asyncrl case >= 1.3x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

ENV_ID = "Pendulum-v1"
NUM_ENVS = 16
FRAMES_PER_BATCH = 1024
#: case -> (kind, workers, envs per worker, EnvPool's num_threads per worker: None = its default)
CASES: dict[str, tuple[str, int, int, int | None]] = {
    "cleanrl": ("cleanrl", 1, NUM_ENVS, None),
    "cleanrl-t1": ("cleanrl", 1, NUM_ENVS, 1),
    "cleanrl-async": ("cleanrl-async", 1, NUM_ENVS, None),
    "sync-2x8": ("sync", 2, 8, None),
    "async-2x8": ("async", 2, 8, None),
    "async-2x8-t1": ("async", 2, 8, 1),
    "async-1x16": ("async", 1, 16, None),
    "async-1x16-t1": ("async", 1, 16, 1),
    "async-1x16-p2": ("async", 1, 16, None),
    "async-2x8-p2": ("async", 2, 8, None),
}
#: case -> ``prefetch`` (batches a worker may run ahead of the trainer; 1 when absent): at
#: 2 a worker collects its next batch while the trainer takes the last one and sends weights.
PREFETCH = {"async-1x16-p2": 2, "async-2x8-p2": 2}
BASELINE = "cleanrl"
TARGET = 1.3


def make_envpool(num_envs: int, seed: int = 0, batch_size: int | None = None,
                 num_threads: int | None = None) -> Any:
    """EnvPool's gymnasium-API Pendulum: what every case steps (a worker's env factory)."""
    import envpool

    extra: dict[str, int] = {} if batch_size is None else {"batch_size": batch_size}
    if num_threads is not None:
        extra["num_threads"] = num_threads
    return envpool.make(ENV_ID, env_type="gymnasium", num_envs=num_envs, seed=seed, **extra)


def _net() -> Any:
    from benchmarks.collect import make_policy

    return make_policy("mlp64", ENV_ID)


# -- the cases, each run in a fresh interpreter ------------------------------------------------
def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system, every thread) of this process and of ``pids`` so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def _timed(step_frames: Any, frames: int, windows: int, pids: list[int] | None = None
           ) -> tuple[float, float]:
    """(frames/s median, CPU-s per 10k frames) over ``windows`` windows of ``frames`` frames."""
    step_frames()  # warm-up
    rates, cpu, total = [], 0.0, 0
    for _ in range(windows):
        done, t0, c0 = 0, time.perf_counter(), cpu_seconds(pids or [])
        while done < frames:
            done += step_frames()
        rates.append(done / (time.perf_counter() - t0))
        cpu, total = cpu + cpu_seconds(pids or []) - c0, total + done
    return statistics.median(rates), cpu / total * 10_000


def _cleanrl_buffers(steps: int, envs: int) -> tuple[Any, Any, Any, Any]:
    """CleanRL's rollout storage for Pendulum: observations, actions, rewards, dones."""
    import torch

    return (torch.zeros((steps, envs, 3)), torch.zeros((steps, envs, 1)),
            torch.zeros((steps, envs)), torch.zeros((steps, envs)))


def run_cleanrl(frames: int, windows: int, fpb: int, threads: int | None = None
                ) -> tuple[float, float]:
    """CleanRL's rollout with EnvPool's synchronous step."""
    import numpy as np
    import torch

    net = _net().module
    env = make_envpool(NUM_ENVS, num_threads=threads)
    steps = fpb // NUM_ENVS
    obs_buf, act_buf, rew_buf, done_buf = _cleanrl_buffers(steps, NUM_ENVS)
    next_obs = torch.Tensor(env.reset()[0])

    def rollout() -> int:
        nonlocal next_obs
        for step in range(steps):
            obs_buf[step] = next_obs
            with torch.no_grad():
                action = net(next_obs)
            act_buf[step] = action
            obs, reward, term, trunc, _ = env.step(action.numpy())
            rew_buf[step] = torch.tensor(reward).view(-1)
            next_obs = torch.Tensor(obs)
            done_buf[step] = torch.Tensor(np.logical_or(term, trunc))
        return steps * NUM_ENVS

    return _timed(rollout, frames, windows)


def run_cleanrl_async(frames: int, windows: int, fpb: int) -> tuple[float, float]:
    """CleanRL's envpool-async rollout: recv the ready half, act, send; halves overlap."""
    import numpy as np
    import torch

    net = _net().module
    half = NUM_ENVS // 2
    env = make_envpool(NUM_ENVS, batch_size=half)
    steps = fpb // half
    obs_buf, act_buf, rew_buf, done_buf = _cleanrl_buffers(steps, half)
    ids_buf = torch.zeros((steps, half), dtype=torch.long)
    env.async_reset()

    def rollout() -> int:
        for step in range(steps):
            obs, reward, term, trunc, info = env.recv()
            env_id = info["env_id"]
            next_obs = torch.Tensor(obs)
            obs_buf[step] = next_obs
            with torch.no_grad():
                action = net(next_obs)
            act_buf[step] = action
            env.send(action.numpy(), env_id)
            rew_buf[step] = torch.tensor(reward).view(-1)
            done_buf[step] = torch.Tensor(np.logical_or(term, trunc))
            ids_buf[step] = torch.from_numpy(env_id)
        return steps * half

    return _timed(rollout, frames, windows)


def run_asyncrl(sync: bool, workers: int, per_worker: int, threads: int | None, frames: int,
                windows: int, fpb: int, update_weights: bool, prefetch: int = 1
                ) -> tuple[float, float]:
    import functools

    import anyio

    from asyncrl import MultiCollector

    async def main() -> tuple[float, float]:
        policy = _net()
        factory = functools.partial(make_envpool, per_worker, num_threads=threads)
        async with MultiCollector(
            [factory] * workers, policy, num_workers=workers, sync=sync,
            frames_per_batch=fpb, total_frames=-1, prefetch=prefetch,
        ) as collector:
            it = collector.__aiter__()
            batch = await it.__anext__()
            if tuple(batch.shape) != ((workers, per_worker, fpb // (workers * per_worker))
                                      if sync else (per_worker, fpb // per_worker)):
                raise AssertionError(f"unexpected batch shape {tuple(batch.shape)}")
            rates, cpu, total = [], 0.0, 0
            pids = list(collector.worker_pids)
            for _ in range(windows):
                done, t0, c0 = 0, time.perf_counter(), cpu_seconds(pids)
                while done < frames:
                    done += (await it.__anext__()).numel()
                    if update_weights:
                        await collector.update_policy_weights()
                rates.append(done / (time.perf_counter() - t0))
                cpu, total = cpu + cpu_seconds(pids) - c0, total + done
            return statistics.median(rates), cpu / total * 10_000

    return anyio.run(main)


def run_one(name: str, frames: int, windows: int, fpb: int, update_weights: bool
            ) -> tuple[float, float]:
    kind, workers, per_worker, threads = CASES[name]
    if kind == "cleanrl":
        return run_cleanrl(frames, windows, fpb, threads)
    if kind == "cleanrl-async":
        return run_cleanrl_async(frames, windows, fpb)
    return run_asyncrl(kind == "sync", workers, per_worker, threads, frames, windows, fpb,
                       update_weights, PREFETCH.get(name, 1))


# -- the driver ----------------------------------------------------------------------------------
def _in_fresh_interpreter(name: str, args: argparse.Namespace) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "benchmarks.envpool", "--one", name, "--frames",
           str(args.frames), "--windows", str(args.windows), "--frames-per-batch",
           str(args.frames_per_batch)]
    if not args.update_weights:
        cmd.append("--no-update-weights")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            fps, cpu = json.loads(line[7:])
            return float(fps), float(cpu)
    raise RuntimeError(f"case {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def environment() -> str:
    import numpy
    import torch

    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}",
                f"numpy {numpy.__version__}"]
    try:
        import envpool

        versions.append(f"envpool {envpool.__version__}")
    except ImportError:
        versions.append("envpool missing")
    return f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, " + ", ".join(versions)


def table(runs: dict[str, list[tuple[float, float]]], errors: dict[str, str]) -> str:
    def med(name: str, k: int) -> float:
        return statistics.median(r[k] for r in runs[name])

    base = med(BASELINE, 0) if runs.get(BASELINE) else float("nan")
    base_cpu = med(BASELINE, 1) if runs.get(BASELINE) else float("nan")
    lines = ["| case | frames/s (median) | runs | ratio to cleanrl | CPU-s / 10k frames "
             "| ratio |", "|---|---:|---|---:|---:|---:|"]
    for name in CASES:
        if name in errors:
            lines.append(f"| {name} | error: {errors[name].splitlines()[-1][:80]} | | | | |")
        elif runs.get(name):
            fps, cpu = med(name, 0), med(name, 1)
            each = ", ".join(f"{r[0]:,.0f}" for r in runs[name])
            lines.append(f"| {name} | {fps:,.0f} | {each} | {fps / base:.2f}x | {cpu:.2f} "
                         f"| {cpu / base_cpu:.2f}x |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.envpool",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated: {', '.join(CASES)} (default: all)")
    p.add_argument("--repeats", type=int, help="fresh interpreters per case (default 3)")
    p.add_argument("--windows", type=int, help="timed windows per run (default 3)")
    p.add_argument("--frames", type=int, help="frames per timed window (default 65,536)")
    p.add_argument("--frames-per-batch", type=int, default=FRAMES_PER_BATCH)
    p.add_argument("--update-weights", action=argparse.BooleanOptionalAction, default=True,
                   help="asyncrl: send the policy's weights after every batch")
    p.add_argument("--quick", action="store_true", help="1 repeat, 1 window of 8,192 frames")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: run one case, print RESULT
    args = p.parse_args(argv)
    defaults = (1, 1, 8192) if args.quick else (3, 3, 65536)
    for name, default in zip(("repeats", "windows", "frames"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        fps, cpu = run_one(args.one, args.frames, args.windows, args.frames_per_batch,
                           args.update_weights)
        print("RESULT " + json.dumps([fps, cpu]))
        return 0
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown cases {unknown}; expected some of {', '.join(CASES)}", file=sys.stderr)
        return 2
    command = "python -m benchmarks.envpool " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(environment(), flush=True)
    runs: dict[str, list[tuple[float, float]]] = {}
    errors: dict[str, str] = {}
    for repeat in range(args.repeats):
        for name in names:  # interleaved: every case once per repeat
            if name in errors:
                continue
            try:
                fps, cpu = _in_fresh_interpreter(name, args)
            except Exception as exc:
                errors[name] = str(exc)
                print(f"{name}: {exc}", file=sys.stderr, flush=True)
                continue
            runs.setdefault(name, []).append((fps, cpu))
            print(f"repeat {repeat + 1} {name}: {fps:,.0f} frames/s, {cpu:.2f} CPU-s / 10k "
                  "frames", flush=True)
    print()
    print(table(runs, errors))
    asyncrl = [statistics.median(r[0] for r in v) for k, v in runs.items()
               if not k.startswith("cleanrl") and v]
    if asyncrl and runs.get(BASELINE):
        best = max(asyncrl) / statistics.median(r[0] for r in runs[BASELINE])
        print(f"\nbest asyncrl / cleanrl: {best:.2f}x (target >= {TARGET}x); "
              f"load after: {os.getloadavg()[0]:.2f}")
    print(f"\ncommand: {command}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
