"""``asyncrl bench NAME`` runs ``benchmarks/NAME.py`` of a source checkout, or says where it is.

Also: every benchmark answers ``--help`` under its ``python -m benchmarks.NAME`` name.
"""

from __future__ import annotations

import glob
import importlib
import os

import pytest

from asyncrl.cli import BENCHMARKS, main, run_benchmark

MODULES = (*BENCHMARKS, "torchrl_faults", "mlp_before_after", "served_module")


def test_bench_without_a_checkout_exits_2_with_the_command_to_run_from_a_clone(
        tmp_path, capsys) -> None:
    assert run_benchmark("codec", ["--quick"], roots=[str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the benchmarks ship with asyncrl's source tree, not with the installed package" in err
    assert "python -m benchmarks.codec --quick" in err


def test_bench_ignores_a_benchmarks_package_outside_an_asyncrl_checkout(tmp_path, capsys) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "codec.py").write_text("raise SystemExit('not ours')\n")
    assert run_benchmark("codec", [], roots=[str(tmp_path)]) == 2
    assert "python -m benchmarks.codec" in capsys.readouterr().err


def test_bench_from_the_checkout_runs_the_benchmark_with_its_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "codec", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m benchmarks.codec")


@pytest.mark.parametrize("name", MODULES)
def test_each_benchmark_answers_help_under_its_module_name(name, capsys) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m benchmarks.{name}")


def test_benchmarks_are_not_part_of_the_installed_package() -> None:
    import asyncrl

    package = os.path.dirname(asyncrl.__file__)
    assert glob.glob(os.path.join(package, "bench", "*.py")) == []
