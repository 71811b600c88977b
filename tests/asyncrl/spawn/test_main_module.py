"""Which ``__main__`` worker processes can run again, and hiding one they cannot."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from asyncrl._spawn.main_module import main_unavailable, without_unavailable_main


def _main(monkeypatch: pytest.MonkeyPatch, **attributes: object) -> types.ModuleType:
    main = types.ModuleType("__main__")
    for name, value in attributes.items():
        setattr(main, name, value)
    monkeypatch.setitem(sys.modules, "__main__", main)
    return main


def test_a_script_file_and_a_module_run_with_m_are_available(monkeypatch, tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    _main(monkeypatch, __file__=str(script))
    assert main_unavailable() is None
    _main(monkeypatch, __file__="<stdin>",
          __spec__=types.SimpleNamespace(name="pkg.train"))  # python -m pkg.train
    assert main_unavailable() is None


def test_stdin_and_an_interactive_session_are_not(monkeypatch) -> None:
    _main(monkeypatch, __file__="<stdin>")
    assert main_unavailable() == (
        "a script read from stdin (`python -`), not from a file that worker processes "
        "can run again (save it to a file and run that)")
    _main(monkeypatch)  # python -c, a REPL, a notebook
    assert main_unavailable() == "an interactive session (__main__ has no file)"


def test_a_stdin_main_is_hidden_while_processes_start_then_restored(monkeypatch) -> None:
    main = _main(monkeypatch, __file__="<stdin>")
    first, second = threading.Event(), threading.Event()
    seen: list[bool] = []

    def start() -> None:  # a second thread starting a process meanwhile
        with without_unavailable_main():
            first.set()
            second.wait(10)
            seen.append(hasattr(main, "__file__"))

    thread = threading.Thread(target=start)
    with without_unavailable_main():
        thread.start()
        assert first.wait(10)
        assert not hasattr(main, "__file__")
    # This thread's block ended; the other one still starts its process: still hidden.
    assert not hasattr(main, "__file__")
    second.set()
    thread.join(10)
    assert seen == [False]
    assert main.__file__ == "<stdin>"


def test_a_script_file_is_left_alone(monkeypatch, tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    main = _main(monkeypatch, __file__=str(script))
    with without_unavailable_main():
        assert main.__file__ == str(script)
