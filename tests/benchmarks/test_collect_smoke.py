"""Smoke test of the collection benchmark's quickest mode (asyncrl only, one tiny case)."""

from __future__ import annotations

import json

import pytest

from benchmarks import collect


@pytest.mark.slow
def test_collect_bench_quick_mode_writes_parsable_results(tmp_path) -> None:
    out = tmp_path / "collect.json"
    # An MLP policy whose head (Argmax) lives in the bench module: the spawned workers
    # must unpickle it by the module's import name.
    code = collect.main(["--quick", "--libraries", "asyncrl", "--envs", "CartPole-v1",
                         "--policies", "mlp64", "--cases", "sync-2x1",
                         "--frames-per-batch", "64", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["update_weights"] is True
    [result] = report["results"]
    assert (result["library"], result["env"], result["policy"]) == ("asyncrl", "CartPole-v1",
                                                                    "mlp64")
    assert result["error"] is None
    [run] = result["runs"]
    assert run["fps"] > 0 and result["median_fps"] == run["fps"]
    assert run["batch_shape"] == [2, 32]  # 2 workers x 1 env, 64 frames: [2, 32]
    assert run["weight_updates"] >= 2  # after the first batch and each timed one
    assert run["trainer_threads"] >= 1
    assert not run["leftover_pids"] and run["close_error"] is None


def test_collect_bench_rejects_unknown_names_before_running() -> None:
    assert collect.main(["--libraries", "asyncrl", "--policies", "mlpx"]) == 2
    assert collect.main(["--libraries", "asyncrl", "--cases", "3x3"]) == 2
    assert collect.main(["--libraries", "asyncrl", "--modes", "fast"]) == 2
