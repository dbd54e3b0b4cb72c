"""Applying messages to one aggregate in memory (pure: no I/O, no clock of its own).

The store writer and the in-memory testing helpers both use :func:`fold`, so dedup, outbox
and parking rules are the same in tests and in production.

:func:`fold` runs two passes at most. The *fast* pass checks the document's size budget
once, on the result (:meth:`_Folder.finish` says whether it fits); only when it does not is
the fold redone by the *strict* pass, which checks the budget per message to find the
culprit(s). Both passes are pure, so the redo sees exactly the same inputs.

One message goes through :meth:`_Folder.step`: :meth:`~_Folder._admit` (layout and state
loadable, not an event, the dedup decision, not blocked, room in the outbox), then
:func:`aggregates.fold.steps.run_handler` (handler lookup, upcast, typed payload, the
handler), :func:`aggregates.fold.steps.check_result` (the result, the emits, the outbox limit)
and, in the strict pass, :meth:`~_Folder._budget` (the size budget). Each returns what it
found or raises :class:`~aggregates.fold.steps.Refusal` (how the message ends instead); only
:meth:`~_Folder._commit` and :meth:`~_Folder._refuse` record anything, each exactly one
outcome per step — in a new slot, or in the ``slot`` the step was given (a message parked
earlier in this fold and retried: its outcome is replaced, one outcome per input message).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import bson

from aggregates.core.errors import AggboxError
from aggregates.core.ids import payload_hash
from aggregates.core.reasons import Reason
from aggregates.core.tracecontext import emit_trace
from aggregates.dedup import source_key
from aggregates.dedup.runs import earlier_attempt, stamped_changes, unapplied
from aggregates.domain.aggregate import AggregateType
from aggregates.fold.document import Snapshot, layout_error
from aggregates.fold.handler_result import EmitHeaders, entries_size
from aggregates.fold.ordering import delivery_order
from aggregates.fold.result import Changes, DeadLetter, FoldResult, Parked
from aggregates.fold.steps import (
    DUPLICATE,
    Refusal,
    added_bytes,
    check_result,
    dead,
    park,
    run_handler,
    too_large,
    unencodable,
)
from aggregates.fold.timers import TimerStep, maybe_fired
from aggregates.message import outcomes as oc
from aggregates.message.envelope import KIND_EVENT, KIND_HEADER, Message
from aggregates.message.outcomes import Outcome, new_outcome

__all__ = ["Changes", "DeadLetter", "FoldResult", "Parked", "fold"]


def fold(
    atype: AggregateType[Any],
    snap: Snapshot,
    messages: Sequence[Message],
    *,
    now: datetime,
    parked: Sequence[Parked] = (),
    max_document_bytes: int = 8 * 1024 * 1024,
    attempt: int = 1,
) -> FoldResult:
    """Apply ``messages`` (in order) to a copy of ``snap``; previously ``parked`` messages
    of this aggregate are retried first and whenever a sequence gap may have closed.

    Returns the new snapshot, the changes to write, and one outcome per input message (plus
    outcomes for released parked messages, marked ``from_parked``)."""
    # The one input from the context: the writer's tracing hook (aggregates/store/tracing.py),
    # read here once and passed down (the trace headers of emitted entries).
    emit_headers = emit_trace.get()
    folder = _Folder(atype, snap, now=now, max_bytes=max_document_bytes, attempt=attempt,
                     strict=False, emit_headers=emit_headers)
    folder.run(parked, messages)
    if not folder.finish():  # over the size budget, or not storable: find the culprit(s)
        folder = _Folder(atype, snap, now=now, max_bytes=max_document_bytes, attempt=attempt,
                         strict=True, emit_headers=emit_headers)
        folder.run(parked, messages)
        folder.finish()
    f = folder
    return FoldResult(f.snap, f.changes, f.outcomes, f.dead, f.parked, f.released)


class _Folder:
    def __init__(
        self,
        atype: AggregateType[Any],
        snap: Snapshot,
        *,
        now: datetime,
        max_bytes: int,
        attempt: int,
        strict: bool = True,
        emit_headers: EmitHeaders = None,
    ) -> None:
        self.atype = atype
        self.emit_headers = emit_headers
        self._upcasting = atype.upcasts
        self.strict = strict
        self.applied = False
        self.now = now
        self.max_bytes = max_bytes
        self.attempt = attempt
        # Work on a copy so the caller's snapshot stays valid for a retry after a conflict.
        self.snap = Snapshot(
            aggregate_id=snap.aggregate_id,
            version=snap.version,
            state=snap.state,
            dedup=snap.dedup.copy(),
            seq=snap.seq,
            outbox_ids=list(snap.outbox_ids),
            blocked=snap.blocked,
            size_bytes=snap.size_bytes,
            state_version=snap.state_version,
            layout_version=snap.layout_version,
            timers=list(snap.timers),
            timer_seq=snap.timer_seq,
        )
        self._state0_bytes = len(bson.encode(snap.state)) if snap.state else 0
        # The pending timers as stored: their size, and which ids may already be firing.
        self._timers0_bytes = entries_size(snap.timers) if snap.timers else 0
        self._stored_timer_ids = (frozenset(str(t.get("id")) for t in snap.timers)
                                  if snap.timers else _NO_IDS)
        #: Set when the stored state cannot be loaded (it does not fit the state type, was
        #: written by a newer state version, or a state migration failed): every message of
        #: this aggregate is then dead-lettered, the batch goes on.
        self.load_error: str | None = None
        #: Set when the document's layout (``_lv``) is unknown to this aggbox: every message
        #: of this aggregate is dead-lettered, nothing of the document is read.
        self.layout_error = layout_error(snap.layout_version)
        try:
            # An older stored state (_sv) is migrated in memory first; the next write
            # stores the new shape and _sv (docs/evolving-schemas.md).
            self.state_obj: Any = atype.load_state(snap.state, snap.state_version)
        except AggboxError as exc:
            self.state_obj, self.load_error = None, str(exc)
        self.changes = Changes()
        self.outcomes: list[Outcome] = []
        self.dead: list[DeadLetter] = []
        self.parked: list[Parked] = []
        self.released: list[str] = []
        self.waiting: list[Parked] = []  # parked (before or in this fold), may be released
        # Messages of this fold's input parked earlier in the same fold: their outcome slot,
        # overwritten if a later message closes their gap (one outcome per input message).
        self._slots: dict[int, int] = {}
        self.added_bytes = 0

    # -- recording ------------------------------------------------------------------------
    def _out(self, msg: Message, kind: oc.OutcomeKind, from_parked: bool, slot: int | None,
             reason: str | None = None, detail: str | None = None,
             emitted: tuple[str, ...] = ()) -> int:
        """Record ``msg``'s outcome in ``slot`` (``None``: a new one); returns the slot."""
        outcome = new_outcome(msg.message_id, msg.aggregate_type, msg.aggregate_id, kind,
                              reason, detail, emitted, self.attempt, from_parked)
        if slot is None:
            outcomes = self.outcomes
            outcomes.append(outcome)
            slot = len(outcomes) - 1
        else:
            self.outcomes[slot] = outcome
        if from_parked and kind != "parked":
            self.released.append(msg.message_id)
        return slot

    def _refuse(self, msg: Message, from_parked: bool, slot: int | None, r: Refusal) -> None:
        if r.kind == "duplicate" or r.kind == "applied":  # applied: by an earlier attempt
            self._out(msg, r.kind, from_parked, slot, r.reason, r.detail)
        elif r.kind == "parked":
            p = Parked(msg, r.reason or "parked", r.detail)
            if not from_parked:  # parked before: no new outcome, it was counted already
                self.parked.append(p)
                self._slots[id(p)] = self._out(msg, "parked", False, slot, r.reason, r.detail)
            self.waiting.append(p)  # a later message of this fold may close its gap
        else:
            self.dead.append(DeadLetter(msg, None, r.reason or "dedup", r.detail, r.tb,
                                        msg.aggregate_type, msg.aggregate_id))
            self._out(msg, "dead_lettered", from_parked, slot, r.reason, r.detail)
            if r.block:
                self.snap.blocked = {"message_id": msg.message_id, "error": r.detail,
                                     "at": self.now}
                self.changes.blocked = self.snap.blocked

    # -- the step -------------------------------------------------------------------------
    def run(self, parked: Sequence[Parked], messages: Sequence[Message]) -> None:
        """Previously parked messages first, then the input, in order."""
        if parked:
            self.retry_parked(list(parked), first=True)
        step = self.step
        for msg in messages:
            step(msg, False)

    def step(self, msg: Message, from_parked: bool, slot: int | None = None) -> None:
        """Handle one message and record its one outcome (in ``slot``, if given)."""
        admitted = self._admit(msg)
        if isinstance(admitted, Refusal):
            self._refuse(msg, from_parked, slot, admitted)
            return
        try:
            result = run_handler(self.atype, self.state_obj, msg, upcasting=self._upcasting)
            new_state, state_doc, entries, timers = check_result(
                self.atype, self.snap, msg, result, self.now, self.emit_headers)
            added = self._budget(msg, state_doc, entries, timers) if self.strict else 0
        except Refusal as refusal:
            self._refuse(msg, from_parked, slot, refusal)
            return
        self._commit(msg, from_parked, slot, admitted, new_state, state_doc, entries, added,
                     timers)

    def _admit(self, msg: Message) -> Refusal | str:
        """Whether the handler may see ``msg``: its payload hash if so (``""`` when the
        dedup strategy does not use it), else how it ends."""
        if self.layout_error is not None:
            return dead(Reason.UNKNOWN_DOCUMENT_LAYOUT,
                        f"{self.atype.name}/{msg.aggregate_id}: {self.layout_error}")
        if self.load_error is not None:
            return dead(Reason.INVALID_STATE,
                         f"the stored state of {self.atype.name}/{msg.aggregate_id} cannot be "
                         f"loaded: {self.load_error}; fix the document or the state type, "
                         "then replay the dead letters")
        if msg.headers.get(KIND_HEADER) == KIND_EVENT:
            # An event this aggregate published (an untargeted emit fed back by a pipeline
            # that reads the dispatcher's output): not input; its effect is already here.
            return Refusal("duplicate", Reason.AGGBOX_EVENT,
                            f"an event {msg.aggregate_type}/{msg.aggregate_id} published "
                            f"(header {KIND_HEADER}: {KIND_EVENT}); events are not input to "
                            "aggregates")
        strategy = self.atype.dedup
        phash = payload_hash(msg.payload) if strategy.uses_payload_hash else ""
        decision = strategy.decide(self.snap.dedup, msg, phash, self.now)
        if decision.verdict == "duplicate":  # applied before: a duplicate, blocked or not
            by = earlier_attempt(strategy, self.snap.dedup, msg)  # aggregates.dedup.runs
            return DUPLICATE if by is None else Refusal("applied", Reason.EARLIER_ATTEMPT, by)
        if (self.snap.blocked is not None
                and decision.reason != Reason.DUPLICATE_WITH_DIFFERENT_PAYLOAD):
            # The blocker itself is parked too when it comes again (a replay after a fix,
            # or the rerun of a batch that crashed before its dead letter was written): the
            # failure stays recorded in _blocked, and releasing the aggregate retries it.
            blocker = self.snap.blocked.get("message_id")
            return park(Reason.AGGREGATE_BLOCKED, f"aggregate blocked by failed message "
                         f"{blocker!r}; release it with `aggbox parked release`")
        if decision.verdict == "dead_letter":
            return dead(decision.reason or "dedup", decision.detail)
        if decision.verdict == "park":
            return park(decision.reason or "parked", decision.detail)
        if len(self.snap.outbox_ids) >= self.atype.max_outbox:
            return park(Reason.OUTBOX_FULL, f"{len(self.snap.outbox_ids)} entries wait in the "
                         f"outbox (limit {self.atype.max_outbox}); is the dispatcher running?")
        return phash

    def _budget(self, msg: Message, state_doc: dict[str, Any],
                entries: list[dict[str, Any]], timers: TimerStep | None) -> int:
        """Strict pass: the bytes this message adds (its outbox entries, inbox entry and new
        timers; a removed timer is not subtracted), if the document stays within its size
        budget."""
        added = added_bytes(entries, timers) + _INBOX_ENTRY_BYTES + len(msg.message_id)
        try:
            size = self._size_with(state_doc)
        except Exception as exc:  # a value BSON cannot store: the field is named
            raise unencodable(Reason.INVALID_STATE, state_doc, "state", exc) from None
        if size + added > self.max_bytes:
            raise too_large(self.snap, state_doc, added, self.max_bytes)
        return added

    def _commit(self, msg: Message, from_parked: bool, slot: int | None, phash: str,
                new_state: Any, state_doc: dict[str, Any], entries: list[dict[str, Any]],
                added: int, timers: TimerStep | None) -> None:
        """Apply the step in memory: state, dedup record, outbox, timers, outcome."""
        snap, changes, atype = self.snap, self.changes, self.atype
        if added:
            self.added_bytes += added
        snap.state = state_doc
        snap.state_version = atype.state_version
        changes.state = state_doc
        self.applied = True
        self.state_obj = new_state
        atype.dedup.record(snap.dedup, msg, phash)
        if entries:
            ids = tuple([e["id"] for e in entries])
            snap.seq += len(entries)
            snap.outbox_ids.extend(ids)
            changes.outbox.extend(entries)
        else:
            ids = ()
        if timers is not None:
            self._commit_timers(timers)
        changes.seq = snap.seq
        if slot is None and not from_parked:  # _out(), inlined: the hot path
            self.outcomes.append(new_outcome(msg.message_id, msg.aggregate_type,
                                             msg.aggregate_id, "applied", None, None, ids,
                                             self.attempt, False))
        else:
            self._out(msg, "applied", from_parked, slot, emitted=ids)
        if self.waiting:
            key = source_key(msg)
            if key is not None:
                self.retry_parked([], first=False, source=key)

    def _commit_timers(self, step: TimerStep) -> None:
        """The step's timers become the pending ones; removed timers that may be firing
        right now are recorded as handled (:func:`~aggregates.fold.timers.maybe_fired`)."""
        snap, strategy = self.snap, self.atype.dedup
        snap.timers = self.changes.timers = step.timers
        if step.added:
            snap.timer_seq += len(step.added)
            self.changes.timer_seq = snap.timer_seq
        for fired in maybe_fired(self.atype, snap.aggregate_id, step, self._stored_timer_ids):
            strategy.record(snap.dedup, fired, payload_hash(fired.payload)
                            if strategy.uses_payload_hash else "")
            unapplied(strategy, snap.dedup, fired)

    # -- parked messages and the end of the fold -------------------------------------------
    def retry_parked(self, candidates: list[Parked], *, first: bool,
                     source: str | None = None) -> None:
        if first:
            if not candidates:
                return
            pool = _in_delivery_order(candidates)
        else:
            pool = [p for p in self.waiting if p.reason == Reason.SEQUENCE_GAP
                    and source_key(p.message) == source]
            if not pool:
                return
            ids = {id(p) for p in pool}
            self.waiting = [p for p in self.waiting if id(p) not in ids]
            pool = _in_delivery_order(pool)
        for p in pool:
            slot = self._slots.pop(id(p), None)
            if slot is None:  # stored by an earlier run
                self.step(p.message, from_parked=True)
            else:  # parked earlier in this fold: settle its own outcome instead
                self.parked = [q for q in self.parked if q is not p]
                self.step(p.message, from_parked=False, slot=slot)

    def _size_with(self, state_doc: dict[str, Any] | None) -> int:
        # The stored size, adjusted by the state's growth and what this fold appended.
        if state_doc is None:
            return self.snap.size_bytes + self.added_bytes
        new_state = len(bson.encode(state_doc))
        return self.snap.size_bytes - self._state0_bytes + new_state + self.added_bytes

    def _fast_size(self) -> int:
        """The fast pass's ``_size_with(state)`` with ``added_bytes`` = the new outbox
        entries' :func:`entries_size` plus the inbox entries, from one BSON encoding: the
        document ``{"e": entries, "s": state}`` is 4 + (1 + 2 + |entries array|) + (1 + 2 +
        |state|) + 1 bytes, ``entries_size`` is 4 + (1 + 2 + |entries array|) + 1, so
        ``entries_size + |state|`` is that encoding's length minus 3."""
        snap, outbox = self.snap, self.changes.outbox
        state, inbox = snap.state, snap.dedup.pending * _INBOX_ENTRY_BYTES
        timers = self.changes.timers
        grown = 0 if timers is None else entries_size(timers) - self._timers0_bytes
        if state is None:  # as _size_with(None)
            return snap.size_bytes + entries_size(outbox) + inbox + grown
        if outbox:
            both = len(bson.encode({"e": outbox, "s": state})) - 3
        else:
            both = len(bson.encode(state))
        return snap.size_bytes - self._state0_bytes + both + inbox + grown

    def finish(self) -> bool:
        """Size the document and add the dedup strategy's part of the write. ``False`` (and
        nothing added) when the fast pass finds the document over its budget or not storable:
        only the strict pass can say which message is to blame."""
        if not self.strict and self.applied:
            try:
                size = self._fast_size()
            except Exception:  # not BSON-encodable: the strict pass finds the message
                return False
            if size > self.max_bytes:
                return False
            self.snap.size_bytes = size
        else:
            self.snap.size_bytes = self._size_with(self.snap.state if self.applied else None)
        # The strategy's part of the write; entries leaving the document with it (never
        # one this write adds: docs/design.md "Dedup") are archived by the writer first.
        self.changes.dedup = stamped_changes(self.atype.dedup, self.snap.dedup,
                                             self.snap.version + 1)
        # Messages that were parked before and still wait keep their parked entry as is.
        return True


_INBOX_ENTRY_BYTES = 64
_NO_IDS: frozenset[str] = frozenset()


def _in_delivery_order(parked: Sequence[Parked]) -> list[Parked]:
    # The pipeline's order (aggregates.fold.ordering), on messages sorted by id first so the
    # result does not depend on the order the parked store returned them in.
    pool = sorted(parked, key=lambda p: p.message.message_id)
    by_msg = {id(p.message): p for p in pool}
    return [by_msg[id(m)] for m in delivery_order([p.message for p in pool])]
