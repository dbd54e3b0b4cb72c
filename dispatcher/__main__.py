"""``python -m dispatcher [options]``: the same as ``aggbox dispatch [options]``."""

from __future__ import annotations

import sys

from dispatcher.cli import main

if __name__ == "__main__":
    sys.exit(main())
