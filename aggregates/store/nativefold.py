"""The batch fold's glue (docs/design.md "The batch fold"): which aggregate types the native
core folds (:func:`spec_of`), the core's environment (registered once), and the writes it
built as pymongo operations (:func:`write_op`).

The native core folds the common path of a slice — messages applied or duplicates, plain
emits, no timers or upcasts, a document it understands — and gives anything else back to
:func:`aggregates.fold.fold`, the definition, which folds the slice from the same snapshot.
Without the core (no Rust toolchain, or ``AGGBOX_PURE=1``) every slice takes the definition.
"""

from __future__ import annotations

import dataclasses
import threading
import types
import typing
from datetime import timedelta
from typing import Any, Final

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import InsertOne, UpdateOne

from aggregates.codec.check import scalar_dataclass_fields
from aggregates.core.ids import AGGBOX_NAMESPACE
from aggregates.core.native_core import native_core
from aggregates.core.tracecontext import emit_trace, trace_headers
from aggregates.dedup import HighWater, Inbox, NoDedup
from aggregates.domain.aggregate import AggregateType, TypedHandler, dump_payload_checked
from aggregates.message.emit import AggregateRef, Emit
from aggregates.message.envelope import Message, Source
from aggregates.message.outcomes import Outcome

__all__ = ["NATIVE", "RAW_OPTIONS", "available", "spec_of"]

#: The native core when it has the batch fold (a core built before it: the pure path).
NATIVE: Any = native_core(needs="fold_slice")

#: How the batch fold reads documents: their BSON, undecoded.
RAW_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)

_lock = threading.Lock()
_ready = False
#: Aggregate type → its spec, or None when the definition folds every slice of it.
_specs: dict[int, tuple[AggregateType[Any], Any]] = {}


def available() -> bool:
    """Whether the native batch fold runs in this process and context (no per-message
    tracing: the handling spans are the definition's)."""
    return NATIVE is not None and emit_trace.get() is None


def _init() -> None:
    global _ready
    with _lock:
        if _ready:
            return
        from datetime import UTC

        opts: CodecOptions[dict[str, Any]] = CodecOptions()

        def encode_value(value: Any) -> bytes:
            return bson.encode({"v": value}, codec_options=opts)

        NATIVE.fold_init(Message, Emit, Source, Outcome, AggregateRef, UTC, encode_value,
                         trace_headers, dump_payload_checked, scalar_dataclass_fields,
                         AGGBOX_NAMESPACE.bytes, InsertOne, UpdateOne, RawBSONDocument)
        _ready = True


def spec_of(atype: AggregateType[Any]) -> Any:
    """The native core's spec of ``atype`` (cached), or None when its slices always take the
    definition: a dedup strategy of its own (a subclass), upcasters registered."""
    if NATIVE is None:
        return None
    found = _specs.get(id(atype))
    if found is not None and found[0] is atype:
        return found[1]
    _init()
    spec = _build(atype)
    with _lock:
        _specs[id(atype)] = (atype, spec)
    return spec


def _build(atype: AggregateType[Any]) -> Any:
    d = atype.dedup
    window, horizon_us, skew_us, always, contiguous, max_sources = 1, 0, 0, False, False, 1
    if type(d) is Inbox:
        kind = "inbox"
        window, always = d.window, d.lookup == "always"
        horizon_us, skew_us = _micros(d.horizon), _micros(d.clock_skew)
    elif type(d) is HighWater:
        kind, contiguous, max_sources = "high-water", d.mode == "contiguous", d.max_sources
    elif type(d) is NoDedup:
        kind = "none"
    else:
        return None
    if atype.upcasts:
        return None
    handlers: dict[str, tuple[Any, Any, Any]] = {}
    for mtype in atype.message_types:
        h = atype.handler_for(mtype)
        # A typed handler's payload is validated by its core validator, as TypedHandler.parse
        # does (a failure is the definition's invalid_payload), or built directly for a plain
        # dataclass of scalar fields (_direct_payload).
        handlers[mtype] = ((h.fn, h._validate, _direct_payload(h.payload_type))
                           if isinstance(h, TypedHandler) else (h, None, None))
    codec = atype.codec
    fast = None
    if codec._fast is not None and dataclasses.is_dataclass(codec.state_type):
        fast = (codec.state_type, [(name, list(allowed)) for name, allowed in codec._fast])
    return NATIVE.TypeSpec(atype.name, kind, window, horizon_us, skew_us, always, contiguous,
                           max_sources, atype.max_outbox, atype.topic, atype.state_version,
                           handlers, atype.load_state, codec.dump_checked, codec._loaded,
                           fast, codec._plain_dict)


def _micros(d: timedelta) -> int:
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


_EXACT: Final[dict[Any, type]] = {str: str, int: int, float: float, bool: bool,
                                   type(None): type(None)}


def _direct_payload(cls: Any) -> Any:
    """For a plain stdlib dataclass whose fields are scalars (str, int, float, bool, None or
    unions of them) and take no conversion — no pydantic configuration, ``__post_init__``,
    slots, ``init=False`` field or default factory: the core's builder of its payload
    objects, which takes a value only when its exact type is one of its field's (then
    pydantic's validation returns it as it is: an int for a float field is converted, so it
    is left to pydantic). None for any other class."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    if (hasattr(cls, "__pydantic_fields__") or hasattr(cls, "__pydantic_config__")
            or hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__
            or not cls.__dataclass_params__.init):  # type: ignore[attr-defined]
        return None
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:
        return None
    fields = []
    for f in dataclasses.fields(cls):
        if not f.init or f.default_factory is not dataclasses.MISSING:
            return None
        allowed = _exact_types(hints.get(f.name))
        if allowed is None:
            return None
        has_default = f.default is not dataclasses.MISSING
        fields.append((f.name, list(allowed), has_default, f.default if has_default else None))
    return NATIVE.DirectPayload(cls, fields)


def _exact_types(tp: Any) -> tuple[type, ...] | None:
    if tp in _EXACT:
        return (_EXACT[tp],)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        out: tuple[type, ...] = ()
        for a in typing.get_args(tp):
            if a not in _EXACT:
                return None
            out += (_EXACT[a],)
        return out
    return None
