"""The exit codes every asyncrl process ends with, in one place.

A worker (``asyncrl worker``, a collector's local worker, a host's worker), an
env worker and the inference process end with one of these; the trainer reads
them back (a lost local worker's code says what likely happened) and the CLI's
``--help`` lists them. Written once so that the process that exits and the one
that reads the code agree.

>>> EXIT_OK, EXIT_ERROR, EXIT_BAD_ARGUMENTS, EXIT_COORDINATOR_LOST, EXIT_REFUSED
(0, 1, 2, 3, 4)
"""

from __future__ import annotations

#: Closed by the coordinator, or stopped by SIGTERM / SIGINT.
EXIT_OK = 0
#: An env or policy error (reported to the coordinator first when it could be).
EXIT_ERROR = 1
#: Bad command-line arguments (an import path that does not resolve, bad keys...).
EXIT_BAD_ARGUMENTS = 2
#: The coordinator is gone, never answered, or the parent process died.
EXIT_COORDINATOR_LOST = 3
#: The coordinator refused this worker (or revoked its key, or the run stayed full).
EXIT_REFUSED = 4
#: No welcome within ``join_timeout``: the coordinator never answered, or stayed full.
EXIT_JOIN_TIMEOUT = 5
#: Not a process exit code: ends one admission when the coordinator says "rejoin".
EXIT_REJOIN = -1000

def likely_causes(exitcode: int | None) -> str:
    """What usually makes a local worker end that way, and what to do about it."""
    if exitcode == EXIT_ERROR:
        return ("it failed before it could report an error to the coordinator; likely "
                "causes: the script that creates the collector lacks an "
                "`if __name__ == \"__main__\":` guard (spawned workers import it again), "
                "the env factory or the policy cannot be unpickled in a fresh process "
                "(defined in an interactive session, a lambda, a class that moved), or "
                "user code called sys.exit(1); its traceback, if any, is on stderr")
    if exitcode == EXIT_COORDINATOR_LOST:
        return "it heard nothing from the coordinator within peer_timeout and gave up"
    if exitcode == EXIT_REFUSED:
        return "the coordinator refused it (see the warning logged by asyncrl.coordinator)"
    if exitcode is not None and exitcode < 0:
        return ("a signal ended it: the OOM killer (see `dmesg`), a `kill`, or a crash "
                "in native code (SIGSEGV, SIGABRT)")
    return "it ended before the collector was closed"


__all__ = ["EXIT_BAD_ARGUMENTS", "EXIT_COORDINATOR_LOST", "EXIT_ERROR", "EXIT_JOIN_TIMEOUT",
           "EXIT_OK", "EXIT_REFUSED", "EXIT_REJOIN", "likely_causes"]
