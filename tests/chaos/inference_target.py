"""The inference fuzzer's target: a central-inference trainer in its own process.

Usage: python inference_target.py BACKEND   (asyncio or trio)

Runs an :class:`~asyncrl.AsyncBatchedCollector` over :class:`~asyncrl.testing.IdentityEnv`
with one honest local env worker (slot 0) and ``remote_workers=1`` on a tcp ``listen=``
without keys (a place the fuzzer's hostile env workers can take), and trains on it for
ever: a new weight version after every batch. Measured from inside as ``wire_target.py``
measures a MultiCollector (``measured.py``: the loop's longest stall, the peak memory
since the baseline, the honest worker's frames exact: steps consecutive per env, every
action the value of the version it is stamped with; every refusal counted). Same commands
on stdin (``report``, ``baseline``); its ``ready`` event carries what a valid remote env
worker sends: its hello's ``specs`` and the entries of a one-env chunk.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout

from asyncrl import AsyncBatchedCollector
from asyncrl._inference.remote_env_hosts import env_layout
from asyncrl.testing import identity_env
from tests.chaos.measured import LIVENESS, HonestTrainer, run


def _schema(collector: AsyncBatchedCollector) -> list[list[Any]]:
    """``[key path, dtype, shape]`` of each entry of a one-env chunk (a valid one's recipe)."""
    assert collector._env_hub.remote is not None
    return [[list(path), str(dtype).removeprefix("torch."), list(shape)]
            for path, (dtype, shape) in collector._env_hub.remote.schema(1).items()]


async def main() -> None:
    trainer = HonestTrainer()
    with trainer.measured.ending():
        async with AsyncBatchedCollector(identity_env, num_envs=1, policy=trainer.policy,
                                         frames_per_batch=20, remote_workers=1,
                                         transition_chunk_size=10,
                                         listen="tcp://127.0.0.1:0", **LIVENESS) as c, \
                anyio.create_task_group() as tg:
            trainer.measured.start(tg)
            trainer.started(c)
            async for batch in c:
                await trainer.train(c, batch, batch[batch["collector", "worker_id"] == 0])
                if trainer.counts["honest"] == 1:
                    remote = c._env_hub.remote
                    assert remote is not None
                    obs = {path: _row(dtype, shape) for path, (dtype, shape) in zip(
                        remote.obs_paths, remote.obs_spec, strict=True)}
                    layout = env_layout(obs, remote.outputs, 1)
                    trainer.ready(specs=layout.to_specs(), schema=_schema(c))


def _row(dtype: Any, shape: tuple[int, ...]) -> Any:
    """A ``[1, *shape]`` tensor of ``dtype``: one env's observation, as ``env_layout`` reads."""
    return torch.zeros((1, *shape), dtype=dtype)


if __name__ == "__main__":
    run(main)
