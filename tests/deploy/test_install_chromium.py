"""scripts/install_chromium.sh: CI gets Debian's chromium; nothing else ever fails on it.

apt-get and sudo are stubs on a PATH of their own here: they record their arguments.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install_chromium.sh"


def stub(folder: Path, name: str, code: int) -> None:
    path = folder / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{folder}/calls"\nexit {code}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run(folder: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    for tool in ("id", "env"):  # what the script needs besides its stubs
        found = shutil.which(tool)
        assert found is not None
        (folder / tool).symlink_to(found)
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, str(SCRIPT)], env={"PATH": str(folder)}, capture_output=True,
                          text=True, timeout=60)
    calls = folder / "calls"
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_it_installs_debians_chromium_by_package_name(tmp_path: Path) -> None:
    stub(tmp_path, "apt-get", 0)
    stub(tmp_path, "sudo", 0)
    done, calls = run(tmp_path)
    assert done.returncode == 0, done.stderr
    apt = [c.removeprefix("sudo -n ") for c in calls if "apt-get" in c]
    if os.getuid() == 0:
        assert calls == ["apt-get update -qq", "apt-get install -y -qq --no-install-recommends "
                         "chromium"]
    else:  # through sudo -n (which here runs nothing: the stub only records)
        assert apt == ["apt-get update -qq", "env DEBIAN_FRONTEND=noninteractive apt-get "
                       "install -y -qq --no-install-recommends chromium"][:len(apt)]
    assert "installed Debian's chromium" in done.stdout


def test_nothing_is_installed_where_a_browser_is_on_path(tmp_path: Path) -> None:
    stub(tmp_path, "apt-get", 0)
    stub(tmp_path, "chromium", 0)
    done, calls = run(tmp_path)
    assert (done.returncode, calls, done.stdout, done.stderr) == (0, [], "", "")


def test_a_failing_or_missing_apt_get_is_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    stub(tmp_path / "a", "apt-get", 100)
    stub(tmp_path / "a", "sudo", 1)
    done, _ = run(tmp_path / "a")
    assert done.returncode == 0
    assert "could not install Debian's chromium: the status page's browser test will skip" \
        in done.stderr
    (tmp_path / "b").mkdir()
    done, calls = run(tmp_path / "b")  # no apt-get at all (not Debian)
    assert (done.returncode, calls, done.stderr) == (0, [], "")
