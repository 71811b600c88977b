"""Recurrent policies: state keys found on the policy, carried step to step in TorchRL's layout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn

from asyncrl import Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.loop import Rollout
from asyncrl._rollout.recurrent import describe_states, find_state_keys

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.collectors import Collector as TorchRLCollector  # noqa: E402
from torchrl.envs import Compose, GymEnv, InitTracker, TransformedEnv  # noqa: E402
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode  # noqa: E402

LIMIT = 120
STATE_KEYS = [("recurrent_state_h",), ("recurrent_state_c",)]


class Greedy(nn.Module):
    """Logits -> argmax action (deterministic, so runs can be compared bit for bit)."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)


def lstm_actor(seed: int = 0, hidden: int = 8) -> TensorDictSequential:
    torch.manual_seed(seed)
    lstm = LSTMModule(input_size=4, hidden_size=hidden, in_key="observation", out_key="embed")
    return TensorDictSequential(
        lstm,
        TensorDictModule(nn.Linear(hidden, 2), in_keys=["embed"], out_keys=["logits"]),
        TensorDictModule(Greedy(), in_keys=["logits"], out_keys=["action"]),
    )


class StepCount(TensorDictModuleBase):
    """A custom recurrent module: its state counts the steps since the last reset.

    Declares the TorchRL convention (reads ``"count"``, writes ``("next", "count")``)
    and reads the state with a default: asyncrl sizes it from the first output.
    The action alternates with the count, so CartPole episodes end at varied times
    only through the env; ``scale`` is a weight for the update tests.
    """

    in_keys = ["observation", "count"]
    out_keys = ["action", ("next", "count")]

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        count = td.get("count", None)
        if count is None:
            count = torch.zeros(td.shape[0], 1)
        td.set(("next", "count"), count + self.scale)
        td.set("action", (td.get("observation")[:, 2] > 0).long())  # lean-following
        return td


class NeedsState(StepCount):
    """Like StepCount but reads the state without a default and has no primer."""

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td.set(("next", "count"), td["count"] + 1)
        td.set("action", torch.zeros(td.shape[0], dtype=torch.long))
        return td


def check_carry(batch: TensorDictBase, keys: list[tuple[str, ...]]) -> None:
    """TorchRL's semantics on a ``[..., T]`` batch: zero + is_init after a reset, else carry."""
    batch = batch.reshape(-1, batch.shape[-1])  # [W, E, T] (stacked workers) -> [W*E, T]
    is_init = batch["is_init"].squeeze(-1)
    done = batch["next", "done"].squeeze(-1)
    assert not batch["next", "is_init"].any()
    assert torch.equal(is_init[:, 1:], done[:, :-1]), "is_init must follow every done"
    for key in keys:
        now, nxt = batch[key], batch[("next", *key)]
        dims = tuple(range(2, now.ndim))
        # zero state on every first frame
        assert not now[is_init].any(), f"{key}: state not zeroed after a reset"
        # carried: state at t+1 == next state at t, where no reset lies between
        carried = ~is_init[:, 1:]
        assert carried.any()
        assert torch.equal(now[:, 1:][carried], nxt[:, :-1][carried]), f"{key} not carried"
        assert (nxt.abs().sum(dims) > 0).all(), f"{key}: the policy's next state was not stored"


# -- discovery -------------------------------------------------------------------------------


def test_lstm_states_are_found_with_their_primer_shapes() -> None:
    actor = lstm_actor()
    spec = describe_states(actor, find_state_keys(actor))
    assert [(s.key, s.shape, s.dtype) for s in spec.states] == [
        (("recurrent_state_h",), (1, 8), torch.float32),
        (("recurrent_state_c",), (1, 8), torch.float32),
    ]


def test_gru_states_are_found_with_their_layers() -> None:
    gru = GRUModule(input_size=4, hidden_size=6, num_layers=2, in_key="observation",
                    out_key="embed")
    spec = describe_states(gru, find_state_keys(gru))
    assert [(s.key, s.shape) for s in spec.states] == [(("recurrent_state",), (2, 6))]


def test_custom_module_declaring_keys_is_found_and_sized_from_its_output() -> None:
    policy = StepCount()
    assert find_state_keys(policy) == (("count",),)
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), policy, frames_per_batch=20) as r:
        batch = r.collect()
    assert batch["count"].shape == batch["next", "count"].shape == (2, 10, 1)
    assert batch["is_init"].shape == batch["next", "is_init"].shape == (2, 10, 1)


