"""Smoke test of the central-inference benchmark's quickest mode (asyncrl only)."""

from __future__ import annotations

import json

import pytest

from benchmarks import inference


@pytest.mark.slow
def test_inference_bench_quick_mode_writes_parsable_results(tmp_path) -> None:
    out = tmp_path / "inference.json"
    code = inference.main(["--quick", "--libraries", "batched,batched-process,per-worker",
                           "--policies", "mlp64", "--frames-per-batch", "64", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.inference --quick")
    runs = {r["library"]: r for r in report["results"]}
    assert set(runs) == {"batched", "batched-process", "per-worker"}
    for run in runs.values():
        assert run["error"] is None and run["fps"] > 0 and run["envs"] == 2


def test_inference_bench_rejects_unknown_names_before_running() -> None:
    assert inference.main(["--libraries", "rllib"]) == 2
    assert inference.main(["--policies", "cnn"]) == 2
