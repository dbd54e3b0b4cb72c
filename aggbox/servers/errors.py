"""Errors of the local-server layer."""

from __future__ import annotations

from aggregates.core.errors import AggboxError


class ServerError(AggboxError):
    """A local server (MongoDB, Kafka) or a tool it needs (java, mvn) is unusable.

    The message says what failed and what to install or set to fix it; when a server did not
    start, it ends with the tail of the server's log.
    """
