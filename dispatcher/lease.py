"""One active dispatcher per collection: a lease document with an expiry.

``aggbox_dispatcher_leases`` holds ``{_id: "<db>.<collection>", owner, expires_at,
renewed_at}``. Acquiring and renewing are the same atomic ``findAndModify``: it matches when
the lease is ours or has expired, and upserts when it does not exist; when another
instance holds a live lease the upsert collides on ``_id`` (E11000) and we stay standby.

The holder counts its lease as valid until ``ttl`` after it *sent* its last successful
renewal, minus a margin — so it stops publishing before a standby may take over (the
standby compares ``expires_at`` with its own clock: hosts' clocks must agree to well within
the margin). A dispatcher that lost its lease may still finish the publish in progress: at
worst an entry is published twice, with the same id, never lost.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

__all__ = ["Lease", "default_instance_id"]

log = logging.getLogger("aggbox.dispatcher.lease")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Lease:
    """The lease on one collection, from the point of view of ``owner``."""

    def __init__(
        self,
        coll: AsyncCollection[Any],
        key: str,
        owner: str,
        *,
        ttl_s: float,
        margin: float = 0.2,
        clock: Callable[[], datetime] = _utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coll = coll
        self.key = key
        self.owner = owner
        self.ttl_s = ttl_s
        self.margin = margin
        self._clock = clock
        self._monotonic = monotonic
        self._valid_until = 0.0
        self.holder: str | None = None

    @property
    def held(self) -> bool:
        """Whether this instance may publish now."""
        return self._monotonic() < self._valid_until

    async def acquire(self) -> bool:
        """Acquire or renew. ``False`` when another instance holds a live lease."""
        sent = self._monotonic()
        now = self._clock()
        try:
            doc = await self.coll.find_one_and_update(
                {"_id": self.key, "$or": [{"owner": self.owner}, {"expires_at": {"$lte": now}}]},
                {"$set": {"owner": self.owner, "expires_at": now + timedelta(seconds=self.ttl_s),
                          "renewed_at": now}},
                upsert=True,
                return_document=ReturnDocument.BEFORE,
            )
        except DuplicateKeyError:
            self._valid_until = 0.0
            current = await self.coll.find_one({"_id": self.key}, {"owner": 1})
            self.holder = current.get("owner") if current else None
            return False
        if doc is None or doc.get("owner") != self.owner:
            log.info("lease on %s acquired by %s (previous holder: %s)", self.key, self.owner,
                     doc.get("owner") if doc else None, extra={"lease": self.key})
        self.holder = self.owner
        self._valid_until = sent + self.ttl_s * (1.0 - self.margin)
        return True

    def forget(self) -> None:
        """Stop counting the lease as held (e.g. a renewal failed for too long)."""
        self._valid_until = 0.0

    async def release(self) -> None:
        """Give the lease up at once (graceful shutdown): a standby need not wait for it to
        expire."""
        self._valid_until = 0.0
        await self.coll.update_one({"_id": self.key, "owner": self.owner},
                                   {"$set": {"expires_at": _EPOCH}})
