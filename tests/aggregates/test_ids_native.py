"""The ids and hashes aggbox uses give the bytes of their definitions, whichever
implementation serves them (the native core, native/; docs/design.md "The hot path"): the
canonical JSON
``json.dumps(payload, sort_keys=True, separators=(",", ":"), default=_default)``, its
blake2b-48 hash and the uuid5 ids.

The native module is optional (built by ``maturin build`` from native/, importable as
``_aggbox_native``); when it is importable every test here also checks it directly, and
``aggregates.core.ids`` serves its functions unless ``AGGBOX_PURE=1``.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.util
import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.core import ids
from tests.hypo import examples

NATIVE: Any = (importlib.import_module("_aggbox_native")
               if importlib.util.find_spec("_aggbox_native") else None)
if NATIVE is not None and ids._native is None:  # AGGBOX_PURE=1: its fallbacks, for the tests
    NATIVE.init(ids._NS_BYTES, ids.payload_hash, ids.emitted_message_id,
                lambda ns, name: ids.uuid5(uuid.UUID(bytes=ns), name))


def _definition_json(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), default=ids._default)


def _definition_hash(payload: Any) -> str:
    return hashlib.blake2b(_definition_json(payload).encode(), digest_size=6).hexdigest()


class Level(enum.IntEnum):
    LOW = 1


class Text(str):
    pass


#: Every character, lone surrogates included (hypothesis leaves them out by default).
_any_char = st.characters(exclude_categories=())
_keys = (st.text(_any_char, max_size=6)
         | st.sampled_from(["", "a", "A", "é", "\U0001f600", "\ufffd"]))
_floats = (st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([1e16, 1e15, 1e-4, 1e-5, 0.1, -0.0, 0.0, 1e22, 5e-324,
                              1.7976931348623157e308, 123456789012345678.0, 0.000123, 1.5e-7,
                              2.5e16]))
_ints = (st.integers() | st.integers(min_value=-(2**63) - 2, max_value=-(2**63) + 2)
         | st.integers(min_value=2**63 - 2, max_value=2**200))
_plain = st.none() | st.booleans() | _ints | _floats | st.text(_any_char)
#: Not plain JSON: the Python definition's default hook or its own rules handle these.
_other = (st.binary(max_size=6) | st.datetimes(timezones=st.just(UTC))
          | st.decimals(allow_nan=False) | st.just(Level.LOW)
          | st.builds(Text, st.text(max_size=4)))
_values = st.recursive(
    _plain | _other,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
                   | st.dictionaries(_keys, inner, max_size=5)),
    max_leaves=20,
)


def _same_outcome(native: Any, definition: Any, value: Any) -> None:
    """Equal results, or the same exception type from both."""
    try:
        want = definition(value)
    except (ValueError, TypeError, UnicodeEncodeError) as e:
        with pytest.raises(type(e)):
            native(value)
        return
    assert native(value) == want


@settings(max_examples=examples(600), deadline=None)
@given(st.dictionaries(_keys, _values, max_size=8))
def test_payload_hash_is_the_definition(payload: dict[str, Any]) -> None:
    _same_outcome(ids.payload_hash, _definition_hash, payload)
    _same_outcome(lambda p: ids.payload_hashes([p, p])[1], _definition_hash, payload)
    if NATIVE is not None:
        _same_outcome(NATIVE.payload_hash, _definition_hash, payload)
        canon = NATIVE.canonical_json(payload)
        if canon is not None:  # None: left to the Python definition
            assert canon == _definition_json(payload)


@settings(max_examples=examples(600), deadline=None)
@given(_plain)
def test_plain_values_are_canonical_natively(value: Any) -> None:
    if NATIVE is None:
        assert ids._native is None
        return
    got = NATIVE.canonical_json(value)
    if got is None:  # left to Python only for text with lone surrogates
        assert isinstance(value, str)
        with pytest.raises(UnicodeEncodeError):
            value.encode()
    else:
        assert got == _definition_json(value)


def test_known_bytes() -> None:
    p = {"b": 1, "a": [1.5, True, None, "é\u2028\U0001f600\ud800\"\\\b\f\n\r\t\x00\x7f"],
         "t": datetime(2026, 1, 2, tzinfo=UTC), "x": b"\x01", "d": Decimal("1.10"),
         "f": [1e16, 1e15, 1e-5, 1e-4, float("nan"), float("inf"), -float("inf"), -0.0],
         "big": 2**100, "neg": -(2**64), "e": Level.LOW, "s": Text("k"), "u": (1, (2,)),
         "\U0001f600": 0, "\uffff": 1, "Z": 2}
    assert ids.payload_hash(p) == _definition_hash(p)
    v: Any
    for v in (1e16, 1e15, 1e-5, 1e-4, 2**100, "é\U0001f600\x7f", {"b": {}, "a": []}, [()]):
        assert NATIVE is None or NATIVE.canonical_json(v) == _definition_json(v)
    circular: list[Any] = []
    circular.append(circular)
    for _ in range(2):
        with pytest.raises(ValueError, match="Circular reference"):
            ids.payload_hash({"c": circular})
    with pytest.raises(TypeError):
        ids.payload_hash({"k": {1: 1, "a": 2}})  # mixed key types: json's own error
    assert ids.payload_hash({"k": {1: 1, 2.5: None}}) == _definition_hash({"k": {1: 1, 2.5: None}})


@settings(max_examples=examples(600), deadline=None)
@given(st.text(_any_char, max_size=8), st.text(_any_char, max_size=8),
       st.text(_any_char, max_size=8), st.integers(min_value=0, max_value=2**70))
def test_emitted_ids_are_uuid5(t: str, a: str, c: str, i: int) -> None:
    name = f"{len(t)}:{t}{len(a)}:{a}{len(c)}:{c}{i}"
    try:
        want = str(uuid.uuid5(ids.AGGBOX_NAMESPACE, name))
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            ids.emitted_message_id(t, a, c, i)
        return
    assert ids.emitted_message_id(t, a, c, i) == want
    assert ids.emitted_message_ids(t, a, c, 3) == [
        str(uuid.uuid5(ids.AGGBOX_NAMESPACE, f"{len(t)}:{t}{len(a)}:{a}{len(c)}:{c}{k}"))
        for k in range(3)]
    if NATIVE is not None:
        other = uuid.UUID("12345678-1234-5678-1234-567812345678")
        assert NATIVE.uuid5(other.bytes, name) == str(uuid.uuid5(other, name))


def test_emitted_id_of_unusual_arguments() -> None:
    # Not an exact int or str: the native core hands them to the Python definition.
    for i in (True, Level.LOW):
        name = f"1:T1:a1:c{i}"
        assert ids.emitted_message_id("T", "a", "c", i) == str(uuid.uuid5(ids.AGGBOX_NAMESPACE,
                                                                          name))
    assert ids.emitted_message_id(Text("T"), "a", "c", 0) == str(
        uuid.uuid5(ids.AGGBOX_NAMESPACE, "1:T1:a1:c0"))
