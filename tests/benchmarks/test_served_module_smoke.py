"""The served-module benchmark: its cases, its TorchRL skip, its reward check (issue #46)."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import served_module, served_module_torchrl

RESULT = {"start_s": 2.0, "frames_s": 100.0, "pss_mb": 500.0, "checked_frames": 8.0,
          "newest_version_share": 1.0}


def test_unknown_cases_are_refused_before_anything_runs(monkeypatch, capsys) -> None:
    monkeypatch.setattr(served_module, "run_one", lambda case, passed: pytest.fail(case))
    assert served_module.main(["--cases", "served,torchrl-rpc"]) == 2
    err = capsys.readouterr().err
    assert "unknown cases ['torchrl-rpc']" in err
    assert "torchrl-ray, torchrl-ray-worker, torchrl-copied" in err


def test_cases_run_in_their_order_with_ratios_to_copied_and_torchrl(monkeypatch, capsys) -> None:
    ran = []
    monkeypatch.setattr(served_module_torchrl, "missing", lambda case: None)
    monkeypatch.setattr(served_module, "run_one",
                        lambda case, passed: ran.append((case, passed)) or dict(RESULT))
    assert served_module.main(["--cases", "copied,torchrl-copied,served,torchrl-ray",
                               "--repeats", "2", "--update-weights"]) == 0
    order = ["served", "torchrl-ray", "torchrl-copied", "copied"]
    assert [case for case, _ in ran] == order * 2  # interleaved repeats, copied last
    assert all("--update-weights" in passed for _, passed in ran)
    out = capsys.readouterr().out
    assert "| torchrl-ray | 2.0 | 100 | 500 | - |" in out
    for a, b in (("served", "copied"), ("torchrl-ray", "torchrl-copied"),
                 ("served", "torchrl-ray"), ("copied", "torchrl-copied")):
        assert f"| {a} / {b} | 1.00x | 1.00x | 1.00x | |" in out


def test_the_default_cases_and_the_flags_that_add_to_them() -> None:
    args = argparse.Namespace(cases=None, ray=False, torchrl=False)
    assert served_module.pick_cases(args) == ["served", "served-process", "copied"]
    args.ray = args.torchrl = True
    assert served_module.pick_cases(args) == [
        "served", "served-process", "served-ray", "torchrl-ray", "torchrl-ray-worker",
        "torchrl-copied", "copied"]


def test_a_torchrl_case_without_torchrl_or_ray_is_skipped_saying_why(monkeypatch, capsys) -> None:
    ran = []
    monkeypatch.setattr(served_module_torchrl, "missing",
                        lambda case: "ray is not importable (ModuleNotFoundError: ray)"
                        if case.startswith("torchrl-ray") else None)
    monkeypatch.setattr(served_module, "run_one",
                        lambda case, passed: ran.append(case) or dict(RESULT))
    assert served_module.main(["--torchrl", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert ran == ["served", "served-process", "torchrl-copied", "copied"]
    for case in ("torchrl-ray", "torchrl-ray-worker"):
        assert f"# {case} skipped: ray is not importable (ModuleNotFoundError: ray)" in out


def test_only_skipped_cases_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setattr(served_module_torchrl, "missing", lambda case: "torchrl is not here")
    monkeypatch.setattr(served_module, "run_one", lambda case, passed: pytest.fail(case))
    assert served_module.main(["--cases", "torchrl-copied"]) == 2
    assert "no case can run here" in capsys.readouterr().err


def test_a_failing_case_is_reported_and_not_run_again(monkeypatch, capsys) -> None:
    ran = []

    def run_one(case, passed):
        ran.append(case)
        return "exit 1\nValueError: boom" if case == "served" else dict(RESULT)

    monkeypatch.setattr(served_module, "run_one", run_one)
    assert served_module.main(["--cases", "served,copied", "--repeats", "2"]) == 1
    assert ran == ["served", "copied", "copied"]
    assert "# served failed: exit 1\nValueError: boom" in capsys.readouterr().out


def test_the_reward_check_reads_each_frames_version_and_refuses_other_rewards() -> None:
    base = served_module.reward_model(8)
    obs = torch.randn(2, 5, 4)
    with torch.no_grad():
        at = {v: served_module.reward_model(8) for v in (0, 1, 2)}
        for v, model in at.items():
            model.load_state_dict(served_module.versioned(base, v))
        reward = {v: model(obs).reshape(2, 5, 1) for v, model in at.items()}
    # batch 0 at version 0; batch 2 came at version 2, its first row still at version 1
    mixed = torch.cat([reward[1][:1], reward[2][1:]])
    out = served_module.check_rewards(base, [(obs, reward[0], 0), (obs, mixed, 2)])
    assert out == {"checked_frames": 20, "newest_version_share": 15 / 20}
    with pytest.raises(AssertionError, match="rewards are not the reward model's"):
        served_module.check_rewards(base, [(obs, torch.ones(2, 5, 1), 0)])  # CartPole's own
    with pytest.raises(AssertionError, match=r"versions 0..0 in a batch that came at version 2"):
        served_module.check_rewards(base, [(obs, reward[0], 2)])  # two updates missed


def test_torchrl_weights_of_a_version_raise_the_output_bias_by_it() -> None:
    pytest.importorskip("torchrl")
    module = served_module_torchrl.reward_module(8)
    params = served_module_torchrl.versioned(module, 3)
    assert torch.equal(params["module", "6", "bias"], module.module[6].bias.detach() + 3)
    assert torch.equal(params["module", "0", "weight"], module.module[0].weight.detach())
