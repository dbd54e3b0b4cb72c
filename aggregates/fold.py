"""Applying messages to one aggregate in memory (pure: no I/O, no clock of its own).

The store writer and the in-memory testing helpers both use :func:`fold`, so dedup, outbox
and parking rules are the same in tests and in production.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import bson

from aggregates import outcomes as oc
from aggregates.aggregate import (
    AggregateRef,
    AggregateType,
    Emit,
    InvalidPayload,
    TypedHandler,
    dump_payload_checked,
)
from aggregates.dedup import (
    DUPLICATE_DIFFERENT_PAYLOAD,
    SEQUENCE_GAP,
    Decision,
    Inbox,
    InboxEntry,
    source_key,
)
from aggregates.document import Snapshot
from aggregates.envelope import KIND_EVENT, KIND_HEADER, MAX_SCHEMA_VERSION, Message
from aggregates.errors import (
    AggboxError,
    HandlerError,
    InvalidFieldName,
    RetryableError,
    UnknownMessageType,
    UnknownSchemaVersion,
    UpcastFailed,
)
from aggregates.fieldnames import check_field_names
from aggregates.ids import emitted_message_id, payload_hash
from aggregates.ordering import delivery_order
from aggregates.outcomes import Outcome


@dataclass(frozen=True, slots=True)
class Parked:
    """A message waiting in the parked store, with why it waits."""

    message: Message
    reason: str
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that cannot be applied, with the reason code and error text."""

    message: Message | None
    raw: Any
    reason: str
    detail: str | None
    traceback: str | None = None
    aggregate_type: str | None = None
    aggregate_id: str | None = None
    #: The identity its outcome reports, for input without a valid envelope (``raw``): the
    #: line's string ``message_id``, else ``raw_message_id(raw)``. ``None``: derived from
    #: ``message`` or ``raw`` (see :func:`aggregates.deadletters.letter_message_id`).
    message_id: str | None = None


@dataclass(slots=True)
class Changes:
    """What one fold adds to the stored document (appends only; invariant 2)."""

    state: dict[str, Any] | None = None
    inbox: list[InboxEntry] = field(default_factory=list)
    #: Inbox entries leaving the document with this write: the writer archives them first.
    archive: list[InboxEntry] = field(default_factory=list)
    archive_floor: datetime | None = None
    archive_undated: bool = False
    hw: dict[str, int] = field(default_factory=dict)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    seq: int | None = None
    blocked: dict[str, Any] | None = None

    @property
    def empty(self) -> bool:
        return (
            self.state is None
            and not self.inbox
            and not self.outbox
            and not self.hw
            and self.blocked is None
        )


