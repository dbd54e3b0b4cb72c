"""How many examples a property test runs: a quick depth by default (``make test`` on a
slow, busy laptop) and the deep one in CI (``.ci/run`` sets ``HYPOTHESIS_PROFILE=deep``).

Tests write ``@settings(max_examples=examples(300), ...)``: 300 in the deep profile, a
quarter of it (at least 10, or all of a smaller number) in the quick one.
"""

from __future__ import annotations

import os

__all__ = ["DEEP", "examples"]

#: True when the deep profile is asked for (``HYPOTHESIS_PROFILE=deep``)
DEEP = os.environ.get("HYPOTHESIS_PROFILE", "").strip().lower() == "deep"


def examples(deep: int) -> int:
    """``deep`` in the deep profile, else a quarter of it (at least ``min(deep, 10)``)."""
    return deep if DEEP else max(min(deep, 10), deep // 4)
