"""``python -m asyncrl``: the ``asyncrl`` command (where its script is not on PATH)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
