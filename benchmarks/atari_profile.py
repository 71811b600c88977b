"""Where one per-worker collection worker's time goes on real Atari, per frame (issue 45, item 5).

    python -m benchmarks.atari_profile                        # 4 envs, 512-frame shares, 10 batches
    python -m benchmarks.atari_profile --batches 20 --top 20

The workload is ``benchmarks.atari``'s per-worker cases (``asyncrl-async``/``-sync``: 2
workers x 4 envs, 1,024 frames per batch): one worker's share, ``ALE/Breakout-v5``
preprocessed and stacked (``benchmarks.atari_env.make_atari``, uint8 [4, 84, 84]) in a
pool of ``--envs`` envs, CleanRL's Nature CNN sampling the actions
(``benchmarks.atari.make_policy``), one torch thread, the rollout in a separate thread as
``anyio.to_thread`` runs it in a worker. It runs, in this process, the worker's own code for
each credit (:class:`asyncrl._rollout.probe.RolloutProbe`): ``Rollout.collect()``, the
message's copy of the batch (``.clone()``: as many bytes as a local worker copies into its
shared-memory slot) and the encoding of a remote worker's batch message.

Two views, per frame (one env step of one env):

1. **timers** (the thread's CPU time: the machine may be busy with other work), no
   profiler, medians over ``--batches`` batches: the batch, then the env pool
   alone (``step_inplace`` with the last actions, resets where done), the policy alone (the
   ``TensorDictModule`` on the rollout's step TensorDict, as the rollout calls it) and the
   bare CNN alone (``NatureCNN.forward`` on the observation tensor, no TensorDict): the
   rollout's own work is the batch less env and policy, the policy's Python wrapping
   (TensorDictModule, exploration, the adapter) the policy less the bare CNN;
2. **cProfile** over ``--batches`` credits: self time by where the code lives, and the
   top functions. The profiler charges every Python call, so it inflates Python-heavy
   parts: trust view 1 for the split, view 2 for *which* functions.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

from asyncrl._rollout.probe import RolloutProbe
from benchmarks.atari import make_cnn, make_policy
from benchmarks.atari_env import ENV_ID, make_atari
from benchmarks.profile_worker import (
    Categories,
    add_view_arguments,
    command_line,
    measure_views,
    parts_table,
    profile_table,
)

#: cProfile self time is charged to the first category whose needle is in the function's
#: ``file:name`` (built-ins have no file: their name). Specific first.
CATEGORIES: Categories = (
    ("env: the emulator (ale_py)", ("ale_py", "ALEInterface")),
    ("env: preprocessing (cv2 resize, frame stack, gymnasium wrappers)",
     ("cv2", "<resize>", "<cvtColor>", "gymnasium/", "asyncrl/_rollout/gym_pools.py",
      "asyncrl/_rollout/env_pools.py", "asyncrl/_rollout/env_specs.py",
      "benchmarks/atari_env.py")),
    ("message: encode (transports codec)", ("transports/", "msgpack")),
    ("copies: the batch's clone, tensordict views", (
        "tensordict/", "method 'clone'", "method 'copy_'", "method 'set_'")),
    ("CNN: torch ops (conv, linear, relu, sampling)", (
        "torch._C", "built-in method torch.", "torch/distributions/", "TensorBase",
        "torch/nn/functional.py")),
    ("policy: Python wrapping (nn.Module, TensorDictModule, adapter)", (
        "torch/nn/", "asyncrl/_rollout/policies.py", "asyncrl/_rollout/td_module_direct.py",
        "benchmarks/atari.py", "torch/utils/_contextlib", "torch/autograd/grad_mode",
        "torch/_dynamo", "torch/_tensor.py")),
    # An ndarray's item assignment (``dst[i] = src``) is a C slot: cProfile charges it to
    # its caller, the loop. The loop's self time is its Python and its buffer writes.
    ("rollout loop and its buffer writes (asyncrl/_rollout/)", ("asyncrl/_rollout/",)),
    ("numpy (done flags, resets)", ("numpy", "copyto", "logical_or", "method 'any'")),
)
OTHER = "other (Python built-ins, dispatch)"


class AtariWorker:
    """One worker's share of the per-worker Atari case, timed piece by piece."""

    def __init__(self, envs: int, frames_per_batch: int) -> None:
        self.probe = RolloutProbe(make_atari, make_policy(), envs_per_worker=envs,
                                  frames_per_batch=frames_per_batch)
        self.frames = frames_per_batch
        self.steps = self.probe.steps
        self.cnn = make_cnn()  # the policy's weights (seeded alike), called bare
        self.obs = self.probe.collect()["observation"][:, 0].clone()  # a real frame stack

    def time_parts(self) -> dict[str, float]:
        """CPU seconds of this thread per batch of each part, measured apart, no profiler.

        CPU time, not wall time: on a machine shared with other work the parts are timed
        at different moments, and wall time would charge each the others' load.
        """
        clock = time.thread_time
        t0 = clock()
        batch = self.probe.collect()
        t1 = clock()
        frames = batch.clone()
        t2 = clock()
        self.probe.encode(frames)
        t3 = clock()
        self.probe.time_env()
        t4 = clock()
        self.probe.time_policy()
        t5 = clock()
        self.time_cnn()
        t6 = clock()
        return {"batch": t1 - t0, "clone": t2 - t1, "encode": t3 - t2, "env": t4 - t3,
                "policy": t5 - t4, "cnn": t6 - t5}

    def time_cnn(self) -> None:
        """:attr:`steps` bare CNN calls on a batch of the envs' observations."""
        with torch.no_grad():
            for _ in range(self.steps):
                self.cnn(self.obs)

    def close(self) -> None:
        self.probe.close()


