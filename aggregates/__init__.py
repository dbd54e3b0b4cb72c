"""aggbox's library for domain teams: aggregate types, handlers, the message envelope,
dedup strategies, the store writer, dead letters and parked messages, and the notebook
debugging helpers (:mod:`aggregates.debug`).

It imports neither ``spark`` nor ``dispatcher``."""

from aggregates.aggregate import (
    AggregateRef,
    AggregateType,
    Emit,
    Handled,
    Handler,
    InvalidPayload,
    MessageHandler,
    Registry,
)
from aggregates.codec import StateCodec, StateCodecError
from aggregates.deadletters import DeadLetterStore
from aggregates.debug import (
    AggregateView,
    dead_letters,
    load_aggregate,
    release_aggregate,
    replay,
    replay_dead_letters,
    trace,
)
from aggregates.dedup import HighWater, Inbox, NoDedup
from aggregates.envelope import Message, Source
from aggregates.errors import (
    AggboxError,
    ConfigurationError,
    EnvelopeError,
    HandlerError,
    InvalidFieldName,
    RetryableError,
    StateMigrationError,
    StoreError,
    UnknownAggregateType,
    UnknownMessageType,
    UnknownSchemaVersion,
    UpcastFailed,
)
from aggregates.ids import emitted_message_id
from aggregates.outcomes import Outcome, OutcomeCounts
from aggregates.parking import ParkedStore
from aggregates.settings import AggboxSettings
from aggregates.writer import StoreWriter

__all__ = [
    "AggboxError",
    "AggboxSettings",
    "AggregateRef",
    "AggregateType",
    "AggregateView",
    "ConfigurationError",
    "DeadLetterStore",
    "Emit",
    "EnvelopeError",
    "Handled",
    "Handler",
    "HandlerError",
    "HighWater",
    "Inbox",
    "InvalidFieldName",
    "InvalidPayload",
    "Message",
    "MessageHandler",
    "NoDedup",
    "Outcome",
    "OutcomeCounts",
    "ParkedStore",
    "Registry",
    "RetryableError",
    "Source",
    "StateCodec",
    "StateCodecError",
    "StateMigrationError",
    "StoreError",
    "StoreWriter",
    "UnknownAggregateType",
    "UnknownMessageType",
    "UnknownSchemaVersion",
    "UpcastFailed",
    "dead_letters",
    "emitted_message_id",
    "load_aggregate",
    "release_aggregate",
    "replay",
    "replay_dead_letters",
    "trace",
]
