"""``on_worker_loss``'s every decision, asked of one LossPolicy, without a collector or socket."""

from __future__ import annotations

import doctest
from typing import ClassVar

import pytest

from asyncrl._coordinator import admission, loss_policy, losses, rounds, state
from asyncrl._coordinator.loss_policy import ON_WORKER_LOSS, LossOutcome, LossPolicy
from asyncrl._coordinator.records import WorkerInfo
from asyncrl._errors import BadBatchError, WorkerLostError
from asyncrl.weights import ZmqWeightSyncScheme

WORKER = WorkerInfo(3, b"w3", "w", "test-host", 42)


def test_the_words_are_checked_once_naming_every_mode() -> None:
    assert ON_WORKER_LOSS == ("raise", "continue", "wait", "restart")
    assert [LossPolicy.check(word).on_worker_loss for word in ON_WORKER_LOSS] == list(
        ON_WORKER_LOSS)
    for wrong in ("Raise", None, 1):
        with pytest.raises(ValueError, match=f"one of 'raise', 'continue', 'wait', 'restart'; "
                                             f"got {wrong!r}"):
            LossPolicy.check(wrong)


@pytest.mark.parametrize(("word", "fails", "waits", "respawns"), [
    ("raise", True, False, False), ("continue", False, False, False),
    ("wait", False, True, False), ("restart", False, True, True)])
def test_what_kind_of_run_each_mode_is(word: str, fails: bool, waits: bool,
                                       respawns: bool) -> None:
    policy = LossPolicy.check(word)
    assert (policy.fails_run, policy.waits_for_replacements, policy.respawns) == (
        fails, waits, respawns)


def test_a_loss_fails_the_run_writes_the_worker_off_or_keeps_its_place() -> None:
    failure = LossPolicy.check("raise").lost(WORKER, "stopped answering").failure
    assert isinstance(failure, WorkerLostError)
    assert str(failure) == ("worker 3 (w, pid 42 on test-host) stopped answering; pass "
                            "on_worker_loss='continue', 'wait' or 'restart' to carry on")
    assert LossPolicy.check("continue").lost(WORKER, "x") == LossOutcome(written_off=True)
    assert LossPolicy.check("wait").lost(WORKER, "x") == LossOutcome(vacancy=True)
    assert LossPolicy.check("restart").lost(WORKER, "x") == LossOutcome(vacancy=True)


def test_a_dead_local_process_that_nothing_can_replace_fails_a_waiting_run() -> None:
    error = WorkerLostError("worker 0 exited")
    assert LossPolicy.check("raise").exited(error, replaceable=True).failure is error
    assert LossPolicy.check("continue").exited(error, replaceable=False) == LossOutcome(
        written_off=True)
    assert LossPolicy.check("restart").exited(error, replaceable=True) == LossOutcome(
        vacancy=True)
    failure = LossPolicy.check("wait").exited(error, replaceable=False).failure
    assert str(failure).startswith(
        "worker 0 exited. on_worker_loss='wait' waits for a replacement, but nothing can "
        "replace a dead local worker here")


def test_a_bad_batch_fails_only_a_raise_run() -> None:
    failure = LossPolicy.check("raise").bad_batch(WORKER, "batch size [1, 4]")
    assert isinstance(failure, BadBatchError) and "batch size [1, 4]" in str(failure)
    assert all(LossPolicy.check(word).bad_batch(WORKER, "x") is None
               for word in ("continue", "wait", "restart"))


def test_a_departure_during_a_weight_update_fails_nothing_whatever_the_mode() -> None:
    assert LossPolicy.check("raise").fails_weight_update(departed=False)
    assert not LossPolicy.check("raise").fails_weight_update(departed=True)
    assert not any(LossPolicy.check(word).fails_weight_update(departed=False)
                   for word in ("continue", "wait", "restart"))


def test_a_crash_looping_slot_is_respawned_at_most_max_restarts_times() -> None:
    last = WorkerLostError("worker 1 (pid 7) was killed by SIGKILL")
    policy = LossPolicy.check("restart")
    assert policy.restart_refused(1, streak=2, max_restarts=3, last=last) is None
    refused = policy.restart_refused(1, streak=3, max_restarts=3, last=last)
    assert str(refused) == (
        "worker slot 1 died 4 times in a row without delivering a batch "
        "(on_worker_loss='restart', max_restarts=3); its last process: worker 1 (pid 7) was "
        "killed by SIGKILL")
    assert LossPolicy.check("wait").restart_refused(1, streak=9, max_restarts=3,
                                                    last=last) is None


def test_a_wait_that_outlasts_its_bound_fails_naming_the_slots_and_the_mode() -> None:
    failure = LossPolicy.check("wait").replacement_timed_out("worker 1 (w)", 5.0, 6.25)
    assert "worker 1 (w) was lost and no replacement joined within replacement_timeout=5.0 s" \
        in str(failure)
    assert "(on_worker_loss='wait', waited 6.2 s)" in str(failure)


class FixedScheme(ZmqWeightSyncScheme):
    """A scheme whose members cannot change (as torch.distributed's process group)."""

    fixed_membership: ClassVar[bool] = True


def test_a_scheme_with_fixed_membership_serves_only_a_raise_run() -> None:
    LossPolicy.check("raise").check_scheme("policy", FixedScheme())
    for word in ("continue", "wait", "restart"):
        LossPolicy.check(word).check_scheme("policy", ZmqWeightSyncScheme())
        with pytest.raises(ValueError, match="ZmqWeightSyncScheme") as caught:
            LossPolicy.check(word).check_scheme("policy", FixedScheme())
        assert f"on_worker_loss={word!r}" in str(caught.value)
        assert "FixedScheme (weight_sync_schemes['policy'])" in str(caught.value)


@pytest.mark.parametrize("module", [loss_policy, admission, rounds, losses, state],
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_examples_in_the_docstrings_run(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.failed == 0 and result.attempted > 0