@pytest.mark.parametrize(
    "policy",
    [
        None,
        nn.Linear(4, 2),
        TensorDictModule(nn.Sequential(nn.Linear(4, 2), Greedy()), ["observation"], ["action"]),
    ],
    ids=["random", "plain-module", "td-module"],
)
def test_non_recurrent_policies_are_unchanged(policy: object) -> None:
    if isinstance(policy, nn.Linear):
        policy = nn.Sequential(policy, Greedy())
    assert find_state_keys(policy) == ()
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), policy, frames_per_batch=8) as r:
        keys = set(r.collect().keys(True, True))
    assert "is_init" not in keys and ("next", "is_init") not in keys


def test_a_state_read_without_default_and_without_primer_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"needs the state \['count'\].*make_tensordict_primer"):
        Rollout(make_env_pool("CartPole-v1", num_envs=2), NeedsState(), frames_per_batch=8)


def test_a_next_state_of_the_wrong_shape_is_refused() -> None:
    class Wrong(StepCount):
        def forward(self, td: TensorDictBase) -> TensorDictBase:
            td.set(("next", "count"), torch.zeros(td.shape[0], 3))
            td.set("action", torch.zeros(td.shape[0], dtype=torch.long))
            return td

        def make_tensordict_primer(self) -> object:
            from torchrl.data import Composite, Unbounded
            from torchrl.envs import TensorDictPrimer

            return TensorDictPrimer(Composite(count=Unbounded(shape=(1,))))

    with pytest.raises(ValueError, match=r"wrote \('next', 'count'\).*expected a tensor of shape"):
        Rollout(make_env_pool("CartPole-v1", num_envs=2), Wrong(), frames_per_batch=8)


# -- carry semantics -------------------------------------------------------------------------


def test_batches_equal_torchrl_collector_with_primer_and_init_tracker() -> None:
    """Same env (a TorchRL env with the primer), same policy: the same frames, bit for bit."""
    t = 40

    def env() -> TransformedEnv:
        lstm = lstm_actor()[0]
        return TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True),
                              Compose(InitTracker(), lstm.make_tensordict_primer()))

    actor = lstm_actor()
    theirs_env = env()
    theirs_env.set_seed(0)
    collector = TorchRLCollector(theirs_env, actor, frames_per_batch=t, total_frames=2 * t)
    theirs = [b.clone() for b in collector]
    collector.shutdown()
    with Rollout(make_env_pool(env()), actor, frames_per_batch=t) as rollout:
        rollout.set_seed(0)
        ours = [rollout.collect()[0].clone() for _ in range(2)]
    for a, b in zip(theirs, ours, strict=True):
        assert a["next", "done"].any(), "the test needs an episode end inside a batch"
        for key in a.keys(True, True):
            assert b[key].dtype == a[key].dtype and torch.equal(b[key], a[key]), key
        assert set(b.keys(True, True)) - set(a.keys(True, True)) == {
            ("collector", "policy_version"), ("collector", "worker_id")}


def test_layout_and_semantics_match_torchrl_on_a_gymnasium_env() -> None:
    actor = lstm_actor()
    env = TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True),
                         Compose(InitTracker(), actor[0].make_tensordict_primer()))
    env.set_seed(1)
    collector = TorchRLCollector(env, actor, frames_per_batch=60, total_frames=60)
    theirs = next(iter(collector)).clone()
    collector.shutdown()
    with Rollout(make_env_pool("CartPole-v1", num_envs=3), actor, frames_per_batch=180) as r:
        r.set_seed(1)
        ours = r.collect().clone()
    assert set(ours.keys(True, True)) - set(theirs.keys(True, True)) == {
        ("collector", "policy_version"), ("collector", "worker_id")}
    for key in theirs.keys(True, True):
        assert ours[key].shape[2:] == theirs[key].shape[1:], key
        assert ours[key].dtype == theirs[key].dtype, key
    check_carry(theirs.unsqueeze(0), STATE_KEYS)  # the rule, checked on TorchRL's own batch
    check_carry(ours, STATE_KEYS)
    assert ours["next", "done"].any()


def test_a_loss_replays_the_batch_in_recurrent_mode() -> None:
    actor = lstm_actor()
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), actor, frames_per_batch=120) as r:
        r.set_seed(3)
        batch = r.collect().clone()
    assert batch["next", "done"].any()
    replay = batch.clone().exclude("embed", "logits", "action")
    with set_recurrent_mode(True), torch.no_grad():
        actor(replay)
    torch.testing.assert_close(replay["embed"], batch["embed"])
    assert torch.equal(replay["action"], batch["action"])


