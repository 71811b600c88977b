"""Self-healing on Ray: from a killed remote worker to its replacement's first frame.

    python -m benchmarks.ray_restart --kills 3 --peer-timeout 10

A MultiSyncCollector (``on_worker_loss="wait"``, IdentityEnv + ValuePolicy,
the weights updated after every batch) and ``--workers`` Ray actors
(``launch_workers``, ``max_restarts=-1``) on a local Ray. Every ``--every``
batches one actor's process is SIGKILLed; Ray restarts it, its worker joins the
place the dead one left and is caught up with the latest weights. For each kill:

- ``lost``: kill -> the collector's "lost" event (the closed connection; before
  #23 it was the ``--peer-timeout`` of silence);
- ``joined``: kill -> the replacement's "joined" event (Ray's restart + join);
- ``first frame``: kill -> the first batch holding a frame of the new process.

Then what the run lost: the frame and version checks of the chaos suite
(every env step once, each frame acting with the weights of its stamped
version) and the exact total. Medians over the kills; the command is printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from typing import Any

import anyio


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from asyncrl import MultiSyncCollector
    from asyncrl.launch._ray_handle import actor_info
    from asyncrl.launch.ray import launch_workers
    from asyncrl.testing import (
        ValuePolicy,
        frame_identity_problems,
        identity_env,
        version_problems,
    )

    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches: list[Any] = []
    kills: list[dict[str, Any]] = []
    total = args.frames_per_worker * args.workers * args.batches
    collector = MultiSyncCollector(
        identity_env, policy, num_workers=0, remote_workers=args.workers,
        listen="tcp://127.0.0.1:0", frames_per_batch=args.frames_per_worker * args.workers,
        total_frames=total, on_worker_loss="wait",
        heartbeat_interval=min(1.0, args.peer_timeout / 4), peer_timeout=args.peer_timeout)
    events = collector.events()
    async with anyio.create_task_group() as tg, collector:

        async def watch() -> None:
            async for event in events:
                now = time.monotonic()
                for kill in kills:
                    if event.kind == "lost" and event.pid == kill["pid"] and "lost" not in kill:
                        kill["lost"] = now - kill["t"]
                    if event.kind == "joined" and "joined" not in kill and now > kill["t"]:
                        kill["joined"] = now - kill["t"]
                        kill["new_pid"] = event.pid

        tg.start_soon(watch)
        async with launch_workers(collector.endpoint, num_workers=args.workers,
                                  env="asyncrl.testing:IdentityEnv",
                                  policy="asyncrl.testing:ValuePolicy",
                                  peer_timeout=args.peer_timeout, join_timeout=60) as workers:
            async for batch in collector:
                now = time.monotonic()
                batches.append(batch)
                pids = {int(p) for p in batch["next", "observation"][..., 0].flatten().tolist()}
                for kill in kills:
                    if "first_frame" not in kill and kill.get("new_pid") in pids:
                        kill["first_frame"] = now - kill["t"]
                if len(batches) % args.every == 0 and len(kills) < args.kills:
                    actor = workers.actors[len(kills) % args.workers]
                    pid = actor_info(actor)["Pid"]
                    kills.append({"pid": pid, "t": time.monotonic()})
                    os.kill(pid, signal.SIGKILL)
                policy.value.data.fill_(collector.policy_version + 1)
                await collector.update_policy_weights()
                values[collector.policy_version] = policy.value.item()
        tg.cancel_scope.cancel()
    problems = frame_identity_problems(batches, from_start=True) + version_problems(batches,
                                                                                    values)
    return {"kills": kills, "problems": problems, "frames": sum(b.numel() for b in batches),
            "total": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--every", type=int, default=40, help="batches between kills")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--frames-per-worker", type=int, default=50)
    parser.add_argument("--peer-timeout", type=float, default=10.0)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=False,
             configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}})
    try:
        result = anyio.run(run, args)
    finally:
        ray.shutdown()
    print("command: python -m benchmarks.ray_restart " + " ".join(sys.argv[1:]))
    for i, kill in enumerate(result["kills"]):
        print(f"kill {i}: lost after {kill.get('lost', float('nan')):.2f} s, replacement "
              f"joined after {kill.get('joined', float('nan')):.2f} s, its first frame after "
              f"{kill.get('first_frame', float('nan')):.2f} s")
    for key in ("lost", "joined", "first_frame"):
        seen = [k[key] for k in result["kills"] if key in k]
        if seen:
            print(f"median {key.replace('_', ' ')}: {statistics.median(seen):.2f} s "
                  f"({len(seen)}/{len(result['kills'])} kills)")
    print(f"frames: {result['frames']} of {result['total']} asked; frame and version problems: "
          f"{len(result['problems'])}")
    for problem in result["problems"][:10]:
        print("  ", problem)


if __name__ == "__main__":
    main()
