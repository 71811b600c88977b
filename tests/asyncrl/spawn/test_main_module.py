"""Which ``__main__`` worker processes can run again, and hiding one they cannot."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from asyncrl._spawn.main_module import has_main_guard, main_unavailable, without_unavailable_main


def _main(monkeypatch: pytest.MonkeyPatch, **attributes: object) -> types.ModuleType:
    main = types.ModuleType("__main__")
    for name, value in attributes.items():
        setattr(main, name, value)
    monkeypatch.setitem(sys.modules, "__main__", main)
    return main


GUARDED = "def main():\n    pass\n\nif __name__ == '__main__':\n    main()\n"


def test_a_script_file_and_a_module_run_with_m_are_available(monkeypatch, tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(GUARDED)
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
    script.write_text(GUARDED)
    main = _main(monkeypatch, __file__=str(script))
    with without_unavailable_main():
        assert main.__file__ == str(script)


@pytest.mark.parametrize("guard", [
    'if __name__ == "__main__":\n    main()\n',
    "if '__main__' == __name__:\n    main()\n",
    'if __name__ == "__main__" and len(sys.argv) > 0:\n    main()\nelse:\n    pass\n',
])
def test_a_main_guard_is_found_whichever_way_it_is_written(tmp_path, guard: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\n\ndef main():\n    pass\n\n" + guard)
    assert has_main_guard(str(script))


@pytest.mark.parametrize("body", [
    "import asyncrl\nprint('training')\n",
    "def main():\n    if __name__ == '__main__':\n        pass\n\nmain()\n",  # not top level
    "if __name__ != '__main__':\n    pass\n",
    "",
])
def test_a_script_without_a_top_level_main_guard_is_not_run_again(
        monkeypatch, tmp_path, body: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(body)
    assert not has_main_guard(str(script))
    main = _main(monkeypatch, __file__=str(script))
    assert main_unavailable() == (
        f"a script without an `if __name__ == \"__main__\":` guard ({str(script)!r}): worker "
        "processes would run all of it again, so they start without it (put what runs at "
        "its top level under the guard)")
    with without_unavailable_main():  # hidden from the fork server and every child
        assert not hasattr(main, "__file__")
    assert main.__file__ == str(script)


def test_a_file_that_cannot_be_parsed_counts_as_guarded(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("def broken(:\n")
    assert has_main_guard(str(script))
    assert has_main_guard(str(tmp_path / "missing.py"))
