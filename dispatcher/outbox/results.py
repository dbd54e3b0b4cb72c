"""What publishing a batch of documents came to (:class:`CycleResult`; the cycle's, the
sweeps' and the worker's counts add them up)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CycleResult"]


@dataclass(slots=True)
class CycleResult:
    documents: int = 0
    published: int = 0
    #: of ``published``, the effect entries executed instead (dispatcher.effects)
    executed: int = 0
    dead_lettered: int = 0
    stale: int = 0
    #: documents with entries still pending after a retryable failure (retry after backoff)
    retry: list[Any] = field(default_factory=list)
    retry_error: str | None = None
    #: the lease was not held: nothing was published
    lease_lost: bool = False

    def add(self, other: CycleResult) -> None:
        self.documents += other.documents
        self.published += other.published
        self.executed += other.executed
        self.dead_lettered += other.dead_lettered
        self.stale += other.stale
        self.retry.extend(other.retry)
        self.retry_error = self.retry_error or other.retry_error
        self.lease_lost = self.lease_lost or other.lease_lost
