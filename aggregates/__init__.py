"""aggbox's library for domain teams — the domain API: aggregate types and handlers, ``Emit``
and refs, the message envelope, dedup strategies, state codecs, the store writer, settings,
errors, outcomes and reason codes, the side effects executed after a write
(``Effects``: docs/side-effects.md), timers (``Schedule``, ``Cancel``: docs/concepts.md
"Timers"), and ``parse_fence`` for the ``fence`` header of the
records the dispatcher publishes.

Elsewhere, by what they do:

- :mod:`aggregates.debug`: notebook helpers that read (``load_aggregate``, ``replay``,
  ``trace``, ``dead_letters`` …); nothing there writes.
- :mod:`aggregates.ops`: operations that write (``replay_dead_letters``,
  ``release_aggregate``, ``DeadLetterStore``, ``ParkedStore``).
- :mod:`aggregates.testing`: ``AggregateHarness`` for unit tests without a server.

It imports neither ``spark`` nor ``dispatcher``."""

from aggregates.codec import StateCodec, StateCodecError
from aggregates.core.errors import (
    AggboxError,
    ConfigurationError,
    DeploymentError,
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
from aggregates.core.ids import emitted_message_id
from aggregates.core.reasons import Reason
from aggregates.core.settings import AggboxSettings
from aggregates.dedup import HighWater, Inbox, NoDedup
from aggregates.domain.aggregate import (
    AggregateRef,
    AggregateType,
    Emit,
    Handled,
    Handler,
    InvalidPayload,
    MessageHandler,
    Registry,
)
from aggregates.domain.effects import (
    Effect,
    EffectCall,
    EffectError,
    Effects,
    PermanentEffectError,
    RetryableEffectError,
)
from aggregates.domain.timers import TIMER_HEADER, Cancel, Schedule, timer_message_id
from aggregates.message.envelope import Message, Source
from aggregates.message.outcomes import Outcome, OutcomeCounts
from aggregates.store.writer import StoreWriter
from aggregates.wire.fence import Fence, InvalidFence, parse_fence

__all__ = [
    "TIMER_HEADER",
    "AggboxError",
    "AggboxSettings",
    "AggregateRef",
    "AggregateType",
    "Cancel",
    "ConfigurationError",
    "DeploymentError",
    "Effect",
    "EffectCall",
    "EffectError",
    "Effects",
    "Emit",
    "EnvelopeError",
    "Fence",
    "Handled",
    "Handler",
    "HandlerError",
    "HighWater",
    "Inbox",
    "InvalidFence",
    "InvalidFieldName",
    "InvalidPayload",
    "Message",
    "MessageHandler",
    "NoDedup",
    "Outcome",
    "OutcomeCounts",
    "PermanentEffectError",
    "Reason",
    "Registry",
    "RetryableEffectError",
    "RetryableError",
    "Schedule",
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
    "emitted_message_id",
    "parse_fence",
    "timer_message_id",
]
