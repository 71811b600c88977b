"""The coordinator's decisions without a hub: each event, the exact sends it returns.

:class:`CoordinatorState` changes state synchronously and returns the actions
to take (sends, expulsions, weight catch-ups), so admission, credits, rounds
and loss are checked here message by message, with no socket and no event loop.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from asyncrl._coordinator.state import CatchUp, CoordinatorState, Expel, Send, WorkerInfo
from asyncrl._errors import BadBatchError, WorkerLostError
from asyncrl._protocol import (
    PROTOCOL,
    Batch,
    Collect,
    Hello,
    Preempt,
    Refuse,
    Rejoin,
    RelayHello,
    RelayWelcome,
    Welcome,
)
from tests.asyncrl.coordinator.rules import rules

FRAMES = 8
TOKEN = "spawn-token"
INSTANCE = "hub-instance"


def state(**options: Any) -> CoordinatorState:
    defaults: dict[str, Any] = {
        "sync": False, "share_frames": [FRAMES], "accept_remote": True, "token": TOKEN}
    return CoordinatorState(*rules(**{**defaults, **options}), instance=INSTANCE,
                            peer_timeout=5.0)


def hello(*, slot: int = -1, token: str = "", protocol: int = PROTOCOL, pid: int = 0,
          specs: dict[str, Any] | None = None, attempt: int = 0, relay: str = "") -> Hello:
    return Hello(protocol=protocol, name="w", host="test-host", pid=pid or os.getpid(),
                 specs={} if specs is None else specs, slot=slot, token=token,
                 relay=relay, attempt=attempt)


def welcome(index: int, attempt: int = 0) -> Welcome:
    return Welcome(index=index, share_frames=FRAMES, attempt=attempt, instance=INSTANCE,
                   compact_batches=True)


def share(worker_id: int, steps: int = FRAMES) -> TensorDict:
    """A batch in TorchRL's layout, ``[1 env, steps]``, from worker ``worker_id``."""
    shape = (1, steps)

    def flags() -> torch.Tensor:
        return torch.zeros((*shape, 1), dtype=torch.bool)

    return TensorDict({
        "action": torch.zeros(shape, dtype=torch.int64),
        "next": TensorDict({"reward": torch.ones((*shape, 1)), "done": flags(),
                            "terminated": flags(), "truncated": flags()}, batch_size=shape),
        "collector": TensorDict({
            "traj_ids": torch.zeros(shape, dtype=torch.int64),
            "worker_id": torch.full(shape, worker_id, dtype=torch.int64),
            "policy_version": torch.zeros(shape, dtype=torch.int64)}, batch_size=shape),
    }, batch_size=shape)


def admit(s: CoordinatorState, peer: bytes, **options: Any) -> WorkerInfo:
    actions = s.hello(peer, hello(**options))
    assert isinstance(actions[0], Send) and isinstance(actions[0].message, Welcome), actions
    return s.roster.workers[peer]


# -- admission ------------------------------------------------------------------------------
def test_an_accepted_hello_is_welcomed_with_the_next_index_caught_up_then_given_credits() -> None:
    s = state(prefetch=2)
    actions = s.hello(b"a", hello())
    a = s.roster.workers[b"a"]
    assert actions == [Send(b"a", welcome(1)), CatchUp(a),
                       Send(b"a", Collect(1, 1)), Send(b"a", Collect(1, 1))]
    assert s.hello(b"b", hello())[0] == Send(b"b", welcome(2))  # remote: after the local slot
    assert [w.index for w in s.roster.live_workers] == [1, 2]
    assert s.admission.specs == {}  # the first hello's specs become the reference


def test_a_local_worker_is_welcomed_with_the_slot_it_was_spawned_for() -> None:
    s = state(share_frames=[FRAMES, FRAMES])
    assert s.hello(b"w", hello(slot=1, token=TOKEN))[0] == Send(b"w", welcome(1))


@pytest.mark.parametrize(("options", "hello_options", "reason"), [
    ({}, {"slot": 0, "token": "forged"},
     "token: this worker was not spawned by this coordinator"),
    ({}, {"protocol": PROTOCOL + 98},
     f"protocol: coordinator speaks {PROTOCOL}, worker {PROTOCOL + 98}"),
    ({"accept_remote": False}, {}, "remote workers are not accepted by this collector"),
    ({"specs": {"obs": [4]}, "check_specs": lambda ours, h: [] if h.specs == ours
      else [f"specs: {h.specs} differs from {ours}"]}, {"specs": {"obs": [5]}},
     "specs: {'obs': [5]} differs from {'obs': [4]}"),
], ids=["token", "protocol", "remote", "specs"])
def test_a_bad_hello_is_refused_naming_the_problem(options: dict[str, Any],
                                                   hello_options: dict[str, Any],
                                                   reason: str) -> None:
    s = state(**options)
    assert s.hello(b"x", hello(**hello_options)) == [Send(b"x", Refuse(reason))]
    assert s.roster.workers == {}


