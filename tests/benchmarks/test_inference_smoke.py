"""Smoke test of the central-inference benchmark's quickest mode (asyncrl only)."""

from __future__ import annotations

import json

import pytest
import torch

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


def test_inference_bench_refuses_a_device_this_machine_lacks(capsys) -> None:
    assert inference.main(["--device", "nonsense"]) == 2
    assert "not a torch device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert inference.main(["--device", "cuda", "--policies", "mlp1024"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_inference_bench_skips_the_torchrl_row_without_torchrl(monkeypatch, capsys) -> None:
    ran = []
    monkeypatch.setattr(inference, "torchrl_missing", lambda: "ModuleNotFoundError: torchrl")
    monkeypatch.setattr(inference, "run_one", lambda lib, policy, n, args: ran.append(lib) or {
        "library": lib, "policy": policy, "envs": n, "fps": 100.0, "rates": [100.0],
        "error": None, "seconds": 0.0})
    assert inference.main(["--libraries", "torchrl,per-worker", "--policies", "mlp64",
                           "--envs", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert ran == ["per-worker"]
    assert "torchrl is not importable here (ModuleNotFoundError: torchrl): its row is skipped" \
        in out
    assert "| mlp64 | 2 | 100 |" in out
