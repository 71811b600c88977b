"""Reading a subprocess's JSON event lines with deadlines (shared by the multi-host tests)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time


class Lines:
    """JSON lines of a subprocess, read by a thread; ``until`` waits with a deadline."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.events: list[dict] = []
        self.other: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(process.stdout,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def until(self, predicate, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            if not line.startswith("{"):
                self.other.append(line)
                continue
            event = json.loads(line)
            self.events.append(event)
            if predicate(event):
                return event
        raise AssertionError(f"no matching event within {timeout} s; last events: "
                             f"{self.events[-5:]}; other output: {''.join(self.other[-20:])}")
