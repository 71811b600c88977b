"""The wire fuzzer's target: a trainer in its own process, measured from inside.

Usage: python wire_target.py BACKEND   (asyncio or trio)

Runs a ``MultiAsyncCollector`` over :class:`~asyncrl.testing.IdentityEnv` with one honest
local worker and ``remote_workers=1`` on a tcp ``listen=`` without keys (a place the
fuzzer's hostile peer can take), and trains on it for ever as ``helpers.train`` does:
a new weight version after every batch. Measured as ``measured.py`` says (the event
loop's longest stall, the peak memory since the baseline, the honest worker's frames
exact, every refusal counted) and driven by the same commands on stdin; its ``ready``
event carries the layout of an honest batch (what a valid batch of a peer holds).

It also serves a module (:func:`reward_model`, a ``Linear(3, 1)`` reward model named
:data:`SERVED`, ``weight_sync_schemes={SERVED: ServedModuleScheme(served)}``) that no
honest env calls: its ``served_call`` messages are the fuzzer's alone. Each report
carries ``served``: the calls the module answered and ``served_refusals`` (the
collector's ``statistics().served_refusals``, by reason).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout

from asyncrl import MultiAsyncCollector
from asyncrl.served import ServedModule, ServedModuleScheme
from asyncrl.testing import identity_env
from tests.chaos.measured import LIVENESS, HonestTrainer, run

#: The served module's name, and one call's inputs (``{name: (dtype, shape)}``).
SERVED = "env.transform[0]"
SERVED_LAYOUT = {"next_observation": ("float32", (3,))}


def reward_model() -> nn.Module:
    """``reward = next_observation . [1, 2, 3] + 0.5``: a fuzzer can check an answer."""
    model = nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0, 3.0]]))
        model.bias.fill_(0.5)
    return model


def _layout(batch: Any) -> list[list[Any]]:
    """``[key path, dtype, shape]`` of each leaf of one honest batch (in the fuzzer's
    hands the recipe of a valid one)."""
    return [[list((k,) if isinstance(k, str) else k), str(v.dtype).removeprefix("torch."),
             list(v.shape)] for k, v in batch.items(include_nested=True, leaves_only=True)]


async def main() -> None:
    trainer = HonestTrainer()
    with trainer.measured.ending():
        async with ServedModule(reward_model(), name=SERVED, clients=4, example={
                    "next_observation": torch.zeros(3)}) as served, \
                MultiAsyncCollector(identity_env, trainer.policy, num_workers=1,
                                    remote_workers=1, listen="tcp://127.0.0.1:0",
                                    frames_per_batch=20, on_worker_loss="continue",
                                    total_frames=-1, weight_sync_schemes={
                                        SERVED: ServedModuleScheme(served)},
                                    **LIVENESS) as c, \
                anyio.create_task_group() as tg:
            fields = trainer.measured.fields
            trainer.measured.fields = lambda: {
                **fields(), "served": served.statistics().calls,
                "served_refusals": dict(c.statistics().served_refusals)}
            trainer.measured.start(tg)
            trainer.started(c)
            async for batch in c:
                honest = set(batch["collector", "worker_id"].flatten().tolist()) == {0}
                await trainer.train(c, batch, batch if honest else None, worker_ids=[0])
                if trainer.counts["honest"] == 1:
                    trainer.ready(layout=_layout(batch))


if __name__ == "__main__":
    run(main)
