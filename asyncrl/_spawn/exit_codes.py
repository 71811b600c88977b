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

__all__ = ["EXIT_BAD_ARGUMENTS", "EXIT_COORDINATOR_LOST", "EXIT_ERROR", "EXIT_JOIN_TIMEOUT",
           "EXIT_OK", "EXIT_REFUSED", "EXIT_REJOIN"]
