"""Deterministic ids and hashes (pure): docs/design.md "Outbox ids" (invariant 3)."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime
from typing import Any, Final

from aggregates.core.native_core import native_core

#: Namespace of every id aggbox derives. Never change it: ids would stop matching.
AGGBOX_NAMESPACE: Final = uuid.UUID("5b1f3c8e-9a47-5d0e-8c3b-2f6a9e41d7c0")


def emitted_message_id(
    aggregate_type: str, aggregate_id: str, causation_id: str, index: int
) -> str:
    """The id of the ``index``-th message emitted while handling ``causation_id`` on one
    aggregate. Same inputs → same id, so re-running a handler after a conflict or a task
    retry re-emits identical ids and downstream consumers can dedup."""
    # Length-prefixed parts: an unambiguous encoding ("a/b" + "c" ≠ "a" + "b/c").
    name = (f"{len(aggregate_type)}:{aggregate_type}{len(aggregate_id)}:{aggregate_id}"
            f"{len(causation_id)}:{causation_id}{index}")
    return uuid5(AGGBOX_NAMESPACE, name)


_NS_BYTES = AGGBOX_NAMESPACE.bytes


def uuid5(namespace: uuid.UUID, name: str) -> str:
    """``str(uuid.uuid5(namespace, name))`` without the UUID object (hot path)."""
    raw = namespace.bytes if namespace is not AGGBOX_NAMESPACE else _NS_BYTES
    h = _sha1(raw + name.encode(), usedforsecurity=False).hexdigest()
    # The first 16 bytes of the digest with the version (byte 6: high nibble 5) and the
    # RFC 4122 variant (byte 8: top bits 10) set, done on the hex digits: hex digit 12 is
    # byte 6's high nibble, hex digit 16 byte 8's.
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


_sha1 = hashlib.sha1
#: A hex digit → the same nibble with its top two bits set to ``10``.
_VARIANT: Final = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


#: The definition of the canonical form: ``json.dumps(payload, sort_keys=True,
#: separators=(",", ":"), default=_default)``.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_default)


def payload_hash(payload: dict[str, Any]) -> str:
    """A short, stable hash of a payload (key order does not matter), kept next to the
    message id in the inbox to flag a reused id with a different payload."""
    return _blake2b(_CANONICAL.encode(payload).encode(), digest_size=6).hexdigest()


_blake2b = hashlib.blake2b


def payload_hashes(payloads: list[dict[str, Any]]) -> list[str]:
    """``[payload_hash(p) for p in payloads]`` (one native call per batch when native)."""
    return [payload_hash(p) for p in payloads]


def emitted_message_ids(aggregate_type: str, aggregate_id: str, causation_id: str,
                        count: int) -> list[str]:
    """``[emitted_message_id(aggregate_type, aggregate_id, causation_id, i) for i in
    range(count)]`` (one native call when native)."""
    return [emitted_message_id(aggregate_type, aggregate_id, causation_id, i)
            for i in range(count)]


def _native_core() -> Any:
    """The native core (native/, docs/design.md "The hot path": the same bytes, checked by
    tests/aggregates/test_ids_native.py) when importable, unless ``AGGBOX_PURE=1``. What it
    does not handle (datetime, bytes, subclasses, lone surrogates...) it hands back to the
    Python definitions above."""
    core = native_core()
    if core is None:
        return None
    core.init(_NS_BYTES, payload_hash, emitted_message_id,
              lambda ns, name: uuid5(uuid.UUID(bytes=ns), name))
    return core


_native = _native_core()
#: Whether the native core computes the ids and payload hashes (``aggbox --version`` says).
NATIVE: Final = _native is not None
if _native is not None:
    payload_hash = _native.payload_hash
    payload_hashes = _native.payload_hashes
    emitted_message_id = _native.emitted_message_id
    emitted_message_ids = _native.emitted_message_ids


def raw_message_id(raw: bytes | str) -> str:
    """An id for input that has no usable ``message_id`` (bad rows): a hash of its bytes, so
    dead-lettering the same bad row twice stays idempotent."""
    data = raw.encode() if isinstance(raw, str) else raw
    return "raw:" + hashlib.blake2b(data, digest_size=16).hexdigest()
