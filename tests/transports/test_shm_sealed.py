"""No SIGBUS reaches the trainer from a segment a worker can shrink (#43.6).

Every shared-memory segment the trainer maps and another process can open (the
weights it publishes, the live model, central inference's request and answer
blocks and chunk rings) is a sealed memfd: a worker that ``ftruncate`` s it is
refused by the kernel (EPERM), one that punches a hole into it makes that range
read as zeros, and the trainer keeps writing and reading every page. Each case
runs the trainer's side in a subprocess, so a SIGBUS shows as that process's
signal exit, not as a crashed pytest; the unsealed ``/dev/shm`` case shows the
attack that the seal stops (the process dies by SIGBUS).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd seals: Linux")

ROOT = Path(__file__).resolve().parents[2]

#: Runs in a separate process, given a block name: what a worker's env code could do to it.
ATTACK = """
import ctypes, json, os, sys
from transports._shm_segment import open_segment

fd = open_segment(sys.argv[1])
size = os.fstat(fd).st_size
outcome = {}
try:
    os.ftruncate(fd, 0)
    outcome["truncate"] = "done"
except OSError as exc:
    outcome["truncate"] = exc.errno
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
# FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE: the segment's pages are dropped
outcome["punch"] = libc.fallocate(fd, 3, 0, size) or ctypes.get_errno()
print(json.dumps(outcome))
"""

#: The trainer's side: ``setup`` makes ``names`` (segments) and ``touch()`` (every page).
VICTIM = """
import json, subprocess, sys
import torch
{setup}
attacks = [subprocess.run([sys.executable, "-c", ATTACK, name], capture_output=True,
                          text=True, check=True).stdout.strip() for name in names]
checks = touch()
print(json.dumps({{"attacks": attacks, "checks": checks}}))
"""

SETUPS = {
    "block": """
from transports._shm import SharedTensorBlock
block = SharedTensorBlock.create({"w": torch.zeros(1 << 20)}, slots=2, sealed=SEALED)
block.write({"w": torch.ones(1 << 20)}, version=1)
names = [block.name]
def touch():
    block.write({"w": torch.full((1 << 20,), 2.0)}, version=2)
    block.write({"w": torch.full((1 << 20,), 3.0)}, version=3)
    version, out = block.read(*block.latest()[:2])
    return [version, float(out["w"].sum())]
""",
    "weights": """
import anyio
from torch import nn
from asyncrl.weights import SharedMemWeightSyncScheme
from transports import LocalHub
policy = nn.Linear(512, 512)
sender = SharedMemWeightSyncScheme().init_on_sender("policy", hub=LocalHub(encode=True),
                                                    model=policy, workers={})
anyio.run(sender.send_async)
names = [sender.block.name]
def touch():
    with torch.no_grad():
        policy.weight.fill_(5.0)
    async def again():
        for _ in range(4):  # no worker holds a version: the same buffer is rewritten
            await sender.send_async()
        version, out = sender.block.read(*sender.block.latest()[:2])
        await sender.aclose()
        return [float(out["weight"].mean())]
    return anyio.run(again)
""",
    "live": """
from torch import nn
from asyncrl.weights import LiveSharedMemWeightSyncScheme
from transports import LocalHub
policy = nn.Linear(512, 512)
sender = LiveSharedMemWeightSyncScheme().init_on_sender("policy", hub=LocalHub(encode=True),
                                                        model=policy, workers={})
names = [sender.share(policy).name]
def touch():  # the trainer trains the model that lives in the segment
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    policy(torch.ones(8, 512)).sum().backward()
    optimizer.step()
    return [bool(torch.isfinite(policy.weight).all())]
""",
    "inference": """
from asyncrl._inference.chunk_ring import ChunkRing
from asyncrl._inference.outputs import OutputLayout
from asyncrl._inference.worker_blocks import make_blocks
blocks = make_blocks([4], {("observation",): torch.zeros(4, 256, 256)},
                     OutputLayout((torch.int64, ())))
ring = ChunkRing.create({("observation",): (torch.float32, (256, 256))}, rows=4, steps=8,
                        slots=2)
names = [blocks[0].obs.name, blocks[0].act.name, *ring.names]
def touch():  # the server reads a request, answers it, reads a chunk
    obs = blocks[0].obs.slot_views(0)["o0"]
    blocks[0].act.slot_views(0)["action"].fill_(1)
    chunk = ring.block.slot_views(1)
    return [float(obs.sum()), int(blocks[0].act.slot_views(0)["action"].sum()),
            sum(float(t.float().sum()) for t in chunk.values())]
""",
}


def run_victim(kind: str, *, sealed: bool = True) -> subprocess.CompletedProcess[str]:
    setup = SETUPS[kind].replace("SEALED", str(sealed))
    code = f"ATTACK = {ATTACK!r}\n" + textwrap.dedent(VICTIM.format(setup=setup))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT),
                                                      "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("kind", sorted(SETUPS))
def test_a_worker_cannot_shrink_a_segment_the_trainer_maps(kind: str) -> None:
    done = run_victim(kind)
    assert done.returncode == 0, (
        f"the trainer's side ended with {done.returncode} "
        f"({'SIGBUS' if done.returncode == -signal.SIGBUS else 'error'}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    # EPERM (1): the kernel refuses the shrink; the hole punch succeeds and reads as zeros.
    assert all(json.loads(a)["truncate"] == 1 for a in result["attacks"]), result
    expected = {"block": [3, 3.0 * (1 << 20)], "weights": [5.0], "live": [True],
                "inference": [0.0, 4, 0.0]}[kind]
    assert result["checks"] == expected


def test_an_unsealed_segment_shrunk_by_a_worker_kills_its_mapper_by_sigbus() -> None:
    """The attack the seal stops: a /dev/shm block (``sealed=False``) is shrunk under its
    creator's mapping and the creator's next write is a SIGBUS, no Python error."""
    done = run_victim("block", sealed=False)
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr[-2000:])
