"""What a handler returned, checked and turned into outbox entries (pure; used by the fold).

:func:`normalise_result` splits a handler's return value into the new state and its emits;
:func:`outbox_entries` validates the emits and builds the outbox entries, with the ids of
docs/design.md "Outbox ids"."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import bson

from aggregates.core.errors import AggboxError, HandlerError
from aggregates.core.fastbuild import storable_text
from aggregates.core.ids import emitted_message_id
from aggregates.core.jsonvalue import NotJSONValue, json_payload
from aggregates.core.tracecontext import trace_headers
from aggregates.domain.aggregate import AggregateRef, AggregateType, Emit, dump_payload_checked
from aggregates.fold.document import Snapshot
from aggregates.message.envelope import MAX_SCHEMA_VERSION, Message

__all__ = ["EmitError", "EmitHeaders", "entries_size", "normalise_result", "outbox_entries"]

#: The writer's tracing hook (:meth:`aggregates.store.tracing.ChunkTrace.emit_headers`): the
#: trace headers of the entries a message emits; ``None`` without per-message tracing.
EmitHeaders = Callable[[Message], Mapping[str, str]] | None


def outbox_entries(atype: AggregateType[Any], snap: Snapshot, msg: Message,
                   emits: Sequence[Emit], now: datetime, emit_headers: EmitHeaders = None,
                   ) -> list[dict[str, Any]]:
    """The outbox entries for what a handler emitted while applying ``msg`` to ``snap``
    (ids: docs/design.md "Outbox ids"); raises :class:`EmitError` naming the bad one.
    The entries carry ``emit_headers(msg)`` as trace headers, or without that hook the
    input's own trace context (:func:`aggregates.core.tracecontext.trace_headers`)."""
    if not emits:
        return []
    out: list[dict[str, Any]] = []
    # Per message, not per emit: the parts every entry of this step shares.
    type_name, agg_id, cause = atype.name, snap.aggregate_id, msg.message_id
    correlation = msg.correlation_id or cause
    seq0 = snap.seq + 1
    # The input's W3C trace context goes on with what it causes (aggregates/core/tracecontext.py).
    # With a tracer provider, the writer's handling span replaces it (aggregates/store/tracing.py).
    trace = (emit_headers(msg) if emit_headers is not None
             else trace_headers(msg.headers) if msg.headers else None)
    for i, e in enumerate(emits):
        if type(e) is not Emit and not isinstance(e, Emit):
            raise EmitError(f"handler emitted {type(e).__name__}, expected Emit")
        etype = e.type
        if not isinstance(etype, str) or not etype:
            raise EmitError(f"Emit #{i}: the type must be a non-empty string (a dict "
                            f"payload needs a type name); got {etype!r}")
        payload: Any = e.payload
        # What is published must be JSON: the payload in its JSON form (docs/design.md
        # "JSON values"), or the emit refused naming the field.
        try:
            if isinstance(payload, dict):
                plain = json_payload(payload)
                # The handler's own dict is copied (shallow), so the entry does not change
                # if the handler keeps and mutates it; a converted payload is new already.
                payload = dict(payload) if plain is payload else plain
            else:  # a payload object (pydantic model, dataclass), dumped: a new dict
                payload = dump_payload_checked(payload)[0]
        except NotJSONValue as exc:  # its path starts "payload"
            raise EmitError(f"Emit({etype!r}) #{i}: emit[{i}].{exc}") from None
        except Exception as exc:
            raise EmitError(
                f"Emit({etype!r}) #{i}: the payload must be a dict, a pydantic model "
                f"or a dataclass instance that dumps to JSON; "
                f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
        to, headers, sv = e.to, e.headers, e.schema_version
        # The common emit (no topic, key, headers or schema version; a good address) needs
        # no further checks: the hot path. An address of two non-empty ASCII strings is
        # storable without a call (anything else: _address_ok decides).
        if (e.topic is not None or e.key is not None or sv is not None or headers
                or not (to is None or (type(to) in _PAIRS and len(to) == 2
                                       and type(to[0]) is str and type(to[1]) is str
                                       and to[0] != "" and to[1] != ""
                                       and to[0].isascii() and to[1].isascii())
                        or _address_ok(to))):
            problem = _emit_problem(e)
            if problem is not None:
                raise EmitError(f"Emit({etype!r}) #{i}: {problem}")
        entry: dict[str, Any] = {
            "id": emitted_message_id(type_name, agg_id, cause, i),
            "type": etype,
            "topic": e.topic or atype.topic,
            "key": e.key or agg_id,
            "payload": payload,
            "headers": ({**trace, **headers} if trace else dict(headers) if headers
                        else {}),
            "causation_id": cause,
            "correlation_id": correlation,
            "source": {"type": type_name, "id": agg_id, "seq": seq0 + i},
            "created_at": now,
        }
        if to is not None:  # an AggregateRef is a (type, id) tuple too
            entry["target"] = {"type": to[0], "id": to[1]}
        if sv is not None and sv != 1:
            entry["schema_version"] = sv
        out.append(entry)
    return out


class EmitError(AggboxError):
    """A handler emitted something that cannot go into the outbox."""


def _address_ok(to: object) -> bool:
    """No address, or an ``atype.ref(...)`` / tuple of two storable strings."""
    return to is None or (type(to) in _PAIRS and len(to) == 2  # type: ignore[arg-type]
                          and storable_text(to[0]) and storable_text(to[1]))  # type: ignore[index]


_PAIRS = (AggregateRef, tuple)


def _emit_problem(e: Emit) -> str | None:
    """What is wrong with an :class:`Emit`'s addressing and headers (type and payload are
    checked by the caller), or None."""
    to = e.to
    if to is not None and not (isinstance(to, tuple | list) and len(to) == 2
                               and storable_text(to[0]) and storable_text(to[1])):
        return f"to must be (aggregate_type, aggregate_id), two non-empty strings; got {to!r}"
    for name in ("topic", "key"):
        value = getattr(e, name)
        if value is not None and not storable_text(value):
            return f"{name} must be None or a non-empty string; got {value!r}"
    sv = e.schema_version
    if sv is not None and (not isinstance(sv, int) or isinstance(sv, bool)
                           or not 1 <= sv <= MAX_SCHEMA_VERSION):
        return f"schema_version must be None or an integer ≥ 1 and ≤ 2^31-1; got {sv!r}"
    headers = e.headers
    if not isinstance(headers, Mapping):
        return f"headers must be a mapping of str → str; got {type(headers).__name__}"
    for k, v in headers.items():
        if not (storable_text(k) and k[:1] != "$" and "\x00" not in k and isinstance(v, str)
                and (v == "" or storable_text(v))):
            return f"headers must be a mapping of str → str; got {k!r}: {v!r}"
    return None


def entries_size(entries: list[dict[str, Any]]) -> int:
    """The BSON size of outbox entries (0 for none); raises if one cannot be encoded."""
    return len(bson.encode({"e": entries})) if entries else 0


def normalise_result(result: Any, msg: Message) -> tuple[Any, Sequence[Emit]]:
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
