"""Smoke test of benchmarks/atari.py: asyncrl's case and one peer for a couple of tiny batches."""

from __future__ import annotations

import json

import pytest

from benchmarks import atari


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
    code = atari.main(["--cases", "vector,asyncrl-async", "--repeats", "1", "--seconds", "0.01",
                       "--warmup", "1", "--frames-per-batch", "64", "--json", str(out)])
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
