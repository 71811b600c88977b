"""CUDA IPC weights: GPU workers on the trainer's host view the trainer's CUDA buffers.

The body checks run everywhere (a hostile body is refused before CUDA sees
it); the rest needs a CUDA device and is skipped without one.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anyio
import msgpack
import pytest
import torch
from torch import nn

from asyncrl.weights import CudaIpcWeightSyncScheme, WeightSyncScheme
from asyncrl.weights._cuda_ipc import CudaIpcBlock, parse_body
from transports import LocalHub, ProtocolError

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
LIMIT = 120  # worker processes that import torch and CUDA: a bound, not a speed claim


def body(**changes: Any) -> dict[str, Any]:
    good: dict[str, Any] = {
        "block": "cudaipc-1-0", "slot": 0, "seq": 3,
        "ipc": [0, b"h" * 64, 1024, 0, b"/torch_1_2", 0, b"e" * 64, True],
        "layout": [["0.weight", "float32", [8, 4], 0], ["0.bias", "float32", [8], 256]],
    }
    good.update(changes)
    return good


def test_a_well_formed_body_is_accepted() -> None:
    assert parse_body(body()) == body()


@pytest.mark.parametrize(("changes", "why"), [
    ({"block": 7}, "'block' is not a short string"),
    ({"block": "x" * 200}, "'block' is not a short string"),
    ({"slot": 1}, "'slot' is not 0"),
    ({"ipc": [0, b"h"]}, "'ipc' is not a list of 8 fields"),
    ({"ipc": [0, "h", 1024, 0, b"r", 0, b"e", True]}, r"ipc\[1\] is a str, expected bytes"),
    ({"ipc": [0, b"h" * 5000, 1024, 0, b"r", 0, b"e", True]}, r"ipc\[1\] is 5000 bytes"),
    ({"ipc": [-1, b"h", 1024, 0, b"r", 0, b"e", True]}, r"ipc\[0\] = -1 is out of range"),
    ({"layout": []}, "'layout' is not a non-empty list"),
    ({"layout": [["w", "object", [2], 0]]}, "dtype 'object' of 'w' is not one of"),
    ({"layout": [["w", "float32", [-2], 0]]}, "shape of 'w' is not a list of sizes"),
    ({"layout": [["w", "float32", [2], 3]]}, "offset of 'w' is not an aligned byte offset"),
    ({"layout": [["w", "float32", [2]]]}, r"is not \[key, dtype, shape, offset\]"),
])
def test_a_hostile_body_is_refused_before_cuda_sees_it(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        parse_body(body(**changes))


def test_the_scheme_round_trips_its_config_and_checks_its_device() -> None:
    scheme = CudaIpcWeightSyncScheme(device="cuda:0", slots=4)
    assert repr(scheme) == "CudaIpcWeightSyncScheme(slots=4, device='cuda:0')"
    assert repr(WeightSyncScheme.from_config(scheme.to_config())) == repr(scheme)
    with pytest.raises(ValueError, match=r"device='cpu'\): the buffers are CUDA memory"):
        CudaIpcWeightSyncScheme(device="cpu")


@pytest.mark.anyio
async def test_a_cpu_learner_without_a_device_is_told_what_to_pass() -> None:
    sender = CudaIpcWeightSyncScheme().init_on_sender(
        "policy", hub=LocalHub(), model=nn.Linear(2, 2), workers={})
    with pytest.raises(ValueError, match=r"pass CudaIpcWeightSyncScheme\(device='cuda:0'\)"):
        await sender.send_async()
    await sender.aclose()


# ------------------------------------------------------------------ CUDA (GPU machines)


CHILD = """
import sys, msgpack
from asyncrl.weights._cuda_ipc import CudaIpcBlock, parse_body
block = CudaIpcBlock.open(parse_body(msgpack.unpackb(sys.stdin.buffer.read())))
print({key: view.cpu().tolist() for key, view in block.views.items()})
"""


@needs_cuda
def test_another_process_reads_the_block_without_a_copy_of_the_bytes() -> None:
    weights = {"w": torch.arange(6.0, device="cuda").reshape(2, 3),
               "b": torch.tensor([7, 8], dtype=torch.int64, device="cuda")}
    block = CudaIpcBlock.create(weights)
    _, seq = block.write(weights, 1)
    # The body crosses as msgpack, as on the wire: the child opens the trainer's memory.
    done = subprocess.run([sys.executable, "-c", CHILD], input=msgpack.packb(block.describe(seq)),
                          capture_output=True, timeout=LIMIT)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == str({"w": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]],
                                                "b": [7, 8]})


@needs_cuda
@pytest.mark.anyio
@pytest.mark.parametrize("learner", ["cuda", "cpu"])
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_gpu_workers_keep_exact_versions(learner: str, sync: bool) -> None:
    from asyncrl import MultiCollector
    from asyncrl.testing import CountingEnv, ValuePolicy, collect_with_updates, version_problems

    policy = ValuePolicy(0.0).to(learner)
    scheme = CudaIpcWeightSyncScheme(device="cuda:0" if learner == "cpu" else None)
    with anyio.fail_after(LIMIT):
        async with MultiCollector([CountingEnv] * 2, policy, sync=sync, frames_per_batch=16,
                                  total_frames=16 * 12, policy_device="cuda",
                                  storing_device="cpu",
                                  weight_sync_schemes={"policy": scheme}) as collector:
            # async: pipelined sends, newest wins, buffers rotate
            batches, values = await collect_with_updates(collector, policy, sync=sync)
    assert version_problems(batches, values) == []
    seen = {int(v) for b in batches for v in b["collector", "policy_version"].reshape(-1)}
    assert len(seen) > 3, f"too few versions reached the workers: {sorted(seen)}"
