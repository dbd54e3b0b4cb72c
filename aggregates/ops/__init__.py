"""Operations that write: re-submit dead letters, release parked messages, and the stores
behind ``aggbox deadletters …`` / ``aggbox parked …``.

Everything here changes the database; the read-only helpers (``replay``, ``trace``,
``load_aggregate``, listings) are in :mod:`aggregates.debug`.

- :func:`replay_dead_letters` → :class:`DeadLetterReplay`: what ``aggbox deadletters
  replay`` does.
- :func:`release_aggregate` → :class:`ReleaseResult`, :func:`clear_block`: what ``aggbox
  parked release`` does.
- :class:`DeadLetterStore`, :class:`ParkedStore`: the two collections and their admin
  operations (list, dismiss, purge …).
"""

from aggregates.ops.redrive import DeadLetterReplay, replay_dead_letters
from aggregates.ops.release import ReleaseResult, clear_block, release_aggregate
from aggregates.store.deadletters import DeadLetterStore
from aggregates.store.parking import ParkedStore

__all__ = [
    "DeadLetterReplay",
    "DeadLetterStore",
    "ParkedStore",
    "ReleaseResult",
    "clear_block",
    "release_aggregate",
    "replay_dead_letters",
]
