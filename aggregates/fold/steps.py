"""One message's handling, after it was admitted (pure; the steps of
:meth:`aggregates.fold._Folder.step`): run the handler (:func:`run_handler`), check what it
returned and build the outbox entries (:func:`check_result`), and say why a step that would
break the size budget cannot be applied (:func:`too_large`). A message that is not applied
ends as a :class:`Refusal` (a duplicate, a dead letter or parked)."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import bson

from aggregates.codec.bson import unstorable_at
from aggregates.core.errors import (
    DeploymentError,
    HandlerError,
    InvalidFieldName,
    RetryableError,
    UnknownMessageType,
    UnknownSchemaVersion,
    UpcastFailed,
)
from aggregates.core.reasons import Reason
from aggregates.domain.aggregate import AggregateType, InvalidPayload, TypedHandler
from aggregates.fold.document import Snapshot
from aggregates.fold.handler_result import (
    EmitError,
    EmitHeaders,
    entries_size,
    normalise_result,
    outbox_entries,
)
from aggregates.fold.timers import TimerError, TimerOp, TimerStep, split_timer_ops, timer_step
from aggregates.message.emit import Cancel, Schedule
from aggregates.message.envelope import Message

__all__ = ["DUPLICATE", "Refusal", "added_bytes", "check_result", "dead", "deployment_error",
           "park", "run_handler", "too_large", "unencodable"]


class Refusal(Exception):
    """How a message ends when it is not applied: a duplicate, a dead letter or parked.
    Returned by the admission step, raised by the later ones."""

    def __init__(self, kind: Literal["duplicate", "dead_lettered", "parked", "applied"],
                 reason: str | None = None, detail: str | None = None,
                 tb: str | None = None, *, block: bool = False) -> None:
        self.kind = kind
        self.reason = reason
        self.detail = detail
        self.tb = tb
        #: A handler error under ``on_handler_error="park"``: block the aggregate too.
        self.block = block


def dead(reason: str, detail: str | None, tb: str | None = None) -> Refusal:
    return Refusal("dead_lettered", reason, detail, tb)


def park(reason: str, detail: str | None) -> Refusal:
    return Refusal("parked", reason, detail)


DUPLICATE = Refusal("duplicate")  # returned, never raised


def run_handler(atype: AggregateType[Any], state: Any, msg: Message, *, upcasting: bool
                ) -> Any:
    """Run ``msg``'s handler on ``state`` (upcasting the payload and validating a typed one
    first): what it returned. Raises :class:`Refusal` for a message that cannot be handled."""
    try:
        handler = atype.handler_for(msg.type)
    except UnknownMessageType as exc:
        raise dead(Reason.UNKNOWN_MESSAGE_TYPE, str(exc)) from None
    # An older payload is upcast to the handler's version first (dedup above and the
    # records below use the message as delivered, so a redelivery stays a duplicate).
    try:
        hmsg = atype.upcast(msg) if upcasting or msg.schema_version != 1 else msg
    except UnknownSchemaVersion as exc:
        raise dead(Reason.UNKNOWN_SCHEMA_VERSION, str(exc)) from None
    except UpcastFailed as exc:
        if isinstance(exc.__cause__, ImportError):
            raise deployment_error(atype, msg, exc.__cause__, "upcaster") from exc.__cause__
        raise dead(Reason.UPCAST_FAILED, str(exc),
                   "".join(traceback.format_exception(exc.__cause__, limit=20))
                   if exc.__cause__ is not None else None) from None
    if isinstance(handler, TypedHandler):
        # A typed handler: the payload is validated into its class before it runs.
        try:
            payload = handler.parse(hmsg)
        except InvalidPayload as exc:
            raise dead(Reason.INVALID_PAYLOAD, str(exc)) from None
    try:
        if isinstance(handler, TypedHandler):
            return handler.fn(state, payload, hmsg)
        return handler(state, hmsg)
    except RetryableError:
        raise
    except ImportError as exc:  # the deployment's fault, never the message's
        raise deployment_error(atype, msg, exc, "handler") from exc
    except Exception as exc:  # a handler bug: dead-letter, keep going (or block)
        detail = f"{type(exc).__name__}: {exc}"
        raise Refusal("dead_lettered", Reason.HANDLER_ERROR, detail,
                       traceback.format_exc(limit=20),
                       block=atype.on_handler_error == "park") from None


def deployment_error(atype: AggregateType[Any], msg: Message, exc: ImportError,
                     what: str) -> DeploymentError:
    """The one line for a handler (or upcaster) that cannot import a module: which, and how
    to ship it (docs/design.md, "Deployment errors")."""
    module = exc.name
    missing = f"module {module!r}" if module else "a module"
    first = (str(exc).strip().splitlines() or [""])[0]
    return DeploymentError(
        f"the {what} of {atype.name} for {msg.type!r} cannot import {missing} "
        f"({type(exc).__name__}: {first}): it is not installed where the {what} runs. Ship "
        "it with the job (--py-files a wheel or .zip that contains it) or pip install it "
        "on every Spark worker, then run again; nothing was applied or dead-lettered, the "
        "input is still there", module)


def check_result(atype: AggregateType[Any], snap: Snapshot, msg: Message, result: Any,
                 now: datetime, emit_headers: EmitHeaders = None,
                 ) -> tuple[Any, dict[str, Any], list[dict[str, Any]], TimerStep | None]:
    """Validate what the handler returned, per message (so outcomes do not depend on where
    slices or batches are cut): the new state, its document, the outbox entries and what
    it does to the pending timers (None: nothing). Only BSON encoding and the size budget
    are left to the strict pass (see :func:`aggregates.fold.fold`)."""
    try:
        # The common results inline (a state, or (state, [Emit, ...]) without timers); any
        # other goes through normalise_result and split_timer_ops, which check it.
        if type(result) is tuple and len(result) == 2 and type(result[1]) is list:
            new_state, returned = result
        elif result is not None and not isinstance(result, tuple):
            new_state, returned = result, ()
        else:
            new_state, returned = normalise_result(result, msg)
        emits: Sequence[Any] = returned
        timer_ops: list[TimerOp] = []
        for x in returned:
            if type(x) is Schedule or type(x) is Cancel:
                emits, timer_ops = split_timer_ops(returned)
                break
        state_doc = atype.codec.dump_checked(new_state)
    except InvalidFieldName as exc:
        raise dead(Reason.INVALID_STATE, str(exc)) from None
    except HandlerError as exc:
        raise dead(Reason.INVALID_HANDLER_RESULT, str(exc)) from None
    except Exception as exc:  # e.g. a state the codec cannot convert
        raise dead(Reason.INVALID_STATE, f"{type(exc).__name__}: {exc}") from None
    try:
        entries = outbox_entries(atype, snap, msg, emits, now, emit_headers)
    except EmitError as exc:
        raise dead(Reason.INVALID_EMIT, str(exc)) from None
    limit = atype.max_outbox
    if len(entries) > limit:  # parking would never help
        raise dead(Reason.EMITS_EXCEED_OUTBOX_LIMIT,
                    f"the handler emitted {len(entries)} messages in one step, more than "
                    f"the outbox holds (limit {limit}, max_outbox): it can never fit, "
                    "however far the dispatcher drains the outbox; emit fewer messages "
                    "per message or raise max_outbox")
    if len(snap.outbox_ids) + len(entries) > limit:
        raise park(Reason.OUTBOX_FULL, f"handling would put "
                    f"{len(snap.outbox_ids) + len(entries)} entries in the outbox "
                    f"(limit {limit})")
    timers = None
    if timer_ops:
        try:
            timers = timer_step(atype, snap, msg, timer_ops,
                                first_seq=snap.timer_seq + 1, now=now,
                                emit_headers=emit_headers)
        except TimerError as exc:
            raise dead(Reason.INVALID_TIMER, str(exc)) from None
        if not (timers.added or timers.removed):  # e.g. a Cancel of no pending timer
            timers = None
    return new_state, state_doc, entries, timers


def added_bytes(entries: list[dict[str, Any]], timers: TimerStep | None) -> int:
    """The BSON size of a step's outbox entries and new timers; a value BSON cannot encode
    dead-letters the message naming the field (``invalid_emit`` / ``invalid_timer``)."""
    try:
        added = entries_size(entries)
    except Exception as exc:
        raise unencodable(Reason.INVALID_EMIT, entries, "emit", exc) from None
    try:
        return added + (entries_size(timers.added) if timers is not None else 0)
    except Exception as exc:
        raise unencodable(Reason.INVALID_TIMER, timers.added if timers else [], "timer",
                          exc) from None


def unencodable(reason: str, doc: Any, path: str, exc: Exception) -> Refusal:
    """A step whose state, outbox entries or timers BSON cannot encode: dead-lettered
    ``reason``, naming the field (:func:`aggregates.codec.bson.unstorable_at`)."""
    what = {"emit": "emitted payload", "timer": "timer"}.get(path, path)
    where = unstorable_at(doc, path) or f"{type(exc).__name__}: {exc}"
    return dead(reason, f"{what} cannot be stored in MongoDB: {where}")


def too_large(snap: Snapshot, state_doc: dict[str, Any], added: int, budget: int) -> Refusal:
    """The step would push the document over its size budget: dead-letter it if no
    draining of the outbox can make room (its new state alone, or with its own outbox
    entries, is over the budget), else park it until the outbox shrinks."""
    state_bytes = len(bson.encode(state_doc))
    if state_bytes > budget:
        return dead(Reason.STATE_TOO_LARGE,
                     f"the handler's new state alone is {state_bytes} bytes (BSON), over "
                     f"the document's size budget of {budget} bytes (max_document_bytes): "
                     "it can never be stored, however far the dispatcher drains the outbox")
    if state_bytes + added > budget:
        return dead(Reason.EMITS_EXCEED_DOCUMENT_BUDGET,
                     f"the new state ({state_bytes} bytes) and the {added} bytes this "
                     "message adds (its own outbox entries and inbox entry) exceed the "
                     f"document's size budget of {budget} bytes (max_document_bytes): it "
                     "can never be stored, however far the dispatcher drains the outbox")
    if snap.outbox_ids:
        return park(Reason.DOCUMENT_SIZE_BUDGET,
                     f"the document would exceed its size budget of {budget} bytes; "
                     f"{len(snap.outbox_ids)} outbox entries wait: it shrinks as the "
                     "dispatcher drains the outbox")
    return park(Reason.DOCUMENT_SIZE_BUDGET,
                 f"the document would exceed its size budget of {budget} bytes and has "
                 "no outbox entries to drain (its inbox and state fill it): raise "
                 "max_document_bytes or shrink the inbox window, then release it")
