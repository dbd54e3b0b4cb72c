"""Every error aggbox raises derives from :class:`AggboxError`.

Messages say what went wrong *and* what to do about it.
"""

from __future__ import annotations

from typing import Any


class AggboxError(Exception):
    """Base of every aggbox error."""


class EnvelopeError(AggboxError, ValueError):
    """A message envelope is invalid. ``field`` names the offending field; ``code`` is the
    reason code (:class:`~aggregates.core.reasons.Reason` value) when the problem has one
    of its own (``payload_too_large``, ``payload_too_deep``), else ``None``
    (``invalid_envelope``) — callers decide by it, never by the text."""

    def __init__(self, field: str, reason: str, *, code: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.code = code
        super().__init__(f"invalid message envelope: field {field!r}: {reason}")


class ConfigurationError(AggboxError):
    """A setting, aggregate definition or registry is wrong."""


class UnknownAggregateType(ConfigurationError, KeyError):
    """No aggregate type with this name is registered."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(
            f"unknown aggregate type {name!r}; registered types: {sorted(known)}. "
            "Register it with Registry.register(...) or pass the module that defines it "
            "(--aggregates)."
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class UnknownMessageType(ConfigurationError, KeyError):
    """The aggregate type has no handler for this message type."""

    def __init__(self, aggregate_type: str, message_type: str, known: list[str]) -> None:
        self.aggregate_type = aggregate_type
        self.message_type = message_type
        super().__init__(
            f"aggregate type {aggregate_type!r} has no handler for message type "
            f"{message_type!r}; it handles {sorted(known)}. Add a handler with "
            f"@<your AggregateType>.handles({message_type!r})."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidFieldName(AggboxError, ValueError):
    """A document key starts with ``$`` or contains ``.`` (operator injection)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"field name at {path!r} starts with '$' or contains '.'; such names could "
            "become MongoDB operators or update paths. Rename the key in the payload/state."
        )


class HandlerError(AggboxError):
    """A handler broke its contract (bad return value, non-deterministic output)."""


class RetryableError(AggboxError):
    """Raise from a handler for a transient failure: the batch fails and is retried
    (by Spark or the caller) instead of dead-lettering the message."""


class DeploymentError(AggboxError):
    """A handler (or upcaster) cannot run where it runs: it raised :class:`ImportError` (or
    :class:`ModuleNotFoundError`), i.e. a module it imports is not installed there. That is
    never the message's fault, so the message is neither applied nor dead-lettered: the
    error propagates like :class:`RetryableError` — the batch (the Spark task) fails, its
    input stays for the retry — and ``aggbox run`` ends with this one line (docs/design.md,
    "Deployment errors"). ``module`` is the module that could not be imported, when known."""

    def __init__(self, message: str, module: str | None = None) -> None:
        super().__init__(message)
        self.module = module

    def __reduce__(self) -> tuple[Any, ...]:  # both arguments survive pickling
        return (type(self), (str(self.args[0]) if self.args else "", self.module))


class StoreError(AggboxError):
    """The store refused or could not confirm a write (or returned something the writer
    cannot interpret).

    ``code`` is the server's error code (pymongo's ``code``, or the failing operation's
    ``code`` in a bulk write result; ``None`` when there is none) and ``labels`` the error
    labels (``RetryableWriteError``, ``TransientTransactionError``, …) — kept so that retry
    decisions are made from them, not from the text. The pymongo exception, when there is
    one, is the ``__cause__``."""

    def __init__(self, message: str, *, code: int | None = None,
                 labels: frozenset[str] | set[str] | tuple[str, ...] = frozenset()) -> None:
        super().__init__(message)
        self.code = code
        self.labels: frozenset[str] = frozenset(labels)

    def __reduce__(self) -> tuple[Any, ...]:  # keep code and labels across pickling (Spark)
        return (type(self), (str(self.args[0]) if self.args else "",),
                {"code": self.code, "labels": self.labels})


class UnknownSchemaVersion(AggboxError):
    """A message carries a ``schema_version`` newer than the latest its aggregate type knows
    (dead-lettered ``unknown_schema_version``): deploy the new definitions first."""


class UpcastFailed(AggboxError):
    """An upcaster raised, or returned something that is not a payload dict (dead-lettered
    ``upcast_failed``)."""


class StateMigrationError(AggboxError):
    """A stored state cannot be brought to the current state version: it was written by a
    newer version, a migration is missing, or a migration raised (the aggregate's messages
    are dead-lettered ``invalid_state``)."""