def test_a_taken_slot_and_a_full_house_are_refused() -> None:
    s = state(share_frames=[FRAMES], max_remote_workers=1)
    admit(s, b"local", slot=0, token=TOKEN)
    assert s.hello(b"twin", hello(slot=0, token=TOKEN, pid=1)) == [
        Send(b"twin", Refuse("slot: worker index 0 is taken"))]
    admit(s, b"remote")
    assert s.hello(b"more", hello(pid=1)) == [Send(b"more", Refuse(
        "remote_workers: this collector takes at most 1 remote worker(s) and 1 already "
        "joined; stop one or start the trainer with a larger remote_workers", full=True))]


def test_a_repeated_hello_is_welcomed_again_with_what_the_worker_is_owed() -> None:
    s = state(prefetch=2)
    a = admit(s, b"a")
    assert s.hello(b"a", hello(attempt=1)) == [
        Send(b"a", welcome(1, attempt=1)), CatchUp(a), Send(b"a", Collect(1, 2))]
    assert a.credits == 2 and len(s.roster.workers) == 1  # one admission, nothing granted twice


def test_a_strangers_batch_and_a_stale_batch_are_ignored() -> None:
    s = state()
    assert s.batch(b"stranger", Batch(0, share(0))) == []
    a = admit(s, b"a")
    assert s.batch(b"a", Batch(a.index + 7, share(a.index))) == []  # another admission's
    assert not s.rounds.ready and a.credits == 1 and a.delivered == 0


def test_a_relay_is_welcomed_and_routes_only_the_workers_that_name_it() -> None:
    s = state()
    relay = RelayHello(protocol=PROTOCOL, name="r", host="test-host", pid=1,
                       members=[b"a", b"b"])
    assert s.admission.relay_hello(b"r", relay) == [Send(b"r", RelayWelcome(2, instance=INSTANCE))]
    a = admit(s, b"a", relay="r")
    admit(s, b"b")  # listed by the relay, but its hello names none: weights go direct
    assert s.roster.relay_routes() == {a.index: b"r"}
    assert state(accept_remote=False).admission.relay_hello(b"r", relay) == [Send(b"r", Refuse(
        "remote workers (and their relays) are not accepted by this collector; pass "
        "listen= and remote_workers="))]


# -- credits (async) --------------------------------------------------------------------------
def test_a_worker_holds_at_most_prefetch_credits_and_a_taken_batch_returns_one() -> None:
    s = state(prefetch=2)
    a = admit(s, b"a")
    assert a.credits == 2 and a.ahead == 2
    assert s.batch(b"a", Batch(a.index, share(a.index))) == []  # delivered: no credit yet
    assert (a.credits, a.queued, a.delivered) == (1, 1, 1)
    worker, frames, actions = s.rounds.take() or pytest.fail("a batch was ready")
    assert worker is a and frames.numel() == FRAMES
    assert actions == [Send(b"a", Collect(a.index, 1))]
    assert (a.credits, a.queued) == (2, 0)
    assert s.rounds.take() is None


def test_the_budget_bounds_the_credits_granted() -> None:
    s = state(prefetch=2, batch_budget=3)
    a, b = admit(s, b"a"), admit(s, b"b")
    assert (a.credits, b.credits, s.rounds.budget) == (2, 1, 0)
    s.batch(b"b", Batch(b.index, share(b.index)))
    taken = s.rounds.take()
    assert taken is not None and taken[0] is b and taken[2] == []  # the budget is spent
    assert s.rounds.budget == 0 and b.ahead == 0


def test_a_paused_run_withholds_the_credit_and_resume_hands_it_back() -> None:
    s = state()
    a = admit(s, b"a")
    s.rounds.paused = True
    s.batch(b"a", Batch(a.index, share(a.index)))
    taken = s.rounds.take()
    assert taken is not None and taken[0] is a and taken[2] == []
    assert a.ahead == 0
    assert s.rounds.resume() == [Send(b"a", Collect(a.index, 1))]
    assert a.credits == 1


