"""An env factory that takes a while (a pixel env loading its ROMs): for signal tests.

It writes the file named by ``ASYNCRL_TEST_BUILDING`` when it starts, then blocks
for ``ASYNCRL_TEST_BUILD_SECONDS`` (default 3) without yielding, as a real build does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from asyncrl.testing import CountingEnv


def slow_env() -> Any:
    Path(os.environ["ASYNCRL_TEST_BUILDING"]).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("ASYNCRL_TEST_BUILD_SECONDS", "3")))
    return CountingEnv()
