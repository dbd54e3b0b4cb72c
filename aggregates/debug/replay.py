"""Replay messages against one aggregate in memory and see every step (nothing is written).

    replay(customers, messages, start=load_aggregate(db, registry, "Customer", "c-1"))

Each message goes through :func:`aggregates.fold.fold` on its own, with the aggregate's
parked messages carried along, so dedup, parking, outbox limits and handler-error rules are
exactly the writer's. Versions count one write per message (the writer writes once per slice
of messages, so stored versions may be lower).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aggregates.core.errors import AggboxError
from aggregates.debug._deps import make_frame, require_pandas
from aggregates.debug.diff import state_diff
from aggregates.debug.view import AggregateView
from aggregates.domain.aggregate import AggregateType
from aggregates.fold import DeadLetter, FoldResult, Parked, fold
from aggregates.fold.document import Snapshot, snapshot_from_document
from aggregates.message.envelope import Message

if TYPE_CHECKING:
    import pandas as pd

#: Columns of the :func:`replay` table, in order.
REPLAY_COLUMNS = ("step", "message_id", "type", "outcome", "reason", "detail", "from_parked",
                  "changes", "emitted_ids", "emitted_types", "version")


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One outcome of a replay. ``step`` is the index of the input message whose fold
    produced it; a parked message released by that fold has ``from_parked=True``.

    ``changes`` (``field → (before, after)``, plus ``_blocked`` when a handler error blocks
    the aggregate) covers the whole fold and is shown on its first applied row (else on
    the input message's row); ``version`` is ``_v`` after the fold."""

    step: int
    message_id: str
    type: str
    outcome: str
    reason: str | None
    detail: str | None
    from_parked: bool
    changes: dict[str, tuple[Any, Any]]
    emitted_ids: tuple[str, ...]
    emitted_types: tuple[str, ...]
    version: int

    def as_row(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in REPLAY_COLUMNS}


@dataclass
class ReplayRun:
    """The result of :func:`replay_steps`: the steps and where the aggregate ended up."""

    atype: AggregateType[Any] = field(repr=False)
    steps: list[ReplayStep]
    snapshot: Snapshot
    outbox: list[dict[str, Any]] = field(default_factory=list)
    parked: list[Parked] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)

    @property
    def state(self) -> Any:
        """The final domain state object."""
        return self.atype.load_state(self.snapshot.state, self.snapshot.state_version)

    def to_frame(self) -> pd.DataFrame:
        """The steps as a pandas DataFrame (columns :data:`REPLAY_COLUMNS`)."""
        return make_frame("replay()", [s.as_row() for s in self.steps], REPLAY_COLUMNS)


Start = Snapshot | AggregateView | Mapping[str, Any] | None


def replay_steps(
    atype: AggregateType[Any],
    messages: Iterable[Message | Mapping[str, Any]],
    *,
    start: Start = None,
    aggregate_id: str | None = None,
    now: datetime | None = None,
    drain_outbox: bool = False,
) -> ReplayRun:
    """Fold ``messages`` one at a time onto ``start`` (a :class:`Snapshot`, an
    :class:`AggregateView` from :func:`load_aggregate`, a stored document, or ``None`` for a
    new aggregate whose id is ``aggregate_id`` or the first message's). Messages may be
    :class:`Message` objects or envelope dicts. Parked messages of an ``AggregateView``
    start parked here too. ``now`` stamps outbox entries (default: the current time).

    The outbox fills up as it would with the dispatcher stopped (so ``max_outbox`` parks
    messages as in production); ``drain_outbox=True`` simulates a running dispatcher that
    publishes the pending entries after every step."""
    msgs = [m if isinstance(m, Message) else Message.from_dict(m, max_payload_bytes=0)
            for m in messages]
    snap, parked = _start(start, aggregate_id, msgs)
    if isinstance(start, AggregateView):
        # What the inbox archive holds for these messages (an in-memory replay keeps the
        # ids it evicts itself).
        snap.dedup.looked_up(start.archived([m.message_id for m in msgs]
                                            + [p.message.message_id for p in parked]))
    elif start is None:
        snap.dedup.looked_up({})
    when = now or _utc_now()
    by_id = {p.message.message_id: p.message for p in parked}
    steps: list[ReplayStep] = []
    run = ReplayRun(atype, steps, snap, parked=list(parked))
    for i, msg in enumerate(msgs):
        if msg.aggregate_type != atype.name or msg.aggregate_id != snap.aggregate_id:
            raise AggboxError(
                f"message {i} ({msg.message_id!r}) is for {msg.aggregate_type}/"
                f"{msg.aggregate_id}, the replay runs {atype.name}/{snap.aggregate_id}; "
                "replay one aggregate at a time"
            )
        by_id.setdefault(msg.message_id, msg)
        res = fold(atype, snap, [msg], now=when, parked=run.parked)
        if not res.changes.empty:
            res.snapshot.version += 1
        steps.extend(_steps(atype, i, snap, res, by_id))
        snap = res.snapshot
        if drain_outbox:
            snap.outbox_ids = []
        released = set(res.released)
        run.parked = [p for p in run.parked if p.message.message_id not in released]
        run.parked.extend(res.parked)
        run.outbox.extend(res.changes.outbox)
        run.dead_letters.extend(res.dead_letters)
    run.snapshot = snap
    return run


