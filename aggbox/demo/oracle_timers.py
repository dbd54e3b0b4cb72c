"""The oracle's timers (:mod:`aggbox.demo.oracle`): what a handler's ``Schedule`` and
``Cancel`` leave pending on its aggregate — the oracle's own bookkeeping, not the library's
(:mod:`aggregates.fold.timers`); only the two classes of the domain API are shared.

Neither is an emitted message. A ``Schedule`` takes the aggregate's next timer number
(``_tseq``, apart from the emits' ``_seq``; one per ``Schedule``, in order) and becomes the
pending timer of its key, replacing a pending one of that key; a ``Cancel`` removes the
pending timer of its key, if there is one, and takes no number. The oracle never fires a
timer: none becomes due while the demo runs (the writer's due time is its clock at the
handling plus the delay, and the domain waits 30 minutes), so whatever is pending at the
end must be in the documents' ``timers``.

A timer removed (cancelled or replaced) after it was stored may have been firing at that
moment, so the writer records its message as handled in the aggregate's dedup record, if
it is addressed to the aggregate itself (docs/design.md "Timers"). The oracle counts a
timer as stored when an earlier round scheduled it (:func:`aggbox.demo.oracle.fold_messages`
gets it as a pending timer); one scheduled and removed in the same round is recorded only
if the writer happened to cut its fold between the two — the demo's domain never does that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from aggbox.demo.oracle_envelope import Key, plain_payload
from aggregates.domain.timers import Cancel, Schedule

__all__ = ["PendingTimer", "TimerOp", "apply_timer_ops", "split_returned"]

TimerOp = Schedule | Cancel


@dataclass(frozen=True, slots=True)
class PendingTimer:
    """A timer the oracle expects pending: its key, the message it will publish (type,
    target, payload), the message whose handling scheduled it, the ``seq`` it took, and
    when it is due — ``after`` the handling, or ``at`` a time (one of the two is given)."""

    key: str
    type: str
    target: Key
    payload: dict[str, Any]
    causation_id: str
    seq: int
    after: timedelta | None = None
    at: datetime | None = None


def split_returned(returned: Iterable[Any]) -> tuple[list[Any], list[TimerOp]]:
    """What a handler returned beside its state: its emits, and its timer operations, each
    in their order."""
    emits: list[Any] = []
    ops: list[TimerOp] = []
    for x in returned:
        if isinstance(x, Schedule | Cancel):
            ops.append(x)
        else:
            emits.append(x)
    return emits, ops


def apply_timer_ops(timers: dict[str, PendingTimer], ops: Sequence[TimerOp], *, owner: Key,
                    cause: str, seq: int) -> tuple[int, list[PendingTimer]]:
    """Apply ``ops`` in order to ``timers`` (key → timer, changed in place) for a message
    ``cause`` handled by ``owner``, whose last timer number taken is ``seq``. Returns the
    last number taken after them (each ``Schedule`` takes the next one) and the timers they
    removed."""
    removed: list[PendingTimer] = []
    for op in ops:
        old = timers.pop(op.key, None)
        if old is not None:
            removed.append(old)
        if isinstance(op, Schedule):
            seq += 1
            to = op.emit.to
            timers[op.key] = PendingTimer(
                key=op.key, type=op.emit.type,
                target=owner if to is None else (to[0], to[1]),
                payload=plain_payload(op.emit.payload), causation_id=cause, seq=seq,
                after=op.after, at=op.at)
    return seq, removed