def test_state_is_per_env_and_carried_across_batches() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=3), StepCount(),
                 frames_per_batch=3 * 50) as r:
        r.set_seed(0)
        batches = [r.collect().clone() for _ in range(3)]
    full = torch.cat(batches, 1)
    assert full["next", "done"].sum() >= 3
    count = full["count"].squeeze(-1)
    # per env: the count is the number of steps since that env's own last reset
    for env in range(3):
        is_init = full["is_init"][env].squeeze(-1).tolist()
        expected, c = [], 0
        for first in is_init:
            c = 0 if first else c + 1
            expected.append(float(c))
        assert count[env].tolist() == expected
    assert full["is_init"][:, 0].all() and not batches[1]["is_init"][:, 0].all()
    check_carry(full, [("count",)])


def test_reset_zeroes_only_the_masked_envs() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), StepCount(), frames_per_batch=6) as r:
        r.collect()
        r.reset(np.array([True, False]))
        batch = r.collect()
    assert batch["count"][:, 0].squeeze(-1).tolist() == [0.0, 3.0]
    assert batch["is_init"][:, 0].squeeze(-1).tolist() == [True, False]


def test_random_frames_keep_the_state() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), StepCount(), frames_per_batch=8,
                 init_random_frames=4) as r:
        batch = r.collect()
    # two random steps: the state stays zero and is stored unchanged; then the policy counts
    assert batch["count"][:, :3].sum() == 0 and batch["next", "count"][:, :2].sum() == 0
    assert batch["next", "count"][:, 2:].squeeze(-1).tolist() == [[1.0, 2.0]] * 2


# -- collectors ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_in_process_collector_carries_state_through_weight_updates() -> None:
    policy = StepCount()
    with anyio.fail_after(LIMIT):
        async with Collector("CartPole-v1", policy, frames_per_batch=40, envs_per_worker=2,
                             total_frames=160) as collector:
            batches = []
            async for batch in collector:
                batches.append(batch.clone())
                with torch.no_grad():
                    policy.scale.fill_(1.0)  # same value: the state must survive the update
                await collector.update_policy_weights()
    full = torch.cat(batches, 1)
    check_carry(full, [("count",)])
    assert full["count"].max() > 20  # episodes span batches: the state was not reset


@pytest.mark.anyio
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_worker_processes_carry_lstm_state_per_env(cls: type) -> None:
    actor = lstm_actor()
    with anyio.fail_after(LIMIT):
        async with cls("CartPole-v1", actor, num_workers=2, envs_per_worker=2,
                       frames_per_batch=160, total_frames=480) as collector:
            batches = []
            async for batch in collector:
                batches.append(batch.clone())
                await collector.update_policy_weights(actor.state_dict())
    for batch in batches:
        assert batch["recurrent_state_h"].shape[-2:] == (1, 8)
        check_carry(batch, STATE_KEYS)
    assert any(b["next", "done"].any() for b in batches)
    if cls is MultiSyncCollector:  # row i is the same env in every round
        check_carry(torch.cat(batches, -1), STATE_KEYS)  # carried across updates and batches


@pytest.mark.anyio
async def test_worker_processes_with_a_torchrl_env_and_a_gru() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(make_torchrl_env, gru_actor(), num_workers=2,
                                      envs_per_worker=2, frames_per_batch=120,
                                      total_frames=240) as collector:
            batches = [b.clone() async for b in collector]
    for batch in batches:
        assert batch.shape == (2, 2, 30)  # [workers, envs, time], TorchRL's stack
        check_carry(batch, [("recurrent_state",)])
        assert batch["recurrent_state"].shape[-2:] == (2, 6)


def gru_actor() -> TensorDictSequential:
    torch.manual_seed(0)
    gru = GRUModule(input_size=4, hidden_size=6, num_layers=2, in_key="observation",
                    out_key="embed")
    return TensorDictSequential(
        gru,
        TensorDictModule(nn.Linear(6, 2), in_keys=["embed"], out_keys=["logits"]),
        TensorDictModule(Greedy(), in_keys=["logits"], out_keys=["action"]),
    )


def make_torchrl_env() -> TransformedEnv:
    """A TorchRL env as a TorchRL user writes it for an RNN: InitTracker and the primer."""
    return TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True),
                          Compose(InitTracker(), gru_actor()[0].make_tensordict_primer()))


def test_the_recurrent_example_trains_on_a_tiny_budget() -> None:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "examples/train_recurrent.py", "--frames", "1024",
         "--frames-per-batch", "512", "--workers", "1", "--envs-per-worker", "2"],
        cwd=root, env=env, capture_output=True, text=True, timeout=LIMIT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("frames=")]
    assert [ln.split()[0] for ln in lines] == ["frames=512", "frames=1024"]


def test_the_docs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "recurrent.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/recurrent.md", "exec"), {"__name__": "docs_recurrent"})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines  # two batches of [2 envs, 32 steps]
    for line in lines:
        shape, resets = line.rsplit(" ", 1)
        assert shape == "torch.Size([2, 32, 1, 32])" and int(resets) >= 2  # both envs start
