"""Smoke test of ``benchmarks.central_inference_parts``: each part runs and reports."""

from __future__ import annotations

from benchmarks import central_inference_parts


def test_each_part_runs_its_real_code_and_reports_cpu_per_frame(capsys) -> None:
    code = central_inference_parts.main([
        "--chunks", "2", "--calls", "50", "--batches", "1", "--repeats", "1",
        "--capacity", "512", "--frames-per-batch", "256"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    for part in ("stepper", "server", "intake"):
        assert any(line.startswith(f"{part}: CPU µs per frame") for line in lines), lines
    # the trainer's stand-in that really takes the chunks, in the stepper's thread
    assert central_inference_parts.main([
        "--parts", "stepper", "--take", "--chunks", "2", "--repeats", "1",
        "--capacity", "512"]) == 0
