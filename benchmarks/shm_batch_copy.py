"""The trainer's copy of a batch out of a local worker's slot: mapping vs descriptor (issue 43.6).

    python -m benchmarks.shm_batch_copy
    python -m benchmarks.shm_batch_copy --envs 8 --steps 128 --repeats 60

Before issue 43.6 the trainer copied each slot out of its own mapping of the
segment (``memcpy``); a worker that shrank the segment killed it by SIGBUS. Now
it reads the slot with ``preadv`` through the segment's descriptor
(:class:`transports.SharedTensorFile`). Both copies run here on the same
segment, in one process, interleaved, into freshly allocated tensors as the
trainer allocates them: a pixel batch of ``--envs`` x ``--steps`` frames,
observation and next observation 4x84x84 uint8 plus the small keys a policy
writes (57.8 MB at 8 x 128). Medians, minimums and the ratio are printed with
this command.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch

from transports import SharedTensorBlock, SharedTensorFile, copy_into


def layout(envs: int, steps: int) -> dict[str, torch.Tensor]:
    """A pixel share's tensors as a batch segment holds them (``held`` last)."""
    shape = (envs, steps)
    return {"t0": torch.zeros(*shape, 4, 84, 84, dtype=torch.uint8),
            "t1": torch.zeros(*shape, 4, 84, 84, dtype=torch.uint8),
            "t2": torch.zeros(shape, dtype=torch.int64), "t3": torch.zeros(shape),
            "t4": torch.zeros(*shape, 1), "t5": torch.zeros(*shape, 1, dtype=torch.bool),
            "t6": torch.zeros(shape, dtype=torch.int64),
            "held": torch.zeros(1, dtype=torch.int64)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args(argv)
    tensors = layout(args.envs, args.steps)
    keys = [key for key in tensors if key != "held"]
    file = SharedTensorFile.create(tensors, slots=2)
    mapped = SharedTensorBlock.attach(file.name)  # the worker's mapping (and, before, ours)
    views = mapped.slot_views(0)
    for key in keys:  # the worker's write
        views[key].view(torch.uint8).copy_(torch.randint(0, 256, views[key].view(
            torch.uint8).shape, dtype=torch.uint8))

    def from_mapping() -> None:
        for key in keys:
            copy_into(torch.empty(views[key].shape, dtype=views[key].dtype), views[key])

    def from_descriptor() -> None:
        for key in keys:
            file.read_into(torch.empty(tensors[key].shape, dtype=tensors[key].dtype), 0, key)

    times: dict[str, list[float]] = {"mapping": [], "descriptor": []}
    try:
        for _ in range(args.repeats):
            for name, copy in (("mapping", from_mapping), ("descriptor", from_descriptor)):
                start = time.perf_counter()
                copy()
                times[name].append(time.perf_counter() - start)
    finally:
        mapped.close()
        file.close()
        file.unlink()
    megabytes = sum(tensors[key].nbytes for key in keys) / 1e6
    command = shlex.join(sys.argv[1:] if argv is None else argv)
    print(f"$ python -m benchmarks.shm_batch_copy {command}")
    print(f"{args.envs} envs x {args.steps} steps, {megabytes:.1f} MB a batch, "
          f"{args.repeats} copies each, interleaved:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<10} median {median * 1e3:7.2f} ms (min {min(values) * 1e3:7.2f} ms), "
              f"{megabytes / median / 1e3:5.2f} GB/s")
    ratio = statistics.median(times["descriptor"]) / statistics.median(times["mapping"])
    print(f"  descriptor / mapping: {ratio:.2f}")


if __name__ == "__main__":
    main()