@dataclass(slots=True)
class FoldResult:
    snapshot: Snapshot
    changes: Changes
    outcomes: list[Outcome]
    dead_letters: list[DeadLetter]
    parked: list[Parked]
    released: list[str]


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
    # Fast path: state validation and the size budget are checked once, on the result. If
    # that check fails, the fold is redone strictly (per message) to find the culprit(s);
    # both passes are pure, so the redo sees exactly the same inputs.
    for strict in (False, True):
        f = _Folder(atype, snap, now=now, max_bytes=max_document_bytes, attempt=attempt,
                    strict=strict)
        try:
            f.retry_parked(list(parked), first=True)
            for msg in messages:
                f.step(msg, from_parked=False)
            f.finish()
        except _NeedStrict:
            continue
        break
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
    ) -> None:
        self.atype = atype
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
        )
        self._floor0 = snap.dedup.archive_floor
        self._undated0 = snap.dedup.archive_undated
        self._state0_bytes = len(bson.encode(snap.state)) if snap.state else 0
        #: Set when the stored state cannot be loaded (it does not fit the state type, was
        #: written by a newer state version, or a state migration failed): every message of
        #: this aggregate is then dead-lettered, the batch goes on.
        self.load_error: str | None = None
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
        self._cur_slot: int | None = None
        self.added_bytes = 0

    # -- outcomes ---------------------------------------------------------------------
    def _out(self, msg: Message, kind: oc.OutcomeKind, from_parked: bool, reason: str | None = None,
             detail: str | None = None, emitted: tuple[str, ...] = ()) -> int:
        outcome = Outcome(msg.message_id, msg.aggregate_type, msg.aggregate_id, kind, reason,
                          detail, emitted, self.attempt, from_parked)
        slot, self._cur_slot = self._cur_slot, None
        if slot is None:
            self.outcomes.append(outcome)
            slot = len(self.outcomes) - 1
        else:
            self.outcomes[slot] = outcome
        if from_parked and kind != "parked":
            self.released.append(msg.message_id)
        return slot

    def _dead(self, msg: Message, from_parked: bool, reason: str, detail: str | None,
              tb: str | None = None) -> None:
        self.dead.append(DeadLetter(msg, None, reason, detail, tb, msg.aggregate_type,
                                    msg.aggregate_id))
        self._out(msg, "dead_lettered", from_parked, reason, detail)

    def _park(self, msg: Message, from_parked: bool, reason: str, detail: str | None) -> None:
        p = Parked(msg, reason, detail)
        if from_parked:
            self.waiting.append(p)  # still parked: no new outcome, it was counted already
        else:
            self.parked.append(p)
            self._slots[id(p)] = self._out(msg, "parked", False, reason, detail)
            self.waiting.append(p)  # a later message of this fold may close its gap

    # -- the step ---------------------------------------------------------------------
    def step(self, msg: Message, *, from_parked: bool) -> None:
        if self.load_error is not None:
            self._dead(msg, from_parked, oc.INVALID_STATE,
                       f"the stored state of {self.atype.name}/{msg.aggregate_id} cannot be "
                       f"loaded: {self.load_error}; fix the document or the state type, then "
                       "replay the dead letters")
            return
        if msg.headers.get(KIND_HEADER) == KIND_EVENT:
            # An event this aggregate published (an untargeted emit fed back by a pipeline
            # that reads the dispatcher's output): not input; its effect is already here.
            self._out(msg, "duplicate", from_parked, oc.AGGBOX_EVENT,
                      f"an event {msg.aggregate_type}/{msg.aggregate_id} published (header "
                      f"{KIND_HEADER}: {KIND_EVENT}); events are not input to aggregates")
            return
        strategy = self.atype.dedup
        phash = payload_hash(msg.payload) if strategy.uses_payload_hash else ""
        decision: Decision = strategy.decide(self.snap.dedup, msg, phash, self.now)
        if decision.verdict == "duplicate":  # applied before: a duplicate, blocked or not
            self._out(msg, "duplicate", from_parked)
            return
        if self.snap.blocked is not None and decision.reason != DUPLICATE_DIFFERENT_PAYLOAD:
            # The blocker itself is parked too when it comes again (a replay after a fix,
            # or the rerun of a batch that crashed before its dead letter was written): the
            # failure stays recorded in _blocked, and releasing the aggregate retries it.
            blocker = self.snap.blocked.get("message_id")
            self._park(msg, from_parked, oc.AGGREGATE_BLOCKED,
                       f"aggregate blocked by failed message {blocker!r}; release it with "
                       "`aggbox parked release`")
            return
        if decision.verdict == "dead_letter":
            self._dead(msg, from_parked, decision.reason or "dedup", decision.detail)
            return
        if decision.verdict == "park":
            self._park(msg, from_parked, decision.reason or "parked", decision.detail)
            return
        if len(self.snap.outbox_ids) >= self.atype.max_outbox:
            self._park(msg, from_parked, oc.OUTBOX_FULL,
                       f"{len(self.snap.outbox_ids)} entries wait in the outbox (limit "
                       f"{self.atype.max_outbox}); is the dispatcher running?")
            return
        try:
            handler = self.atype.handler_for(msg.type)
        except UnknownMessageType as exc:
            self._dead(msg, from_parked, oc.UNKNOWN_MESSAGE_TYPE, str(exc))
            return
        # An older payload is upcast to the handler's version first (dedup above and the
        # records below use the message as delivered, so a redelivery stays a duplicate).
        try:
            hmsg = self.atype.upcast(msg) if self._upcasting or msg.schema_version != 1 else msg
        except UnknownSchemaVersion as exc:
            self._dead(msg, from_parked, oc.UNKNOWN_SCHEMA_VERSION, str(exc))
            return
        except UpcastFailed as exc:
            self._dead(msg, from_parked, oc.UPCAST_FAILED, str(exc),
                       "".join(traceback.format_exception(exc.__cause__, limit=20))
                       if exc.__cause__ is not None else None)
            return
        if isinstance(handler, TypedHandler):
            # A typed handler: the payload is validated into its class before it runs.
            try:
                payload = handler.parse(hmsg)
            except InvalidPayload as exc:
                self._dead(msg, from_parked, oc.INVALID_PAYLOAD, str(exc))
                return
        try:
            if isinstance(handler, TypedHandler):
                result = handler.fn(self.state_obj, payload, hmsg)
            else:
                result = handler(self.state_obj, hmsg)
        except RetryableError:
            raise
        except Exception as exc:  # a handler bug: dead-letter, keep going (or block)
            tb = traceback.format_exc(limit=20)
            detail = f"{type(exc).__name__}: {exc}"
            self._dead(msg, from_parked, oc.HANDLER_ERROR, detail, tb)
            if self.atype.on_handler_error == "park":
                self.snap.blocked = {"message_id": msg.message_id, "error": detail,
                                     "at": self.now}
                self.changes.blocked = self.snap.blocked
            return
        # Validate what the handler returned, per message (so outcomes do not depend on
        # where slices or batches are cut). Only BSON encoding and the size budget are
        # checked once per fold in the fast pass (see fold()).
        try:
            new_state, emits = _normalise(result, msg)
            state_doc = self.atype.codec.dump_checked(new_state)
        except InvalidFieldName as exc:
            self._dead(msg, from_parked, oc.INVALID_STATE, str(exc))
            return
        except HandlerError as exc:
            self._dead(msg, from_parked, oc.INVALID_RESULT, str(exc))
            return
        except Exception as exc:  # e.g. a state the codec cannot convert
            self._dead(msg, from_parked, oc.INVALID_STATE, f"{type(exc).__name__}: {exc}")
            return
        try:
            entries = self._entries(msg, emits)
        except _EmitError as exc:
            self._dead(msg, from_parked, oc.INVALID_EMIT, str(exc))
            return
        if len(entries) > self.atype.max_outbox:  # parking would never help
            self._dead(msg, from_parked, oc.EMITS_EXCEED_OUTBOX_LIMIT,
                       f"the handler emitted {len(entries)} messages in one step, more than "
                       f"the outbox holds (limit {self.atype.max_outbox}, max_outbox): it can "
                       "never fit, however far the dispatcher drains the outbox; emit fewer "
                       "messages per message or raise max_outbox")
            return
        if len(self.snap.outbox_ids) + len(entries) > self.atype.max_outbox:
            self._park(msg, from_parked, oc.OUTBOX_FULL,
                       f"handling would put {len(self.snap.outbox_ids) + len(entries)} entries "
                       f"in the outbox (limit {self.atype.max_outbox})")
            return
        if self.strict:
            try:
                added = _entries_size(entries) + _INBOX_ENTRY_BYTES + len(msg.message_id)
            except Exception as exc:  # a payload value BSON cannot store
                self._dead(msg, from_parked, oc.INVALID_EMIT,
                           f"emitted payload cannot be stored in MongoDB: {exc}")
                return
            try:
                size = self._size_with(state_doc)
            except Exception as exc:
                self._dead(msg, from_parked, oc.INVALID_STATE,
                           f"state cannot be stored in MongoDB: {exc}")
                return
            if size + added > self.max_bytes:
                self._too_large(msg, from_parked, state_doc, added)
                return
            self.added_bytes += added
        self.snap.state = state_doc
        self.snap.state_version = self.atype.state_version
        self.changes.state = state_doc
        # Commit the step in memory.
        self.applied = True
        self.state_obj = new_state
        dedup = self.snap.dedup
        self.atype.dedup.record(dedup, msg, phash)
        if isinstance(self.atype.dedup, Inbox):
            self.changes.inbox.append(dedup.inbox[-1])
        key = source_key(msg)
        if key is not None and key in dedup.hw:
            self.changes.hw[key] = dedup.hw[key]
        self.snap.seq += len(entries)
        self.snap.outbox_ids.extend(e["id"] for e in entries)
        self.changes.outbox.extend(entries)
        self.changes.seq = self.snap.seq
        self._out(msg, "applied", from_parked, emitted=tuple(e["id"] for e in entries))
        if key is not None and self.waiting:
            self.retry_parked([], first=False, source=key)

    def _too_large(self, msg: Message, from_parked: bool, state_doc: dict[str, Any],
                   added: int) -> None:
        """The step would push the document over its size budget: dead-letter it if no
        draining of the outbox can make room (its new state alone, or with its own outbox
        entries, is over the budget), else park it until the outbox shrinks."""
        state_bytes = len(bson.encode(state_doc))
        budget = self.max_bytes
        if state_bytes > budget:
            self._dead(msg, from_parked, oc.STATE_TOO_LARGE,
                       f"the handler's new state alone is {state_bytes} bytes (BSON), over the "
                       f"document's size budget of {budget} bytes (max_document_bytes): it can "
                       "never be stored, however far the dispatcher drains the outbox")
        elif state_bytes + added > budget:
            self._dead(msg, from_parked, oc.EMITS_TOO_LARGE,
                       f"the new state ({state_bytes} bytes) and the {added} bytes this message "
                       f"adds (its own outbox entries and inbox entry) exceed the document's "
                       f"size budget of {budget} bytes (max_document_bytes): it can never be "
                       "stored, however far the dispatcher drains the outbox")
        elif self.snap.outbox_ids:
            self._park(msg, from_parked, oc.DOCUMENT_TOO_LARGE,
                       f"the document would exceed its size budget of {budget} bytes; "
                       f"{len(self.snap.outbox_ids)} outbox entries wait: it shrinks as the "
                       "dispatcher drains the outbox")
        else:
            self._park(msg, from_parked, oc.DOCUMENT_TOO_LARGE,
                       f"the document would exceed its size budget of {budget} bytes and has "
                       "no outbox entries to drain (its inbox and state fill it): raise "
                       "max_document_bytes or shrink the inbox window, then release it")

    def retry_parked(self, candidates: list[Parked], *, first: bool,
                     source: str | None = None) -> None:
        if first:
            if not candidates:
                return
            pool = _in_delivery_order(candidates)
        else:
            pool = [p for p in self.waiting if p.reason == SEQUENCE_GAP
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
                self._cur_slot = slot
                self.step(p.message, from_parked=False)

    def _size_with(self, state_doc: dict[str, Any] | None) -> int:
        # The stored size, adjusted by the state's growth and what this fold appended.
        if state_doc is None:
            return self.snap.size_bytes + self.added_bytes
        new_state = len(bson.encode(state_doc))
        return self.snap.size_bytes - self._state0_bytes + new_state + self.added_bytes

    def finish(self) -> None:
        if not self.strict and self.applied:
            try:
                self.added_bytes = (_entries_size(self.changes.outbox)
                                    + len(self.changes.inbox) * _INBOX_ENTRY_BYTES)
                too_large = self._size_with(self.snap.state) > self.max_bytes
            except Exception:  # not BSON-encodable: the strict pass finds the message
                raise _NeedStrict() from None
            if too_large:
                raise _NeedStrict()
        self.snap.size_bytes = self._size_with(self.snap.state if self.applied else None)
        # Entries beyond the window leave the document with this write (never one this
        # write adds: docs/design.md "Dedup"); the writer archives them before writing.
        dedup = self.snap.dedup
        if isinstance(self.atype.dedup, Inbox) and self.applied:
            self.changes.archive = dedup.evict(self.atype.dedup.window)
        if dedup.archive_floor != self._floor0:
            self.changes.archive_floor = dedup.archive_floor
        if dedup.archive_undated and not self._undated0:
            self.changes.archive_undated = True
        # Messages that were parked before and still wait keep their parked entry as is.

    def _entries(self, msg: Message, emits: Sequence[Emit]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, e in enumerate(emits):
            if not isinstance(e, Emit):
                raise _EmitError(f"handler emitted {type(e).__name__}, expected Emit")
            if not isinstance(e.type, str) or not e.type:
                raise _EmitError(f"Emit #{i}: the type must be a non-empty string (a dict "
                                 f"payload needs a type name); got {e.type!r}")
            if isinstance(e.payload, dict):
                payload, trusted = e.payload, False
            else:  # a payload object (pydantic model, dataclass), dumped JSON-safe
                try:
                    payload, trusted = dump_payload_checked(e.payload)
                except Exception as exc:
                    raise _EmitError(
                        f"Emit({e.type!r}) #{i}: the payload must be a dict, a pydantic model "
                        f"or a dataclass instance that dumps to JSON; "
                        f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
            problem = None if _plain(e) else _emit_problem(e)
            if problem is not None:
                raise _EmitError(f"Emit({e.type!r}) #{i}: {problem}")
            if not trusted:
                try:
                    check_field_names(payload, f"emit[{i}].payload")
                except InvalidFieldName as exc:
                    raise _EmitError(str(exc)) from None
            seq = self.snap.seq + i + 1
            entry: dict[str, Any] = {
                "id": emitted_message_id(self.atype.name, self.snap.aggregate_id,
                                         msg.message_id, i),
                "type": e.type,
                "topic": e.topic or self.atype.topic,
                "key": e.key or self.snap.aggregate_id,
                "payload": dict(payload),
                "headers": dict(e.headers),
                "causation_id": msg.message_id,
                "correlation_id": msg.correlation_id or msg.message_id,
                "source": {"type": self.atype.name, "id": self.snap.aggregate_id, "seq": seq},
                "created_at": self.now,
            }
            if e.to is not None:  # an AggregateRef is a (type, id) tuple too
                entry["target"] = {"type": e.to[0], "id": e.to[1]}
            if e.schema_version is not None and e.schema_version != 1:
                entry["schema_version"] = e.schema_version
            out.append(entry)
        return out


class _EmitError(AggboxError):
    pass


def _text(value: Any) -> bool:
    """A non-empty string MongoDB can store (no lone surrogates)."""
    if not isinstance(value, str) or not value:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain(e: Emit) -> bool:
    """An emit with nothing to check beyond type, payload and address (the common case): no
    topic, key, headers or schema version; its address, if any, is an ``atype.ref(...)``
    or a tuple of two storable strings."""
    if e.topic is not None or e.key is not None or e.schema_version is not None or e.headers:
        return False
    to = e.to
    return to is None or (type(to) in _PAIRS and len(to) == 2 and _text(to[0])
                          and _text(to[1]))


_PAIRS = (AggregateRef, tuple)


def _emit_problem(e: Emit) -> str | None:
    """What is wrong with an :class:`Emit`'s addressing and headers (type and payload are
    checked by the caller), or None."""
    to = e.to
    if to is not None and not (isinstance(to, tuple | list) and len(to) == 2
                               and _text(to[0]) and _text(to[1])):
        return f"to must be (aggregate_type, aggregate_id), two non-empty strings; got {to!r}"
    for name in ("topic", "key"):
        value = getattr(e, name)
        if value is not None and not _text(value):
            return f"{name} must be None or a non-empty string; got {value!r}"
    sv = e.schema_version
    if sv is not None and (not isinstance(sv, int) or isinstance(sv, bool)
                           or not 1 <= sv <= MAX_SCHEMA_VERSION):
        return f"schema_version must be None or an integer ≥ 1 and ≤ 2^31-1; got {sv!r}"
    headers = e.headers
    if not isinstance(headers, Mapping):
        return f"headers must be a mapping of str → str; got {type(headers).__name__}"
    for k, v in headers.items():
        if not (_text(k) and k[:1] != "$" and "\x00" not in k and isinstance(v, str)
                and (v == "" or _text(v))):
            return f"headers must be a mapping of str → str; got {k!r}: {v!r}"
    return None


class _NeedStrict(Exception):
    """The fast pass found a problem only a per-message pass can attribute."""


_INBOX_ENTRY_BYTES = 64


def _entries_size(entries: list[dict[str, Any]]) -> int:
    return len(bson.encode({"e": entries})) if entries else 0


def _in_delivery_order(parked: Sequence[Parked]) -> list[Parked]:
    # The pipeline's order (aggregates.ordering), on messages sorted by id first so the
    # result does not depend on the order the parked store returned them in.
    pool = sorted(parked, key=lambda p: p.message.message_id)
    by_msg = {id(p.message): p for p in pool}
    return [by_msg[id(m)] for m in delivery_order([p.message for p in pool])]


def _normalise(result: Any, msg: Message) -> tuple[Any, Sequence[Emit]]:
    if isinstance(result, tuple):
        if len(result) != 2:
            raise HandlerError(
                f"handler for {msg.type!r} returned a tuple of {len(result)}; return state "
                "or (state, [Emit, ...])"
            )
        state, emits = result
        if isinstance(emits, Emit):
            emits = [emits]
        if not isinstance(emits, list | tuple):
            raise HandlerError(f"handler for {msg.type!r} returned emits of type "
                               f"{type(emits).__name__}; use a list of Emit")
        return state, emits
    if result is None:
        raise HandlerError(f"handler for {msg.type!r} returned None; return the new state")
    return result, ()
