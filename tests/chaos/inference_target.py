"""The inference fuzzer's target: a central-inference trainer in its own process.

Usage: python inference_target.py BACKEND   (asyncio or trio)

Runs an :class:`~asyncrl.AsyncBatchedCollector` over :class:`~asyncrl.testing.IdentityEnv`
with one honest local env worker (slot 0) and ``remote_workers=1`` on a tcp ``listen=``
without keys (a place the fuzzer's hostile env workers can take), and trains on it for
ever: a new weight version after every batch. Measured from inside as ``wire_target.py``
measures a MultiCollector (its :class:`Gauges` and :class:`Honest`: the loop's longest
stall, the peak memory since the baseline, the honest worker's frames exact: steps
consecutive per env, every action the value of the version it is stamped with), and it
counts every refusal (each rate-limited log, each warning). Same commands on stdin
(``report``, ``baseline``); its ``ready`` event carries what a valid remote env worker
sends: its hello's ``specs`` and the entries of a one-env chunk.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout

from asyncrl import AsyncBatchedCollector
from asyncrl._inference.remote_env_hosts import env_layout
from asyncrl.testing import ValuePolicy, identity_env
from tests.chaos.wire_target import (
    LIVENESS,
    Gauges,
    Honest,
    _counted,
    _status,
    _Warnings,
    reactions,
    say,
    warnings,
)
from transports import RateLimitedLog


def _schema(collector: AsyncBatchedCollector) -> list[list[Any]]:
    """``[key path, dtype, shape]`` of each entry of a one-env chunk (a valid one's recipe)."""
    assert collector._env_hub.remote is not None
    return [[list(path), str(dtype).removeprefix("torch."), list(shape)]
            for path, (dtype, shape) in collector._env_hub.remote.schema(1).items()]


async def main() -> None:
    RateLimitedLog.log = _counted  # type: ignore[method-assign]
    logging.getLogger().addHandler(_Warnings())
    logging.getLogger().setLevel(logging.INFO)
    gauges = Gauges()
    honest = Honest()
    counts = {"batches": 0, "honest": 0, "others": 0}
    policy = ValuePolicy(0.0)
    values = honest.values

    def report() -> dict[str, Any]:
        return {"event": "report", **counts, "max_gap": round(gauges.max_gap, 3),
                "max_busy": round(gauges.max_busy, 3),
                "rss_growth_mb": round((_status("VmHWM") - gauges.baseline_kib) / 1024, 1),
                "rss_mb": round(_status("VmRSS") / 1024, 1), "problems": honest.problems[:5],
                "reactions": dict(reactions), "warnings": list(warnings)[-5:]}

    async def commands(scope: anyio.CancelScope) -> None:
        while line := await anyio.to_thread.run_sync(sys.stdin.readline,
                                                     abandon_on_cancel=True):
            if line.strip() == "baseline":
                gauges.reset()
                say(event="baseline", rss_mb=round(gauges.baseline_kib / 1024, 1))
            else:
                say(**report())
        scope.cancel()

    try:
        async with AsyncBatchedCollector(identity_env, num_envs=1, policy=policy,
                                         frames_per_batch=20, remote_workers=1,
                                         transition_chunk_size=10,
                                         listen="tcp://127.0.0.1:0", **LIVENESS) as c, \
                anyio.create_task_group() as tg:
            tg.start_soon(gauges.tick)
            tg.start_soon(commands, tg.cancel_scope)
            values[c.policy_version] = policy.value.item()
            say(event="listening", endpoint=c.endpoint)
            async for batch in c:
                counts["batches"] += 1
                ours = batch[batch["collector", "worker_id"] == 0]
                if ours.numel():
                    honest.check(ours, counts["honest"])
                    counts["honest"] += 1
                if ours.numel() < batch.numel():
                    counts["others"] += 1
                policy.value.data.fill_(c.policy_version + 1)
                await c.update_policy_weights()
                values[c.policy_version] = policy.value.item()
                if counts["honest"] == 1:
                    gauges.reset()
                    assert c._env_hub.remote is not None
                    obs = {path: _row(dtype, shape) for path, (dtype, shape) in zip(
                        c._env_hub.remote.obs_paths, c._env_hub.remote.obs_spec, strict=True)}
                    layout = env_layout(obs, c._env_hub.remote.outputs, 1)
                    say(event="ready", rss_mb=round(gauges.baseline_kib / 1024, 1),
                        specs=layout.to_specs(), schema=_schema(c))
    except BaseException as exc:  # the fuzzer wants to know how the run ended
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            raise
        say(event="ended", error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc()[-4000:], **{k: v for k, v in report().items()
                                                          if k != "event"})
        raise SystemExit(1) from None


def _row(dtype: Any, shape: tuple[int, ...]) -> Any:
    """A ``[1, *shape]`` tensor of ``dtype``: one env's observation, as ``env_layout`` reads."""
    import torch

    return torch.zeros((1, *shape), dtype=dtype)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # a fuzzer that gets no answer asks for the stacks
    anyio.run(main, backend=sys.argv[1])
