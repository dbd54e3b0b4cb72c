"""The demo's error type."""

from __future__ import annotations

from aggregates.core.errors import AggboxError

__all__ = ["DemoError"]


class DemoError(AggboxError):
    """The demo cannot run as asked (the message says which option to change)."""