def _steps(atype: AggregateType[Any], i: int, snap: Snapshot, res: FoldResult,
           by_id: Mapping[str, Message]) -> list[ReplayStep]:
    """The rows of step ``i`` (one per outcome; the state changes go on the applied one, or
    the message's own when none applied)."""
    changes = state_diff(_state_before(atype, snap), res.snapshot.state)
    if res.changes.blocked is not None:
        changes["_blocked"] = (snap.blocked, res.changes.blocked)
    emitted = {e["id"]: str(e["type"]) for e in res.changes.outbox}
    outcomes = res.outcomes
    holder = next((k for k, o in enumerate(outcomes) if o.outcome == "applied"),
                  next((k for k, o in enumerate(outcomes) if not o.from_parked), 0))
    return [ReplayStep(
        step=i,
        message_id=o.message_id,
        type=by_id[o.message_id].type if o.message_id in by_id else "",
        outcome=o.outcome,
        reason=o.reason,
        detail=o.detail,
        from_parked=o.from_parked,
        changes=changes if k == holder else {},
        emitted_ids=o.emitted_ids,
        emitted_types=tuple(emitted.get(e, "") for e in o.emitted_ids),
        version=res.snapshot.version,
    ) for k, o in enumerate(outcomes)]


def replay(
    atype: AggregateType[Any],
    messages: Iterable[Message | Mapping[str, Any]],
    *,
    start: Start = None,
    aggregate_id: str | None = None,
    now: datetime | None = None,
    drain_outbox: bool = False,
) -> pd.DataFrame:
    """:func:`replay_steps` as a pandas DataFrame, one row per outcome (columns
    :data:`REPLAY_COLUMNS`). Needs pandas (``pip install aggbox[notebook]``); use
    :func:`replay_steps` for the final state, outbox and parked messages."""
    require_pandas("replay()")
    return replay_steps(atype, messages, start=start, aggregate_id=aggregate_id, now=now,
                        drain_outbox=drain_outbox).to_frame()


def _start(start: Start, aggregate_id: str | None, msgs: list[Message]
           ) -> tuple[Snapshot, list[Parked]]:
    if isinstance(start, AggregateView):
        parked = [Parked(Message.from_dict(p["message"], max_payload_bytes=0), p["reason"],
                         p.get("detail")) for p in start.parked if p.get("message")]
        return start.snapshot(), parked
    if isinstance(start, Snapshot):
        return start, []
    if isinstance(start, Mapping):
        return snapshot_from_document(start, str(start["_id"])), []
    agg = aggregate_id or (msgs[0].aggregate_id if msgs else None)
    if agg is None:
        raise AggboxError("replay of no messages on a new aggregate: pass aggregate_id=...")
    return Snapshot(aggregate_id=agg), []


def _state_before(atype: AggregateType[Any], snap: Snapshot) -> dict[str, Any] | None:
    """The stored state, or for a new aggregate its initial state (so a first step shows
    the fields its handler set, not every field)."""
    if snap.state is not None:
        return snap.state
    try:
        return atype.codec.dump(atype.codec.initial())
    except Exception:  # a state type without a no-argument constructor: diff against {}
        return None


def _utc_now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


__all__ = ["REPLAY_COLUMNS", "ReplayRun", "ReplayStep", "replay", "replay_steps"]