def test_a_bad_batch_is_refused_never_counted_and_fails_the_run_under_raise() -> None:
    s = state()
    a = admit(s, b"a")
    actions = s.batch(b"a", Batch(a.index, share(a.index, steps=FRAMES // 2)))
    assert actions == [Send(b"a", Refuse(
        f"your batch for request {a.index} was rejected: batch size [1, {FRAMES // 2}]: "
        f"expected {FRAMES} frames")), Expel(b"a")]
    assert not a.alive and a.delivered == 0 and not s.rounds.ready
    assert isinstance(s.losses.failure, BadBatchError)
    assert "sent a batch that is not what was asked" in str(s.losses.failure)


# -- sync rounds ------------------------------------------------------------------------------
def sync_state(workers: int, **options: Any) -> tuple[CoordinatorState, list[WorkerInfo]]:
    s = state(sync=True, share_frames=[FRAMES] * workers, **options)
    admitted = [admit(s, f"w{i}".encode(), slot=i, token=TOKEN) for i in range(workers)]
    return s, admitted


def test_a_round_asks_one_share_of_each_worker_and_completes_with_the_last() -> None:
    s, (w0, _, w2) = sync_state(3)
    round_, actions = s.start_round()
    assert actions == [Send(b"w0", Collect(1, 1)), Send(b"w1", Collect(1, 1)),
                       Send(b"w2", Collect(1, 1))]
    for worker in (w2, w0):
        assert s.batch(worker.peer, Batch(1, share(worker.index))) == []
    assert not round_.complete
    assert s.batch(b"w1", Batch(2, share(1))) == []  # another round's: discarded
    assert s.batch(b"w1", Batch(1, share(1))) == [] and round_.complete
    assert [w.index for w, _ in s.rounds.end_round(round_)] == [0, 1, 2]
    assert s.rounds.round is None


def test_a_round_asks_only_the_workers_that_total_frames_still_needs() -> None:
    s, _ = sync_state(3)
    _, actions = s.start_round(max_frames=FRAMES + 1)
    assert actions == [Send(b"w0", Collect(1, 1)), Send(b"w1", Collect(1, 1))]


def test_the_stragglers_are_preempted_once_the_threshold_delivered() -> None:
    s, (_, _, w2) = sync_state(3, preemptive_threshold=0.5)
    round_, _ = s.start_round()
    assert s.batch(b"w0", Batch(1, share(0))) == []  # 1 of 3: below ceil(0.5 * 3) = 2
    assert s.batch(b"w1", Batch(1, share(1))) == [Send(b"w2", Preempt(1))]
    assert round_.preempted and round_.missing() == [w2]
    assert s.batch(b"w2", Batch(1, share(2, steps=3))) == []  # cut short: accepted
    assert round_.complete


# -- loss -------------------------------------------------------------------------------------
def test_a_lost_workers_credits_go_back_to_the_budget_and_to_the_others() -> None:
    s = state(prefetch=2, batch_budget=3, on_worker_loss="continue")
    a, b = admit(s, b"a"), admit(s, b"b")
    assert (a.credits, b.credits, s.rounds.budget) == (2, 1, 0)
    assert s.losses.lost(b"a") == [Expel(b"a"), Send(b"b", Collect(b.index, 1))]
    assert (a.alive, a.credits, b.credits, s.rounds.budget) == (False, 0, 2, 1)
    assert s.batch(b"a", Batch(a.index, share(a.index))) == []  # its late batch: dropped
    assert s.losses.written_off == 1 and b"a" in s.losses.gone


def test_a_lost_workers_share_is_released_and_the_round_completes_without_it() -> None:
    s, (w0, _) = sync_state(2, on_worker_loss="continue")
    round_, _ = s.start_round()
    assert s.batch(b"w0", Batch(1, share(0))) == []
    assert s.losses.lost(b"w1") == [Expel(b"w1")]
    assert round_.complete and list(round_.targets) == [b"w0"]
    assert [w for w, _ in s.rounds.end_round(round_)] == [w0]


def test_under_wait_a_lost_share_is_asked_of_the_next_worker_to_join() -> None:
    s, _ = sync_state(2, on_worker_loss="wait")
    round_, _ = s.start_round()
    assert s.losses.lost(b"w1") == [Expel(b"w1")]
    assert round_.replacements == 1 and not round_.complete
    actions = s.hello(b"new", hello())
    newcomer = s.roster.workers[b"new"]
    assert actions == [Send(b"new", welcome(2)), CatchUp(newcomer),
                       Send(b"new", Collect(1, 1))]
    assert round_.replacements == 0 and list(round_.targets) == [b"w0", b"new"]


def test_a_lost_worker_fails_the_run_under_raise_naming_it() -> None:
    s = state()
    a = admit(s, b"a")
    s.losses.lost(b"a")
    assert isinstance(s.losses.failure, WorkerLostError)
    assert str(s.losses.failure) == (
        f"worker {a.index} (w, pid {a.pid} on test-host) stopped answering; pass "
        "on_worker_loss='continue', 'wait' or 'restart' to carry on")


def test_a_dropped_worker_that_speaks_again_is_told_to_rejoin_once() -> None:
    s = state(on_worker_loss="continue")
    admit(s, b"a")
    s.losses.lost(b"a")
    assert s.losses.returned(b"a") == [Send(b"a", Rejoin("silent for more than 5.0 s"))]
    assert s.losses.returned(b"a") == []
    assert s.losses.returned(b"stranger") == []


def test_a_dead_local_worker_that_nothing_can_replace_fails_a_waiting_run() -> None:
    s, _ = sync_state(1, on_worker_loss="wait")
    assert s.losses.exited(b"w0", WorkerLostError("worker 0 exited"), replaceable=False) == [
        Expel(b"w0")]
    assert str(s.losses.failure).startswith(
        "worker 0 exited. on_worker_loss='wait' waits for a replacement, but nothing can "
        "replace a dead local worker here")


def test_an_order_carries_its_admission_so_one_lost_before_it_went_out_is_dropped() -> None:
    s = state()
    actions = s.hello(b"a", hello())
    s.losses.lost(b"a")
    orders = [a for a in actions if isinstance(a, Send)]
    assert orders and all(send.worker is not None and not send.worker.alive
                          for send in orders)
