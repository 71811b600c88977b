"""Smoke test of benchmarks/atari.py: asyncrl's case and one peer for a couple of tiny batches."""

from __future__ import annotations

import json

import pytest

from benchmarks import atari, pixels


def test_the_floor_is_the_cores_cpu_over_env_and_cnn_per_frame() -> None:
    floor = {"env_ms": 0.6, "cnn_ms": {"4": 0.65, "8": 0.4}}
    assert atari.floor_fps(floor, 8, cores=2) == pytest.approx(2000.0)
    assert atari.floor_fps(floor, 4, cores=2) == pytest.approx(1600.0)
    assert atari.floor_fps(floor, 8, cores=64) == pytest.approx(8000.0)  # 8 envs: 8 cores


def test_a_package_that_does_not_import_is_named_as_the_reason_to_skip() -> None:
    assert atari.missing(("json",)) is None
    assert atari.missing(("json", "no_such_package_here")) == (
        "no_such_package_here does not import (ModuleNotFoundError: No module named "
        "'no_such_package_here')")


def test_the_bench_rejects_unknown_cases_before_running_any() -> None:
    assert atari.main(["--cases", "floor,envpool,asyncrl-fast"]) == 2


@pytest.mark.slow
def test_asyncrl_and_asyncvectorenv_report_frames_cpu_memory_and_first_batch(tmp_path) -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    out = tmp_path / "atari.json"
    # 0.3 s timed: CPU time is read from /proc in 10 ms ticks per process, so one fast
    # batch of 64 frames spread over 9 processes could read as no CPU at all
    code = atari.main(["--cases", "vector,asyncrl-async", "--repeats", "1", "--seconds", "0.3",
                       "--warmup", "1", "--frames-per-batch", "64", "--with-optimizer",
                       "--json", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    assert sorted(results) == ["asyncrl-async", "vector"]
    for case in ("vector", "asyncrl-async"):
        [run] = results[case]
        assert run["frames"] >= 64 and run["frames"] % 64 == 0  # whole timed batches
        assert run["fps"] > 0 and run["cpu_per_10k"] > 0
        # the main process and its env workers (8 for vector, 2 + fork server for asyncrl)
        assert run["processes"] >= 3 and run["pss_mb"] > 0
        assert 0 < run["first_batch_s"] < 600
        assert run["with_optimizer"] is True  # the flag reached the case's interpreter
        # each process's PSS, split by what its pages map, adds up to its whole
        for role, (_, mb) in run["pss_by_role"].items():
            assert sum(run["pss_by_kind"][role].values()) == pytest.approx(mb, rel=0.02)
        assert run["pss_by_kind"]["trainer"]["torch libraries"] > 0


def test_pss_by_kind_sums_each_role_over_its_processes() -> None:
    rows = [{"role": "trainer", "pss_mb": 3.0,
             "kinds_mb": {"anonymous": 2.0, "shared memory": 1.0}},
            {"role": "worker", "pss_mb": 1.5, "kinds_mb": {"anonymous": 1.0, "shared memory": 0.5}},
            {"role": "worker", "pss_mb": 2.0, "kinds_mb": {"anonymous": 2.0}}]
    assert pixels.by_kind_mb(rows) == {"trainer": {"anonymous": 2.0, "shared memory": 1.0},
                                       "worker": {"anonymous": 3.0, "shared memory": 0.5}}
    assert pixels.by_role_mb(rows) == {"trainer": [1, 3.0], "worker": [2, 3.5]}


@pytest.mark.parametrize(("argv", "says"), [
    (["--envs", "8", "--workers", "3"], "--workers must divide --envs"),
    (["--envs", "16", "--workers", "4", "--frames-per-batch", "1000"],
     "--frames-per-batch must be a positive multiple of 64 (16 envs x 4 workers), got 1000"),
    (["--device", "gpu0"], "--device 'gpu0' is not a torch device"),
])
def test_a_shape_the_cases_cannot_run_is_refused_before_any_case(argv, says, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        atari.main(["--cases", "floor", *argv])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_cuda_on_a_machine_without_it_is_refused_naming_cpu(capsys, monkeypatch) -> None:
    monkeypatch.setattr(atari.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        atari.main(["--cases", "floor", "--device", "cuda"])
    assert "--device cuda: this machine has no CUDA device; use cpu" in capsys.readouterr().err


def test_the_labels_and_batches_follow_the_runs_shape(monkeypatch) -> None:
    monkeypatch.setattr(atari.Shape, "envs", 32)
    monkeypatch.setattr(atari.Shape, "workers", 16)
    assert atari.CASES["asyncrl-sync"].title() == "asyncrl MultiSyncCollector 16x2"
    assert atari.CASES["asyncrl-sync"].cnn_batch == 2
    assert atari.CASES["asyncrl-batched"].cnn_batch == 32
    assert atari.CASES["asyncrl-batched-2x4s2"].title() == (
        "asyncrl AsyncBatchedCollector, 16 env workers x 2 envs in 2 splits")
    assert atari.floor_batches() == [1, 2, 32]
    assert atari.floor_fps({"env_ms": 0.5, "cnn_ms": {"32": 0.0}}, 32, cores=16) == (
        pytest.approx(32000.0))  # the CNN on a GPU: 16 cores of env steps