def direct_table(samples: list[dict[str, float]], frames: int) -> list[str]:
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    rows = [
        ("env step: emulator + preprocessing + frame stack (+ resets)", med["env"]),
        ("CNN forward (bare NatureCNN, no TensorDict)", med["cnn"]),
        ("policy's Python wrapping (TensorDictModule, adapter; policy - CNN)",
         max(0.0, med["policy"] - med["cnn"])),
        ("rollout's own work (buffer writes, hooks, resets' bookkeeping; "
         "batch - env - policy)", max(0.0, med["batch"] - med["env"] - med["policy"])),
        ("copy of the batch for the message (clone; a local worker's slot write)",
         med["clone"]),
        ("encode the batch message (a remote worker's wire path)", med["encode"]),
    ]
    return parts_table(rows, med["batch"] + med["clone"] + med["encode"], frames,
                       "CPU µs / frame")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.atari_profile",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--envs", type=int, default=4, help="envs in the worker (atari.py: 4)")
    p.add_argument("--frames-per-batch", type=int, default=512,
                   help="the worker's share (atari.py: 1,024 frames over 2 workers)")
    add_view_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = command_line("atari_profile", argv)
    torch.set_num_threads(1)
    worker = AtariWorker(args.envs, args.frames_per_batch)
    try:  # one torch thread in the rollout's thread too, as the worker sets it
        views = measure_views(worker.probe.credit, worker.time_parts, args.batches, threads=1)
    finally:
        worker.close()
    frames = args.frames_per_batch
    print(f"\n`{command}`\n")
    print(f"{ENV_ID} (benchmarks.atari_env), Nature CNN, {args.envs} envs in the worker, "
          f"{frames} frames per batch ({worker.steps} steps), 1 torch thread, rollout in a "
          f"thread; python {platform.python_version()}, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; medians "
          f"of {args.batches} batches ({args.batches * frames:,} frames per view)")
    print(f"\nOne credit (collect + clone + encode), no profiler: {1e6 * views.cpu / frames:.1f} "
          f"CPU µs per frame ({frames / views.cpu:,.0f} frames per CPU-second); wall "
          f"{1e6 * views.wall / frames:.1f} µs per frame ({frames / views.wall:,.0f} frames/s "
          "for this worker alone, as loaded)\n")
    print("\n".join(direct_table(views.samples, frames)))
    print(f"\ncProfile over {args.batches} credits (the profiler slows Python-heavy code):\n")
    print("\n".join(profile_table(views.stats, frames * args.batches, args.top, per="frame",
                                   categories=CATEGORIES, other=OTHER)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
